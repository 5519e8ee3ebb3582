"""agent.schedule (rollout/agent.py): per_episode sends an episode's next turn to the engine as soon as its own tool
results are back (rollout/engine_stream.py), lockstep waits for every episode's tools. Under a fixed seed and engine
both give the same episodes; only per_episode lets a fast episode go on while a slow tool call runs."""

import json

import numpy as np
import pytest

from rl.advantages import expand_segments
from rollout.agent import AgentConfig, AgentRunner
from rollout.engine_stream import BatchStream
from rollout.sampling import Generation, SamplingParams

FIELDS = ("prompt_ids", "response_ids", "inference_logprobs", "loss_mask", "generated", "kept_ids", "kept_offsets",
          "routed_experts")


def _requests(n_tasks: int):
    return [{"group_id": f"g{i}", "domain": "agent", "prompt_ids": [], "prompt_text": "",
             "sample": {"id": f"smoke-{i}", "prompt": "ignored"}} for i in range(n_tasks)]


def _same(a, b):
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None) == (y is None), f
        if x is not None:
            assert np.array_equal(np.asarray(x), np.asarray(y)), f
    assert (a.episode is None) == (b.episode is None)  # a context segment has none
    if a.episode is not None:
        timeless = lambda e: {k: v for k, v in e.items() if k not in ("tool_wall_s", "calls")}  # noqa: E731
        assert timeless(a.episode) == timeless(b.episode)
        assert [c["status"] for c in a.episode["calls"]] == [c["status"] for c in b.episode["calls"]]


@pytest.mark.parametrize("strategy", ["none", "discard_all"])
def test_per_episode_gives_the_same_episodes_as_lockstep(tiny_moe_path, strategy):
    """The real transformers engine, one request per batch (so no batching changes a number), seeded: every token,
    logprob, kept set and route of every episode (and context segment) is the same under both schedules."""
    from rollout.hf_engine import HFEngine

    engine = HFEngine(tiny_moe_path, record_routes=True, max_batch_size=1)
    sp = SamplingParams(n=2, temperature=1.0, top_p=0.9, max_new_tokens=12, seed=5)
    runner = AgentRunner(engine, engine.tokenizer, AgentConfig(env="smoke"))
    P = len(runner._prompt_ids({"prompt": "What value is stored under the key 'alpha'? Submit it."}))

    def run(schedule):
        cfg = AgentConfig(env="smoke", max_turns=4, max_context_tokens=P + (60 if strategy != "none" else 200),
                          context_strategy=strategy,
                          schedule=schedule)
        return AgentRunner(engine, engine.tokenizer, cfg).run(_requests(2), sp)

    lock, per = run("lockstep"), run("per_episode")
    assert len(lock) == len(per) == 4 and sum(t.episode["turns"] for t in lock) > 4
    assert len({tuple(t.response_ids) for t in lock}) > 1  # the episodes differ from each other
    for a, b in zip(expand_segments(lock), expand_segments(per)):
        _same(a, b)
    if strategy != "none":
        assert any(t.segments for t in per)


def test_seeded_requests_do_not_depend_on_their_batch(tiny_moe_path):
    """The transformers engine's per-prompt seeds: a prompt's sample is the same alone or beside another."""
    from rollout.hf_engine import HFEngine

    engine = HFEngine(tiny_moe_path, record_routes=False, max_batch_size=1)
    sp = SamplingParams(n=1, temperature=1.0, max_new_tokens=8, seed=1)
    a, b = [5, 6, 7, 8], [9, 10, 11]
    ((alone,),) = engine.generate([a], sp, seeds=[123])
    (first,), (second,) = engine.generate([b, a], sp, seeds=[77, 123])
    assert np.array_equal(alone.response_ids, second.response_ids)
    assert np.array_equal(alone.inference_logprobs, second.inference_logprobs)
    with pytest.raises(ValueError, match="seeds for"):
        engine.generate([a, b], sp, seeds=[1])


# -- no barrier --------------------------------------------------------------------------------------------------
WAIT_ENV = '''
import time
from pathlib import Path


def work(state, what: str) -> str:
    """Do some work. 'slow' work waits until the fast episode has finished (its flag file), for at most 20 s.

    Args:
        what: slow or fast.
    """
    if what != "slow":
        return "done"
    flag = Path(state.task["flag"])
    end = time.monotonic() + 20
    while time.monotonic() < end and not flag.exists():
        time.sleep(0.01)
    return "flag seen" if flag.exists() else "flag not seen"


def submit_result(state, answer: str) -> str:
    """Submit.

    Args:
        answer: anything.
    """
    return "ok"


TOOLS = [work, submit_result]


def verify(task, state):
    return (1.0, None) if state.submitted else (0.0, "nothing submitted")
'''


