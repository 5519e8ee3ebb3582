"""Property-based checks of the agent loop (issue 33): random bytes, arbitrary Unicode (lone surrogates, control
characters, huge strings) and random JSON shapes as model turns, tool-call arguments and tool results, through the
tool-call parsers (hermes, dsml), a session's call path, the rendering and tokenising of tool results, and whole
episodes. Whatever comes in, nothing raises past an episode, and what is tokenised and logged is valid text.

Derandomised (the same examples on every run, no example database), a few dozen examples each: seconds on 2 cores.
"""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_strategies import FUZZ, any_text, decode_pass, json_shape

from rl.models import load_tokenizer
from rollout.agent import AgentConfig, AgentRunner
from rollout.episode import Episode, safe_text
from rollout.envs.base import STATUSES, ToolResult, load_env
from rollout.sampling import Generation, SamplingParams
from rollout.tool_format import ParsedTurn, ToolCall, dsml_invoke, tool_format

FUZZ = settings(FUZZ, max_examples=80)
FUZZ_MORE = settings(FUZZ, max_examples=200)  # the parsers are cheap


MARKUP = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<|im_end|>", "<|im_start|>",
          "<think>", "</think>", '{"name": "echo", "arguments": ', '{"name": "submit_result", "arguments": {', "}",
          '"', "\\ud800", "\\u0000", "<｜DSML｜function_calls>", "</｜DSML｜function_calls>", '<｜DSML｜invoke name="echo">',
          "</｜DSML｜invoke>", '<｜DSML｜parameter name="text" string="true">', '<｜DSML｜parameter name="n" string="false">',
          "</｜DSML｜parameter>", "<｜end▁of▁sentence｜>", "[" * 50, "{" * 30]
tool_name = st.one_of(st.sampled_from(["echo", "count", "ret", "submit_result", "boom"]), any_text)


@st.composite
def model_text(draw) -> str:
    """A model turn: free text and markup fragments, and well-formed calls (hermes or dsml) with random arguments."""
    parts = []
    for kind in draw(st.lists(st.sampled_from(["text", "markup", "hermes", "dsml"]), max_size=6)):
        if kind == "text":
            parts.append(draw(any_text))
        elif kind == "markup":
            parts.append(draw(st.sampled_from(MARKUP)))
        else:
            name, args = draw(tool_name), draw(st.one_of(st.dictionaries(any_text, json_shape, max_size=4), json_shape))
            if kind == "hermes":
                ascii_only = draw(st.booleans())
                payload = json.dumps({"name": name, "arguments": args}, ensure_ascii=ascii_only, allow_nan=True)
                parts.append(f"<tool_call>\n{payload}\n</tool_call>")
            elif isinstance(args, dict):
                parts.append("<｜DSML｜function_calls>\n" + dsml_invoke(name, args) + "\n</｜DSML｜function_calls>")
    return "".join(parts)


short_text = st.one_of(st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=12),
                      st.binary(max_size=12).map(decode_pass),
                      st.sampled_from(["hi", "\ud800", "\x00", "raise \udcff", "<|im_end|>", "</tool_call>"]))
small_json = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10, 10), st.floats(), short_text),
                          lambda kids: st.one_of(st.lists(kids, max_size=3), st.dictionaries(short_text, kids,
                                                                                             max_size=3)),
                          max_leaves=4)
ARGS = {"echo": st.fixed_dictionaries({"text": short_text}),
        "count": st.fixed_dictionaries({"n": st.one_of(st.integers(-60, 60), small_json)},
                                       optional={"items": st.one_of(st.lists(short_text, max_size=3), small_json)}),
        "ret": st.fixed_dictionaries({}, optional={"value": small_json}),
        "submit_result": st.fixed_dictionaries({"answer": st.one_of(st.just("hi"), short_text)}),
        "boom": st.just({})}
plausible_call = st.one_of(  # mostly the right arguments for the tool named, sometimes anything
    *(st.tuples(st.just(name), args) for name, args in ARGS.items()),
    st.tuples(st.one_of(st.sampled_from(sorted(ARGS)), short_text),
              st.one_of(*ARGS.values(), st.dictionaries(short_text, small_json, max_size=2))),
)


