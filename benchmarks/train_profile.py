"""Where the train phase's time goes: `PolicyTrainer.train_step` in this process (one DeepSpeed rank, no Ray), on
synthetic trajectories of the GRPO benchmarks' shapes, timed per step and then once under torch.profiler.

Trajectories: `--samples` responses of random token ids with lengths drawn uniformly from [--min-len, --len]
(a real model's responses end at different lengths), prompts of `--prompt-len` tokens, random advantages,
engine logprobs near the policy's (so ratios stay near 1). The config is `+experiment=smol_math` with
`--override`s, so the trainer is set up exactly as in a run (DeepSpeed ZeRO-2, bf16, the logprob head).

    python benchmarks/train_profile.py --model smol [--samples 256 --len 192 --min-len 20] [--profile]
    python benchmarks/train_profile.py --model qwen06b --samples 128 --len 1024 --min-len 1024 \
        --override trainer.micro_batch_size=8

`--reference` times the KL reference's forward instead (`FrozenModel.logprobs`, set up as in a run, colocated: it
hands its cache back after each call); MFU then counts forward FLOPs only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_cfg(model_path: str, device: str, samples: int, overrides: list[str]) -> dict:
    from launch.config import compose
    from rl.config import resolve_auto

    cfg = compose(["+experiment=smol_math", f"model.path={model_path}", f"trainer.device={device}",
                   f"data.prompts_per_step={samples // 8}", "rollout.n_samples=8", *overrides])
    resolve_auto(cfg, is_moe=False)
    return cfg


def trajectories(n: int, prompt_len: int, lo: int, hi: int, vocab: int, seed: int = 0):
    from rl.trajectory import Trajectory

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        R = int(rng.integers(lo, hi + 1))
        out.append(Trajectory(uid=f"u{i}", group_id=f"g{i // 8}", domain="math",
                              prompt_ids=rng.integers(0, vocab, prompt_len), response_ids=rng.integers(0, vocab, R),
                              inference_logprobs=np.full(R, -2.0, np.float32), advantage=float(rng.normal())))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smol", choices=["smol", "qwen06b", "dense-small"],
                    help="dense-small: the tests' small random dense model (launch/testbed.py), for CPU checks")
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=60)
    ap.add_argument("--len", type=int, default=192)
    ap.add_argument("--min-len", type=int, default=20)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--override", nargs="*", default=[])
    ap.add_argument("--device", default="cuda", help="cpu: a check of this script")
    ap.add_argument("--profile", action="store_true", help="one more step under torch.profiler: top ops")
    ap.add_argument("--trace", help="with --profile: keep the Chrome/Perfetto trace there (gzipped JSON; "
                                    "benchmarks/trace_gaps.py reads it)")
    ap.add_argument("--reference", action="store_true", help="time the reference's forward (FrozenModel.logprobs)")
    ap.add_argument("--bf16-partials", action="store_true",
                    help="the LM head's weight gradient as before: a bf16 product per chunk, widened and added "
                         "(rl.logprobs.add_outer's fallback), to compare with the float32-accumulating GEMM")
    ap.add_argument("--per-gradient-check", action="store_true",
                    help="keep DeepSpeed's per-gradient inf/NaN test before each step (bf16 ZeRO-1/2; a run drops "
                         "it, trainer.policy.drop_per_gradient_overflow_check), to compare")
    args = ap.parse_args()
    if args.bf16_partials:
        import rl.logprobs

        rl.logprobs._MIXED_ADDMM[0] = False
    if args.model == "smol":
        from rl.models import SMOLLM2, resolve_model_path

        path = resolve_model_path(SMOLLM2)
    else:
        from launch.testbed import DENSE_SMALL, QWEN3_06B, build_model

        path = build_model(f"/tmp/{args.model}-model", QWEN3_06B if args.model == "qwen06b" else DENSE_SMALL)
    from transformers import AutoConfig

    from trainer.dist import open_store
    from trainer.policy import PolicyTrainer

    cfg = build_cfg(path, args.device, args.samples, args.override)
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    trajs = trajectories(args.samples, args.prompt_len, args.min_len, args.len, AutoConfig.from_pretrained(path).vocab_size)
    norm = (len(trajs), int(sum(t.num_response_tokens for t in trajs)))
    tokens = sum(t.num_tokens for t in trajs)
    if args.reference:
        from trainer.frozen import FrozenModel

        tr = FrozenModel(cfg, path)
        device, what = tr.device, "reference forward"

        planned, plan = [], tr._chunks

        def chunks_recorded(ts):  # the forwards `logprobs` plans, counted as it plans them
            out = plan(ts)
            planned.append(len(out))
            return out

        tr._chunks = chunks_recorded

        def step_once() -> str:
            tr.logprobs(trajs)
            return f"{planned[-1]} micro-batches"
    else:
        store = open_store()  # the rendezvous the trainer joins
        tr = PolicyTrainer(cfg, path, 0, 1, "127.0.0.1", store.port)
        device, what = tr.engine.device, "train step"
        if args.per_gradient_check:
            vars(tr.engine.optimizer).pop("check_overflow", None)  # DeepSpeed's own method again

        def step_once() -> str:
            return f"{tr.train_step([trajs], [norm])['micro_batches']:.0f} micro-batches"
    from rl.flops import body_flops, peak_tflops

    # perf/mfu's count (rl/flops.py): body FLOPs of forward + backward over every trained token (forward only for
    # the reference, as perf/ref_tflops counts it)
    counts = body_flops(AutoConfig.from_pretrained(path))
    flops = sum((counts.forward if args.reference else counts.train)(t.num_tokens) for t in trajs)
    peak = peak_tflops(torch.cuda.get_device_name()) if cuda else None
    print(f"{args.model} {what}: {args.samples} samples, {tokens} tokens, micro_batch_size "
          f"{cfg['trainer']['micro_batch_size']}, packed {tr.packed}, head {tr.head}, gradient checkpointing "
          f"{cfg['trainer']['gradient_checkpointing']}, {torch.cuda.get_device_name() if cuda else 'cpu'}", flush=True)
    for step in range(args.steps):
        sync()
        t0 = time.perf_counter()
        done = step_once()
        sync()
        dt = time.perf_counter() - t0
        mfu = f", MFU {100 * flops / dt / 1e12 / peak:.1f}%" if peak else ""
        mem = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
        print(f"step {step}: {dt:.3f} s ({tokens / dt:,.0f} tokens/s{mfu}), {done}, peak memory {mem:.1f} GiB",
              flush=True)
    if args.profile:  # what a run writes with trainer.profile_step (trainer/profiling.py): printed, trace kept
        import shutil
        import tempfile

        from trainer.profiling import profiled

        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "train_step"
            with profiled(out, device):
                step_once()
            print(out.with_name(out.name + ".txt").read_text())
            if args.trace:
                shutil.move(str(out.with_name(out.name + ".json.gz")), args.trace)


if __name__ == "__main__":
    main()
