"""W&B keeps what a run logged when the run is killed (`kill -9`), a resumed run continues the same W&B run (id and
name), and the offline run directory holds the history, the config and the summary (launch/wandb_logger.py).

The runs here are the Tracker alone, fed a fake metrics stream in a subprocess that kills itself with SIGKILL;
what W&B kept is read back from its `.wandb` files (the transaction log `wandb sync` uploads)."""

import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

# A run's Tracker: log steps first..last, then close, or SIGKILL itself as soon as the last one is logged.
CHILD = r"""
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from launch.tracking import Tracker
run_dir, first, last, resume, name, end, pad = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5], sys.argv[6], int(sys.argv[7])
cfg = {{"run_name": name, "lr": 0.5, "logger": {{"mode": "offline", "project": "t", "progress_bar": False, "save_rollouts": False}}}}
tracker = Tracker(cfg, run_dir, total_steps=100, start_step=first - 1, resume=resume,
                  start_up=lambda: {{"ray": 1.5, "trainer": 7.25, "first_step": 9.0}})
for step in range(first, last + 1):
    tracker.log({{"step": step, "reward/mean": 0.1 * step, "kl/math": None, "loss/pg": float("nan"),
                 **{{f"time/part{{i}}": step + i / 7 for i in range(pad)}}}})
if end == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
tracker.close()
"""


def run_tracker(run_dir: Path, first: int, last: int, *, resume: bool, name: str = "a-name", end: str = "close",
                pad: int = 0) -> int:
    if resume:
        # W&B names an offline run's folder by the second it starts (offline-run-YYYYMMDD_HHMMSS-<id>): a resume that
        # starts in the same second as the run before (these runs take ~1 s; a real resume takes far longer) would
        # write into that run's folder, and the test would find one folder instead of two (seen once in CI)
        time.sleep(1.05 - time.time() % 1)
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    proc = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT)), str(run_dir), str(first), str(last),
                           "1" if resume else "0", name, end, str(pad)], env=env, capture_output=True, text=True, timeout=300)
    if end == "close":
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.returncode


