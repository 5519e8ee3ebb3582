"""Per-domain thinking mode (`domains.<d>.thinking`, issue 35): prompts rendered in the domain's mode with the
embedded tokenizer's template, `both` drawn per prompt group deterministically (and the same after a resume), the
mode carried from the request to every sample (single-turn and agent episodes), config errors, metrics by mode."""

import json

import numpy as np
import pytest

from rl.config import ConfigError, validate_domains
from rl.data import EvalPrompts, PromptMixture, draw_mode, render_prompt, thinking_modes
from rl.metrics import rollout_metrics
from rl.models import load_tokenizer
from rl.trajectory import Trajectory
from rollout.agent import AgentConfig, AgentRunner
from rollout.sampling import SamplingParams
from test_agent import LOOKUP, SUBMIT, ScriptedEngine

EMPTY_THINK = "<think>\n\n</think>\n\n"  # the non-thinking prefill of the embedded (Qwen3-style) template
MATH = {"path": "bundled:math.jsonl", "columns": {"prompt": "question", "answer": "answer"}}


@pytest.fixture(scope="module")
def tok(tiny_moe_path):
    return load_tokenizer(tiny_moe_path)


def test_render_prompt_follows_the_mode(tok):
    row = {"prompt": "What is 2 + 3?"}
    plain, plain_ids = render_prompt(tok, "Be brief.", row, {})
    on, _ = render_prompt(tok, "Be brief.", row, {}, thinking=True)
    off, off_ids = render_prompt(tok, "Be brief.", row, {}, thinking=False)
    assert off.endswith("<|im_start|>assistant\n" + EMPTY_THINK) and not on.endswith(EMPTY_THINK)
    assert on == plain  # the embedded template thinks unless told not to; null leaves the kwargs as given
    assert off_ids == tok(off, add_special_tokens=False)["input_ids"] != plain_ids
    # the domain's mode wins over a run-wide enable_thinking in data.chat_template_kwargs; null keeps that one
    assert render_prompt(tok, None, row, {"enable_thinking": False}, thinking=True)[0] == \
        render_prompt(tok, None, row, {})[0]
    assert render_prompt(tok, None, row, {"enable_thinking": False})[0].endswith(EMPTY_THINK)


@pytest.mark.parametrize("spec, modes", [
    ({}, None),
    ({"thinking": None}, None),
    ({"thinking": True}, [True]),
    ({"thinking": False}, [False]),
    ({"thinking": "both"}, [True, False]),
    ({"agent": {"env": "smoke", "thinking": True}}, [True]),  # the older agent.thinking, when the domain sets none
    ({"agent": {"env": "smoke"}}, None),
    ({"thinking": False, "agent": {"env": "smoke"}}, [False]),
])
def test_thinking_modes(spec, modes):
    assert thinking_modes(spec) == modes


def _mixture(tok, thinking, seed=1):
    domains = {"math": {"weight": 3.0, "dataset": MATH, "thinking": thinking},
               "plain": {"weight": 1.0, "dataset": {**MATH, "system_prompt": "Be brief."}}}
    return PromptMixture(domains, tok, seed=seed, max_prompt_tokens=512)


def test_both_draws_a_mode_per_prompt_deterministically_and_in_equal_shares(tok):
    a, b = _mixture(tok, "both"), _mixture(tok, "both")
    steps = [a.next_batch(8) for _ in range(6)]
    assert [[p["thinking"] for p in s] for s in steps] == [[p["thinking"] for p in b.next_batch(8)] for _ in range(6)]
    for s in steps:
        math = [p["thinking"] for p in s if p["domain"] == "math"]
        assert set(math) <= {True, False} and abs(math.count(True) - math.count(False)) <= 1  # alternating
        assert all(p["thinking"] is None for p in s if p["domain"] == "plain")  # no mode set: none recorded
        for p in s:  # each prompt is rendered in its own mode
            system = None if p["domain"] == "math" else "Be brief."
            assert p["prompt_text"] == render_prompt(tok, system, {"prompt": p["sample"]["prompt"]}, {},
                                                     p["thinking"])[0]
    drawn = [p["thinking"] for s in steps for p in s if p["domain"] == "math"]
    assert drawn.count(True) and drawn.count(False)
    # another seed starts the alternation elsewhere on some step
    c = _mixture(tok, "both", seed=2)
    other = [[p["thinking"] for p in c.next_batch(8) if p["domain"] == "math"] for _ in range(6)]
    assert other != [[p["thinking"] for p in s if p["domain"] == "math"] for s in steps]


