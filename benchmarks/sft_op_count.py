"""Ops per SFT step, ours vs a plain-PyTorch step doing the same math: where does our step's CPU overhead come from?

On an H100 our SFT step of SmolLM2-135M is CPU-bound (benchmarks/README.md, sft_speed.py): the CPU issues ~17k kernel
launches a step while the GPU computes for 0.32 s of its 1.6 s. This counts, on the CPU, the aten ops one step
issues, as a proxy of those launches, per phase of the step:

- ours: `PolicyTrainer.train_step` in this process (one DeepSpeed rank over gloo, no Ray), set up from
  `+experiment=sft` exactly as a run sets it up (DeepSpeed ZeRO, the chunked logprob head, packed micro-batches cut
  by `trainer.micro_batch_tokens`, `TrainStatSums`), on one mini-batch of synthetic conversations;
- reference: the same micro-batches (ours' packing, the same position ids) through the HF model from the same
  weights: body forward, LM head + cross-entropy over the assistant tokens (sum / the mini-batch's loss tokens),
  backward, `clip_grad_norm_`, `torch.optim.AdamW` (foreach, as ours' torch AdamW), `zero_grad`.

Each phase is a `torch.profiler.record_function` around the code that does it (wrappers set up here, none in the
trainer): an op counts in the innermost labelled function it runs in. Ours' loss head is the chunked logprob
(`token_logprobs`, forward and its autograd backward) and the SFT loss; the reference's is the LM head and
cross-entropy, its backward run as a backward of its own into the body's output (then the body's backward), so the
two split alike. `data` is host work (collate; on a GPU only its copies to the device launch anything).

Counted ("launch-like"): the aten ops that work themselves, outside every other such op: views, allocations and
composites whose work is all in the ops they call (`TRANSPARENT`) are left out, and what an op calls internally (a
CPU reduction's output fill, a scalar's conversion) is part of it. `host syncs`: `_local_scalar_dense` (`.item()`,
`float(t)`), a wait for the GPU where the tensor is on the GPU (AdamW's step counters are CPU tensors on a GPU too:
the reference's are no wait there). Limits of the proxy: a foreach op (AdamW, clip_grad_norm_) is one op here and a
few multi-tensor kernels on a GPU; cuDNN attention is one op and a few kernels plus its own host work. The GPU's own
count: `trainer.profile_step`, `benchmarks/train_profile.py --profile`.

`--time N` also times N steps of each (alternating, no profiler) and splits the wall time by the same phases. On the
CPU the body's compute hides the overhead; `--narrow` keeps SmolLM2's 30 layers and 272 parameter tensors at hidden
size 72, and `--lengths 4 8 8 16 --tokens 40` makes the micro-batches a few dozen tokens, so that a step's time is
mostly what the CPU spends around the kernels (Python, dispatch, DeepSpeed's bookkeeping): what a GPU step waits on
when it is CPU-bound.

    python benchmarks/sft_op_count.py                      # SmolLM2-135M's shape, random weights, float32 (~4 min)
    python benchmarks/sft_op_count.py --quick              # the embedded tiny-dense model (seconds)
    python benchmarks/sft_op_count.py --narrow --lengths 4 8 8 16 --tokens 40 --time 10   # CPU overhead (~1 min)
    python benchmarks/sft_op_count.py --quick --dtype bfloat16 --override trainer.zero_stage=0 --phase clip

The SmolLM2-shape weights (~0.5 GB float32) are written once to MIXRL_CACHE.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# SmolLM2-135M's architecture (its config.json), random weights
SMOLLM2_SHAPE = dict(
    model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0,
    rms_norm_eps=1e-5, tie_word_embeddings=True, initializer_range=0.04,
)
# the same layers and parameter tensors, ~nothing to compute: a step's time is then the CPU's overhead (--narrow)
NARROW = dict(hidden_size=72, head_dim=8, intermediate_size=192, vocab_size=4096)
PHASES = ("data", "forward", "loss head", "backward", "grad reduction", "clip", "optimizer step", "optimizer other",
          "metrics", "other")
LABEL = "phase::"  # record_function names this script adds: phase::<phase>::<site>
# Ops that launch no kernel of their own on a GPU: views and metadata, allocations (the caching allocator's, no
# launch), and composites whose work is all in the ops they call (those are counted instead)
TRANSPARENT = {f"aten::{name}" for name in """
    view _unsafe_view as_strided reshape _reshape_alias t transpose permute expand expand_as slice select unsqueeze
    squeeze detach detach_ alias empty empty_strided empty_like new_empty new_empty_strided resize_ lift_fresh split
    split_with_sizes chunk unbind narrow view_as flatten unflatten contiguous is_nonzero result_type set_ to _to_copy
    requires_grad_ _has_compatible_shallow_copy_type is_same_size _local_scalar_dense item resolve_conj resolve_neg
    movedim dim type_as is_pinned promote_types numpy_T matrix_H
    linear matmul zeros zeros_like ones ones_like full full_like new_zeros new_ones new_full clone stack
    scaled_dot_product_attention embedding embedding_backward cross_entropy_loss log_softmax softmax nll_loss_nd
    nll_loss isfinite isnan diff __and__ __or__ __invert__ special_xlogy slice_backward select_backward index_put_
    masked_fill unflatten_dense_tensors dropout
