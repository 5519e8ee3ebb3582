"""`RewardWorker`: the reward actor's body. A plain class; the driver wraps it with `ray.remote`.

Built from the resolved config dict (`cfg["domains"]`, `cfg["rewards"]`, `cfg["rollout"]["max_new_tokens"]`).
It owns one `RewardComposer` (its process pool and sandbox threads live inside the actor's process). `judge` is the
Ray handle of the one `rollout.judge_worker.JudgeWorker` actor when a domain uses `rubric_judge` (the driver creates it
once and passes it to every RewardWorker, so the judge model is loaded once).

Scoring while the rollout still generates: a rollout worker hands the samples that have ended to `prescore` in small
batches while the rest generate (rollout/worker.py), and `score`, called with the whole share once it is generated,
takes the result kept for every sample whose group and response are ones scored early, and scores only the others.
So on one rollout worker the reward phase is left with the samples that ended last, not the whole batch.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import OrderedDict
from typing import Any, Mapping

from rl.config import to_plain
from rl.trajectory import Trajectory

from .compose import RewardComposer

logger = logging.getLogger(__name__)

# Groups whose early results are kept at most (a share retried on another worker leaves its early results here)
MAX_EARLY_GROUPS = 8192


def response_fingerprint(t: Trajectory) -> bytes:
    """What a reward reads of a sample besides its prompt and dataset row: the response and how it ended. The prompt
    and row are the group's, and the loop makes group ids unique per run (`s<step>-p<i>`; eval: `...-step<step>`), so
    (group id, fingerprint) names what a sample is scored on, whichever of the group's n samples it is."""
    h = hashlib.blake2b(digest_size=16)
    h.update(t.domain.encode())
    h.update(str(t.finish_reason).encode())
    h.update(t.response_ids.tobytes())
    return h.digest()


class RewardWorker:
    def __init__(self, cfg: Mapping[str, Any], judge: Any = None):
        cfg = to_plain(cfg)
        # fastText/BLAS inside this actor: one thread each, the parallelism is the pool's and the sandboxes'.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        self.composer = RewardComposer(
            cfg["domains"], cfg.get("rewards") or {}, (cfg.get("rollout") or {}).get("max_new_tokens", 0),
            judge=judge,
        )
        # group id -> {response fingerprint: (reward, reward_parts, reward_error, reward_failed)} from `prescore`
        self._early: OrderedDict[str, dict[bytes, tuple]] = OrderedDict()
        self.early_used = self.scored = 0  # samples `score` took an early result for / was given, since start

    def ready(self) -> bool:
        """True once the composer (and its process pool) is up; the driver awaits it before the first batch."""
        return self.composer.ready()

    def prescore(self, trajs: list[Trajectory]) -> int:
        """Score samples that ended while the rollout goes on; `score` uses the results. Domains with a judge part
        wait for `score` (the judge model would compete with the rollout for the GPU). Returns how many were scored."""
        trajs = [t for t in trajs if not self.composer.uses_judge(t.domain)]
        for t in self.composer.score(trajs):
            result = (t.reward, dict(t.reward_parts), t.reward_error, t.reward_failed)
            self._early.setdefault(t.group_id, {})[response_fingerprint(t)] = result
            self._early.move_to_end(t.group_id)
        while len(self._early) > MAX_EARLY_GROUPS:
            self._early.popitem(last=False)
        return len(trajs)

    def score(self, trajs: list[Trajectory]) -> list[Trajectory]:
        self.scored += len(trajs)
        rest = []
        for t in trajs:
            early = self._early.get(t.group_id, {}).get(response_fingerprint(t))
            if early is not None:
                t.reward, parts, t.reward_error, t.reward_failed = early
                t.reward_parts = dict(parts)
                self.early_used += 1
            else:
                rest.append(t)
        for group in {t.group_id for t in trajs}:  # each group is scored once; what was not used is stale
            self._early.pop(group, None)
        t0 = time.perf_counter()
        if rest:
            self.composer.score(rest)  # in place
        if len(rest) < len(trajs):
            logger.info("reward worker: %d of %d samples were scored during generation, the other %d now in %.2f s",
                        len(trajs) - len(rest), len(trajs), len(rest), time.perf_counter() - t0)
        return trajs

    def early_stats(self) -> dict:
        """Samples given to `score` and early results it took since start; early results kept unclaimed now."""
        return {"scored": self.scored, "used": self.early_used, "kept": sum(map(len, self._early.values()))}

    def close(self) -> None:
        self.composer.close()