def test_a_resumed_mixture_draws_the_same_modes(tok):
    a = _mixture(tok, "both")
    for _ in range(3):
        a.next_batch(8)
    state = json.loads(json.dumps(a.state_dict()))
    upcoming = [[(p["domain"], p["index"], p["thinking"]) for p in a.next_batch(8)] for _ in range(3)]
    resumed = _mixture(tok, "both")
    resumed.load_state_dict(state)
    assert [[(p["domain"], p["index"], p["thinking"]) for p in resumed.next_batch(8)] for _ in range(3)] == upcoming


@pytest.mark.parametrize("thinking", [True, False, None])
def test_a_single_mode_renders_every_prompt_so(tok, thinking):
    batch = _mixture(tok, thinking).next_batch(16)
    math = [p for p in batch if p["domain"] == "math"]
    assert math and all(p["thinking"] is thinking for p in math)
    assert all(p["prompt_text"].endswith(EMPTY_THINK) == (thinking is False) for p in math)


def test_draw_mode_without_modes_is_none():
    assert draw_mode(None, 1, 0, "math", 0) is None
    assert [draw_mode([False], 1, s, "math", k) for s in range(3) for k in range(3)] == [False] * 9


def test_eval_prompts_alternate_the_modes_of_both(tok):
    domains = {"math": {"weight": 1.0, "dataset": MATH, "thinking": "both",
                        "eval_dataset": {"path": "bundled:eval/math.jsonl", "columns": MATH["columns"]}}}
    ev = EvalPrompts(domains, tok, max_prompts=4, max_prompt_tokens=512)
    assert [r["thinking"] for r in ev.requests] == [True, False, True, False]
    assert [r["prompt_text"].endswith(EMPTY_THINK) for r in ev.requests] == [False, True, False, True]


@pytest.mark.parametrize("domain, match", [
    ({"thinking": "sometimes"}, r"domains\.d\.thinking must be true, false, both or null"),
    ({"thinking": 1}, r"domains\.d\.thinking must be"),  # 1 == True in Python: refused all the same
    ({"thinking": "both", "agent": {"env": "smoke", "thinking": False}}, r"domains\.d\.thinking=both and "
     r"domains\.d\.agent\.thinking=False disagree"),
    ({"thinking": True, "agent": {"env": "smoke", "demo": True}}, r"domains\.d\.thinking=True: agent\.demo"),
])
def test_bad_thinking_values_name_the_key(domain, match):
    block = {"weight": 1.0, "kl_coef": 0.0, "dataset": MATH, **domain}
    with pytest.raises(ConfigError, match=match):
        validate_domains({"d": block})


def test_thinking_agreeing_with_agent_thinking_is_fine():
    validate_domains({"d": {"weight": 1.0, "kl_coef": 0.0, "dataset": MATH, "thinking": False,
                            "agent": {"env": "smoke", "thinking": False, "demo": True}}})


def test_the_cli_refuses_a_bad_mode_with_one_line():
    from launch.config import check_config, compose

    with pytest.raises(ConfigError, match=r"^domains\.logic\.thinking must be"):
        check_config(compose(["+experiment=mixed_rl", "+domains.logic.thinking=maybe"]))
    cfg = compose(["+experiment=mixed_rl"])
    check_config(cfg)
    assert cfg["domains"]["math"]["thinking"] == "both"  # the embedded default exercises it


def _traj(uid, domain, reward, thinking, length=3):
    t = Trajectory(uid=uid, group_id=uid[:2], domain=domain, prompt_ids=[1], response_ids=np.arange(length),
                   inference_logprobs=np.zeros(length), thinking=thinking)
    t.reward = reward
    return t


