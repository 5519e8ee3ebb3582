"""`RewardWorker`: the reward actor's body. A plain class; the driver wraps it with `ray.remote`.

Built from the resolved config dict (`cfg["domains"]`, `cfg["rewards"]`, `cfg["rollout"]["max_new_tokens"]`).
It owns one `RewardComposer` (its process pool and sandbox threads live inside the actor's process). `judge` is the
Ray handle of the one `rollout.judge_worker.JudgeWorker` actor when a domain uses `rubric_judge` (the driver creates it
once and passes it to every RewardWorker, so the judge model is loaded once).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from rl.config import to_plain
from rl.trajectory import Trajectory

from .compose import RewardComposer

logger = logging.getLogger(__name__)


class RewardWorker:
    def __init__(self, cfg: Mapping[str, Any], judge: Any = None):
        cfg = to_plain(cfg)
        # fastText/BLAS inside this actor: one thread each, the parallelism is the pool's and the sandboxes'.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        self.composer = RewardComposer(
            cfg["domains"], cfg.get("rewards") or {}, (cfg.get("rollout") or {}).get("max_new_tokens", 0),
            judge=judge,
        )

    def ready(self) -> bool:
        """True once the composer (and its process pool) is up; the driver awaits it before the first batch."""
        return self.composer.ready()

    def score(self, trajs: list[Trajectory]) -> list[Trajectory]:
        return self.composer.score(trajs)

    def close(self) -> None:
        self.composer.close()
