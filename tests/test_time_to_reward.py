"""benchmarks/time_to_reward.py: the clock from the command to a held-out pass@1 target, ours and TRL, each run
watched from outside and stopped at its first evaluation at or above the target."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import time_to_reward  # noqa: E402


def test_the_first_evaluation_at_or_above_the_target_stops_the_clock():
    evals = [(5, 0.10, 61.0), (10, 0.30, 95.5), (15, 0.45, 130.2)]
    assert time_to_reward.first_reaching(evals, 0.3) == (10, 0.30, 95.5)
    assert time_to_reward.first_reaching(evals, 0.5) is None
    assert time_to_reward.first_reaching([], 0.0) is None


def test_evaluations_are_read_from_each_runs_own_file(tmp_path):
    ours, trl = tmp_path / "ours", tmp_path / "trl"
    ours.mkdir(), trl.mkdir()
    assert time_to_reward.evaluations("ours", ours) == []  # nothing written yet
    (ours / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.1}) + "\n"
                                        + json.dumps({"step": 2, "eval/math/pass@1": 0.25}) + "\n"
                                        + '{"step": 3, "eval/ma')  # a line being written
    (trl / "steps.jsonl").write_text(json.dumps({"step": 1, "reward": 0.2}) + "\n"
                                     + json.dumps({"step": 2, "eval_reward": 0.5, "wall": 1.0}) + "\n")
    assert time_to_reward.evaluations("ours", ours) == [(2, 0.25)]
    assert time_to_reward.evaluations("trl", trl) == [(2, 0.5)]


@pytest.mark.slow
def test_both_runs_are_timed_to_their_first_evaluation_and_stopped(tmp_path, tiny_dense_path):
    """On the CPU: ours on the embedded default (its math domain evaluated every 2 steps) and TRL's CPU smoke
    wiring on the tiny dense model, target 0: each reached at step 2 and stopped before its 6 steps were done."""
    ours = time_to_reward.time_to_reward("ours", tmp_path, 0.0, 2, 6, 600, [], experiment="mixed_rl")
    trl = time_to_reward.time_to_reward("trl", tmp_path, 0.0, 2, 6, 600,
                                        ["--smoke", "--model-path", tiny_dense_path, "--eval-prompts", "4"])
    for r in (ours, trl):
        assert r["reached"] and r["step"] == 2 and 0 < r["seconds"] < 600, r
        assert r["evaluations"][0][:2] == [2, r["best_pass@1"]]
    rows = [json.loads(x) for x in (tmp_path / "ours" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) < 6  # stopped at the target, not run to the end
    steps = [json.loads(x) for x in (tmp_path / "trl" / "steps.jsonl").read_text().splitlines()]
    assert any("eval_reward" in r for r in steps)