def test_metrics_split_by_mode():
    trajs = [_traj("m1a", "math", 1.0, True, 4), _traj("m1b", "math", 0.0, True, 2),
             _traj("m2a", "math", 0.5, False, 6), _traj("l1a", "logic", 1.0, None)]
    m = rollout_metrics(trajs, {"math": ["math"], "logic": ["exact_match"]}, domain_modes={"math": [True, False]})
    assert m["mode/math/thinking/reward_mean"] == 0.5 and m["mode/math/thinking/response_length_mean"] == 3.0
    assert m["mode/math/non_thinking/reward_mean"] == 0.5 and m["mode/math/non_thinking/response_length_mean"] == 6.0
    assert not any(k.startswith("mode/logic/") for k in m)  # no mode set, none carried: not split
    # a step that drew only thinking prompts of math: the other mode's keys are there, null
    only = rollout_metrics(trajs[:2], {"math": ["math"]}, domain_modes={"math": [True, False]})
    assert only["mode/math/non_thinking/reward_mean"] is None and only["mode/math/thinking/reward_mean"] == 0.5
    # samples that carry a mode are split even where the config was not passed
    assert rollout_metrics(trajs[2:3])["mode/math/non_thinking/reward_mean"] == 0.5


def test_saved_rollouts_carry_the_mode(tmp_path):
    from launch.tracking import Tracker

    cfg = {"logger": {"mode": "disabled", "progress_bar": False, "save_rollouts": True}}
    tracker = Tracker(cfg, tmp_path, total_steps=1, start_step=0, resume=False)
    tracker.save_rollouts("step_000001", [_traj("m1a", "math", 1.0, False), _traj("l1a", "logic", 0.0, None)])
    lines = [json.loads(x) for x in (tmp_path / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    assert lines[0]["thinking"] is False and "thinking" not in lines[1]


def test_the_rollout_worker_gives_every_sample_of_a_group_its_requests_mode(tok, tiny_moe_path):
    from rollout.worker import RolloutWorker

    cfg = {"seed": 1, "model": {"dtype": "float32", "attn_implementation": "sdpa"},
           "algorithm": {"keep_routing": False, "keep_sampling_mask": False},
           "rollout": {"engine": "hf", "device": "cpu", "n_samples": 2, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                       "max_new_tokens": 4, "max_batch_size": 8},
           "domains": {"math": {"weight": 1.0, "dataset": MATH, "thinking": "both"}}}
    worker = RolloutWorker(cfg, tiny_moe_path, 0)
    requests = []
    for i, thinking in enumerate([True, False, None]):
        text, ids = render_prompt(tok, None, {"prompt": "1 + 1?"}, {}, thinking)
        requests.append({"group_id": f"g{i}", "domain": "math", "prompt_ids": ids, "prompt_text": text,
                         "sample": {"prompt": "1 + 1?"}, "thinking": thinking})
    trajs = worker.generate(requests, step=0)
    assert [(t.group_id, t.thinking) for t in trajs] == [("g0", True), ("g0", True), ("g1", False), ("g1", False),
                                                         ("g2", None), ("g2", None)]


def test_the_agent_runner_renders_each_episode_in_its_requests_mode(tok):
    """Episodes of both modes in one call: each first prompt and each tool-result text (the next turn's prefill)
    follows its own episode's mode, so the runner holds one tool-call format per mode."""
    engine = ScriptedEngine(tok, [LOOKUP, SUBMIT])
    runner = AgentRunner(engine, tok, AgentConfig(env="smoke"))  # agent.thinking false: the default mode
    requests = [{"group_id": f"g{i}", "domain": "agent", "prompt_ids": [], "prompt_text": "", "thinking": mode,
                 "sample": {"id": "smoke-0", "prompt": "x"}} for i, mode in enumerate([True, False, None])]
    trajs = runner.run(requests, SamplingParams(n=1, temperature=1.0, max_new_tokens=64, seed=1))
    first = [tok.decode(p) for p in engine.calls[0]]
    assert [f.endswith(EMPTY_THINK) for f in first] == [False, True, True]  # None: agent.thinking (false)
    assert first[0].endswith("<|im_start|>assistant\n")
    second = [tok.decode(p) for p in engine.calls[1]]  # after the lookup's result: the prefill of each mode again
    assert [s.endswith(EMPTY_THINK) for s in second] == [False, True, True]
    assert [t.thinking for t in trajs] == [True, False, None]
    assert all(t.episode["termination"] == "submitted" for t in trajs)
    # the episode's messages: the task, the model's turns as parsed, the tool result as the model read it
    msgs = trajs[0].episode["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": {"key": "alpha"}}
    assert msgs[3]["content"] == "17" and msgs[4]["tool_calls"][0]["function"]["name"] == "submit_result"
