"""The search_long environment (rollout/envs/search_long): every reference solution passes and every perturbation
fails (check_env, training and held-out tasks), the chains are followable article by article, generate.py rebuilds
the committed files byte for byte, and solving a task the intended way needs more tokens than a context window
holds (the reason the environment exists: agent.context_strategy)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rl.models import load_tokenizer
from rollout.envs.base import check_env, load_env
from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
ENV_DIR = ROOT / "rollout" / "envs" / "search_long"
EVAL = ROOT / "rl" / "bundled" / "eval" / "search_long.jsonl"
WINDOW = 2048  # the smallest window the task set is meant for (benchmarks/context_strategies.py uses 2560)


def _module(name: str, path: Path):
    return load_script(path, name)


@pytest.fixture(scope="module")
def env():
    return load_env("search_long")


@pytest.fixture(scope="module")
def held_out():
    return [json.loads(x) for x in EVAL.read_text(encoding="utf-8").splitlines() if x.strip()]


def test_every_reference_solution_passes_and_every_perturbation_fails(env, held_out):
    train = env.tasks()
    assert len(train) == 48 and len(held_out) == 16
    report = check_env(env, train + held_out)
    assert report["ok"], report["failures"][:5]
    # no_submit, extended, truncated, previous_hop and off_by_one (every answer is a number) per task
    assert report["reference_passed"] == 64 and report["perturbed_failed"] == report["perturbed"] == 64 * 5


def test_tasks_are_chains_of_five_to_eight_followable_articles(env, held_out):
    docs = {d["id"]: d for d in map(json.loads, (ENV_DIR / "docs.jsonl").read_text(encoding="utf-8").splitlines())}
    train = env.tasks()
    for split in (train, held_out):
        assert sorted({len(t["hops"]) for t in split}) == [5, 6, 7, 8]
    for t in train + held_out:
        hops = t["hops"]
        assert len({h["doc"] for h in hops}) == len(hops)  # no article twice
        assert t["prompt"].startswith(f"Start from {hops[0]['query']}.")
        for here, nxt in zip(hops, hops[1:]):  # the next name to search for is in the article just read
            assert nxt["query"] in docs[here["doc"]]["text"], (t["id"], here["doc"], nxt["query"])
        assert t["answers"][0] in docs[hops[-1]["doc"]]["text"] and t["previous_answer"] != t["answers"][0]
    ids = [t["id"] for t in train + held_out]
    assert len(set(ids)) == len(ids) and not set(env.tasks()[0]) - {"id", "prompt", "answers", "hops",
                                                                     "previous_answer"}
    # held-out tasks start where no training task starts
    assert not {t["hops"][0]["doc"] for t in train} & {t["hops"][0]["doc"] for t in held_out}
    # the tool schemas speak of this world, not the search environment's
    assert "ada_vell" in json.dumps(env.tool_schemas()) and "marta_osk" not in json.dumps(env.tool_schemas())


def test_generate_is_deterministic_and_matches_the_committed_files(tmp_path):
    gen = _module("search_long_generate", ENV_DIR / "generate.py")
    assert gen.generate() == gen.generate()
    gen.main(["--out", str(tmp_path)])  # checks every task through the tools before it writes
    for name, committed in (("docs.jsonl", ENV_DIR / "docs.jsonl"), ("tasks.jsonl", ENV_DIR / "tasks.jsonl"),
                            ("eval.jsonl", EVAL)):
        assert (tmp_path / name).read_bytes() == committed.read_bytes(), f"{committed} is not what generate.py writes"


def _reference_tokens(tokenizer, tasks, strategy="none", window=1_000_000, **kw):
    """Episodes of the reference policy (benchmarks/context_strategies.py: the reference solution replayed as the
    model's turns) through the real agent loop."""
    from rollout.agent import AgentConfig, AgentRunner
    from rollout.sampling import SamplingParams

    bench = _module("context_strategies", ROOT / "benchmarks" / "context_strategies.py")
    cfg = AgentConfig.from_config({"env": "search_long", "max_turns": 40, "max_context_tokens": window,
                                   "max_episode_tokens": 100_000, "context_strategy": strategy,
                                   "system_prompt": bench.SYSTEM_PROMPT, **kw})
    runner = AgentRunner(bench.ReferencePolicy(tokenizer, tasks), tokenizer, cfg)
    try:
        return runner.run(bench.requests_for(tasks), SamplingParams(n=1, max_new_tokens=256, seed=0))
    finally:
        runner.close()


def _check_reference_needs_more_than_the_window(tokenizer, tasks, max_tool_output_tokens):
    trajs = _reference_tokens(tokenizer, tasks, max_tool_output_tokens=max_tool_output_tokens)
    assert all(t.episode["termination"] == "submitted" and t.episode["outcome"]["score"] == 1.0 for t in trajs)
    need = np.array([len(t.prompt_ids) + len(t.response_ids) for t in trajs])
    assert (need > 2 * WINDOW).all(), need.tolist()
    # and within the window it cannot be done without managing the context; with discard_all it can
    for strategy, ending in (("none", "length"), ("discard_all", "submitted")):
        trajs = _reference_tokens(tokenizer, tasks, strategy, WINDOW, max_tool_output_tokens=max_tool_output_tokens)
        assert [t.episode["termination"] for t in trajs] == [ending] * len(tasks)
    return need


def test_the_reference_solution_needs_over_twice_the_window_embedded_tokenizer(tiny_moe_path, held_out):
    # the embedded tokenizer spends ~1.6x SmolLM2's tokens on this text: an article is up to ~620 of them
    need = _check_reference_needs_more_than_the_window(load_tokenizer(tiny_moe_path), held_out[:4], 1024)
    assert need.min() > 3 * WINDOW


def test_the_reference_solution_needs_over_twice_the_window_smollm2(smollm2_path, env, held_out):
    """Measured (with the benchmark's system prompt): held-out 4529 / 5760 / 7014 tokens (min / median / max),
    training 4551 / 5757 / 7152; an article is 277-354 tokens."""
    tok = load_tokenizer(smollm2_path)
    need = _check_reference_needs_more_than_the_window(tok, held_out, 512)
    assert 2 * WINDOW < np.median(need) < 3 * WINDOW
    docs = [json.loads(x) for x in (ENV_DIR / "docs.jsonl").read_text(encoding="utf-8").splitlines()]
    sizes = [len(tok(json.dumps(d), add_special_tokens=False)["input_ids"]) for d in docs]
    assert 250 <= min(sizes) and max(sizes) <= 400