""".split()}
SYNCS = {"aten::_local_scalar_dense"}


# -- phase labels ---------------------------------------------------------------------------------------------------
class Clock:
    """Wall time per phase, each labelled call's own (what labelled calls inside it took goes to theirs)."""

    def __init__(self) -> None:
        self.times: Counter = Counter()
        self.stack: list[list[float]] = []  # [start, time of labelled calls inside]

    def enter(self) -> None:
        self.stack.append([time.perf_counter(), 0.0])

    def leave(self, phase: str) -> None:
        start, inside = self.stack.pop()
        took = time.perf_counter() - start
        self.times[phase] += took - inside
        if self.stack:
            self.stack[-1][1] += took


CLOCK = Clock()


def label(phase: str, site: str):
    """A decorator: run the function inside record_function(phase::<phase>::<site>), its time on CLOCK."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            CLOCK.enter()
            try:
                with torch.profiler.record_function(f"{LABEL}{phase}::{site}"):
                    return fn(*args, **kwargs)
            finally:
                CLOCK.leave(phase)
        return inner
    return wrap


PATCHED: list[tuple] = []  # (owner, attr, what owner.__dict__ held: None if nothing), for `unpatch`


def patch(owner, attr: str, phase: str, site: str | None = None) -> None:
    """owner.attr (a function of a module, a method of an object or class) runs labelled until `unpatch`."""
    fn = getattr(owner, attr)
    held = vars(owner).get(attr) if hasattr(owner, "__dict__") else None
    PATCHED.append((owner, attr, held))
    if isinstance(owner, type) and isinstance(held, staticmethod):
        setattr(owner, attr, staticmethod(label(phase, site or attr)(fn)))
    else:
        setattr(owner, attr, label(phase, site or attr)(fn))


def unpatch() -> None:
    """Every `patch` undone, the last first (tests run this script's step among other tests)."""
    while PATCHED:
        owner, attr, held = PATCHED.pop()
        if held is None:
            delattr(owner, attr)  # an instance's attribute that shadowed its class's method
        else:
            setattr(owner, attr, held)


def label_ours(tr) -> None:
    """Our step's phases: wrappers on the functions the trainer calls, and on DeepSpeed's own."""
    import rl.logprobs
    import trainer.forward
    import trainer.policy
    from rl.metrics import TrainStatSums

    patch(trainer.policy, "collate", "data")
    engine, opt = tr.engine, tr.engine.optimizer
    patch(engine, "forward", "forward", "engine.forward")
    patch(trainer.forward, "token_logprobs", "loss head")
    for fn in (rl.logprobs._ChunkedTokenLogprobs, rl.logprobs._SupportTokenLogprobs):
        patch(fn, "backward", "loss head", f"{fn.__name__}.backward")
    obj = tr.objective
    tr.objective = dataclasses.replace(obj, loss=label("loss head", "objective.loss")(obj.loss),
                                       sums=label("metrics", "objective.sums")(obj.sums))
    patch(trainer.policy, "forward_sums", "metrics")
    patch(TrainStatSums, "add", "metrics", "TrainStatSums.add")
    patch(TrainStatSums, "totals", "metrics", "TrainStatSums.totals")
    patch(engine, "backward", "backward", "engine.backward")
    for name in ("process_gradients", "reduce_ready_partitions_and_remove_grads", "backward_epilogue",
                 "overlapping_partition_gradients_reduce_epilogue", "independent_gradient_partition_epilogue"):
        if hasattr(opt, name):
            patch(opt, name, "grad reduction", f"zero.{name}")
    for name in ("_flush_coalesced_reduction_zero12", "allreduce_gradients", "_backward_epilogue"):
        if hasattr(engine, name):
            patch(engine, name, "grad reduction", f"engine.{name}")
    patch(engine, "step", "optimizer other", "engine.step")
    for name in ("scaled_global_norm", "unscale_and_clip_grads", "clip_fp32_gradients", "get_global_norm",
                 "get_grad_norm", "_get_norm_with_moe_layers", "clip_grad_norm_"):
        if hasattr(opt, name):
            patch(opt, name, "clip", f"zero.{name}")
    inner = getattr(opt, "optimizer", opt)  # the torch optimizer DeepSpeed steps
    patch(inner, "step", "optimizer step", f"{type(inner).__name__}.step")
    if hasattr(engine, "clip_fp32_gradients"):
        patch(engine, "clip_fp32_gradients", "clip", "engine.clip_fp32_gradients")
    patch(engine, "get_global_grad_norm", "metrics", "engine.get_global_grad_norm")


# -- the step's samples ---------------------------------------------------------------------------------------------
def conversations(n: int, vocab: int, lengths: tuple[int, int, int, int] = (30, 60, 60, 200), seed: int = 0):
    """`n` synthetic SFT rows (rl/sft_data.py's shape): a prompt of lengths[0]-lengths[1] tokens, an answer of
    lengths[2]-lengths[3] tokens, its last two tokens (the template's scaffolding) out of the loss."""
    from rl.trajectory import Trajectory

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        P, R = int(rng.integers(lengths[0], lengths[1] + 1)), int(rng.integers(lengths[2], lengths[3] + 1))
        mask = np.ones(R, np.float32)
        mask[-2:] = 0.0
        out.append(Trajectory(uid=f"sft-{i}", group_id=f"sft-{i}", domain="sft", prompt_ids=rng.integers(0, vocab, P),
                              response_ids=rng.integers(0, vocab, R), inference_logprobs=None, loss_mask=mask))
    return out


# -- ours -----------------------------------------------------------------------------------------------------------
def build_cfg(model_path: str, samples: int, tokens: int, dtype: str, overrides: list[str]) -> dict:
    from launch.config import compose
    from rl.config import resolve_auto

    # sdpa on both sides: on the CPU varlen (the experiment's attention) runs its masked stand-in, not its kernels
    cfg = compose(["+experiment=sft", f"model.path={model_path}", f"model.dtype={dtype}", "trainer.device=cpu",
                   "model.attn_implementation=sdpa",
                   "trainer.micro_batch_size=auto", f"trainer.micro_batch_tokens={tokens}",
                   "trainer.pack_sequences=true", "trainer.mini_batches=1", f"algorithm.samples_per_step={samples}",
                   "trainer.lr=1e-4", *overrides])
    resolve_auto(cfg, is_moe=False)
    return cfg


def ours_step(cfg: dict, model_path: str, trajs, port: int):
    """(one step's function, the trainer): `PolicyTrainer.train_step` on one mini-batch of `trajs`."""
    from rl.batching import minibatch_norm
    from trainer.policy import PolicyTrainer

    tr = PolicyTrainer(cfg, model_path, 0, 1, "127.0.0.1", port)
    label_ours(tr)
    norm = minibatch_norm(trajs)
    return (lambda: tr.train_step([trajs], [norm])), tr


# -- the reference --------------------------------------------------------------------------------------------------
def reference_step(model_path: str, plan, norm_tokens: int, cfg: dict, dtype: str):
    """A minimal SFT step in plain PyTorch on the same packed micro-batches (`plan`: lists of trajectories)."""
    from rl.models import load_causal_lm

    model = load_causal_lm(model_path, dtype, "sdpa").train()
    model.config.use_cache = False
    t = cfg["trainer"]
    # foreach as torch's default on a GPU (on the CPU it defaults to one op per parameter)
    opt = torch.optim.AdamW(model.parameters(), lr=float(t["lr"]), betas=tuple(t["betas"]), eps=1e-8,
                            weight_decay=float(t["weight_decay"]), foreach=True)
    body, head = model.get_decoder(), model.get_output_embeddings()

    @label("data", "pack")
    def pack(chunk):
        ids = np.concatenate([np.concatenate([c.prompt_ids, c.response_ids]) for c in chunk])
        pos = np.concatenate([np.arange(c.num_tokens) for c in chunk])
        # labels[i] = the id at i + 1 where that token is trained (an assistant token of the same conversation)
        labels = np.full(len(ids), -100, np.int64)
        start = 0
        for c in chunk:
            P = len(c.prompt_ids)
            trained = np.flatnonzero(c.loss_mask_or_ones() > 0)
            labels[start + P - 1 + trained] = c.response_ids[trained]
            start += c.num_tokens
        as_t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))[None]  # noqa: E731
        return as_t(ids), as_t(pos), as_t(labels)

    @label("forward", "body")
    def forward(ids, pos):
        return body(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state

    @label("loss head", "lm_head+cross_entropy")
    def head_loss(hidden, labels):
        logits = head(hidden).float()
        return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1),
                                                 ignore_index=-100, reduction="sum") / max(norm_tokens, 1)

    @label("loss head", "head backward")
    def head_backward(loss, leaf):
        loss.backward()
        return leaf.grad

    @label("backward", "body backward")
    def body_backward(hidden, grad):
        hidden.backward(grad)

    @label("clip", "clip_grad_norm_")
    def clip():
        return torch.nn.utils.clip_grad_norm_(model.parameters(), float(t["grad_clip"]))

    @label("optimizer step", "AdamW.step+zero_grad")
    def update():
        opt.step()
        opt.zero_grad(set_to_none=True)

    def step():
        for micro in plan:
            for chunk in micro:
                ids, pos, labels = pack(chunk)
                hidden = forward(ids, pos)
                leaf = hidden.detach().requires_grad_()
                body_backward(hidden, head_backward(head_loss(leaf, labels), leaf))
            norm = clip()
            update()
        return float(norm)

    return step, model


