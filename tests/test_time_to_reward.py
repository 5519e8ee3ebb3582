"""benchmarks/time_to_reward.py: the clock from the command to a held-out pass@1 target, ours and TRL, each run
watched from outside and stopped at its first evaluation at or above the target."""

import json
import signal
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
def test_our_run_is_timed_to_its_first_evaluation_and_stopped(tmp_path):
    """On the CPU: ours on the embedded default (its math domain evaluated every 2 steps), target 0: reached at
    step 2 and stopped before its 6 steps were done, even started from a process that ignores SIGINT (as a batch
    script's background job does: the run must not inherit that and carry on to its last step)."""
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        r = time_to_reward.time_to_reward("ours", tmp_path, 0.0, 2, 6, 600, [], experiment="mixed_rl")
    finally:
        signal.signal(signal.SIGINT, ignored)
    assert r["reached"] and r["step"] == 2 and 0 < r["seconds"] < 600, (r, _log_tail(tmp_path, "ours"))
    assert r["evaluations"][0][:2] == [2, r["best_pass@1"]]
    rows = [json.loads(x) for x in (tmp_path / "ours" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows) < 6  # stopped at the target, not run to the end


@pytest.mark.slow
def test_the_trl_run_is_timed_to_its_own_held_out_evaluation(tmp_path, tiny_dense_path):
    """TRL's CPU smoke wiring (learn_real.py --trl-child --smoke --eval-every 2) on the tiny dense model, target 0:
    its own eval on held-out prompts is read and stops the clock at step 2. TRL is a benchmark's peer, not one of
    the project's dependencies: skipped where it is not installed (CI)."""
    pytest.importorskip("trl")
    r = time_to_reward.time_to_reward("trl", tmp_path, 0.0, 2, 6, 600,
                                      ["--smoke", "--model-path", tiny_dense_path, "--eval-prompts", "4"])
    assert r["reached"] and r["step"] == 2 and 0 < r["seconds"] < 600, (r, _log_tail(tmp_path, "trl"))
    assert r["evaluations"][0][:2] == [2, r["best_pass@1"]]
    steps = [json.loads(x) for x in (tmp_path / "trl" / "steps.jsonl").read_text().splitlines()]
    assert any("eval_reward" in r for r in steps)


def _log_tail(out: Path, run: str) -> str:
    log = out / f"{run}.log"
    return log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"


def test_train_stats_give_the_pace_and_the_mismatch_range(tmp_path):
    run = tmp_path / "ours_bitwise"
    run.mkdir()
    rows = [{"step": 1, "time/step": 40.0, "mismatch/logprob_abs": 0.0},  # the first step (start-up) is left out
            {"step": 2, "time/step": 2.0, "mismatch/logprob_abs": 0.0},
            {"step": 3, "time/step": 3.0, "mismatch/logprob_abs": 0.0},
            {"step": 3, "eval/math/pass@1": 0.2},  # an evaluation row: no time/step
            {"step": 4, "time/step": 2.5, "mismatch/logprob_abs": 0.01}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5, "time')
    stats = time_to_reward.train_stats("ours_bitwise", run)
    assert stats == {"s_per_step": 2.5, "first_step_s": 40.0, "mismatch_max": 0.01, "mismatch_min": 0.0, "steps": 4}
    assert time_to_reward.train_stats("trl", run)["s_per_step"] is None  # TRL's steps.jsonl: none here
    assert "algorithm.on_policy=bitwise" in time_to_reward.command("ours_bitwise", run, 5, 20, [])


def test_trl_pace_comes_from_its_step_seconds(tmp_path):
    """learn_real.py's TRL child logs {"seconds", "step", "reward"} per step and {"step", "eval_reward"} per
    evaluation; the pace is the median of the steps after the first, in step order."""
    run = tmp_path / "trl"
    run.mkdir()
    rows = [{"seconds": 50.7, "step": 1, "reward": 0.02}, {"seconds": 3.9, "step": 2, "reward": 0.03},
            {"step": 2, "eval_reward": 0.07}, {"seconds": 3.7, "step": 3, "reward": 0.06},
            {"seconds": 4.4, "step": 4, "reward": 0.05}]
    (run / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert time_to_reward.step_seconds("trl", run) == [50.7, 3.9, 3.7, 4.4]
    stats = time_to_reward.train_stats("trl", run)
    assert (stats["s_per_step"], stats["first_step_s"], stats["steps"]) == (3.9, 50.7, 4)


def test_a_verl_run_is_timed_to_verls_own_validation(tmp_path):
    """verl's file logger ({"step", "data"}) gives pass@1 as `val-core/<source>/acc/mean@4` on the steps it
    validated (verl 0.9.1's reward loop files a float score as `acc`, which becomes the core metric; `reward` is
    then under val-aux); the run is verl_peer.py on the smol benchmark, validating every N steps, in this script's
    folder."""
    run = tmp_path / "verl_best"
    run.mkdir()
    rows = [{"step": 1, "data": {"timing_s/step": 30.0, "critic/score/mean": 0.1}},
            {"step": 5, "data": {"timing_s/step": 3.0, "val-core/mixrl/bundled_math/acc/mean@4": 0.25,
                                 "val-aux/mixrl/bundled_math/reward/mean@4": 0.25,
                                 "val-aux/mixrl/bundled_math/acc/std@4": 0.4}},
            {"step": 10, "data": {"val-core/mixrl/bundled_math/reward/mean@4": 0.5}},  # a score without `acc`
            {"step": 6, "data": {"timing_s/step": 3.1}}]
    (run / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 15, "da')
    assert time_to_reward.evaluations("verl_best", run) == [(5, 0.25), (10, 0.5)]
    # verl's own step seconds: step 1 apart, the median of the rest (the partial last line skipped)
    stats = time_to_reward.train_stats("verl_best", run)
    assert (stats["s_per_step"], stats["first_step_s"], stats["steps"]) == (3.1, 30.0, 3)
    assert stats["mismatch_max"] is None
    cmd = time_to_reward.command("verl_best", run, 5, 60, [])
    assert cmd[1].endswith("verl_peer.py")
    args = dict(zip(cmd[2::2], cmd[3::2]))
    assert args["--out"] == str(tmp_path) and args["--name"] == "verl_best" and args["--bench"] == "smol"
    assert args["--setting"] == "best" and args["--eval-every"] == "5" and args["--steps"] == "60"
    defaults = time_to_reward.command("verl", run, 5, 60, [])
    assert dict(zip(defaults[2::2], defaults[3::2]))["--setting"] == "defaults"


def test_the_overlap_run_is_a_config_the_run_accepts(tmp_path):
    """ours_overlap: smol_math with vLLM awake on the trainer's GPU and the next rollout generating meanwhile."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from launch.config import check_config

    cmd = time_to_reward.command("ours_overlap", tmp_path / "ours_overlap", 5, 20, [])
    overrides = [a for a in cmd[cmd.index("launch.train") + 1:] if not a.startswith("run_dir=")]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name="train", overrides=[*overrides, "model.path=/nonexistent"]),
                                     resolve=True)
    assert cfg["rollout"]["max_staleness"] == 1 and cfg["rollout"]["enable_sleep_mode"] is False
    assert cfg["rollout"]["placement"] == "colocated"
    check_config(cfg)


def test_a_run_that_fails_before_any_evaluation_says_why(tmp_path, capsys):
    """A run that ends at once (here a misspelled engine) is reported as not reached, with its exit code, and the
    end of its log is printed with the result rather than left in a file on the machine that ran it."""
    r = time_to_reward.time_to_reward("ours", tmp_path, 0.3, 2, 6, 300, ["rollout.engine=vlm"],
                                      experiment="mixed_rl")
    assert not r["reached"] and r["exit_code"] == 2 and r["evaluations"] == []
    printed = capsys.readouterr().out
    assert "exited 2 before any evaluation" in printed and "rollout.engine" in printed, printed
