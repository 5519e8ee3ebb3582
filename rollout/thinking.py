"""Reasoning and context rules for multi-turn tool use (the DeepSeek-V3.2 recipe), as pure functions over chat
message lists: dicts with `role` (system | user | developer | assistant | tool), `content`, and optionally
`reasoning_content` and `tool_calls` on assistant messages. Nothing here mutates its input.

Thinking context (V3.2, section "Thinking in tool-use"): while a task goes on through tool calls, the assistant's
earlier reasoning stays in the context; it is dropped only when a new user message arrives. Tool calls and their
results are always kept. `keep_reasoning` applies that rule; `strip_reasoning` is the non-thinking mode, where no
reasoning is shown at all.

Thinking vs non-thinking mode differ in what the prompt already holds after the assistant header
(`assistant_prefill`): ChatML models (Qwen3, the embedded tokenizer) open `<think>` themselves in thinking mode and
get an empty `<think>\\n\\n</think>\\n\\n` pre-filled otherwise; DeepSeek-V3.2 pre-fills `<think>` in thinking mode
(the model writes its reasoning and closes it) and `</think>` in non-thinking mode.

Context management for search agents (V3.2, section "Context management"): when the context passes a share
(80%) of the window, `manage_context` shrinks the tool-call history (assistant messages with tool calls and the
tool results that answer them) by one of `summary` (the whole history replaced by one message a given callable
writes), `discard_75` (the first 75% of the tool-call turns and their results dropped, in pairs) or `discard_all`
(all of it dropped). The system prompt and the task (user) messages are always kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
USER_ROLES = ("user", "developer")  # what counts as a new user turn (V3.2's encoder counts `developer` too)
STYLES = ("chatml", "dsml")
STRATEGIES = ("summary", "discard_75", "discard_all")
REASONING_KEYS = ("reasoning_content", "reasoning")


# -- reasoning in one generated turn ---------------------------------------------------------------------------
def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, the rest) of one generated turn. The reasoning is what comes before the first `</think>`, after
    a `<think>` if the model wrote one (in V3.2's thinking mode `<think>` is in the prompt, so only `</think>` is
    generated); text before that `<think>` stays in the rest. A `<think>` never closed makes everything after it
    reasoning (the turn has no answer). Without either tag: (None, text). Reasoning is stripped of surrounding
    whitespace; the rest is returned as it is."""
    close = text.find(THINK_CLOSE)
    if close == -1:
        start = text.find(THINK_OPEN)
        if start == -1:
            return None, text
        return text[start + len(THINK_OPEN):].strip(), text[:start]
    start = text.find(THINK_OPEN, 0, close)
    if start == -1:
        return text[:close].strip(), text[close + len(THINK_CLOSE):]
    return text[start + len(THINK_OPEN):close].strip(), text[:start] + text[close + len(THINK_CLOSE):]


def assistant_prefill(style: str, thinking: bool) -> str:
    """What the prompt holds after the assistant header, before the model's first token.
    chatml (Qwen3, embedded): thinking "" (the model opens <think>), non-thinking "<think>\\n\\n</think>\\n\\n".
    dsml (DeepSeek-V3.2): thinking "<think>", non-thinking "</think>"."""
    if style == "chatml":
        return "" if thinking else f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"
    if style == "dsml":
        return THINK_OPEN if thinking else THINK_CLOSE
    raise ValueError(f"style must be one of {STYLES}, got {style!r}")


# -- which reasoning stays in the context ------------------------------------------------------------------------
def last_user_index(messages: Sequence[dict]) -> int:
    """Index of the last user (or developer) message; -1 when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") in USER_ROLES:
            return i
    return -1


def _without_reasoning(message: dict) -> dict:
    return {k: v for k, v in message.items() if k not in REASONING_KEYS}


def keep_reasoning(messages: Sequence[dict]) -> list[dict]:
    """V3.2's thinking-context rule: the reasoning of assistant messages before the last user message is dropped;
    the reasoning after it (the current task's tool-use turns) is kept. Content, tool calls and tool results are
    always kept. Returns a new list (messages that change are copied)."""
    last = last_user_index(messages)
    return [_without_reasoning(m) if i < last and m.get("role") == "assistant" else m for i, m in enumerate(messages)]


def strip_reasoning(messages: Sequence[dict]) -> list[dict]:
    """Non-thinking mode: no assistant message keeps its reasoning."""
    return [_without_reasoning(m) if m.get("role") == "assistant" else m for m in messages]


def context_for_mode(messages: Sequence[dict], thinking: bool) -> list[dict]:
    """The messages as the model should see them in the given mode."""
    return keep_reasoning(messages) if thinking else strip_reasoning(messages)


# -- context management for long tool-use episodes ---------------------------------------------------------------
def tool_history(messages: Sequence[dict]) -> list[list[int]]:
    """The tool-call history as groups of message indices, in order: an assistant message with tool calls followed
    by the tool messages that answer it. Tool messages with no such assistant message before them form a group of
    their own. Assistant messages without tool calls, user and system messages belong to no group."""
    groups: list[list[int]] = []
    open_group = False
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            groups.append([i])
            open_group = True
        elif role == "tool":
            if not open_group:
                groups.append([])
                open_group = True
            groups[-1].append(i)
        else:
            open_group = False
    return groups


def needs_management(messages: Sequence[dict], count_tokens: Callable[[list[dict]], int], window: int,
                     threshold: float = 0.8) -> bool:
    """Whether the context passes `threshold` of the window."""
    return count_tokens(list(messages)) > threshold * window


def discard_count(n_groups: int, share: float = 0.75) -> int:
    """How many of the first tool-call groups `discard_75` drops: floor(share * n), at least one when there is any
    (so the context always shrinks)."""
    return 0 if n_groups <= 0 else max(1, math.floor(share * n_groups))


def manage_context(messages: Sequence[dict], count_tokens: Callable[[list[dict]], int], window: int,
                   strategy: str, *, summarize: Callable[[list[dict]], str] | None = None,
                   threshold: float = 0.8, summary_role: str = "user") -> list[dict]:
    """Shrink the tool-call history when `count_tokens(messages)` passes `threshold * window`; otherwise return the
    messages unchanged (as a new list).

    - `summary`: every tool-call group is removed and one `{"role": summary_role, "content": summarize(history)}`
      message takes the place of the first one (`history` is the removed messages, in order);
    - `discard_75`: the first `discard_count(n)` groups are removed (an assistant tool-call turn always goes with
      its results);
    - `discard_all`: every group is removed.
    System, user and developer messages, and assistant messages without tool calls, are always kept. The result
    may still be over the threshold (e.g. a long task); the caller decides what to do then."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if strategy == "summary" and summarize is None:
        raise ValueError("strategy 'summary' needs a summarize callable")
    messages = list(messages)
    if not needs_management(messages, count_tokens, window, threshold):
        return messages
    groups = tool_history(messages)
    if not groups:
        return messages
    if strategy == "discard_75":
        groups = groups[: discard_count(len(groups))]
    drop = {i for g in groups for i in g}
    if strategy != "summary":
        return [m for i, m in enumerate(messages) if i not in drop]
    first = min(drop)
    summary = {"role": summary_role, "content": summarize([messages[i] for i in sorted(drop)])}
    out = []
    for i, m in enumerate(messages):
        if i == first:
            out.append(summary)
        if i not in drop:
            out.append(m)
    return out
