"""Checkpoints of a run: where they are, which one a run resumes from, and how one is written.

`run_dir/checkpoints/step_N/`: `hf/` (the policy in HF format, loadable as a model), `deepspeed/` (optimizer,
scheduler and RNG state of every rank), `state.json` (step and data-mixture position) and `COMPLETE`, written last:
a checkpoint is written to a temporary folder and renamed when complete, so a crash mid-save never leaves a
checkpoint that resume would take.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from rl.config import ConfigError

log = logging.getLogger(__name__)


def latest_checkpoint(run_dir: Path) -> Path | None:
    done = sorted(p.parent for p in (run_dir / "checkpoints").glob("step_*/COMPLETE"))
    return done[-1] if done else None


def find_resume(resume, run_dir: Path) -> Path | None:
    """The checkpoint to start from (`trainer.resume`: null | auto | a path); refuses to overwrite a run."""
    latest = latest_checkpoint(run_dir)
    if resume is None:
        if latest is not None:
            raise ConfigError(
                f"trainer.resume: run_dir={run_dir} already has checkpoints (newest {latest.name}); pass "
                "trainer.resume=auto to continue that run, or choose another run_dir"
            )
        return None
    if resume == "auto":
        if latest is None:
            log.warning("trainer.resume=auto: no checkpoint in %s, starting from step 1", run_dir)
        return latest
    path = Path(resume)
    if not (path / "COMPLETE").exists() or not (path / "state.json").exists():
        raise ConfigError(f"trainer.resume={resume}: not a complete checkpoint (no COMPLETE / state.json)")
    return path


def load_checkpoint_state(ckpt: Path) -> dict:
    """The loop's state saved with a checkpoint: {"step": int, "data": the mixture's state_dict}."""
    return json.loads((ckpt / "state.json").read_text())


def save_checkpoint(cluster, state: dict, run_dir: Path, step: int, keep: int) -> None:
    """Every trainer rank writes its part, then the loop's `state`; the newest `keep` checkpoints stay (0 = all).
    Shared storage is assumed when trainer ranks run on several nodes."""
    root = run_dir / "checkpoints"
    final, tmp = root / f"step_{step:06d}", root / f".step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    cluster.save(str(tmp), state)
    (tmp / "state.json").write_text(json.dumps(state))
    (tmp / "COMPLETE").touch()
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    old = sorted(p.parent for p in root.glob("step_*/COMPLETE"))[:-keep] if keep > 0 else []
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
