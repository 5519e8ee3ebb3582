"""Inline rule rewards: exact_match, format, char_fraction, length, and the text helpers, incl. hostile input."""

import time

import pytest

from rewards.spec import RewardZero, SampleView
from rewards.rule_rewards import char_fraction, exact_match, format_reward, length_penalty, pick_short_answer
from rewards.text import answer_part, last_boxed, last_python_block, sanitize


def view(response, sample=None, n=10, finish="stop", max_new=1000):
    response = sanitize(response)
    return SampleView(response, answer_part(response), sample or {}, finish, n, "d", max_new)


HOSTILE = ["x" * 1_000_000, "\ud800\udfff bad \x00\x01\x1b[31m", "<think><think></think>", "</think></think>x",
           "<think>never closed", "\\boxed{" * 10000, "```" * 50000, "\u202e\ufeff" * 1000]


def test_sanitize_makes_valid_utf8():
    s = sanitize("a\ud800b\x00c")
    s.encode("utf-8")
    assert s.startswith("a") and "\x00" not in s


def test_answer_part_rules():
    assert answer_part("<think>r</think> A") == " A"
    assert answer_part("<think>r never closed") == ""
    assert answer_part("plain") == "plain"
    assert answer_part("r</think>ans") == "ans"  # template opened <think> in the prompt


def test_boxed_and_code_block_extraction():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{unclosed") is None
    text = "```python\nx=1\n```\n```bash\nls\n```\n```\ny=2\n```\n```python\nunclosed"
    assert last_python_block(text) == "y=2\n"


@pytest.mark.parametrize("response,gold,score", [
    ("<think>hmm</think>Answer: **Alice**.", "alice", 1.0),
    ("so it is\n\\boxed{\\text{Carol}}", "Carol", 1.0),
    ("Final answer: 12:15", "12:15", 1.0),
    ("The answer is (B).", "B", 1.0),
    ("Let me think.\nfriday", "Friday", 1.0),
    ("Answer: Bob", "Alice", 0.0),
    ("Alice\nBob\nCarol", "Alice", 0.0),  # only the last line counts, listing options does not pay
    ("答案：4", "4", 1.0),
])
def test_exact_match(response, gold, score):
    assert exact_match(view(response, {"answer": gold}), {"max_answer_chars": 4000}) == score


def test_pick_short_answer_priority():
    assert pick_short_answer("Answer: 3\nbut \\boxed{4}") == "4"
    assert pick_short_answer("Answer: 3\nmore text") == "3"


def test_exact_match_empty_answer_is_reasoned_zero():
    with pytest.raises(RewardZero):
        exact_match(view("<think>only thinking", {"answer": "x"}), {"max_answer_chars": 4000})


@pytest.mark.parametrize("response,thinking,in_prompt,score", [
    ("<think>reason</think>answer", True, False, 1.0),
    ("  <think>reason</think>\nanswer", True, False, 1.0),
    ("<think>reason</think>   ", True, False, 0.0),
    ("answer <think>reason</think> more", True, False, 0.0),
    ("<think>a</think><think>b</think>c", True, False, 0.0),
    ("<think>unclosed answer", True, False, 0.0),
    ("reason</think>answer", True, True, 1.0),
    ("<think>reason</think>answer", True, True, 0.0),
    ("plain answer", False, False, 1.0),
    ("<think>x</think>answer", False, False, 0.0),
    ("", False, False, 0.0),
])
def test_format(response, thinking, in_prompt, score):
    assert format_reward(view(response), {"thinking": thinking, "think_in_prompt": in_prompt}) == score


def test_format_auto_follows_each_samples_mode():
    """`thinking: auto` (the default): a `both` domain's samples are each held to their own mode; a sample of a
    domain with no mode set, to thinking (the earlier default)."""
    import dataclasses

    p = {"thinking": "auto", "think_in_prompt": False}
    think, plain = view("<think>reason</think>answer"), view("plain answer")
    assert format_reward(dataclasses.replace(think, thinking=True), p) == 1.0
    assert format_reward(dataclasses.replace(plain, thinking=True), p) == 0.0
    assert format_reward(dataclasses.replace(plain, thinking=False), p) == 1.0
    assert format_reward(dataclasses.replace(think, thinking=False), p) == 0.0
    assert format_reward(think, p) == 1.0 and format_reward(plain, p) == 0.0  # no mode: thinking


def test_char_fraction():
    p = {"chars": "0123456789"}
    assert char_fraction(view("12 34"), p) == 1.0
    assert char_fraction(view("<think>abc</think>1a"), p) == 0.5
    assert char_fraction(view(""), p) == 0.0


def test_length_overlong_and_linear():
    p = {"mode": "overlong", "buffer": 100, "max_new_tokens": None, "target": None, "scale": None}
    assert length_penalty(view("x", n=900), p) == 0.0
    assert length_penalty(view("x", n=950), p) == pytest.approx(-0.5)
    assert length_penalty(view("x", n=1000), p) == -1.0
    assert length_penalty(view("x", n=10, finish="length"), p) == -1.0
    lin = {"mode": "linear", "target": 100, "scale": 200.0, "buffer": None, "max_new_tokens": None}
    assert length_penalty(view("x", n=100), lin) == 0.0
    assert length_penalty(view("x", n=200), lin) == pytest.approx(-0.5)
    assert length_penalty(view("x", n=10_000), lin) == -1.0


@pytest.mark.parametrize("hostile", HOSTILE)
def test_rules_survive_hostile_input_quickly(hostile):
    t0 = time.monotonic()
    v = view(hostile, {"answer": "x"})
    for fn, p in ((format_reward, {"thinking": True, "think_in_prompt": False}), (char_fraction, {"chars": "x"})):
        assert 0.0 <= fn(v, p) <= 1.0
    try:
        assert exact_match(v, {"max_answer_chars": 4000}) in (0.0, 1.0)
    except RewardZero:
        pass
    last_python_block(hostile)
    assert time.monotonic() - t0 < 2.0
