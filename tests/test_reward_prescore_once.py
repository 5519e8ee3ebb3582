"""Issue 68, item 7 (design review R7): a group is scored once. `prescore` calls come from the rollout worker and
`score` from the driver's side; Ray does not order calls from different callers, so a `prescore` can arrive after
the `score` of its share. Scoring it then is wasted work (for code: sandbox CPU), and its results would be parked
until evicted; it is dropped instead."""

import numpy as np

from rewards import registry
from rewards.spec import RewardSpec
from rewards.worker import RewardWorker
from rl.trajectory import Trajectory

SCORED: list[str] = []


def _counting(view, params):
    SCORED.append(view.response)
    return 1.0 if "42" in view.response else 0.0


def _sample(text: str, group: str, uid: str) -> Trajectory:
    ids = np.frombuffer(text.encode(), np.uint8).astype(np.int32)
    return Trajectory(uid=uid, group_id=group, domain="logic", prompt_ids=[1], response_ids=ids,
                      inference_logprobs=np.zeros(len(ids)), finish_reason="stop", response_text=text,
                      sample={"answer": "42"})


def _worker(monkeypatch) -> RewardWorker:
    monkeypatch.setitem(registry.REWARDS, "counting", RewardSpec(_counting))
    SCORED.clear()
    return RewardWorker({"domains": {"logic": {"rewards": [{"name": "counting", "weight": 1.0}]}}, "rewards": {},
                         "rollout": {"max_new_tokens": 64}})


def test_a_late_prescore_of_a_group_already_scored_is_dropped(monkeypatch):
    w = _worker(monkeypatch)
    share = [_sample("Answer: 42", "s1-p0", "a"), _sample("Answer: 7", "s1-p0", "b")]
    assert [t.reward for t in w.score(share)] == [1.0, 0.0] and len(SCORED) == 2
    # the rollout worker's last early batch of that group arrives after the share's `score`
    late = [_sample("Answer: 7", "s1-p0", "early-b"), _sample("Answer: 42", "s1-p1", "early-c")]
    assert w.prescore(late) == 1  # only the group not scored yet is queued
    stats = w.early_stats()  # waits for the scoring thread
    assert SCORED == ["Answer: 42", "Answer: 7", "Answer: 42"], "a group already scored was scored again"
    assert stats["kept"] == 1  # s1-p1's result, for its share's `score`; nothing parked for s1-p0
    assert w.late_dropped == 1
    w.close()


def test_groups_not_scored_yet_are_still_scored_early(monkeypatch):
    w = _worker(monkeypatch)
    assert w.prescore([_sample("Answer: 42", "g", "early")]) == 1
    assert w.early_stats()["kept"] == 1 and len(SCORED) == 1
    out = w.score([_sample("Answer: 42", "g", "a")])
    assert out[0].reward == 1.0 and len(SCORED) == 1 and w.early_used == 1
    w.close()