def read_wandb_file(path: Path) -> list:
    """The records of a `.wandb` file (LevelDB log format: 32 KiB blocks of CRC-checked chunks after a 7-byte
    header), read here on their own to check the logger's files (and its reader) against."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, parts, out = path.read_bytes(), 7, [], []
    while pos + 7 <= len(data):
        end = (pos // 32768 + 1) * 32768
        crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if (crc, n, kind) == (0, 0, 0):
            pos = end
            continue
        chunk = data[pos + 7:pos + 7 + n]
        if len(chunk) < n or zlib.crc32(bytes([kind]) + chunk) != crc:
            break
        pos = pos + 7 + n if pos + 14 + n <= end else end
        parts = [chunk] if kind in (1, 2) else [*parts, chunk]
        if kind in (1, 4):
            out.append(pb.Record.FromString(b"".join(parts)))
    return out


def wandb_runs(run_dir: Path, run_id: str, *, timeout: float = 30.0) -> list[dict]:
    """This run's offline W&B directories, oldest first, each read from its `.wandb` file: the run record, the
    `step` of every history row, and the exit code of its exit record (None: the file does not end the run). Waits
    (up to `timeout`) until every file ends its run: a killed run's W&B logger finishes it a moment after the kill."""
    deadline = time.time() + timeout
    while True:
        out = []
        for path in sorted(run_dir.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")):
            records = read_wandb_file(path)
            by_kind = {}
            for r in records:
                by_kind.setdefault(r.WhichOneof("record_type"), []).append(r)
            steps = [json.loads(i.value_json) for r in by_kind.get("history", []) for i in r.history.item
                     if (i.key or "/".join(i.nested_key)) == "step"]
            out.append({"dir": path.parent, "run": by_kind["run"][0].run if "run" in by_kind else None,
                        "steps": steps, "exit_code": by_kind["exit"][0].exit.exit_code if "exit" in by_kind else None,
                        "size": path.stat().st_size})
        if (out and all(r["exit_code"] is not None for r in out)) or time.time() > deadline:
            return out
        time.sleep(0.2)


def test_kill_9_keeps_every_logged_step_in_the_wandb_files(tmp_path):
    assert run_tracker(tmp_path, 1, 3, resume=False, end="kill") == -signal.SIGKILL  # killed right after step 3
    run_id = (tmp_path / "wandb_run_id").read_text()
    [killed] = wandb_runs(tmp_path, run_id)
    assert killed["steps"] == [1, 2, 3]  # every step logged before the kill
    assert killed["exit_code"] == 1  # and the file ends the run, as failed: `wandb sync` uploads all of it
    files = killed["dir"] / "files"  # summary and config also for a killed run
    summary = json.loads((files / "wandb-summary.json").read_text())
    assert summary["step"] == 3 and summary["summary/steps"] == 3
    assert summary["summary/reward/all/last"] == pytest.approx(0.3)  # as the Tracker's summary has it
    assert yaml.safe_load((files / "config.yaml").read_text())["lr"] == {"value": 0.5}


def test_a_resumed_run_is_the_same_wandb_run(tmp_path):
    run_tracker(tmp_path, 1, 3, resume=False, name="first-name")
    run_id = (tmp_path / "wandb_run_id").read_text()
    # resumed from the checkpoint of step 2, with a new time-stamped run_name as launch.train gives it
    run_tracker(tmp_path, 3, 4, resume=True, name="second-name")
    assert (tmp_path / "wandb_run_id").read_text() == run_id
    first, second = wandb_runs(tmp_path, run_id)
    assert first["run"].display_name == "first-name"
    assert second["run"].run_id == run_id and second["run"].display_name == "first-name"
    assert second["run"].resume  # offline, W&B cannot know `resumed`; its run record says it may resume one
    assert first["steps"] == [1, 2, 3] and second["steps"] == [3, 4]  # the redone step is logged again
    assert first["exit_code"] == second["exit_code"] == 0
    state = json.loads((tmp_path / "wandb_run.json").read_text())
    assert state["id"] == run_id and state["name"] == "first-name"
    assert [s["start_step"] for s in state["segments"]] == [0, 2]


def test_the_offline_run_dir_holds_config_and_summary(tmp_path):
    run_tracker(tmp_path, 1, 4, resume=False)
    [run] = wandb_runs(tmp_path, (tmp_path / "wandb_run_id").read_text())
    files = run["dir"] / "files"
    config = yaml.safe_load((files / "config.yaml").read_text())
    assert config["lr"] == {"value": 0.5} and config["logger"]["value"]["project"] == "t"
    summary = json.loads((files / "wandb-summary.json").read_text())
    assert summary["step"] == 4 and summary["reward/mean"] == pytest.approx(0.4)  # the last values
    assert summary["summary/steps"] == 4 and summary["summary/reward/all/first"] == pytest.approx(0.15)
    # the start-up timeline (launch/startup.py), as the run's summary.json has it too
    assert summary["summary/start_up/trainer"] == 7.25 and summary["summary/start_up/first_step"] == 9.0
    assert json.loads((tmp_path / "summary.json").read_text())["start_up"] == {"ray": 1.5, "trainer": 7.25,
                                                                               "first_step": 9.0}
    assert "loss/pg" not in summary and "kl/math" not in summary  # NaN and None are left out of W&B
    assert run["steps"] == [1, 2, 3, 4] and run["exit_code"] == 0


def test_a_resumed_run_logs_to_wandb_the_steps_no_wandb_file_holds(tmp_path):
    """The run's W&B logger was killed with it (a whole job killed at once): metrics.jsonl has steps W&B lacks. The
    resumed run logs them first, up to its checkpoint, then the steps it redoes and its new ones."""
    run_tracker(tmp_path, 1, 300, resume=False, pad=12)  # > 32 KiB of W&B records: several blocks of its file
    run_id = (tmp_path / "wandb_run_id").read_text()
    with (tmp_path / "metrics.jsonl").open("a") as f:  # what the run logged after its W&B logger died
        for step in range(301, 306):
            f.write(json.dumps({"step": step, "reward/mean": 1.0}) + "\n")
    run_tracker(tmp_path, 304, 306, resume=True)  # resumed from the checkpoint of step 303
    first, second = wandb_runs(tmp_path, run_id)
    assert first["size"] > 3 * 32768 and first["steps"] == list(range(1, 301))
    assert second["steps"] == [301, 302, 303, 304, 305, 306]
    assert [s["replayed"] for s in json.loads((tmp_path / "wandb_run.json").read_text())["segments"]] == [0, 3]
    from launch.wandb_logger import history_steps, read_records  # the logger's own reader reads the same

    assert history_steps(read_records(first["dir"] / f"run-{run_id}.wandb")) == first["steps"]


def test_which_steps_a_resumed_run_replays():
    """(first step - 1, steps in W&B) of each earlier part of a run; a step belongs to the newest part that started
    before it, and counts as in W&B when that part or a later one logged it."""
    from launch.wandb_logger import steps_to_replay

    rows = [1, 2, 3, 4, 5, 6]
    assert steps_to_replay(rows, []) == rows  # W&B was off before: all of it
    assert steps_to_replay(rows, [(0, {1, 2, 3, 4, 5, 6, 7, 8})]) == []
    assert steps_to_replay(rows, [(0, {1, 2})]) == [3, 4, 5, 6]
    # the part resumed at 4 lost all its W&B records: steps 5 and 6 in W&B are the first part's, since redone
    assert steps_to_replay(rows, [(0, set(range(1, 11))), (4, set())]) == [5, 6]
    assert steps_to_replay(rows, [(0, set(range(1, 11))), (4, {5})]) == [6]
    assert steps_to_replay(rows, [(0, {1, 2}), (4, {3, 4, 5, 6})]) == []  # replayed by the second part
