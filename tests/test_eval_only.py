"""`eval.only=true` (verl's trainer.val_only): the held-out evaluation of the weights a run starts from, then stop.
With `trainer.resume=auto` those are the checkpoint's weights."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_eval_only_is_refused_for_sft_and_checked():
    from launch.config import check_config, compose
    from rl.config import ConfigError

    check_config(compose(["+experiment=mixed_rl", "eval.only=true"]))
    with pytest.raises(ConfigError, match=r"eval\.only=true evaluates a policy .* SFT run"):
        check_config(compose(["+experiment=sft", "eval.only=true"]))
    with pytest.raises(ConfigError, match=r"eval\.only"):
        check_config(compose(["+experiment=mixed_rl", "eval.only=maybe"]))


def _train(run_dir: Path, *overrides: str) -> list[dict]:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "launch.train", "+experiment=mixed_rl", f"run_dir={run_dir}",
                           "logger.progress_bar=false", "eval.max_prompts=2", "eval.n_samples=3", "ray.num_cpus=3",
                           *overrides], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_eval_only_scores_the_resumed_checkpoint_and_trains_nothing(tmp_path):
    run_dir = tmp_path / "run"
    trained = _train(run_dir, "trainer.total_steps=2", "trainer.save_every=1", "trainer.keep_checkpoints=2")
    assert [r["step"] for r in trained] == [1, 2] and (run_dir / "checkpoints" / "step_000001" / "COMPLETE").exists()
    older = run_dir / "checkpoints" / "step_000001"
    rows = _train(run_dir, "trainer.total_steps=5", f"trainer.resume={older}", "eval.only=true")
    # the training rows stay (a resumed training run would redo step 2; this one will not), then the evaluation of
    # step 1's checkpoint
    assert [r["step"] for r in rows] == [1, 2, 1]
    ev = rows[-1]
    assert ev["eval/k"] == 3 and ev["eval/math/prompts"] == 2 and 0 <= ev["eval/math/pass@1"] <= 1
    assert not any(k.startswith(("loss/", "time/train", "reward/")) for k in ev), sorted(ev)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.is_dir()) == ["step_000001", "step_000002"]
    assert (run_dir / "rollouts" / "eval_only_step_000001.jsonl").exists()  # beside the run's own, not over them


@pytest.mark.slow
def test_eval_only_of_the_model_path_starts_no_trainer(tmp_path):
    """Nothing to resume: the rollout workers load model.path themselves, so no trainer rank (nor its DeepSpeed state,
    nor the reference) starts; the one row is the evaluation of step 0."""
    run_dir = tmp_path / "run"
    rows = _train(run_dir, "eval.only=true")
    assert [r["step"] for r in rows] == [0]
    assert rows[0]["eval/k"] == 3 and 0 <= rows[0]["eval/math/pass@1"] <= 1
    started = json.loads((run_dir / "summary.json").read_text())["start_up"]
    assert "rollout0" in started or "rollout" in started, started
    assert not any(name.startswith(("trainer", "reference")) for name in started), started
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())