@st.composite
def episode_turn(draw) -> str:
    """A model turn as a policy might write it: a few calls of the environment's tools (hermes or dsml) with
    small random arguments, between bits of text and markup."""
    parts = []
    for kind in draw(st.lists(st.sampled_from(["call", "call", "text", "markup", "dsml"]), min_size=1, max_size=4)):
        if kind == "text":
            parts.append(draw(short_text))
        elif kind == "markup":
            parts.append(draw(st.sampled_from(MARKUP)))
        else:
            name, args = draw(plausible_call)
            if kind == "dsml":
                parts.append("<｜DSML｜function_calls>\n" + dsml_invoke(name, args) + "\n</｜DSML｜function_calls>")
            else:
                payload = json.dumps({"name": name, "arguments": args}, ensure_ascii=draw(st.booleans()))
                parts.append(f"<tool_call>\n{payload}\n</tool_call>")
    return "\n".join(parts)


FUZZ_ENV = '''
from typing import Any

from rollout.envs.base import ToolError


def echo(state, text: str) -> str:
    """Echo text back.

    Args:
        text: anything.
    """
    return text


def count(state, n: int, items: list[str] | None = None) -> dict:
    """Count.

    Args:
        n: a number.
        items: some strings.
    """
    return {"n": n, "items": items, "raw": "\\udcff\\x00" * min(abs(n), 50)}


def ret(state, value: Any = None) -> Any:
    """Return the value as it is, or raise it when it is a string starting with 'raise'.

    Args:
        value: any JSON value.
    """
    if isinstance(value, str) and value.startswith("raise"):
        raise ToolError(value)
    return value


def boom(state) -> str:
    """Raise with a message that is not valid text."""
    raise ValueError("bad \\ud800 \\x00 text")


def submit_result(state, answer: str) -> str:
    """Submit.

    Args:
        answer: the answer.
    """
    return "ok \\udfff"


TOOLS = [echo, count, ret, boom, submit_result]


def verify(task, state):
    return (1.0, None) if state.submission == task["answer"] else (0.0, f"got {state.submission!r:.100}")
'''


@pytest.fixture(scope="module")
def tok(tiny_moe_path):
    return load_tokenizer(tiny_moe_path)


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz_env")
    limits = "{tool_timeout_s: 2, max_output_chars: 300}"
    (d / "env.yaml").write_text(f"name: fuzz\ndescription: Fuzzing.\nlimits: {limits}\n")
    (d / "env.py").write_text(FUZZ_ENV)
    (d / "tasks.jsonl").write_text(json.dumps({"id": "f0", "prompt": "say hi \ud800", "answer": "hi"}) + "\n")
    return d


@pytest.fixture(scope="module")
def formats(tok):
    return {"hermes": tool_format("hermes", tok), "dsml": tool_format("dsml", tok)}


def _valid(text: str) -> None:
    assert isinstance(text, str)
    text.encode("utf-8")  # no lone surrogate: what the tokenizer and a UTF-8 log file take


# ------------------------------------------------------------------------------------------------ the parsers
@FUZZ_MORE
@given(text=st.one_of(model_text(), any_text))
def test_parsers_never_raise_and_return_calls_or_errors(formats, text):
    for fmt in formats.values():
        turn = fmt.parse(text)
        assert isinstance(turn, ParsedTurn) and isinstance(turn.content, str)
        assert all(isinstance(c.name, str) and isinstance(c.arguments, dict) for c in turn.tool_calls)
        assert all(isinstance(e, str) for e in turn.errors)


@FUZZ
@given(name=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,24}", fullmatch=True),
       args=st.dictionaries(st.text(min_size=1, max_size=20).filter(lambda s: not set(s) & set('"<>')),
                            json_shape, max_size=4))
def test_a_well_formed_call_parses_back(formats, name, args):
    """What `call_text` writes, `parse` reads back as the same call (JSON values compare as JSON: NaN aside)."""
    args = json.loads(json.dumps(args))  # the JSON view of the arguments (tuples, -0.0 and the like normalised)
    if "NaN" in json.dumps(args) or "think>" in json.dumps(args, ensure_ascii=False):
        return  # reasoning markers end a call: one holding them is not well formed (the model is told so)
    for fmt_name, fmt in formats.items():
        if fmt_name == "dsml" and any("</｜DSML｜parameter>" in json.dumps(v, ensure_ascii=False)
                                      or (isinstance(v, str) and "｜DSML｜" in v) for v in args.values()):
            continue
        turn = fmt.parse(fmt.call_text([(name, args)]) + fmt.end_token)
        assert [(c.name, c.arguments) for c in turn.tool_calls] == [(name, args)], (fmt_name, turn.errors)


