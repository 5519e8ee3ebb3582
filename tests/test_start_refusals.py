"""A run refused at start (issue 33, item 9): a misspelled override is one line and exit code 2, like every other
config mistake, and a refused run leaves no run_dir behind unless the run_dir held something before."""

import os
import subprocess
import sys
from pathlib import Path

from launch.run_dir import RunDirLock
from launch.train import is_fresh_run_dir, override_error, remove_refused_run_dir

ROOT = Path(__file__).resolve().parents[1]


def _train(*overrides, timeout=300):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "WANDB_MODE": "offline"}
    return subprocess.run([sys.executable, "-m", "launch.train", "+experiment=mixed_rl", "logger.mode=disabled",
                           *overrides], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def test_a_misspelled_override_is_one_line_and_exit_code_2(tmp_path):
    run_dir = tmp_path / "run"
    proc = _train("trainer.total_stepz=3", f"run_dir={run_dir}")
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert lines == ["config error: trainer.total_stepz: unknown key (a misspelling? to add a key that no config "
                     "file defines, write +trainer.total_stepz=3)"]
    assert not run_dir.exists()


def test_override_errors_name_what_is_wrong():
    assert override_error(["+experiment=mixed_rl", "trainer.total_steps=3"]) is None
    assert "Could not find 'experiment/nope'" in override_error(["+experiment=nope"])
    assert "mixed_rl" in override_error(["+experiment=nope"])  # the options are listed
    assert "\n" not in override_error(["+experiment=mixed_rl", "trainer.total_steps=["])


def test_a_run_refused_at_start_leaves_no_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    proc = _train(f"run_dir={run_dir}", "domains.math.dataset.path=/no/such/file.jsonl")
    assert proc.returncode == 2 and "file not found" in proc.stdout + proc.stderr
    assert not run_dir.exists(), list(run_dir.iterdir())


def test_a_refused_run_leaves_an_earlier_runs_dir_as_it_was(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    proc = _train(f"run_dir={tmp_path}", "domains.math.dataset.path=/no/such/file.jsonl")
    assert proc.returncode == 2
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_a_run_dir_in_use_keeps_its_lock(tmp_path):
    lock = RunDirLock(tmp_path)
    proc = _train(f"run_dir={tmp_path}")
    assert proc.returncode == 2 and "is in use by another run" in proc.stdout + proc.stderr
    assert (tmp_path / ".lock").exists()
    lock.release()


def test_fresh_run_dirs(tmp_path):
    assert is_fresh_run_dir(tmp_path / "absent")
    assert is_fresh_run_dir(tmp_path)
    (tmp_path / "train.log").write_text("")
    assert is_fresh_run_dir(tmp_path)  # what Hydra makes before the run starts
    (tmp_path / "train.log").write_text("an earlier run's log\n")
    assert not is_fresh_run_dir(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "checkpoints").mkdir()
    assert not is_fresh_run_dir(other)
    (other / ".lock").write_text("{}")
    remove_refused_run_dir(other)
    assert (other / "checkpoints").exists() and not (other / ".lock").exists()  # only what a refused run writes
