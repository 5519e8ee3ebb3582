"""One benchmark run started as a command: its environment and its cleanup (grpo_step.py, time_to_reward.py,
learn_real.py, verl_peer.py and sft_speed.py), and the reading of its JSON-lines logs (every benchmark script).

Each run gets a Ray folder of its own (`RAY_TMPDIR`), so runs side by side on one machine (one per GPU) never share
a Ray session, and the project root first on `PYTHONPATH`, so the run's Ray workers import the project whatever
the caller's environment (a checkout without `pip install -e .`). A run that exits cleanly leaves no Ray folder
behind (its session logs and spilled objects would pile up in /tmp over many runs); a failed run's folder is kept,
and said where, for Ray's own logs.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_env(prefix: str) -> dict:
    """os.environ plus unbuffered output, the project on PYTHONPATH and a new Ray folder (`prefix` names it)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_TMPDIR": tempfile.mkdtemp(prefix=prefix)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def drop_ray_folder(env: dict, returncode: int | None) -> None:
    """Remove the run's Ray folder after exit code 0, or when Ray never wrote to it (the run failed before Ray
    started: a config error); keep it after anything else (a failure, a timeout: None)."""
    folder = env["RAY_TMPDIR"]
    if returncode == 0 or not any(Path(folder).iterdir()):
        shutil.rmtree(folder, ignore_errors=True)
    else:
        print(f"  the run's Ray logs are kept in {folder}/session_latest/logs", flush=True)


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a run's JSON-lines log ([] before it exists). A last line that does not parse is one still being
    written (a log read while its run goes on) and is left out; any other such line is an error."""
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()] if path.exists() else []
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except ValueError:
            if i < len(lines) - 1:
                raise ValueError(f"{path}, line {i + 1}: not JSON ({line[:80]!r})") from None
    return rows
