"""Checkpoints of a run: where they are, which one a run resumes from, how one is written and checked.

`run_dir/checkpoints/step_N/`: `hf/` (the policy in HF format, loadable as a model), `deepspeed/` (optimizer,
scheduler and RNG state of every rank), `state.json` (step and data-mixture position), `MANIFEST.json` (every
file's size) and `COMPLETE`, written last. A checkpoint is written to a temporary folder and renamed when
complete, so a crash mid-save never leaves a checkpoint that resume would take; on resume each candidate is
checked against its manifest, and a damaged newest one gives way to the previous complete one, with a warning.

A run continues one lineage: once it has loaded a checkpoint, every checkpoint of its run_dir with a later step is
moved aside (`set_aside_newer`): one that was skipped because it is damaged or does not load to `checkpoints/bad/`,
a whole one that an explicit `trainer.resume=<older checkpoint>` passed over to `checkpoints/superseded/`, each with a
`SET_ASIDE` note saying why. Otherwise it would stay the "newest": pruning (`keep_checkpoints`) would delete the
resumed run's own checkpoints as they are written, until their step passed it, and a later resume=auto would
continue from it. Pruning also counts only the checkpoints up to the step just written.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from pathlib import Path

from rl.config import ConfigError

log = logging.getLogger(__name__)


class RunError(RuntimeError):
    """The run cannot go on for a reason outside the config (disk full, no loadable checkpoint); the message is one
    line that names what to fix."""


_STEP_DIR = re.compile(r"step_(\d+)")


def checkpoint_step(ckpt: Path) -> int | None:
    """The step of a checkpoint folder named `step_N`, or None for any other name."""
    m = _STEP_DIR.fullmatch(Path(ckpt).name)
    return int(m.group(1)) if m else None


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints whose save finished (COMPLETE written), oldest first (by step: past step 999999 the names grow a
    digit). Only `checkpoints/step_N/`: the folders set aside under `checkpoints/bad/` and `superseded/` are not."""
    found = [p.parent for p in (run_dir / "checkpoints").glob("step_*/COMPLETE")]
    return sorted((p for p in found if checkpoint_step(p) is not None), key=checkpoint_step)


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why `ckpt` cannot be resumed from (naming the file), or None when it looks whole. Never raises: a checkpoint
    whose files cannot even be checked (damaged JSON of the wrong shape, an unreadable folder) is not whole."""
    try:
        return _checkpoint_problem(ckpt)
    except Exception as e:  # noqa: BLE001 - whatever the damage, resume=auto must go on to an older checkpoint
        return f"{ckpt} cannot be checked ({type(e).__name__}: {e})"


def state_problem(state) -> str | None:
    """What is wrong with a loaded state.json (the keys and types `resume` reads), or None."""
    if not isinstance(state, dict):
        return f"a JSON {type(state).__name__} where an object is expected"
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"step is {step!r}, not a step number"
    data = state.get("data")
    if not isinstance(data, dict) or "cursor" not in data:
        return f"data is {str(data)[:80]!r}, not the data position (an object with a cursor)"
    return None


def manifest_problem(sizes) -> str | None:
    """What is wrong with a loaded MANIFEST.json (relative path inside the checkpoint -> size in bytes), or None."""
    if not isinstance(sizes, dict):
        return f"a JSON {type(sizes).__name__} where an object of file sizes is expected"
    for rel, size in sizes.items():
        parts = Path(rel).parts
        if not rel or Path(rel).is_absolute() or ".." in parts:
            return f"{rel!r} is not a path inside the checkpoint"
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            return f"the size of {rel} is {size!r}, not a number of bytes"
    return None


def _checkpoint_problem(ckpt: Path) -> str | None:
    if not (ckpt / "COMPLETE").exists():
        return f"{ckpt / 'COMPLETE'} is missing (the save never finished)"
    try:
        state = load_checkpoint_state(ckpt)
    except FileNotFoundError:
        return f"{ckpt / 'state.json'} is missing"
    except (ValueError, OSError) as e:
        return f"{ckpt / 'state.json'} is unreadable ({type(e).__name__}: {e})"
    problem = state_problem(state)
    if problem:
        return f"{ckpt / 'state.json'} is damaged ({problem})"
    manifest = ckpt / "MANIFEST.json"
    if manifest.exists():
        try:
            sizes = json.loads(manifest.read_text())
        except (ValueError, OSError) as e:
            return f"{manifest} is unreadable ({e})"
        problem = manifest_problem(sizes)
        if problem:
            return f"{manifest} is damaged ({problem})"
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


def set_aside_newer(run_dir: Path, resumed: Path, step: int, failed: dict[Path, str] | None = None) -> list[Path]:
    """After the run resumed from `resumed` (at `step`): move every complete checkpoint of `run_dir` with a later step
    out of `checkpoints/` (see the module's docstring), so that neither pruning nor a later resume counts it.
    `failed`: the checkpoints that did not load, with why. Nothing is deleted. Returns where they went."""
    failed = {Path(p).resolve(): why for p, why in (failed or {}).items()}
    moved = []
    for ckpt in complete_checkpoints(run_dir):
        if checkpoint_step(ckpt) <= step:
            continue
        why = failed.get(ckpt.resolve())
        why = f"does not load ({why})" if why else checkpoint_problem(ckpt)
        kind = "bad" if why else "superseded"
        why = why or f"a whole checkpoint, but trainer.resume named the older {resumed}"
        folder = run_dir / "checkpoints" / kind
        dest, n = folder / ckpt.name, 0
        while dest.exists():
            n += 1
            dest = folder / f"{ckpt.name}.{n}"
        try:
            folder.mkdir(exist_ok=True)
            ckpt.rename(dest)
        except OSError as e:
            raise RunError(f"trainer.resume: the run continues from {resumed.name}, and the newer checkpoint {ckpt} "
                           f"could not be moved aside to {dest} ({e.strerror or e}); move or delete it, then resume "
                           "again (left there, pruning would delete this run's new checkpoints)") from None
        try:
            (dest / "SET_ASIDE").write_text(f"{why}\nset aside at {time.strftime('%Y-%m-%d %H:%M:%S')} by a run that "
                                            f"resumed from {resumed} (step {step})\n")
        except OSError:  # the note is a courtesy: the move is what protects the lineage
            pass
        log.warning("trainer.resume: moved %s to %s: %s. Pruning and later resumes skip it; move it back by hand to "
                    "use it again", ckpt.name, dest.relative_to(run_dir), why)
        moved.append(dest)
    return moved


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
    # by step, up to this one: a newer checkpoint (another lineage's; `set_aside_newer` moves those when the run
    # resumes) must neither push this one out nor be pruned in its place
    lineage = [p for p in complete_checkpoints(run_dir) if checkpoint_step(p) <= step]
    old = lineage[:-keep] if keep > 0 else []
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