# -- counting -------------------------------------------------------------------------------------------------------
def site_of(event) -> tuple[str, str]:
    """(phase, site) of the innermost labelled function an event ran in; ("other", "-") outside all."""
    e = event.cpu_parent
    while e is not None:
        if e.name.startswith(LABEL):
            phase, site = e.name[len(LABEL):].split("::", 1)
            return phase, site
        e = e.cpu_parent
    return "other", "-"


def launches(event) -> bool:
    """Whether an op counts as a kernel launch: an aten op that works itself (not TRANSPARENT), outside every other
    such op (what an op calls internally, a CPU reduction's output fill or a scalar's conversion, is part of it; a
    foreach op is one, on a GPU one to a few multi-tensor kernels)."""
    if not event.name.startswith("aten::") or event.name in TRANSPARENT:
        return False
    e = event.cpu_parent
    while e is not None:
        if e.name.startswith("aten::") and e.name not in TRANSPARENT:
            return False
        e = e.cpu_parent
    return True


def count_ops(prof) -> dict:
    """Counters of one profiled step: launch-like ops per phase, per (phase, site), per op name and per (phase, op
    name); host syncs per phase."""
    phases, sites, names, syncs, by_phase = Counter(), Counter(), Counter(), Counter(), Counter()
    for e in prof.events():
        if e.name in SYNCS:
            syncs[site_of(e)[0]] += 1
        if not launches(e):
            continue
        phase, site = site_of(e)
        phases[phase] += 1
        sites[phase, site] += 1
        names[e.name] += 1
        by_phase[phase, e.name] += 1
    return {"phases": phases, "sites": sites, "names": names, "syncs": syncs, "by_phase": by_phase}


