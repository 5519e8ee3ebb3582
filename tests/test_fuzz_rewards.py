"""Property-based checks of the reward stack (issue 33): random bytes, Unicode and JSON shapes as responses, dataset
fields, `launch.score` input lines and a user reward's return values. Whatever comes in, every sample (line) gets
a finite reward, its reason is a string or None, its rollout-dump line encodes, and nothing raises past a sample.

Derandomised (the same examples on every run, no example database), a few dozen examples each: seconds on 2 cores.
"""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_strategies import FUZZ, any_text, json_shape

from launch.score import score_lines
from launch.tracking import json_line
from rewards.compose import RewardComposer, finite_real
from rl.trajectory import Trajectory

DOMAINS = {
    "logic": {"rewards": [{"name": "exact_match", "weight": 1.0}, {"name": "format", "weight": 0.5},
                          {"name": "length", "weight": 0.5, "mode": "overlong", "buffer": 16, "max_new_tokens": 64},
                          {"name": "language", "weight": 0.2}]},
    "chat": {"rewards": [{"name": "char_fraction", "weight": 1.0, "chars": "aeiou"}, {"name": "language", "weight": 1.0}]},
}


def _check(out: dict) -> None:
    assert isinstance(out["reward"], float) and math.isfinite(out["reward"]), out["reward"]
    assert out["error"] is None or isinstance(out["error"], str)
    json.loads(json_line(out))  # the rollout dump / --out line of it is written whatever it holds


row_fields = st.fixed_dictionaries({}, optional={
    "domain": st.one_of(st.sampled_from(["logic", "chat", "nope"]), json_shape),
    "prompt": st.one_of(any_text, json_shape), "response": st.one_of(any_text, json_shape),
    "answer": st.one_of(any_text, json_shape), "language": json_shape, "finish_reason": json_shape,
    "response_tokens": st.one_of(st.integers(min_value=-(10 ** 20), max_value=10 ** 20), json_shape),
})
line = st.one_of(
    row_fields.map(json.dumps),  # ASCII JSON: lone surrogates travel as \\udxxx escapes
    any_text,  # not JSON at all
    st.integers(1, 100_000).map(lambda n: "[" * n + "]" * n),  # nesting past the JSON parser's recursion limit
    json_shape.map(lambda v: json.dumps(v, allow_nan=True)),  # JSON, but not an object
)


@FUZZ
@given(st.lists(line, min_size=1, max_size=6))
def test_score_lines_scores_every_line_whatever_it_holds(lines):
    cfg = {"domains": DOMAINS, "rewards": {"num_workers": 1}, "rollout": {"max_new_tokens": 64}}
    outs = list(score_lines(lines, cfg))
    assert len(outs) == sum(bool(x.strip()) for x in lines)
    for out in outs:
        _check(out)


@pytest.fixture(scope="module")
def pooled_composer():
    """math-verify and a user's reward in the killable pool, started once for the module."""
    domains = {"math": {"rewards": [{"name": "math", "weight": 1.0}]},
               "mine": {"rewards": [{"name": "custom_reward_example:contains_keyword", "keyword": "blue"},
                                    {"name": "exact_match", "weight": 1.0}]}}
    with RewardComposer(domains, {"num_workers": 1, "math": {"timeout_s": 5.0}}, 64) as c:
        yield c


def _traj(i, domain, text, sample):
    n = 1 + len(text) % 7
    return Trajectory(uid=f"u{i}", group_id="g", domain=domain, prompt_ids=[1], response_ids=np.zeros(n, np.int32),
                      inference_logprobs=np.zeros(n, np.float32), response_text=text, sample=sample)


@settings(FUZZ, max_examples=25)
@given(st.lists(st.tuples(st.sampled_from(["math", "mine"]), any_text, st.dictionaries(
    st.sampled_from(["answer", "prompt", "language", "keyword"]), json_shape, max_size=3)), min_size=1, max_size=4))
def test_pool_rewards_score_any_sample(pooled_composer, samples):
    trajs = [_traj(i, d, text, sample) for i, (d, text, sample) in enumerate(samples)]
    for t in pooled_composer.score(trajs):
        _check({"reward": t.reward, "error": t.reward_error, "parts": t.reward_parts})
        assert all(math.isfinite(v) for v in t.reward_parts.values())


@FUZZ
@given(st.one_of(json_shape, st.integers(), st.complex_numbers(), st.fractions(), st.decimals(),
                 st.just(np.float32("nan")), st.just(np.array([1.0, 2.0])), st.just(10 ** 5000)))
def test_any_return_value_is_a_finite_real_or_none(value):
    score = finite_real(value)
    assert score is None or (isinstance(score, float) and math.isfinite(score))
