"""benchmarks/run_env.py: a benchmark run's own Ray folder (removed after a clean exit, kept after a failure),
the project importable by the run's processes whatever the caller's PYTHONPATH, and the reader of a run's JSON-lines
logs that the benchmark scripts' reports and watchers share."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from run_env import drop_ray_folder, read_jsonl, run_env  # noqa: E402


def test_each_run_gets_a_new_ray_folder_and_the_project_on_its_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    a, b = run_env("ray-test-"), run_env("ray-test-")
    assert a["RAY_TMPDIR"] != b["RAY_TMPDIR"] and all(Path(e["RAY_TMPDIR"]).is_dir() for e in (a, b))
    assert a["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/elsewhere"] and a["PYTHONUNBUFFERED"] == "1"
    # a process started from another folder imports the project (what the run's Ray workers need)
    out = subprocess.run([sys.executable, "-c", "import launch.worker_logs, rl; print('ok')"], cwd=tmp_path,
                         env=a, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    monkeypatch.delenv("PYTHONPATH")
    assert run_env("ray-test-")["PYTHONPATH"] == str(ROOT)
    for e in (a, b):
        drop_ray_folder(e, 0)


def test_the_folder_goes_after_a_clean_exit_and_stays_after_a_failure_of_a_started_ray(capsys):
    for rc, kept in ((0, False), (1, True), (None, True)):  # None: the run timed out
        env = run_env("ray-test-")
        (Path(env["RAY_TMPDIR"]) / "session_latest").mkdir()  # what Ray leaves there
        drop_ray_folder(env, rc)
        assert Path(env["RAY_TMPDIR"]).exists() == kept
        if kept:
            assert f"{env['RAY_TMPDIR']}/session_latest/logs" in capsys.readouterr().out
            drop_ray_folder(env, 0)
    empty = run_env("ray-test-")  # failed before Ray started (a config error): nothing to keep
    drop_ray_folder(empty, 2)
    assert not Path(empty["RAY_TMPDIR"]).exists() and "Ray logs" not in capsys.readouterr().out


def test_a_log_being_written_reads_its_complete_lines(tmp_path):
    log = tmp_path / "metrics.jsonl"
    assert read_jsonl(log) == []  # the run has not written it yet
    rows = [{"step": 1, "reward/mean": 0.25}, {"step": 2, "reward/mean": 0.5}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n" + '{"step": 3, "rew')  # a blank line, a partial one
    assert read_jsonl(log) == rows


def test_a_broken_line_before_the_last_is_an_error_naming_it(tmp_path):
    log = tmp_path / "steps.jsonl"
    log.write_text('{"step": 1}\n{"step": 2, oops\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"steps.jsonl, line 2: not JSON"):
        read_jsonl(log)
