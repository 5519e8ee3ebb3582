"""`python -m launch.generate` (issue 35): data from specialists on the embedded tiny model, the transformers engine on
CPU, the domains' own reward stacks. Rows load as SFT data (rl/sft_data.py) and render to the sequence the model
sampled in; keep=pass/best keep exactly the passing samples of keep=all; reruns resume without duplicates; the
generator of each mode is the one configured; config mistakes are one line and exit 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch.config import compose
from launch.generate import check_generate, episode_messages, generate, single_turn_messages
from rl.config import ConfigError
from rl.data import load_domain_rows, render_prompt
from rl.models import load_tokenizer
from rl.sft_data import ConversationDataset, assistant_spans, load_conversations

ROOT = Path(__file__).resolve().parents[1]
# Small and quick (the transformers engine on a tiny MoE, 2 CPU cores): few prompts and tokens; 16 new tokens where
# math is generated (its length penalty's buffer is 16), 8 elsewhere.
SMALL = ["+experiment=mixed_rl", "generate.k=2", "domains.agent.agent.max_turns=2"]


def _cfg(out: Path, *overrides: str, max_prompts: int = 2, max_new_tokens: int = 8) -> dict:
    return compose([*SMALL, f"generate.out={out}", f"generate.max_prompts={max_prompts}",
                    f"rollout.max_new_tokens={max_new_tokens}", *overrides])


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "data.jsonl").read_text().splitlines()]


def _key(r: dict) -> tuple:
    return r["prompt_id"], r["mode"], r["sample_index"]


@pytest.fixture(scope="module")
def tok(tiny_moe_path):
    return load_tokenizer(tiny_moe_path)


def test_keep_all_writes_every_sample_as_sft_rows(tmp_path, tok):
    out = tmp_path / "gen"
    cfg = _cfg(out, "generate.keep=all", "generate.domains=[math,logic,agent]", max_prompts=1, max_new_tokens=16)
    summary = generate(cfg)
    rows = _rows(out)
    # math is `thinking: both` (two passes), logic sets no mode (one, mode null), agent non-thinking (agent.thinking)
    assert [(s["domain"], s["mode"], s["prompts"], s["samples"]) for s in summary] == [
        ("agent", "non_thinking", 1, 2), ("logic", None, 1, 2), ("math", "non_thinking", 1, 2),
        ("math", "thinking", 1, 2)]
    assert sorted(_key(r) for r in rows) == sorted(
        (f"{d}-0", m, j) for d, modes in (("math", ["thinking", "non_thinking"]), ("logic", [None]),
                                          ("agent", ["non_thinking"])) for m in modes for j in range(2))
    assert json.loads((out / "COMPLETE").read_text())["summary"] == summary
    for r in rows:
        assert r["generator"] == "embedded:tiny-moe" and isinstance(r["reward"], float) and "passed" in r
        assert r["messages"][-1]["role"] == "assistant" or r["domain"] == "agent"
        assert ("tools" in r) == (r["domain"] == "agent")
    agent = [r for r in rows if r["domain"] == "agent"]
    assert [t["function"]["name"] for t in agent[0]["tools"]] == ["lookup", "submit_result"]
    assert [m["role"] for m in agent[0]["messages"][:3]] == ["system", "user", "assistant"]

    # a single-turn row renders to exactly the prompt the model was given (in its mode) and the response it wrote
    # (non-thinking: the empty think block of the prompt's prefill is the row's reasoning_content "")
    for r in rows:
        last = r["messages"][-1]
        if r["domain"] == "agent" or (last.get("reasoning_content") and r["mode"] != "non_thinking"):
            continue  # agent rows: test_an_agent_episodes_messages_render_to_the_episodes_tokens; split reasoning
        spec = cfg["domains"][r["domain"]]
        row = load_domain_rows(r["domain"], spec["dataset"])[int(r["prompt_id"].rsplit("-", 1)[1])]
        mode = {"thinking": True, "non_thinking": False, None: None}[r["mode"]]
        prompt, _ = render_prompt(tok, spec["dataset"].get("system_prompt"), row, {}, mode)
        assert assistant_spans(tok, r["messages"])[0] == prompt + last["content"] + "<|im_end|>\n"

    # the SFT data path reads them: every row renders, with assistant tokens to train on
    convs = load_conversations({"path": str(out / "data.jsonl")})
    data = ConversationDataset(convs, tok, seed=0, max_tokens=4096)
    assert len(convs) == len(rows)
    assert all(data.sample(i, 0).loss_mask.sum() > 0 for i in range(len(convs)))
    # each row is rendered in its own mode: a non-thinking row's empty think block is prompt (prefilled when it was
    # sampled), not trained as the assistant's own tokens; a thinking row's prompt has none
    empty = "<think>\n\n</think>\n\n"
    for i, r in enumerate(rows):
        if r["domain"] == "math":
            t = data.sample(i, 0)
            assert t.prompt_text.endswith(empty) == (r["mode"] == "non_thinking"), r["mode"]
            assert not t.response_text.startswith(empty)
    import datasets  # HF-loadable as a dataset too

    assert datasets.load_dataset("json", data_files=str(out / "data.jsonl"), split="train").num_rows == len(rows)


def _outcome_run(out: Path, keep: str, threshold: float) -> list[dict]:
    """logic scored by `language` alone (its first part, the outcome): a score in [0, 1] that the random model's
    text reaches for some samples and not for others, the same samples every run (the sampling is seeded)."""
    cfg = _cfg(out, f"generate.keep={keep}", f"generate.pass_threshold={threshold}", "generate.domains=[logic]",
               "generate.k=3", max_prompts=4)
    cfg["domains"]["logic"]["rewards"] = [{"name": "language", "weight": 1.0}, {"name": "length", "weight": 0.5,
                                                                             "mode": "linear", "target": 4, "scale": 8}]
    generate(cfg)
    return _rows(out)


def test_keep_pass_and_best_keep_the_passing_samples_of_keep_all(tmp_path):
    every = _outcome_run(tmp_path / "all", "all", 0.5)
    assert len(every) == 4 * 3
    passing = {_key(r) for r in every if r["parts"]["language"] >= 0.5}
    assert 0 < len(passing) < len(every), "the fixture needs both passing and failing samples"
    assert {_key(r) for r in every if r["passed"]} == passing
    kept = _outcome_run(tmp_path / "pass", "pass", 0.5)
    assert {_key(r) for r in kept} == passing and all(r["passed"] for r in kept)
    best = _outcome_run(tmp_path / "best", "best", 0.5)
    by_prompt = {}
    for r in every:
        if _key(r) in passing:
            by_prompt.setdefault(r["prompt_id"], []).append(r)
    # per prompt the passing sample of highest total reward (outcome + length penalty), the first on a tie
    assert sorted(_key(r) for r in best) == sorted(
        _key(max(rs, key=lambda r: (r["reward"], -r["sample_index"]))) for rs in by_prompt.values())


def test_a_rerun_resumes_without_duplicates(tmp_path):
    out = tmp_path / "gen"
    base = ("generate.keep=all", "generate.domains=[logic]", "generate.batch_prompts=1")
    generate(_cfg(out, *base, max_prompts=1))
    first = _rows(out)
    assert {r["prompt_id"] for r in first} == {"logic-0"} and (out / "COMPLETE").exists()
    # more prompts on the second run: only the new one is generated
    generate(_cfg(out, *base, max_prompts=3))
    rows = _rows(out)
    assert rows[: len(first)] == first and sorted(_key(r) for r in rows) == sorted(
        (f"logic-{i}", None, j) for i in range(3) for j in range(2))
    whole = (out / "data.jsonl").read_bytes()
    # a run cut off mid-call: rows written but its progress line only half; the rerun drops those rows and redoes it
    progress = (out / "progress.jsonl").read_text().splitlines(keepends=True)
    (out / "progress.jsonl").write_text("".join(progress[:-1]) + progress[-1][:20])
    (out / "COMPLETE").unlink()
    with (out / "data.jsonl").open("a") as f:
        f.write('{"messages": [], "prompt_id": "cut-off"')
    generate(_cfg(out, *base, max_prompts=3))
    assert (out / "data.jsonl").read_bytes() == whole and (out / "COMPLETE").exists()
    assert len((out / "progress.jsonl").read_text().splitlines()) == 3
    # nothing left to do: no model is loaded, COMPLETE stays
    summary = generate(_cfg(out, *base, max_prompts=3))
    assert summary == [{"domain": "logic", "mode": None, "prompts": 3, "samples": 6, "kept": 6,
                        "mean_reward": summary[0]["mean_reward"]}]
    with pytest.raises(ConfigError, match=r"^generate\.k=3: generate\.out=.* holds data generated with generate\.k=2"):
        generate(_cfg(out, *base, "generate.k=3"))
    # another model for the same domain and mode would mix two generators' rows under one out
    with pytest.raises(ConfigError, match=r"holds logic/None rows generated by embedded:tiny-moe"):
        generate(_cfg(out, *base, "++generate.generators.logic=embedded:tiny-dense"))
    # a domain switched off for RL (weight 0) still generates
    generate(_cfg(tmp_path / "off", "generate.keep=all", "generate.domains=[logic]", "domains.logic.weight=0",
                  max_prompts=1))
    assert {r["prompt_id"] for r in _rows(tmp_path / "off")} == {"logic-0"}


def test_each_mode_is_sampled_by_its_generator(tmp_path, tiny_moe_path, monkeypatch):
    """Two generator models, one engine after the other in this process: each engine's core runs in a process of
    its own (vLLM's in-process core keeps the process's sleep-mode allocator, and the second engine failed on it)."""
    import rollout.worker

    cores = []

    class Recording(rollout.worker.RolloutWorker):
        def __init__(self, cfg, *a, **k):
            cores.append(cfg["rollout"].get("engine_core"))
            super().__init__(cfg, *a, **k)

    monkeypatch.setattr(rollout.worker, "RolloutWorker", Recording)
    a, b = tmp_path / "specialist_thinking", tmp_path / "specialist_direct"
    os.symlink(tiny_moe_path, a)
    os.symlink(tiny_moe_path, b)
    out = tmp_path / "gen"
    cfg = _cfg(out, "generate.keep=all", "generate.domains=[math,logic]", f"+generate.generators.math.thinking={a}",
               f"+generate.generators.math.non_thinking={b}", f"+generate.generators.logic={b}",
               "domains.logic.weight=0", max_prompts=1, max_new_tokens=16)  # logic: off in RL's mixture, not here
    generate(cfg)
    gens = {(r["domain"], r["mode"], r["generator"]) for r in _rows(out)}
    assert gens == {("math", "thinking", str(a)), ("math", "non_thinking", str(b)), ("logic", None, str(b))}
    assert cores == ["subprocess", "subprocess"]


@pytest.mark.parametrize("override, match", [
    ("generate.keep=some", r"^generate\.keep must be one of \['pass', 'best', 'all'\]"),
    ("generate.k=0", r"^generate\.k must be >= 1"),
    ("generate.domains=[maths]", r"^generate\.domains: 'maths' is not a domain"),
    ("generate.batch_prompts=0", r"^generate\.batch_prompts must be >= 1"),
])
def test_bad_generate_keys_name_the_key(override, match, tmp_path):
    with pytest.raises(ConfigError, match=match):
        check_generate(_cfg(tmp_path, override))


@pytest.mark.parametrize("override, match", [
    ("+generate.generators.logic.thinking=/x", r"^generate\.generators\.logic\.thinking: domain logic does not "
     r"generate in that mode"),
    ("+generate.generators.math.thoughtful=/x", r"^generate\.generators\.math\.thoughtful: unknown key"),
    ("+generate.generators.math=/no/such/model", r"^generate\.generators: model\.path=/no/such/model"),
])
def test_bad_generators_name_the_key(override, match, tmp_path):
    with pytest.raises(ConfigError, match=match):
        generate(_cfg(tmp_path / "gen", override, max_new_tokens=16))


def test_the_cli_says_a_config_mistake_in_one_line_and_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "launch.generate", "+experiment=mixed_rl", "generate.keep=some",
                           f"generate.out={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("config error: generate.keep")


def test_message_shapes_follow_the_mode():
    think = single_turn_messages("sys", "q", "<think>\nstep\n</think>\n\nanswer", True)
    assert think[-1] == {"role": "assistant", "content": "answer", "reasoning_content": "step"}
    assert single_turn_messages(None, "q", "answer", False) == [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "answer", "reasoning_content": ""}]
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "lookup", "arguments": {"key": "alpha"}}}]}
    (m,) = episode_messages([call], True)
    assert m["tool_calls"][0]["function"]["arguments"] == '{"key": "alpha"}' and "reasoning_content" not in m


@pytest.mark.parametrize("thinking", [True, False])
def test_an_agent_episodes_messages_render_to_the_episodes_tokens(tok, thinking):
    """A two-turn episode (a lookup, its result, the submit) as generate writes it renders, with the environment's
    tools, to exactly the tokens of the episode: its first prompt, the model's turns and the tool results."""
    from test_agent import LOOKUP, SUBMIT, ScriptedEngine

    from rollout.agent import AgentConfig, AgentRunner
    from rollout.sampling import SamplingParams
    from rollout.tool_format import openai_tools

    runner = AgentRunner(ScriptedEngine(tok, [LOOKUP, SUBMIT]), tok, AgentConfig(env="smoke"))
    (t,) = runner.run([{"group_id": "g", "domain": "agent", "sample": {"id": "smoke-0", "prompt": "x"},
                        "thinking": thinking}], SamplingParams(n=1, max_new_tokens=64, seed=1))
    assert t.episode["termination"] == "submitted"
    messages = episode_messages(t.episode["messages"], thinking)
    full, spans = assistant_spans(tok, messages, openai_tools(runner.tools))
    episode_text = tok.decode(list(t.prompt_ids) + list(t.response_ids))
    assert full.rstrip("\n") == episode_text.rstrip("\n")
    assert len(spans) == 2
