"""Seconds per GRPO step of verl 0.9.1, the peer of benchmarks/grpo_step.py (issue 37), on the same two benchmarks.

verl runs `python -m verl.trainer.main_ppo` (its V1 trainer, `trainer.v1.trainer_mode=sync`), the FSDP engine
(`model_engine=dp`, its default) and the vLLM rollout colocated with the trainer ("hybrid engine": vLLM sleeps while
FSDP trains), on one GPU (the first of CUDA_VISIBLE_DEVICES), in a child of this script (`--verl-child`) that applies
two fixes before calling verl's `main` (below). Settings (`--setting`):
- defaults: verl's own defaults (gradient checkpointing on, pi_old recomputed by the trainer before the update);
- best: gradient checkpointing off (memory allows at these sizes) and pi_old taken from the engine: verl 0.9.1 has
  it as `algorithm.rollout_correction.bypass_mode=true` (old_log_probs = vLLM's `rollout_log_probs`, which
  `actor_rollout_ref.rollout.calculate_log_probs` has vLLM return; its V1 trainer then skips the `old_log_prob`
  forward and keeps the configured PPO-clip loss), the same as this project's default (V3.2: pi_old from vLLM).

What is matched (grpo_step.py's `smol` and `qwen06b`; learn_real.py's work):
- model: smol = SmolLM2-135M-Instruct (`rl.models.resolve_model_path(rl.models.SMOLLM2)`), qwen06b = the random
  Qwen3-0.6B shape of `launch.testbed` (grpo_step.model_path builds it once in --out);
- prompts: the bundled arithmetic (rl/bundled/math.jsonl), as chat messages with the system prompt "Solve the
  problem. Put the final answer in \\boxed{}." (verl applies the model's chat template), written as verl's parquet
  dataset (`write_dataset`); smol 32 prompts x 8 samples x 192 new tokens, qwen06b 16 x 8 x 1024;
- sampling: temperature 1, top_p 1, top_k off; vLLM gpu_memory_utilization 0.3 and max_model_len 2048 (TRL's);
- reward: this project's math reward, as the `math` domain scores it (rewards.registry: `fast_math_check`, else
  math-verify in a process of its own, `math_verify_reward`, with the registry's default parameters), given to verl
  as `reward.custom_reward_function` (`compute_score` below; verl calls it from a thread, where math-verify's SIGALRM
  timeouts cannot be armed, so math-verify runs in a spawned process, as ours runs it in its pool);
- algorithm: GRPO advantages without std normalisation, one optimizer step per step (ppo_mini_batch_size = the
  step's prompts, one epoch), clip 0.2, the `1/G sum_i 1/|o_i| sum_t` loss (`seq-mean-token-mean`), AdamW lr 2e-5
  constant, no warm-up, weight decay 0, gradient clip 1.0; smol no KL (no reference model runs), qwen06b a KL loss
  of 0.04 with a reference model (verl's `low_var_kl`: K3, clamped to [-10, 10]);
- precision: fp32 master weights, bf16 compute (verl's FSDP default: model_dtype fp32, mixed precision bf16);
- micro-batches: TRL's in grpo_step.py (smol 256 samples, qwen06b 8), for the update and the log-prob forwards.
What is not matched: verl's KL is K3 on pi_theta/pi_ref (ours: V3.2's unbiased K3, weighted by pi_theta/pi_old);
verl packs a micro-batch's samples (use_remove_padding, its default) and without flash-attn runs sdpa
(`override_config.attn_implementation`, flash_attention_2 when flash_attn imports); its own data loader order
(shuffled, its seed); reward scoring overlaps generation in verl's reward-loop workers (8, its default); verl's
`entropy` forward (its default, computed with the old log-probs) and torch.compile of its entropy function (default).

The two fixes (both in the Ray worker processes too, through Ray's `worker_process_setup_hook`, `worker_setup`):
- `verl.models.transformers.monkey_patch.is_trl_available` returns False: with trl 1.16 importable, verl's FSDP
  engine imports trl's `AutoModelForCausalLMWithValueHead`, which trl 1.16 no longer has; GRPO never uses it.
- verl's log-prob fallback without flash-attn's cross entropy, `verl.utils.torch_functional.logprobs_from_logits_v2`,
  loops in Python over the first dimension of the logits to bound memory; with `use_remove_padding` the logits are
  (tokens, vocab), so it runs one log_softmax (bf16) or logsumexp (fp32) kernel per token: tens of thousands of
  launches per micro-batch. `logprobs_by_chunks` computes the same per-row formula (bf16: log_softmax then gather;
  fp32: gathered logit minus logsumexp) on blocks of rows holding at most 2^26 logits, so the values are the same
  and the memory it saves for backward is the same (each row's log_softmax or logsumexp input), with at most one
  block (256 MiB in fp32) of transient memory more than one row. It is fair to the peer: it removes launch
  overhead that a GPU image with flash-attn would not pay, and changes no number (tests/test_verl_peer.py compares
  values and gradients with verl's own function).

Timing: verl's console and file loggers print every step's metrics, `timing_s/step` (the whole step) and one
`timing_s/<phase>` per phase (gen, reward, old_log_prob, ref, adv, update_actor, update_weights); this script
reads the file logger's JSON lines (`VERL_FILE_LOGGER_PATH`), or the console lines of the log. s/step is the median
over steps 2.. (step 1 holds compilation and warm-up), like grpo_step.py's. verl's Ray set-up holds ~12 CPUs
(TransferQueue actors, reward and agent-loop workers): with fewer than 13 CPUs it hangs before step 1, so this
script stops first. Needs verl 0.9.1 and its wheels (benchmarks/README.md, verl_peer.py).

    python benchmarks/verl_peer.py --out /tmp/grpo_step [--bench qwen06b smol] [--setting defaults best] [--steps 6]
    python benchmarks/verl_peer.py --out /tmp/grpo_step --report   # the table of what --out holds
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
for _p in (str(ROOT), str(HERE)):  # this file is also loaded by verl (the reward) and by Ray (the setup hook)
    if _p not in sys.path:
        sys.path.insert(0, _p)

from learn_real import SYSTEM  # noqa: E402  (benchmarks/, this script's directory)
from run_env import drop_ray_folder, read_jsonl, run_env  # noqa: E402

BENCHES = {  # grpo_step.py's two benchmarks; micro: TRL's --micro-batch there (samples per forward/backward)
    "smol": dict(prompts=32, max_new_tokens=192, kl=0.0, micro=256),
    "qwen06b": dict(prompts=16, max_new_tokens=1024, kl=0.04, micro=8),
}
SETTINGS = ("defaults", "best")
N_SAMPLES = 8
EVAL_SAMPLES = 4  # held-out samples a prompt (ours: eval.n_samples of smol_math; TRL: learn_real.py's)
PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights")
MIN_CPUS = 13
DATA_SOURCE = "mixrl/bundled_math"


# ---------------------------------------------------------------- the work: dataset and reward

def write_dataset(path: Path, source: str = "math.jsonl", limit: int | None = None, split: str = "train") -> int:
    """Bundled arithmetic (`source` under rl/bundled: the training set, or `eval/math.jsonl`, the held-out one, whose
    first `limit` prompts ours and TRL evaluate) as verl's RL parquet (columns data_source, prompt (chat messages),
    ability, reward_model {style, ground_truth}, extra_info); returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rl.data import BUNDLED_DIR

    rows = [json.loads(x) for x in (BUNDLED_DIR / source).read_text().splitlines() if x.strip()][:limit]
    table = pa.Table.from_pylist([
        {"data_source": DATA_SOURCE,
         "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": r["question"]}],
         "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": str(r["answer"])},
         "extra_info": {"index": i, "id": r.get("id", str(i)), "split": split}}
        for i, r in enumerate(rows)])
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return len(rows)


