"""`python -m launch.train +experiment=mixed_rl [overrides]`: compose the Hydra config and run the RL loop."""

from __future__ import annotations

import errno
import logging
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
RUN_LOG = "train.log"  # Hydra's log of this job (hydra.job.name is the module's name), in run_dir
# When the command started (its process's creation: interpreter start and imports count as start-up too); set by
# `cli()`, None when main() is called in-process (the run's start then counts from train())
LAUNCHED: float | None = None


@hydra.main(config_path=CONF_DIR, config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from tqdm.contrib.logging import logging_redirect_tqdm

    from launch.checkpoint import RunError
    from launch.loop import train
    from launch.tracking import format_summary
    from rl.config import ConfigError

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    log = logging.getLogger("launch.train")
    run_dir = Path(str(cfg.run_dir))
    fresh = is_fresh_run_dir(run_dir)
    try:
        with logging_redirect_tqdm():  # log lines print above the progress bar instead of through it
            summary = train(OmegaConf.to_container(cfg, resolve=True), launched=take_launched())
    except ConfigError as e:
        log.error("config error: %s", e)
        if fresh:  # a run refused at start leaves no run_dir behind (the message is on the console)
            remove_refused_run_dir(run_dir)
        sys.exit(2)
    except RunError as e:
        log.error("%s", e)
        sys.exit(1)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        log.error("disk full while writing %s (%s): free some space and resume with trainer.resume=auto",
                  e.filename or "the run's outputs", e.strerror)
        sys.exit(1)
    print(format_summary(summary))


def is_fresh_run_dir(run_dir: Path) -> bool:
    """True when run_dir holds nothing of an earlier run: absent, or just made by Hydra with its empty log."""
    try:
        entries = list(run_dir.iterdir())
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return all(p.name == RUN_LOG and p.is_file() and p.stat().st_size == 0 for p in entries)


def remove_refused_run_dir(run_dir: Path) -> None:
    """What a refused run wrote there (the lock, Hydra's log, the config copy), and the folder if that emptied it."""
    for name in (".lock", RUN_LOG, "config.yaml"):
        (run_dir / name).unlink(missing_ok=True)
    try:
        run_dir.rmdir()
    except OSError:  # something else is there: not ours to delete
        pass


def override_error(overrides: list[str]) -> str | None:
    """One line saying what is wrong with command-line overrides that Hydra cannot apply (or with the run_dir they
    give, which Hydra makes first: `run_dir_error`), else None. Hydra's own report of a misspelled key is six lines
    and exit code 1; the config checks promise one line and exit code 2. Composing once more costs about 0.2 s;
    interpolations are not resolved here (`${hydra:...}` needs the run)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from launch.config import hydra_error_line

    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(config_name="train", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        return hydra_error_line(exc)
    return run_dir_error(cfg)


def run_dir_error(cfg: DictConfig) -> str | None:
    """One line when the composed run_dir cannot be a directory (a file, or under one): Hydra would make it before
    the run starts and fail with a traceback. None when it can, or when it resolves only inside the run."""
    from launch.run_dir import run_dir_problem

    try:
        run_dir = str(cfg.run_dir)
    except Exception:  # noqa: BLE001 - an interpolation only Hydra's run resolves: the run checks it itself
        return None
    problem = run_dir_problem(Path(run_dir).expanduser())
    return f"run_dir={run_dir}: {problem}" if problem else None


def take_launched() -> float | None:
    """The command's start, for its first run only: Hydra's multirun (-m) runs its jobs one after another in this
    process, and each later one starts when it starts (None: train() takes its own start)."""
    global LAUNCHED
    launched, LAUNCHED = LAUNCHED, None
    return launched


def process_started() -> float:
    """This process's creation time (time.time() scale)."""
    import psutil

    return psutil.Process(os.getpid()).create_time()


def cli() -> None:
    global LAUNCHED
    LAUNCHED = process_started()
    args = sys.argv[1:]
    # Hydra's own flags (--cfg, --help, -m, ...) stay Hydra's; plain overrides are checked here first.
    if args and not any(a.startswith("-") for a in args):
        problem = override_error(args)
        if problem is not None:
            print(f"config error: {problem}", file=sys.stderr)
            sys.exit(2)
    main()


if __name__ == "__main__":
    cli()
