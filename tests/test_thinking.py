"""rollout/thinking.py: the reasoning split of a generated turn, the thinking / non-thinking prefills, V3.2's
thinking-context rule for tool use and the three context-management strategies, as tables."""

import copy

import pytest

from rollout.thinking import (
    assistant_prefill, context_for_mode, discard_count, keep_reasoning, last_user_index, manage_context,
    split_reasoning, strip_reasoning, tool_history,
)


@pytest.mark.parametrize("text, reasoning, rest", [
    ("plain answer", None, "plain answer"),
    ("<think>\nstep 1\n</think>\n\nanswer", "step 1", "\n\nanswer"),  # Qwen3 thinking mode: the model opens it
    ("step 1</think>answer", "step 1", "answer"),  # V3.2 thinking mode: <think> was in the prompt
    ("<think>\n\n</think>\n\nanswer", "", "\n\nanswer"),  # an empty block
    ("<think>never closed <tool_call>", "never closed <tool_call>", ""),  # cut off while reasoning: no answer
    ("pre <think>r</think> post", "r", "pre  post"),  # text before <think> stays in the answer
    ("a</think>b</think>c", "a", "b</think>c"),  # only the first </think> closes
    ("<think>a<think>b</think>c", "a<think>b", "c"),
    ("", None, ""),
])
def test_split_reasoning(text, reasoning, rest):
    assert split_reasoning(text) == (reasoning, rest)


@pytest.mark.parametrize("style, thinking, prefill", [
    ("chatml", True, ""),
    ("chatml", False, "<think>\n\n</think>\n\n"),
    ("dsml", True, "<think>"),
    ("dsml", False, "</think>"),
])
def test_assistant_prefill(style, thinking, prefill):
    assert assistant_prefill(style, thinking) == prefill


def test_assistant_prefill_rejects_unknown_style():
    with pytest.raises(ValueError, match="style"):
        assistant_prefill("llama", True)


def _call(name):
    return [{"type": "function", "function": {"name": name, "arguments": {}}}]


SYS = {"role": "system", "content": "sys"}
U1 = {"role": "user", "content": "task 1"}
A1 = {"role": "assistant", "content": "", "reasoning_content": "r1", "tool_calls": _call("search")}
T1 = {"role": "tool", "content": "result 1"}
A2 = {"role": "assistant", "content": "", "reasoning_content": "r2", "tool_calls": _call("open")}
T2 = {"role": "tool", "content": "result 2"}
A3 = {"role": "assistant", "content": "answer 1", "reasoning_content": "r3"}
U2 = {"role": "user", "content": "task 2"}
A4 = {"role": "assistant", "content": "", "reasoning_content": "r4", "tool_calls": _call("search")}
T4 = {"role": "tool", "content": "result 4"}


def _reasoning(messages):
    return [m.get("reasoning_content") for m in messages if m["role"] == "assistant"]


@pytest.mark.parametrize("messages, kept", [
    # one task going on through tool calls: every reasoning stays
    ([SYS, U1, A1, T1, A2, T2], ["r1", "r2"]),
    ([SYS, U1, A1, T1, A2, T2, A3], ["r1", "r2", "r3"]),
    # a new user message arrives: everything before it loses its reasoning, the new task's turns keep theirs
    ([SYS, U1, A1, T1, A2, T2, A3, U2], [None, None, None]),
    ([SYS, U1, A1, T1, A2, T2, A3, U2, A4, T4], [None, None, None, "r4"]),
    ([SYS, U1, A1, T1, {"role": "developer", "content": "d"}, A2], [None, "r2"]),  # developer counts as a user turn
    ([A1, T1], ["r1"]),  # no user message at all
])
def test_v32_thinking_context_rule(messages, kept):
    before = copy.deepcopy(messages)
    out = keep_reasoning(messages)
    assert _reasoning(out) == kept
    assert messages == before  # pure
    # tool calls, tool results and every message's content are always kept
    assert [m["role"] for m in out] == [m["role"] for m in messages]
    assert [m.get("tool_calls") for m in out] == [m.get("tool_calls") for m in messages]
    assert [m["content"] for m in out] == [m["content"] for m in messages]


def test_reasoning_alias_is_dropped_too():
    msgs = [U1, {"role": "assistant", "content": "a", "reasoning": "old"}, U2]
    assert "reasoning" not in keep_reasoning(msgs)[1]


@pytest.mark.parametrize("thinking, kept", [(True, [None, "r4"]), (False, [None, None])])
def test_context_for_mode(thinking, kept):
    assert _reasoning(context_for_mode([U1, A1, T1, U2, A4, T4], thinking)) == kept
    assert _reasoning(strip_reasoning([A1, A4])) == [None, None]