def profile_step(step) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return count_ops(prof)


# -- report ---------------------------------------------------------------------------------------------------------
def phase_table(ours: dict, ref: dict) -> str:
    rows = ["| phase | ours ops | reference ops | ours - ref | ours host syncs | ref host syncs |",
            "|---|---|---|---|---|---|"]
    for p in PHASES:
        a, b = ours["phases"].get(p, 0), ref["phases"].get(p, 0)
        if a or b or ours["syncs"].get(p) or ref["syncs"].get(p):
            rows.append(f"| {p} | {a} | {b} | {a - b:+d} | {ours['syncs'].get(p, 0)} | {ref['syncs'].get(p, 0)} |")
    ta, tb = sum(ours["phases"].values()), sum(ref["phases"].values())
    rows.append(f"| **total** | **{ta}** | **{tb}** | {ta - tb:+d} ({ta / max(tb, 1):.2f}x) | "
                f"{sum(ours['syncs'].values())} | {sum(ref['syncs'].values())} |")
    return "\n".join(rows)


def site_table(counts: dict, top: int) -> str:
    rows = ["| phase | site (innermost labelled function) | ops |", "|---|---|---|"]
    for (phase, site), n in counts["sites"].most_common(top):
        rows.append(f"| {phase} | {site} | {n} |")
    return "\n".join(rows)


