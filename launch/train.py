"""`python -m launch.train +experiment=mixed_rl [overrides]`: compose the Hydra config and run the RL loop."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


@hydra.main(config_path=CONF_DIR, config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from launch.loop import train
    from rl.config import ConfigError

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        run_dir = train(OmegaConf.to_container(cfg, resolve=True))
    except ConfigError as e:
        logging.getLogger("launch.train").error("config error: %s", e)
        sys.exit(2)
    print(f"done: metrics in {run_dir / 'metrics.jsonl'}")


if __name__ == "__main__":
    main()
