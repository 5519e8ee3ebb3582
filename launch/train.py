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
    try:
        with logging_redirect_tqdm():  # log lines print above the progress bar instead of through it
            summary = train(OmegaConf.to_container(cfg, resolve=True))
    except ConfigError as e:
        log.error("config error: %s", e)
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


if __name__ == "__main__":
    main()
