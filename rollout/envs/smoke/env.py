"""The smoke environment: one lookup tool over a tiny key-value table, and submit. For fast tests of the agent
loop and of the environment machinery (base.py)."""

from __future__ import annotations

import json

from rollout.envs.base import ToolError, create_table
from rewards.rule_rewards import normalize_short_answer


def build_db(conn, env_dir):
    entries = json.loads((env_dir / "data.json").read_text(encoding="utf-8"))["entries"]
    create_table(conn, "entries", entries, primary_key="key")


def lookup(state, key: str) -> str:
    """Look up the value stored under a key.

    Args:
        key: the key, exactly as written in the task (e.g. "alpha").

    Returns:
        The stored value as text.
    """
    row = state.db.execute("SELECT value FROM entries WHERE key = ?", (key.strip(),)).fetchone()
    if row is None:
        known = [r["key"] for r in state.db.execute("SELECT key FROM entries ORDER BY key")]
        raise ToolError(f"no key {key!r}; the keys are: {', '.join(known)}")
    return row["value"]


def submit_result(state, answer: str) -> str:
    """Submit the final answer; this ends the episode.

    Args:
        answer: the value the task asks for.
    """
    return "Submitted."


TOOLS = [lookup, submit_result]


def verify(task, state):
    if not state.submitted:
        return 0.0, "nothing was submitted"
    if normalize_short_answer(str(state.submission)) == normalize_short_answer(task["answer"]):
        return 1.0, None
    return 0.0, f"submitted {str(state.submission)[:80]!r}, expected {task['answer']!r}"


def solve(task, call):
    value = call("lookup", key=task["key"])
    call("submit_result", answer=value)
