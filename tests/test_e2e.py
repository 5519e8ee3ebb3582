"""End-to-end runs of the real entry point (`python -m launch.train`) on the embedded CPU default.

Marked slow: `pytest -m "not gpu"` (the README's test command, and CI) runs them; plain `pytest` skips them.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl.metrics import TERMINATIONS

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = [
    "step", "reward/mean", "response_length/mean", "loss/pg", "clip_frac", "entropy/kept_set", "entropy/full_vocab", "time/rollout",
    "time/reward", "time/ref", "time/train", "time/sync", "throughput/tokens_per_s", "opsm/masked_frac",
    "mismatch/logprob_abs", "throughput/train_tokens_per_s", "perf/train_tflops_per_gpu",
]


def launch(run_dir: Path, *overrides: str, timeout: int = 900, outputs: dict | None = None) -> list[dict]:
    """Run `python -m launch.train`; returns metrics.jsonl's rows (`outputs` gets the process's stdout/stderr)."""
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "launch.train", f"run_dir={run_dir}", "logger.progress_bar=false", *overrides],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )
    if proc.returncode != 0:  # pytest.fail prints the whole message (an assert's repr is cut to a few lines)
        log = run_dir / "train.log"  # the workers' output: why an actor died is there, not in the driver's stderr
        worker = log.read_text(errors="replace").splitlines()[-80:] if log.exists() else ["(no train.log)"]
        pytest.fail(f"launch.train exited {proc.returncode}\n--- stderr (last 60 lines) ---\n"
                    + "\n".join(proc.stderr.splitlines()[-60:]) + "\n--- train.log (last 80 lines) ---\n"
                    + "\n".join(worker), pytrace=False)
    if outputs is not None:
        outputs.update(stdout=proc.stdout, stderr=proc.stderr)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def rollouts(run_dir: Path, step: int) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "rollouts" / f"step_{step:06d}.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_mixed_rl_embedded_default(quick_start_run):
    """The README's quick start as written (tests/conftest.py runs it once for the session)."""
    rows, out, run = quick_start_run.rows, vars(quick_start_run), quick_start_run.run_dir
    assert [r["step"] for r in rows] == list(range(1, 13))
    for r in rows:
        assert "perf/mfu" not in r  # CPU: no peak to compare with
        for key in REQUIRED:
            assert key in r, key
        for d in ("math", "code", "logic", "general", "agent"):  # every domain's keys every step (null without samples)
            assert f"reward/{d}/mean" in r and f"kl/{d}" in r and f"samples/{d}" in r
            assert (r[f"reward/{d}/mean"] is None) == (r[f"samples/{d}"] == 0)
        if r["samples/agent"]:  # multi-turn episodes against the smoke environment
            assert r["episode/agent/turns"] >= 1 and r["episode/agent/tool_tokens"] > 0 and "time/tools" in r
            assert abs(sum(r[f"episode/agent/termination/{x}"] for x in TERMINATIONS) - 1) < 1e-9
            assert r["episode/agent/success"] is not None
        else:
            assert r["episode/agent/turns"] is None and r["episode/agent/success"] is None and r["time/tools"] is None
        assert (r["opsm/agent/masked_frac"] is None) == (r["samples/agent"] == 0)
        # the rank's own time in the update, inside the driver's (which adds sending the samples, the results back)
        assert 0 < r["time/train_rank"] <= r["time/train"]
    # held-out eval every 6 steps on math and logic (rl/bundled/eval/)
    for r in rows:
        evaluated = r["step"] in (6, 12)
        assert ("eval/math/pass@k" in r and "eval/logic/mean@k" in r) == evaluated
        assert (r.get("eval/math/prompts") == 8.0) == evaluated
    # the end: a summary, the outputs; workers log to train.log, not through the console
    assert "done: 12 steps" in out["stdout"] and "  math: " in out["stdout"] and str(run / "metrics.jsonl") in out["stdout"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 12 and set(summary["reward"]) == {"all", "math", "code", "logic", "general", "agent"}
    # the start-up timeline (launch/startup.py): every actor of the run, in time order, ending with the first step
    marks = summary["start_up"]
    assert {"model", "data", "ray", "rollout", "reward", "trainer", "reference", "judge", "first_step"} <= set(marks)
    assert list(marks.values()) == sorted(marks.values()) and list(marks)[-1] == "first_step"
    assert marks["model"] < marks["ray"] < min(marks["trainer"], marks["rollout"]) <= marks["first_step"]
    log_text = (run / "train.log").read_text()
    assert "worker pid" in log_text and "scored 0 with a reason" in log_text
    assert "scored 0 with a reason" not in out["stdout"] + out["stderr"]
    assert (run / "rollouts" / "eval_step_000012.jsonl").exists() and (run / "config.yaml").exists()
    # math has kl_coef 0 (no reference for it); the others have a KL estimate
    assert all(r["kl/math"] is None for r in rows)
    assert any(r.get("kl/logic") is not None for r in rows)
    # the HF checkpoint at the end is a loadable model
    from transformers import AutoModelForCausalLM

    final = run / "checkpoints" / "step_000012"
    assert (final / "COMPLETE").exists()
    AutoModelForCausalLM.from_pretrained(final / "hf")


@pytest.mark.slow
def test_smoke_learn_raises_reward(tmp_path):
    rows = launch(tmp_path / "run", "+experiment=smoke_learn", "trainer.peak_tflops=0.5")
    for r in rows:  # MFU against the given peak (on CPU, auto gives none)
        assert r["perf/mfu"] == pytest.approx(r["perf/train_tflops_per_gpu"] / 0.5) and 0 < r["perf/mfu"] < 1
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
    run_id = (tmp_path / "b" / "wandb_run_id").read_text()
    resumed = launch(tmp_path / "b", *common, "trainer.total_steps=4", "trainer.resume=auto")
    # the resumed run continues the same W&B run (offline runs are named ...-<run id>)
    assert (tmp_path / "b" / "wandb_run_id").read_text() == run_id
    assert len(list((tmp_path / "b" / "wandb").glob(f"offline-run-*-{run_id}"))) == 2
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for step in (3, 4):
        a, b = rollouts(tmp_path / "a", step), rollouts(tmp_path / "b", step)
        assert [x["prompt"] for x in a] == [x["prompt"] for x in b]  # same data order
        assert [x["response"] for x in a] == [x["response"] for x in b]  # same weights, same sampling RNG
    assert abs(straight[3]["reward/mean"] - resumed[3]["reward/mean"]) < 1e-6


@pytest.mark.slow
def test_two_ranks_compute_the_same_update_as_one(tmp_path):
    """Data parallel over 2 gloo ranks (ZeRO-3, and ZeRO-2) must give the same loss and gradient norm as 1 rank: the
    loss is normalised by the whole mini-batch and scaled back up by the world size that DeepSpeed averages over."""
    common = ["+experiment=smoke_learn", "trainer.total_steps=1", "trainer.mini_batches=2", "trainer.micro_batch_size=4"]
    one = launch(tmp_path / "one", *common)[0]
    two = launch(tmp_path / "two", *common, "trainer.num_processes=2", "trainer.zero_stage=3")[0]
    assert one["reward/mean"] == two["reward/mean"]  # same samples (same weights, same seeds)
    assert abs(one["loss/pg"] - two["loss/pg"]) < 1e-5
    assert abs(one["grad_norm"] - two["grad_norm"]) < 1e-4 * max(one["grad_norm"], 1e-8)
    state = tmp_path / "two" / "checkpoints" / "step_000001" / "deepspeed" / "state"
    assert (state / "rng_rank0.pt").exists() and (state / "rng_rank1.pt").exists()  # every rank's RNG is kept
    # trainer.micro_batch_size=auto over the same 2 ranks: the count is agreed across ranks (8 samples per
    # micro-batch on CPU), each rank marks DeepSpeed's accumulation boundary itself, and the update is the same
    auto = launch(tmp_path / "auto", *common[:-1], "trainer.micro_batch_size=auto", "trainer.num_processes=2",
                  "trainer.zero_stage=3")[0]
    assert abs(one["loss/pg"] - auto["loss/pg"]) < 1e-5 and auto["perf/micro_batches"] >= 1
    assert abs(one["grad_norm"] - auto["grad_norm"]) < 1e-4 * max(one["grad_norm"], 1e-8)
    # ZeRO-2 over 2 ranks reduces each mini-batch's gradients once, as the mini-batch ends (coalesced): same update
    two2 = launch(tmp_path / "two2", *common, "trainer.num_processes=2", "trainer.zero_stage=2")[0]
    assert abs(one["loss/pg"] - two2["loss/pg"]) < 1e-5
    assert abs(one["grad_norm"] - two2["grad_norm"]) < 1e-4 * max(one["grad_norm"], 1e-8)


@pytest.mark.slow
def test_rollout_overlaps_training_with_a_staleness_bound(tmp_path):
    """rollout.max_staleness=1: the rollout of step n+1 runs while step n trains, on weights one update old; the
    samples of step 1 are the same as in a synchronous run (same weights, same seeds), later ones are not."""
    common = ["+experiment=smoke_learn", "trainer.total_steps=3", "rollout.max_new_tokens=6"]
    sync = launch(tmp_path / "sync", *common)
    overlap = launch(tmp_path / "overlap", *common, "rollout.max_staleness=1")
    assert [r["rollout/staleness"] for r in sync] == [0.0, 0.0, 0.0]
    assert [r["rollout/staleness"] for r in overlap] == [0.0, 1.0, 1.0]
    # the sync waits for the next rollout (not after the last step); the rollout's own time gives its tokens/s,
    # and from step 2 it ran while the step before trained, so the loop's rollout phase only collects it
    assert ["time/rollout_wait" in r for r in overlap] == [True, True, False]
    assert not any("time/rollout_wait" in r for r in sync)
    for r in sync + overlap:
        generated = r["throughput/tokens_per_s"] * r["time/step"]
        assert r["throughput/rollout_tokens_per_s"] * r["time/generate"] == pytest.approx(generated)
    assert all(r["time/generate"] > r["time/rollout"] for r in overlap[1:])
    assert [x["response"] for x in rollouts(tmp_path / "sync", 1)] == [x["response"] for x in rollouts(tmp_path / "overlap", 1)]
    assert [x["prompt"] for x in rollouts(tmp_path / "sync", 3)] == [x["prompt"] for x in rollouts(tmp_path / "overlap", 3)]


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path):
    common = ["+experiment=smoke_learn", "trainer.save_every=2", "rollout.max_new_tokens=6", "trainer.keep_checkpoints=0"]
    launch(tmp_path / "run", *common, "trainer.total_steps=4")
    optim = next((tmp_path / "run" / "checkpoints" / "step_000004" / "deepspeed").rglob("*optim_states.pt"))
    optim.write_bytes(optim.read_bytes()[: optim.stat().st_size // 2])  # truncated, as by a crash or a full disk
    out: dict = {}
    rows = launch(tmp_path / "run", *common, "trainer.total_steps=5", "trainer.resume=auto", outputs=out)
    console = out["stdout"] + out["stderr"]
    assert "skipping checkpoint step_000004" in console and optim.name in console
    assert "resumed from" in (tmp_path / "run" / "train.log").read_text()
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # steps 3-4 redone from step 2's checkpoint


@pytest.mark.slow
def test_greedy_groups_are_reported(tmp_path):
    out: dict = {}
    rows = launch(tmp_path / "run", "+experiment=smoke_learn", "trainer.total_steps=2", "rollout.temperature=0",
                  "rollout.max_new_tokens=4", outputs=out)
    assert all(r["advantage/zero_variance_group_frac"] == 1.0 and r["loss/pg"] == 0.0 for r in rows)
    console = out["stdout"] + out["stderr"]
    assert console.count("rollout.temperature=0 (greedy)") == 1  # at start
    assert console.count("this step learned nothing") == 1  # once, not every step