_POOL = None
_POOL_LOCK = threading.Lock()


def _math_pool():
    """One spawned process per verl reward worker for math-verify (its timeouts need a main thread)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            _POOL = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return _POOL


def math_params() -> dict:
    """The `math` reward's parameters at the registry's defaults (what the `math` domain scores with)."""
    from rewards.registry import REWARDS

    return {name: p.default for name, p in REWARDS["math"].params.items()}


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **_) -> float:
    """verl's custom reward (`reward.custom_reward_function.name=compute_score`): this project's math reward of one
    decoded response. The fast exact check first, then math-verify, in this thread when it is the main one, else
    in a spawned process; a reason to score 0 (RewardZero, an unparsable answer) or a math-verify run past a
    minute scores 0, like TRL's wrapper in learn_real.py."""
    from rewards.math_reward import fast_math_check, math_verify_reward
    from rewards.spec import RewardZero, SampleView
    from rewards.text import answer_part, sanitize

    text = sanitize(solution_str)
    view = SampleView(response=text, answer=answer_part(text), sample={"answer": ground_truth}, finish_reason="stop",
                      num_response_tokens=0, domain="math", max_new_tokens=0)
    params = math_params()
    fast = fast_math_check(view, params)
    if fast is not None:
        return float(fast)
    try:
        if threading.current_thread() is threading.main_thread():
            return float(math_verify_reward(view, params))
        return float(_math_pool().submit(math_verify_reward, view, params).result(timeout=60))
    except (RewardZero, ValueError, TimeoutError):
        return 0.0