@pytest.mark.parametrize("messages, index", [([], -1), ([SYS], -1), ([SYS, U1, A1], 1), ([U1, A1, U2, A4, T4], 2)])
def test_last_user_index(messages, index):
    assert last_user_index(messages) == index


@pytest.mark.parametrize("messages, groups", [
    ([SYS, U1, A1, T1, A2, T2, A3], [[2, 3], [4, 5]]),
    ([SYS, U1, A1, T1, T2, A3, U2, A4, T4], [[2, 3, 4], [7, 8]]),  # two results of one call turn go together
    ([SYS, U1, T1, A1], [[2], [3]]),  # a result with no call before it is a group; a call with no result too
    ([SYS, U1, A3], []),  # an answer without tool calls is no tool-call history
])
def test_tool_history(messages, groups):
    assert tool_history(messages) == groups


@pytest.mark.parametrize("n, dropped", [(0, 0), (1, 1), (2, 1), (3, 2), (4, 3), (5, 3), (8, 6), (100, 75)])
def test_discard_count(n, dropped):
    assert discard_count(n) == dropped


def chars(messages):  # a token counter: one token per character of content
    return sum(len(m.get("content") or "") for m in messages)


def _turns(k):
    out = []
    for i in range(k):
        out += [{"role": "assistant", "content": f"c{i}", "tool_calls": _call(f"t{i}")},
                {"role": "tool", "content": f"result {i} " + "x" * 20}]
    return out


LONG = [SYS, U1] + _turns(4) + [A3]  # 3 + 6 + 4 * (2 + 29) + 8 = 141 characters


@pytest.mark.parametrize("window, strategy, contents", [
    # under 80% of the window: nothing changes, whatever the strategy
    (1000, "discard_all", [m["content"] for m in LONG]),
    (177, "discard_75", [m["content"] for m in LONG]),  # 141 <= 0.8 * 177 = 141.6
    # over: discard_75 drops the first 3 of 4 call turns with their results, discard_all all 4
    (176, "discard_75", ["sys", "task 1", "c3", "result 3 " + "x" * 20, "answer 1"]),
    (100, "discard_all", ["sys", "task 1", "answer 1"]),
])
def test_discard_strategies(window, strategy, contents):
    out = manage_context(LONG, chars, window, strategy)
    assert [m["content"] for m in out] == contents
    assert out is not LONG


def test_discard_75_keeps_pairs_together():
    msgs = [SYS, U1, A1, T1, T2, A2, T2, A4, T4, A2, T2]  # 4 groups, the first with two results
    out = manage_context(msgs, chars, 1, "discard_75")
    assert out == [SYS, U1, A2, T2]


def test_summary_replaces_the_tool_history():
    seen = []

    def summarize(history):
        seen.append(history)
        return f"summary of {len(history)} messages"

    out = manage_context(LONG, chars, 100, "summary", summarize=summarize)
    assert seen == [LONG[2:10]]  # exactly the tool-call history, in order
    assert out == [SYS, U1, {"role": "user", "content": "summary of 8 messages"}, A3]
    out = manage_context(LONG, chars, 100, "summary", summarize=summarize, summary_role="assistant")
    assert out[2]["role"] == "assistant"


def test_summary_is_not_called_under_the_threshold():
    def summarize(history):
        raise AssertionError("called")

    assert manage_context(LONG, chars, 10_000, "summary", summarize=summarize) == LONG


@pytest.mark.parametrize("strategy", ["summary", "discard_75", "discard_all"])
def test_system_and_task_messages_are_always_kept(strategy):
    msgs = [SYS, U1, A1, T1, A2, T2, A3, U2, A4, T4]
    out = manage_context(msgs, chars, 1, strategy, summarize=lambda h: "s")
    for m in (SYS, U1, U2, A3):
        assert m in out
    assert [m for m in out if m["role"] in ("system", "user") and m["content"] != "s"] == [SYS, U1, U2]


def test_no_tool_history_leaves_an_overlong_context_as_it_is():
    msgs = [SYS, U1, A3]
    assert manage_context(msgs, chars, 1, "discard_all") == msgs


def test_threshold_is_configurable():
    assert manage_context(LONG, chars, 1000, "discard_all", threshold=0.1) != LONG
    assert manage_context(LONG, chars, 1000, "discard_all", threshold=0.5) == LONG


@pytest.mark.parametrize("kwargs, match", [
    ({"strategy": "discard_50"}, "strategy"),
    ({"strategy": "summary"}, "summarize"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        manage_context(LONG, chars, 10, **kwargs)