# ---------------------------------------------------------------------------------------------- the session
@FUZZ
@given(calls=st.lists(st.tuples(tool_name, st.one_of(st.dictionaries(any_text, json_shape, max_size=3), json_shape,
                                                     st.fixed_dictionaries({"value": json_shape}),
                                                     st.fixed_dictionaries({"text": any_text}))), max_size=4))
def test_session_calls_never_raise(env_dir, calls):
    env = load_env(str(env_dir))
    session = env.reset(env.tasks()[0])
    try:
        for name, args in calls:
            res = session.call(name, args)
            assert isinstance(res, ToolResult) and res.status in STATUSES and isinstance(res.content, str)
            assert len(res.content) <= 300 + 80  # cut in the middle, with its marker
    finally:
        session.close()


# ------------------------------------------------------------------------- rendering and tokenising results
@FUZZ
@given(contents=st.lists(st.one_of(any_text, json_shape.map(lambda v: json.dumps(v, ensure_ascii=False,
                                                                                  allow_nan=True))),
                         min_size=1, max_size=3),
       errors=st.lists(any_text, max_size=2), cut=st.booleans())
def test_tool_results_are_rendered_and_tokenised_whatever_they_hold(tok, env_dir, contents, errors, cut):
    """The one place where tool results become tokens (`AgentRunner._tool_message`): any content gives valid
    text and ids, and no content adds a special token (markup inside results stays text)."""
    runner = _runner(tok, env_dir, [])
    specials = set(tok.all_special_ids)

    def message(items, errs):
        ep = Episode({}, 0, None, [], parsed=ParsedTurn("", None, [], errs), cut_turn=cut)
        return runner._tool_message(ep, [(ToolCall("echo", {}), ToolResult(c, "ok", 0.0)) for c in items])

    text, ids = message(contents, errors)
    _valid(text)
    assert all(isinstance(i, int) and 0 <= i < len(tok) for i in ids)
    _, plain = message(["x"] * len(contents), ["x"] * len(errors))
    assert sum(i in specials for i in ids) == sum(i in specials for i in plain)
    assert safe_text(text) == text


# ------------------------------------------------------------------------------------------- whole episodes
class FuzzEngine:
    """Answers turn k of every episode with turns[k]: a text (tokenised once it is safe, as the model could only
    have written valid text), or a list of raw token ids (whatever they decode to)."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.n = tokenizer, turns, 0

    def generate(self, prompts, sp, seeds=None):
        turn = self.turns[min(self.n, len(self.turns) - 1)]
        self.n += 1
        if isinstance(turn, str):
            # no more than max_new_tokens of it is ever seen; tokenising all of a huge text would only cost time
            turn = self.tokenizer(safe_text(turn[:2000]) + "<|im_end|>", add_special_tokens=False)["input_ids"]
        ids = np.asarray(turn[: sp.max_new_tokens], np.int32)
        reason = "stop" if len(ids) < sp.max_new_tokens else "length"
        return [[Generation(ids, np.full(len(ids), -1.0, np.float32), reason)] for _ in prompts]


def _runner(tok, env_dir, turns, **kw):
    return AgentRunner(FuzzEngine(tok, turns), tok, AgentConfig(env=str(env_dir), **kw))


@FUZZ
@given(turns=st.lists(st.one_of(episode_turn(), episode_turn(), model_text(), st.lists(st.integers(0, 2047), max_size=60)),
                      min_size=1, max_size=3),
       require_submit=st.booleans(), fmt=st.sampled_from(["hermes", "dsml"]))
def test_episodes_end_with_a_record_whatever_the_model_writes(tok, env_dir, turns, require_submit, fmt):
    runner = _runner(tok, env_dir, turns, max_turns=3, max_context_tokens=3000, max_tool_output_tokens=64,
                     require_submit=require_submit, tool_workers=2, format=fmt)
    try:
        trajs = runner.run([{"group_id": "g", "domain": "agent", "sample": {"id": "f0", "prompt": "x"}}],
                           SamplingParams(n=2, max_new_tokens=400, seed=1))
    finally:
        runner.close()
    assert len(trajs) == 2
    for t in trajs:
        ep = t.episode
        assert ep["termination"] in ("submitted", "answer", "max_turns", "length", "tool_timeout"), ep.get("error")
        assert 0.0 <= ep["outcome"]["score"] <= 1.0
        assert len(t.response_ids) == len(t.inference_logprobs) == len(t.loss_mask) == len(t.generated)
        assert len(t.prompt_ids) + len(t.response_ids) <= 3000
        _valid(ep["transcript"])
        json.dumps(ep, ensure_ascii=False).encode("utf-8")  # what rollouts/step_N.jsonl holds