# ---------------------------------------------------------------- the two fixes, in every process of the run

def logprobs_by_chunks(logits, labels, chunk_elems: int = 1 << 26):
    """verl's `logprobs_from_logits_v2` (log-prob of each label), the same per-row formula on blocks of rows instead
    of one row at a time: float32/64 logits: gathered logit - logsumexp; others (bf16): log_softmax, gathered."""
    import torch
    import torch.nn.functional as F

    vocab = logits.shape[-1]
    flat, flat_labels = logits.reshape(-1, vocab), labels.reshape(-1)
    rows = max(1, chunk_elems // vocab)
    parts = []
    for lo in range(0, flat.shape[0], rows):
        block, idx = flat[lo:lo + rows], flat_labels[lo:lo + rows].unsqueeze(-1)
        if block.dtype in (torch.float32, torch.float64):
            parts.append(block.gather(-1, idx).squeeze(-1) - torch.logsumexp(block, dim=-1))
        else:
            parts.append(F.log_softmax(block, dim=-1).gather(-1, idx).squeeze(-1))
    return torch.cat(parts).view(labels.shape) if parts else logits.new_empty(labels.shape)


def _no_trl(module) -> None:
    module.is_trl_available = lambda: False


def _chunked_logprobs(module) -> None:
    module.logprobs_from_logits_v2 = logprobs_by_chunks  # `logprobs_from_logits` looks it up at each call


PATCHES = {"verl.models.transformers.monkey_patch": _no_trl, "verl.utils.torch_functional": _chunked_logprobs}


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Applies PATCHES[name] right after module `name` is executed, wherever it is first imported (so verl's
    `from ... import` of a patched name, done later, sees the patched object)."""

    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module, run=run, patch=PATCHES[name]):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def worker_setup() -> None:
    """Ray's `worker_process_setup_hook` (and the launcher's own process): the fixes, lazily, on import."""
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
    for name, patch in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])


def verl_child(overrides: list[str]) -> None:
    """The launcher: the fixes, then verl's Hydra main with `overrides` on its command line."""
    worker_setup()
    sys.argv = [sys.argv[0], *overrides]
    from verl.trainer.main_ppo import main as verl_main

    verl_main()


