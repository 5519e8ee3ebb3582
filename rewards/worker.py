"""`RewardWorker`: the reward actor's body. A plain class; the driver wraps it with `ray.remote`.

Built from the resolved config dict (`cfg["domains"]`, `cfg["rewards"]`, `cfg["rollout"]["max_new_tokens"]`).
It owns one `RewardComposer` (its process pool and sandbox threads live inside the actor's process). `judge` is the
Ray handle of the one `rollout.judge_worker.JudgeWorker` actor when a domain uses `rubric_judge` (the driver creates it
once and passes it to every RewardWorker, so the judge model is loaded once).

Scoring while the rollout still generates: a rollout worker hands the samples that have ended to `prescore` in small
batches while the rest generate (rollout/worker.py), and `score`, called with the whole share once it is generated,
takes the result kept for every sample whose group and response are ones scored early, and scores only the others.
So on one rollout worker the reward phase is left with the samples that ended last, not the whole batch.

`prescore` only queues its samples and returns: a thread of the actor scores whatever is queued, all of it in one
composer call. Scoring each early batch inside its `prescore` call kept the actor busy batch after batch, so the
share's `score` call waited behind the last of them (on the device a whole step's answers take ~0.09 s of the pool,
the reward phase took 0.3-0.45 s). `score` scores the samples of its groups still in the queue together with the
rest; one lock keeps the thread and `score` from using the composer at the same time.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Any, Mapping

from rl.config import to_plain
from rl.trajectory import Trajectory

from .compose import RewardComposer
from .text import log_safe

logger = logging.getLogger(__name__)

# Groups whose early results are kept at most (a share retried on another worker leaves its early results here)
MAX_EARLY_GROUPS = 8192
# Groups `score` has scored that are remembered, so a late `prescore` of them is dropped (the oldest are forgotten
# first: the late calls come within moments of their share's `score`)
MAX_SCORED_GROUPS = 65536


def response_fingerprint(t: Trajectory) -> bytes:
    """What a reward reads of a sample besides its prompt and dataset row: the response and how it ended. The prompt
    and row are the group's, and the loop makes group ids unique per run (`s<step>-p<i>`; eval: `...-step<step>`), so
    (group id, fingerprint) names what a sample is scored on, whichever of the group's n samples it is."""
    h = hashlib.blake2b(digest_size=16)
    h.update(t.domain.encode())
    h.update(str(t.finish_reason).encode())
    h.update(t.response_ids.tobytes())
    return h.digest()


def pool_summary(run: dict) -> str:
    """`RewardComposer.last_pool_run` in words, for the log line of a share's scoring."""
    if not run:
        return ""
    text = f" ({run['decided_in_process']} decided in-process"
    if run.get("tasks"):
        text += (f"; the pool: {run['tasks']} tasks in {run['round_trips']} round trips, {run['wall_s']:.2f} s, "
                 f"{run['worker_s']:.2f} s of worker time, slowest task {run['slowest_s']:.3f} s")
    return text + ")"


