"""End-to-end runs of the real entry point (`python -m launch.train`) on the embedded CPU default.

Marked slow: `pytest -m "not gpu"` (the README's test command, and CI) runs them; plain `pytest` skips them.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = [
    "step", "reward/mean", "response_length/mean", "loss/pg", "clip_frac", "entropy", "time/rollout",
    "time/reward", "time/ref", "time/train", "time/sync", "throughput/tokens_per_s", "opsm/masked_frac",
    "mismatch/logprob_abs",
]


def launch(run_dir: Path, *overrides: str, timeout: int = 900) -> list[dict]:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "launch.train", f"run_dir={run_dir}", "logger.progress_bar=false", *overrides],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-6000:])
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def rollouts(run_dir: Path, step: int) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "rollouts" / f"step_{step:06d}.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_mixed_rl_embedded_default(tmp_path):
    rows = launch(tmp_path / "run", "+experiment=mixed_rl")
    assert [r["step"] for r in rows] == list(range(1, 13))
    for r in rows:
        for key in REQUIRED:
            assert key in r, key
        for d in ("math", "code", "logic", "general"):
            if r.get(f"samples/{d}"):
                assert f"reward/{d}/mean" in r and f"kl/{d}" in r
    # math has kl_coef 0 (no reference for it); the others have a KL estimate
    assert all(r["kl/math"] is None for r in rows)
    assert any(r.get("kl/logic") is not None for r in rows)
    # the HF checkpoint at the end is a loadable model
    from transformers import AutoModelForCausalLM

    final = tmp_path / "run" / "checkpoints" / "step_000012"
    assert (final / "COMPLETE").exists()
    AutoModelForCausalLM.from_pretrained(final / "hf")


@pytest.mark.slow
def test_smoke_learn_raises_reward(tmp_path):
    rows = launch(tmp_path / "run", "+experiment=smoke_learn")
    first = sum(r["reward/mean"] for r in rows[:5]) / 5
    last = sum(r["reward/mean"] for r in rows[-5:]) / 5
    print(f"smoke_learn reward: first 5 steps {first:.3f}, last 5 steps {last:.3f}")
    assert last > first + 0.1
    assert all(r["time/ref"] == 0.0 and r["kl/digits"] is None for r in rows)  # kl_coef 0: no reference run


@pytest.mark.slow
def test_resume_continues_at_next_step_with_same_data(tmp_path):
    common = ["+experiment=smoke_learn", "trainer.save_every=2", "rollout.max_new_tokens=6"]
    straight = launch(tmp_path / "a", *common, "trainer.total_steps=4")
    launch(tmp_path / "b", *common, "trainer.total_steps=2")
    resumed = launch(tmp_path / "b", *common, "trainer.total_steps=4", "trainer.resume=auto")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for step in (3, 4):
        a, b = rollouts(tmp_path / "a", step), rollouts(tmp_path / "b", step)
        assert [x["prompt"] for x in a] == [x["prompt"] for x in b]  # same data order
        assert [x["response"] for x in a] == [x["response"] for x in b]  # same weights, same sampling RNG
    assert abs(straight[3]["reward/mean"] - resumed[3]["reward/mean"]) < 1e-6


@pytest.mark.slow
def test_two_zero3_ranks_compute_the_same_update_as_one(tmp_path):
    """Data parallel over 2 gloo ranks (ZeRO-3) must give the same loss and gradient norm as 1 rank: the loss is
    normalised by the whole mini-batch and scaled back up by the world size that DeepSpeed averages over."""
    common = ["+experiment=smoke_learn", "trainer.total_steps=1", "trainer.mini_batches=2", "trainer.micro_batch_size=4"]
    one = launch(tmp_path / "one", *common)[0]
    two = launch(tmp_path / "two", *common, "trainer.num_processes=2", "trainer.zero_stage=3")[0]
    assert one["reward/mean"] == two["reward/mean"]  # same samples (same weights, same seeds)
    assert abs(one["loss/pg"] - two["loss/pg"]) < 1e-5
    assert abs(one["grad_norm"] - two["grad_norm"]) < 1e-4 * max(one["grad_norm"], 1e-8)


@pytest.mark.slow
def test_rollout_overlaps_training_with_a_staleness_bound(tmp_path):
    """rollout.max_staleness=1: the rollout of step n+1 runs while step n trains, on weights one update old; the
    samples of step 1 are the same as in a synchronous run (same weights, same seeds), later ones are not."""
    common = ["+experiment=smoke_learn", "trainer.total_steps=3", "rollout.max_new_tokens=6"]
    sync = launch(tmp_path / "sync", *common)
    overlap = launch(tmp_path / "overlap", *common, "rollout.max_staleness=1")
    assert [r["rollout/staleness"] for r in sync] == [0.0, 0.0, 0.0]
    assert [r["rollout/staleness"] for r in overlap] == [0.0, 1.0, 1.0]
    assert [x["response"] for x in rollouts(tmp_path / "sync", 1)] == [x["response"] for x in rollouts(tmp_path / "overlap", 1)]
    assert [x["prompt"] for x in rollouts(tmp_path / "sync", 3)] == [x["prompt"] for x in rollouts(tmp_path / "overlap", 3)]