# ---------------------------------------------------------------- the command

def attn_implementation() -> str:
    import importlib.util

    return "flash_attention_2" if importlib.util.find_spec("flash_attn") else "sdpa"


def overrides(bench: str, setting: str, model: str, data: Path, run_dir: Path, steps: int,
              attn: str = "sdpa", eval_data: Path | None = None, eval_every: int = 0) -> list[str]:
    """verl's Hydra overrides (all keys of verl/trainer/config/ppo_trainer.yaml) for one benchmark and setting.
    `eval_data`, `eval_every`: verl's validation (`trainer.test_freq`) on those held-out prompts every N steps, as ours
    and TRL evaluate for time_to_reward.py: EVAL_SAMPLES samples a prompt at the training sampling (verl's default
    is one greedy answer), logged as `val-core/<data_source>/acc/mean@4`, the mean 0/1 score: pass@1."""
    b = BENCHES[bench]
    micro = min(b["micro"], b["prompts"] * N_SAMPLES)
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    out = [
        "algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=false", "algorithm.use_kl_in_reward=false",
        f"data.train_files={data}", f"data.val_files={data}", f"data.train_batch_size={b['prompts']}",
        "data.max_prompt_length=256", f"data.max_response_length={b['max_new_tokens']}",
        f"actor_rollout_ref.model.path={model}", f"+actor_rollout_ref.model.override_config.attn_implementation={attn}",
        f"{a}.optim.lr=2e-5", f"{a}.optim.weight_decay=0.0", f"{a}.optim.lr_warmup_steps=0", f"{a}.grad_clip=1.0",
        f"{a}.ppo_mini_batch_size={b['prompts']}", f"{a}.ppo_micro_batch_size_per_gpu={micro}", f"{a}.ppo_epochs=1",
        f"{a}.clip_ratio=0.2", f"{a}.loss_agg_mode=seq-mean-token-mean", f"{a}.entropy_coeff=0",
        f"{a}.use_kl_loss={'true' if b['kl'] else 'false'}", f"{a}.kl_loss_coef={b['kl']}", f"{a}.kl_loss_type=low_var_kl",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
        f"{r}.name=vllm", f"{r}.n={N_SAMPLES}", f"{r}.temperature=1.0", f"{r}.top_p=1.0", f"{r}.top_k=-1",
        f"{r}.tensor_model_parallel_size=1", f"{r}.gpu_memory_utilization=0.3", f"{r}.max_model_len=2048",
        f"{r}.log_prob_micro_batch_size_per_gpu={micro}", f"{r}.calculate_log_probs=true",
        f"reward.custom_reward_function.path={Path(__file__).resolve()}", "reward.custom_reward_function.name=compute_score",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.resume_mode=disable",
        "trainer.logger=[console,file]", "trainer.project_name=verl_peer", f"trainer.experiment_name={run_dir.name}",
        f"trainer.default_local_dir={run_dir / 'checkpoints'}",
        "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=verl_peer.worker_setup",
    ]
    if eval_every:
        v = f"{r}.val_kwargs"
        out = [x for x in out if not x.startswith(("data.val_files=", "trainer.test_freq="))]
        out += [f"data.val_files={eval_data}", f"trainer.test_freq={eval_every}", f"{v}.n={EVAL_SAMPLES}",
                f"{v}.do_sample=true", f"{v}.temperature=1.0", f"{v}.top_p=1.0", f"{v}.top_k=-1"]
    if setting == "best":
        out += ["actor_rollout_ref.model.enable_gradient_checkpointing=false",
                "algorithm.rollout_correction.bypass_mode=true"]
        if attn_implementation() == "sdpa":
            # without flash-attn, verl's packed micro-batch (use_remove_padding) reaches sdpa as one sequence whose
            # attention mask is tokens x tokens: smol's 256 samples without checkpointing ran out of the H200's
            # 140 GB in the first update (2026-11-27); padded sequences cost per sample only
            out += ["actor_rollout_ref.model.use_remove_padding=false"]
    return out


