"""Checkpoints of a run: where they are, which one a run resumes from, how one is written and checked.

`run_dir/checkpoints/step_N/`: `hf/` (the policy in HF format, loadable as a model), `deepspeed/` (optimizer,
scheduler and RNG state of every rank), `state.json` (step and data-mixture position), `MANIFEST.json` (every
file's size) and `COMPLETE`, written last. A checkpoint is written to a temporary folder and renamed when
complete, so a crash mid-save never leaves a checkpoint that resume would take; on resume each candidate is
checked against its manifest, and a damaged newest one gives way to the previous complete one, with a warning.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from rl.config import ConfigError

log = logging.getLogger(__name__)


class RunError(RuntimeError):
    """The run cannot go on for a reason outside the config (disk full, no loadable checkpoint); the message is one
    line that names what to fix."""


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints whose save finished (COMPLETE written), oldest first."""
    return sorted(p.parent for p in (run_dir / "checkpoints").glob("step_*/COMPLETE"))


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why `ckpt` cannot be resumed from (naming the file), or None when it looks whole."""
    if not (ckpt / "COMPLETE").exists():
        return f"{ckpt / 'COMPLETE'} is missing (the save never finished)"
    try:
        state = load_checkpoint_state(ckpt)
        int(state["step"]), state["data"]["cursor"]  # noqa: B018 - the keys resume reads
    except FileNotFoundError:
        return f"{ckpt / 'state.json'} is missing"
    except (ValueError, KeyError, TypeError) as e:
        return f"{ckpt / 'state.json'} is unreadable ({type(e).__name__}: {e})"
    manifest = ckpt / "MANIFEST.json"
    if manifest.exists():
        try:
            sizes = json.loads(manifest.read_text())
        except ValueError as e:
            return f"{manifest} is unreadable ({e})"
        for rel, size in sizes.items():
            f = ckpt / rel
            if not f.is_file():
                return f"{f} is missing"
            if f.stat().st_size != size:
                return f"{f} has {f.stat().st_size} bytes, {size} were written (truncated or damaged)"
    elif not (ckpt / "deepspeed").is_dir() or not (ckpt / "hf").is_dir():  # an older checkpoint, without manifest
        return f"{ckpt} has no deepspeed/ or hf/ folder"
    return None


def find_resume(resume, run_dir: Path) -> list[Path]:
    """Checkpoints to try, best first (`trainer.resume`: null | auto | a path); [] starts from step 1.

    null refuses a run_dir that already has checkpoints (a fresh run must not overwrite another); auto takes the
    newest whole checkpoint, then older ones (a damaged one is skipped with a warning naming the file); a path
    must be a whole checkpoint.
    """
    done = complete_checkpoints(run_dir)
    if resume is None:
        if done:
            raise ConfigError(
                f"trainer.resume: run_dir={run_dir} already has checkpoints (newest {done[-1].name}); pass "
                "trainer.resume=auto to continue that run, or choose another run_dir"
            )
        return []
    if resume == "auto":
        if not done:
            log.warning("trainer.resume=auto: no checkpoint in %s, starting from step 1", run_dir)
        good = []
        for ckpt in reversed(done):
            problem = checkpoint_problem(ckpt)
            if problem:
                log.warning("trainer.resume=auto: skipping checkpoint %s: %s", ckpt.name, problem)
            else:
                good.append(ckpt)
        if done and not good:
            raise ConfigError(f"trainer.resume=auto: no checkpoint in {run_dir / 'checkpoints'} is whole (see the "
                              "warnings above); pass trainer.resume=null with a new run_dir to start over")
        return good
    path = Path(resume)
    problem = checkpoint_problem(path)
    if problem:
        raise ConfigError(f"trainer.resume={resume}: not a complete checkpoint: {problem}")
    return [path]


def load_checkpoint_state(ckpt: Path) -> dict:
    """The loop's state saved with a checkpoint: {"step": int, "data": the mixture's state_dict}."""
    return json.loads((ckpt / "state.json").read_text())


def save_checkpoint(cluster, state: dict, run_dir: Path, step: int, keep: int) -> None:
    """Every trainer rank writes its part, then the loop's `state`; the newest `keep` checkpoints stay (0 = all).
    Shared storage is assumed when trainer ranks run on several nodes."""
    root = run_dir / "checkpoints"
    final, tmp = root / f"step_{step:06d}", root / f".step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        cluster.save(str(tmp), state)
        (tmp / "state.json").write_text(json.dumps(state))
        sizes = {str(f.relative_to(tmp)): f.stat().st_size for f in sorted(tmp.rglob("*")) if f.is_file()}
        (tmp / "MANIFEST.json").write_text(json.dumps(sizes, indent=0))
        (tmp / "COMPLETE").touch()
    except Exception as e:  # noqa: BLE001 - a trainer rank's exception arrives wrapped by Ray
        shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(root if root.exists() else run_dir).free / 2**30
        last = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        raise RunError(f"checkpoint step_{step:06d}: writing it under {root} failed ({last[-1][:200] if last else e}); "
                       f"{free:.1f} GiB free there. Free some space (or set trainer.keep_checkpoints lower) and "
                       f"resume with trainer.resume=auto") from None
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    old = complete_checkpoints(run_dir)[:-keep] if keep > 0 else []
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
