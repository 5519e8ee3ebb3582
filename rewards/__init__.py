"""Rewards: rule-based outcome rewards, length penalty, language consistency, per-domain composition.

Public entry points: `RewardComposer` (rewards.compose), `RewardWorker` (rewards.worker) and the registry
`REWARDS` (rewards.registry); the scoring CLI is `python -m launch.score IN.jsonl --out OUT.jsonl`.
Imports are lazy so `import rewards` stays cheap in processes that only need one piece.
"""

__all__ = ["RewardComposer", "RewardWorker", "REWARDS"]


def __getattr__(name):
    if name == "RewardComposer":
        from .compose import RewardComposer

        return RewardComposer
    if name == "RewardWorker":
        from .worker import RewardWorker

        return RewardWorker
    if name == "REWARDS":
        from .registry import REWARDS

        return REWARDS
    raise AttributeError(name)