def hydra_overrides(run_dir: Path) -> list[str]:
    """Hydra's own: its run directory in the run's folder, not ./outputs."""
    return [f"hydra.run.dir={run_dir / 'hydra'}"]


def check_cpus(count: int | None = None) -> None:
    count = os.cpu_count() if count is None else count
    if (count or 0) < MIN_CPUS:
        raise SystemExit(f"verl_peer: this machine has {count} CPUs; verl 0.9.1's Ray set-up holds ~12 (TransferQueue "
                         f"actors, reward and agent-loop workers) and hangs before step 1 with fewer than {MIN_CPUS}")


def run_verl(bench: str, setting: str, model: str, out: Path, steps: int, timeout: float, name: str | None = None,
             eval_every: int = 0, eval_prompts: int = 64) -> Path:
    """One verl run in a child process (in out/`name`, default verl_<bench>_<setting>); returns its file logger's JSON
    lines (one object per step). `eval_every`: held-out validation every N steps on the first `eval_prompts` prompts
    of rl/bundled/eval/math.jsonl (time_to_reward.py)."""
    # a named run (time_to_reward.py) keeps verl's output in its folder: out/<name>.log is the caller's own log
    log_path = out / f"verl_{bench}_{setting}.log" if name is None else out / name / "verl.log"
    name = name or f"verl_{bench}_{setting}"
    run_dir = out / name
    run_dir.mkdir(parents=True, exist_ok=True)
    data = out / "verl_data" / "math.parquet"
    write_dataset(data)
    eval_data = out / "verl_data" / f"eval_math_{eval_prompts}.parquet"
    if eval_every:
        write_dataset(eval_data, "eval/math.jsonl", limit=eval_prompts, split="test")
    steps_file = run_dir / "steps.jsonl"
    steps_file.unlink(missing_ok=True)
    env = {**run_env("ray-verl-peer-"), "VERL_FILE_LOGGER_PATH": str(steps_file), "WANDB_MODE": "disabled"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env["PYTHONPATH"]])  # verl's reward and Ray's hook load this file
    visible = env.get("CUDA_VISIBLE_DEVICES")
    env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[0] if visible else "0"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--verl-child",
           *overrides(bench, setting, model, data, run_dir, steps, attn_implementation(), eval_data, eval_every),
           *hydra_overrides(run_dir)]
    t0 = time.perf_counter()
    with log_path.open("w") as log:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        except KeyboardInterrupt:  # stopped on purpose: time_to_reward.py at its target, or by hand
            drop_ray_folder(env, 0)
            raise
    print(f"  {name}: {time.perf_counter() - t0:.0f} s wall, exit {rc} (log: {log_path})", flush=True)
    drop_ray_folder(env, rc if isinstance(rc, int) else None)  # a timed-out run's Ray logs are kept too
    return steps_file


# ---------------------------------------------------------------- timing: verl's logs -> a table

# verl.utils.logger.aggregate_logger.concat_dict_to_str: "step:3 - key:value - ...", each value pprint.pformat'ed
# (with numpy 2, a numpy scalar prints as `np.float64(1.5)`)
_CONSOLE_STEP = re.compile(r"^step:(\d+) - ")
_CONSOLE_VALUE = re.compile(r"([\w/@.\-]+):(?:np\.\w+\()?([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))\)?(?= - |$)")


def parse_console_line(line: str) -> tuple[int, dict[str, float]] | None:
    """(step, {metric: value}) from one line of verl's console logger, None for any other line."""
    line = line.strip()
    m = _CONSOLE_STEP.match(line)
    if m is None:
        return None
    return int(m[1]), {k: float(v) for k, v in _CONSOLE_VALUE.findall(line[m.end():])}