def name_table(ours: dict, ref: dict, top: int, phase: str | None = None) -> str:
    """The op names whose counts differ the most (in one phase, or in the whole step)."""
    def get(counts: dict, name: str) -> int:
        return counts["names"].get(name, 0) if phase is None else counts["by_phase"].get((phase, name), 0)

    rows = ["| op | ours | reference | ours - ref |", "|---|---|---|---|"]
    keys = {k if phase is None else k[1] for c in (ours, ref) for k in c["names" if phase is None else "by_phase"]
            if phase is None or k[0] == phase}
    for k in sorted(keys, key=lambda k: (-abs(get(ours, k) - get(ref, k)), k))[:top]:
        a, b = get(ours, k), get(ref, k)
        rows.append(f"| {k} | {a} | {b} | {a - b:+d} |")
    return "\n".join(rows)


def time_steps(ours, ref, n: int) -> dict:
    """{name: (wall seconds of each step, mean seconds per phase)} over `n` steps of each, alternating."""
    out = {"ours": ([], Counter()), "reference": ([], Counter())}
    for _ in range(n):
        for name, step in (("ours", ours), ("reference", ref)):
            CLOCK.times.clear()
            t0 = time.perf_counter()
            step()
            wall = time.perf_counter() - t0
            walls, phases = out[name]
            walls.append(wall)
            phases.update({**CLOCK.times, "other": wall - sum(CLOCK.times.values())})
    return {k: (walls, {p: t / n for p, t in phases.items()}) for k, (walls, phases) in out.items()}


def time_table(timed: dict) -> str:
    (ow, op), (rw, rp) = timed["ours"], timed["reference"]
    rows = ["| phase | ours ms | reference ms | ours - ref |", "|---|---|---|---|"]
    for p in PHASES:
        a, b = 1e3 * op.get(p, 0.0), 1e3 * rp.get(p, 0.0)
        if a or b:
            rows.append(f"| {p} | {a:.1f} | {b:.1f} | {a - b:+.1f} |")
    a, b = 1e3 * float(np.median(ow)), 1e3 * float(np.median(rw))
    rows.append(f"| **median step** | **{a:.1f}** | **{b:.1f}** | {a - b:+.1f} ({a / b:.2f}x) |")
    return f"\nwall time per step ({len(ow)} steps each, phases: the mean):\n\n" + "\n".join(rows)