class TurnByContextEngine:
    """Answers an episode's k-th turn (k = tool results in its context) from its task's script, and writes the flag
    file when it generates the fast episode's last turn. Logs (task, turn) in the order it generated them."""

    def __init__(self, tokenizer, scripts: dict[str, list[str]], flag):
        self.tokenizer, self.scripts, self.flag, self.log = tokenizer, scripts, flag, []

    def generate(self, prompts, sp, seeds=None):
        out = []
        for p in prompts:
            text = self.tokenizer.decode(p)
            task = next(k for k in self.scripts if f"task {k}" in text)
            turn = text.count("<tool_response>") - self.base
            self.log.append((task, turn))
            if task == "fast" and turn == len(self.scripts[task]) - 1:
                self.flag.write_text("done")
            ids = self.tokenizer(self.scripts[task][turn] + "<|im_end|>", add_special_tokens=False)["input_ids"]
            out.append([Generation(np.asarray(ids, np.int32), np.full(len(ids), -1.0, np.float32), "stop")])
        return out


def _call(name, **args):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


def _slow_and_fast(tiny_moe_path, tmp_path, schedule: str):
    """Two episodes of WAIT_ENV under `schedule`: a slow one (its tool waits for the fast one to end) and a fast one
    (three quick calls, then submit). Returns (engine, slow trajectory, fast trajectory)."""
    from rl.models import load_tokenizer

    tok = load_tokenizer(tiny_moe_path)
    env = tmp_path / "env"
    env.mkdir()
    flag = tmp_path / "flag"
    (env / "env.yaml").write_text("name: waits\ndescription: Work, then submit.\nlimits: {tool_timeout_s: 30}\n")
    (env / "env.py").write_text(WAIT_ENV)
    (env / "tasks.jsonl").write_text("\n".join(json.dumps(t) for t in (
        {"id": "slow", "prompt": "task slow", "flag": str(flag)}, {"id": "fast", "prompt": "task fast"})) + "\n")
    scripts = {"slow": [_call("work", what="slow"), _call("submit_result", answer="a")],
               "fast": [_call("work", what="fast")] * 3 + [_call("submit_result", answer="b")]}
    engine = TurnByContextEngine(tok, scripts, flag)
    runner = AgentRunner(engine, tok, AgentConfig(env=str(env), max_turns=6, schedule=schedule))
    engine.base = tok.decode(runner._prompt_ids({"prompt": "x"})).count("<tool_response>")
    requests = [{"group_id": k, "domain": "agent", "prompt_ids": [], "prompt_text": "", "sample": {"id": k}}
                for k in ("slow", "fast")]
    slow, fast = runner.run(requests, SamplingParams(n=1, max_new_tokens=64))
    return engine, slow, fast


def test_a_slow_tool_holds_back_only_its_own_episode(tiny_moe_path, tmp_path):
    """The slow episode's tool waits for the fast episode to finish. per_episode: the fast episode's turns go on
    while that tool runs, so the tool sees the flag (in lockstep it never would: test_lockstep_waits_...)."""
    engine, slow, fast = _slow_and_fast(tiny_moe_path, tmp_path, "per_episode")
    assert slow.episode["termination"] == fast.episode["termination"] == "submitted"
    assert "flag seen" in slow.episode["transcript"]
    # the fast episode's four turns were all generated before the slow episode's second
    assert engine.log.index(("fast", 3)) < engine.log.index(("slow", 1))


@pytest.mark.slow
def test_lockstep_waits_for_the_slowest_tool(tiny_moe_path, tmp_path):
    """The other side of the test above: in lockstep the fast episode's second turn waits for the slow tool, which
    gives up after its 20 s without seeing the flag (so this test takes that long)."""
    engine, slow, _ = _slow_and_fast(tiny_moe_path, tmp_path, "lockstep")
    assert "flag not seen" in slow.episode["transcript"]
    assert engine.log.index(("slow", 1)) < engine.log.index(("fast", 3))


def test_batch_stream_hands_back_every_request_once():
    """BatchStream over an engine: what is pending at `wait` is generated in one call per sampling setting, each
    with its own seed, and handed back under its key."""

    class Echo:
        def __init__(self):
            self.calls = []

        def generate(self, prompts, sp, seeds=None):
            self.calls.append((len(prompts), sp.max_new_tokens, seeds))
            return [[Generation(np.asarray(p[-1:], np.int32), np.zeros(1, np.float32), "stop")] for p in prompts]

    engine = Echo()
    stream = BatchStream(engine)
    sp = SamplingParams(max_new_tokens=4, seed=9)
    keys = [stream.submit([1, k], sp, seed=100 + k) for k in range(3)]
    keys.append(stream.submit([1, 7], SamplingParams(max_new_tokens=2, seed=9), seed=5))
    assert len(stream) == 4
    got = dict(stream.wait())
    assert len(stream) == 0 and stream.wait() == []
    assert [int(got[k].response_ids[0]) for k in keys] == [0, 1, 2, 7]
    assert sorted(engine.calls, key=lambda c: c[1]) == [(1, 2, [5]), (3, 4, [100, 101, 102])]