def read_steps(steps_file: Path, log: Path | None = None) -> dict[int, dict[str, float]]:
    """step -> metrics: from the file logger's JSON lines ({"step", "data"}), else from the console lines of `log`."""
    steps: dict[int, dict[str, float]] = {}
    for row in read_jsonl(steps_file):
        steps.setdefault(int(row["step"]), {}).update(
            {k: float(v) for k, v in row["data"].items() if isinstance(v, (int, float))})
    if not steps and log is not None and log.exists():
        for line in log.read_text(errors="replace").splitlines():
            parsed = parse_console_line(line)
            if parsed:
                steps.setdefault(parsed[0], {}).update(parsed[1])
    return {s: m for s, m in sorted(steps.items()) if "timing_s/step" in m}


def summarize(bench: str, setting: str, steps: dict[int, dict[str, float]]) -> dict:
    """s/step and per-phase seconds, medians over steps 2.. (a phase a step did not run counts 0 s)."""
    later = [m for s, m in steps.items() if s >= 2]
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    s = {"bench": bench, "setting": setting, "steps": len(steps), "s_step": med([m["timing_s/step"] for m in later]),
         "reward_mean": med([m["critic/score/mean"] for m in later if "critic/score/mean" in m]),
         "response_length": med([m["response_length/mean"] for m in later if "response_length/mean" in m])}
    s["phases"] = {ph: med([m.get(f"timing_s/{ph}", 0.0) for m in later]) for ph in PHASES}
    return s


def table(summaries: list[dict]) -> str:
    f = lambda x, p=2: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    lines = ["| benchmark | verl 0.9.1 setting | verl s/step | verl: " + " / ".join(PHASES) + " s "
             "| reward (median) | response tokens | steps |", "|---|---|---|---|---|---|---|"]
    for s in summaries:
        lines.append(f"| {s['bench']} | {s['setting']} | {f(s['s_step'])} | "
                     f"{' / '.join(f(s['phases'][ph]) for ph in PHASES)} | {f(s['reward_mean'], 3)} | "
                     f"{f(s['response_length'], 0)} | {s['steps']} |")
    return "\n".join(lines)


def report(out: Path, benches: list[str], settings: list[str]) -> list[dict]:
    """Summaries of the runs in `out`, each also written to out/verl_<bench>_<setting>.json."""
    found = []
    for bench in benches:
        for setting in settings:
            name = f"verl_{bench}_{setting}"
            steps = read_steps(out / name / "steps.jsonl", out / f"{name}.log")
            if steps:
                s = summarize(bench, setting, steps)
                (out / f"{name}.json").write_text(json.dumps(s, indent=1) + "\n")
                found.append(s)
    return found


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--verl-child":
        return verl_child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bench", nargs="+", default=list(BENCHES), choices=list(BENCHES))
    ap.add_argument("--setting", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=1500.0, help="seconds per run (verl takes ~215 s to step 1)")
    ap.add_argument("--report", action="store_true", help="print the table of what --out holds, run nothing")
    ap.add_argument("--eval-every", type=int, default=0, help="held-out pass@1 every N steps (time_to_reward.py)")
    ap.add_argument("--eval-prompts", type=int, default=64, help="with --eval-every: held-out prompts")
    ap.add_argument("--name", default=None, help="the run's folder in --out (one --bench and --setting)")
    args = ap.parse_args()
    if args.name and len(args.bench) * len(args.setting) != 1:
        ap.error("--name names one run: give one --bench and one --setting")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        check_cpus()
        from grpo_step import model_path

        for bench in args.bench:
            path = model_path(bench, out)
            print(f"{bench}: {path}", flush=True)
            for setting in args.setting:
                run_verl(bench, setting, path, out, args.steps, args.timeout, args.name, args.eval_every,
                         args.eval_prompts)
    if not args.name:
        print(table(report(out, args.bench, args.setting)))


if __name__ == "__main__":
    main()
