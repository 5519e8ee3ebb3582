"""Language consistency reward."""

import time

import pytest

from rewards.language_reward import language_consistency, prose_only, segments
from rewards.spec import SampleView
from rewards.text import answer_part, sanitize

P = {"model": "lite", "min_detect_chars": 12, "max_segments": 2000}


def score(response, prompt="", language=None):
    sample = {"prompt": prompt}
    if language:
        sample["language"] = language
    r = sanitize(response)
    return language_consistency(SampleView(r, answer_part(r), sample, "stop", 1, "general", 1), P)


ZH_PROMPT = "请用简单的语言解释什么是光合作用。"
EN_TEXT = ("Photosynthesis is how plants make food. They use sunlight, water and carbon dioxide. "
           "The result is sugar and oxygen.")
ZH_TEXT = "光合作用是植物制造食物的过程。它们利用阳光、水和二氧化碳。结果是产生糖和氧气。"


def test_same_language_scores_high():
    assert score(ZH_TEXT, ZH_PROMPT) > 0.9
    assert score(EN_TEXT, "Explain photosynthesis simply.") > 0.9
    assert score("<think>Let me recall what the plants do with light.</think>" + EN_TEXT, "Explain photosynthesis.") > 0.9


def test_wrong_language_scores_low():
    assert score(EN_TEXT, ZH_PROMPT) < 0.1
    assert score(ZH_TEXT, "Explain photosynthesis simply.") < 0.1
    assert score(EN_TEXT, "Explique la photosynthèse simplement.", language="fr") < 0.2


def test_mixed_response_is_character_weighted():
    s = score("<think>" + EN_TEXT + "</think>" + ZH_TEXT, ZH_PROMPT)
    assert 0.2 < s < 0.8


def test_code_and_math_are_ignored():
    resp = ZH_TEXT + "\n```python\nprint('this is english code with many words in it')\n```\n设 $x = \\frac{a}{b}$，`len(xs)`。"
    assert score(resp, ZH_PROMPT) > 0.9
    assert "english code" not in prose_only(resp)


def test_language_field_wins_and_region_is_ignored():
    assert score(ZH_TEXT, "Explain photosynthesis.", language="zh-CN") > 0.9


def test_nothing_to_judge_is_one():
    assert score("$$x^2$$ 12345 ```\ncode\n```", ZH_PROMPT) == 1.0
    assert score("", "") == 1.0


@pytest.mark.parametrize("hostile", ["word " * 200_000, "\ud800\x00\x01 text", "$" * 100_000, "。" * 100_000,
                                     "<think>" * 1000, "a" * 1_000_000])
def test_hostile_input_is_bounded(hostile):
    t0 = time.monotonic()
    s = score(hostile, "Explain this.")
    assert 0.0 <= s <= 1.0
    assert time.monotonic() - t0 < 10


def test_segments_drop_letterless_parts():
    assert segments("123. ---\nHello there.") == ["Hello there."]