class RewardWorker:
    def __init__(self, cfg: Mapping[str, Any], judge: Any = None):
        cfg = to_plain(cfg)
        # fastText/BLAS inside this actor: one thread each, the parallelism is the pool's and the sandboxes'.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        # max_new_tokens 0 when absent (not the YAML's 48): the budget is unknown, so a length part must state its
        # own (tests/test_config_defaults.py KNOWN)
        self.composer = RewardComposer(
            cfg["domains"], cfg.get("rewards") or {}, (cfg.get("rollout") or {}).get("max_new_tokens", 0),
            judge=judge,
        )
        # group id -> {response fingerprint: (reward, reward_parts, reward_error, reward_failed)} from `prescore`
        self._early: OrderedDict[str, dict[bytes, tuple]] = OrderedDict()
        self.early_used = self.scored = 0  # samples `score` took an early result for / was given, since start
        # groups `score` has scored (ids are unique per run): a `prescore` of one comes late and is dropped
        self._scored_groups: OrderedDict[str, None] = OrderedDict()
        self.late_dropped = 0  # samples dropped that way, since start
        self._queue: list[Trajectory] = []  # early samples not yet taken by the scoring thread
        self._changed = threading.Condition()  # guards _queue, _early, _busy, _closed
        self._busy = self._closed = False
        self._composer_lock = threading.Lock()  # one composer call at a time: the thread's or `score`'s
        self._thread = threading.Thread(target=self._score_early, name="reward-early-scoring", daemon=True)
        self._thread.start()

    def ready(self) -> bool:
        """True once the composer (and its process pool) is up; the driver awaits it before the first batch."""
        return self.composer.ready()

    def prescore(self, trajs: list[Trajectory]) -> int:
        """Queue samples that ended while the rollout goes on, for the scoring thread; `score` uses the results.
        Domains with a judge part wait for `score` (the judge model would compete with the rollout for the GPU).
        A group is scored once: this call comes from the rollout worker and `score` from the driver's side, which
        Ray does not order, so it may come after its share's `score`; such samples are dropped (scoring them would
        waste the pool's or the sandbox's time, and nothing would take the results). Returns how many were queued."""
        trajs = [t for t in trajs if not self.composer.uses_judge(t.domain)]
        with self._changed:
            queued = [t for t in trajs if t.group_id not in self._scored_groups]
            self.late_dropped += len(trajs) - len(queued)
            self._queue.extend(queued)
            self._changed.notify_all()
        if len(queued) < len(trajs):
            logger.debug("reward worker: %d early samples came after their groups were scored; dropped",
                         len(trajs) - len(queued))
        return len(queued)

    def _score_early(self) -> None:
        """The scoring thread: everything queued, in one composer call, until `close`."""
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._queue or self._closed)
                if self._closed:
                    return
            with self._composer_lock:  # taken before the queue: `score` never finds a batch half done
                with self._changed:
                    batch, self._queue, self._busy = self._queue, [], True
                results = []
                try:
                    results = [(t.group_id, response_fingerprint(t),
                                (t.reward, dict(t.reward_parts), t.reward_error, t.reward_failed))
                               for t in self.composer.score(batch)] if batch else []
                except Exception as exc:  # noqa: BLE001 - `score` scores these samples again; the thread goes on
                    # one line: the error may quote a sample (where it was raised is on it too)
                    logger.error("reward worker: scoring %d early samples failed (%s); they are scored with their "
                                 "share", len(batch), log_safe(exc, 2000))
                finally:
                    with self._changed:
                        for group, key, result in results:
                            self._early.setdefault(group, {})[key] = result
                            self._early.move_to_end(group)
                        while len(self._early) > MAX_EARLY_GROUPS:
                            self._early.popitem(last=False)
                        self._busy = False
                        self._changed.notify_all()

    def score(self, trajs: list[Trajectory]) -> list[Trajectory]:
        groups = {t.group_id for t in trajs}
        with self._composer_lock:  # the scoring thread's batch in progress, if any, is done
            with self._changed:
                # this share's samples still queued are scored below with the rest, in the same composer call
                self._queue = [t for t in self._queue if t.group_id not in groups]
                early = {g: self._early.pop(g) for g in groups if g in self._early}  # each group is scored once
                for g in groups:  # ... and a `prescore` of it that comes later is dropped
                    self._scored_groups[g] = None
                    self._scored_groups.move_to_end(g)
                while len(self._scored_groups) > MAX_SCORED_GROUPS:
                    self._scored_groups.popitem(last=False)
            self.scored += len(trajs)
            rest = []
            for t in trajs:
                found = early.get(t.group_id, {}).get(response_fingerprint(t))
                if found is not None:
                    t.reward, parts, t.reward_error, t.reward_failed = found
                    t.reward_parts = dict(parts)
                    self.early_used += 1
                else:
                    rest.append(t)
            t0, pool_run = time.perf_counter(), {}
            if rest:
                self.composer.score(rest)  # in place
                pool_run = self.composer.last_pool_run  # read under the lock: the thread's next call resets it
        if len(rest) < len(trajs):
            logger.info("reward worker: %d of %d samples were scored during generation, the other %d now in %.2f s%s",
                        len(trajs) - len(rest), len(trajs), len(rest), time.perf_counter() - t0,
                        pool_summary(pool_run))
        return trajs

    def early_stats(self) -> dict:
        """Samples given to `score` and early results it took since start; early results kept unclaimed now (once
        the samples queued so far are scored)."""
        with self._changed:
            self._changed.wait_for(lambda: not (self._queue or self._busy) or self._closed, timeout=120)
            return {"scored": self.scored, "used": self.early_used, "kept": sum(map(len, self._early.values()))}

    def close(self) -> None:
        """Stop the scoring thread (after the batch it is on, for up to a minute), then the composer's pool."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread.join(timeout=60)
        self.composer.close()