def model_path(quick: bool, narrow: bool, layers: int | None) -> str:
    from rl.models import build_random_model, cache_root, resolve_model_path

    if quick:
        return resolve_model_path("embedded:tiny-dense")
    spec = dict(SMOLLM2_SHAPE, num_hidden_layers=layers or SMOLLM2_SHAPE["num_hidden_layers"],
                **(NARROW if narrow else {}))
    out = cache_root() / f"sft-op-count-smollm2-shape-{spec['num_hidden_layers']}l{'-narrow' if narrow else ''}"
    if not (out / "config.json").exists():
        build_random_model(out, spec)
    return str(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the embedded tiny-dense model instead of SmolLM2's shape")
    ap.add_argument("--narrow", action="store_true", help="SmolLM2's layers and parameter tensors, hidden size 72 "
                    "and a 4096 vocabulary: with --time, a step's wall time is mostly the CPU's overhead")
    ap.add_argument("--layers", type=int, help="SmolLM2's shape with this many layers (default its 30)")
    ap.add_argument("--time", type=int, default=0, help="also time this many steps of each (alternating, no profiler): "
                    "median wall seconds per step and the mean per phase")
    ap.add_argument("--samples", type=int, default=10, help="conversations in the step (one mini-batch)")
    ap.add_argument("--lengths", type=int, nargs=4, default=[30, 60, 60, 200],
                    metavar=("P_MIN", "P_MAX", "R_MIN", "R_MAX"),
                    help="prompt and answer token ranges of the synthetic conversations")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steadier timings on a shared CPU)")
    ap.add_argument("--tokens", type=int, default=512, help="trainer.micro_batch_tokens: packed tokens per micro-batch")
    ap.add_argument("--dtype", default="float32", help="model.dtype (bfloat16: DeepSpeed's bf16 path, slow on CPU)")
    ap.add_argument("--override", nargs="*", default=[],
                    help="more config overrides for ours, e.g. trainer.zero_stage=0")
    ap.add_argument("--top", type=int, default=20, help="rows of the per-site and per-op tables")
    ap.add_argument("--phase", nargs="*", default=[], choices=PHASES, help="also the op names of these phases")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    from transformers import AutoConfig

    from trainer.dist import open_store

    path = model_path(args.quick, args.narrow, args.layers)
    trajs = conversations(args.samples, AutoConfig.from_pretrained(path).vocab_size, tuple(args.lengths))
    cfg = build_cfg(path, args.samples, args.tokens, args.dtype, args.override)
    store = open_store()
    ours, tr = ours_step(cfg, path, trajs, store.port)
    plan = tr._auto_micro_batches([trajs], "packed")  # the same micro-batches for the reference
    norm_tokens = int(sum(t.loss_mask_or_ones().sum() for t in trajs))
    ref, _ = reference_step(path, plan, norm_tokens, cfg, args.dtype)
    print(f"model {path}: {sum(t.num_tokens for t in trajs)} tokens in {args.samples} conversations, "
          f"{len(plan[0])} micro-batches of <= {args.tokens} tokens, {args.dtype}, zero_stage "
          f"{cfg['trainer']['zero_stage']}, overrides {args.override or '-'}", flush=True)
    ours(), ref()  # warm-up: the optimizer's state, lazy initialisation
    if args.time:
        print(time_table(time_steps(ours, ref, args.time)))
    counts_ours = profile_step(ours)
    counts_ref = profile_step(ref)
    print("\nlaunch-like ops per step (aten ops that would launch a kernel on a GPU, see the docstring):\n")
    print(phase_table(counts_ours, counts_ref))
    print("\nours, by site:\n")
    print(site_table(counts_ours, args.top))
    print("\nreference, by site:\n")
    print(site_table(counts_ref, args.top))
    print("\nops whose counts differ the most:\n")
    print(name_table(counts_ours, counts_ref, args.top))
    for phase in args.phase:
        print(f"\nops of phase {phase!r} whose counts differ the most:\n")
        print(name_table(counts_ours, counts_ref, args.top, phase))


if __name__ == "__main__":
    main()
