"""Reliability round 4: bad input gets a clear error and loses nothing (items 9, 10 and 11; item 8, the HTML
report, is tested in tests/test_report.py).

Item 9: an SFT line that is JSON but not an object, a run_dir that is a file, and a damaged checkpoint under
trainer.resume=auto. Item 10: inf for weights, lr, temperature and kl_coef, and rollout.max_new_tokens past the
model's context, refused at start. Item 11: an agent environment whose reference solution breaks (a tool call that
times out, or raises) when agent.demo builds its demonstration.

Everything here runs in-process on CPU in seconds, without Ray; only the run_dir test starts `python -m
launch.train`, which stops in its command-line check before Hydra creates anything.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from launch.checkpoint import find_resume
from launch.config import check_config, compose, prepare
from launch.run_dir import RunDirLock
from launch.train import override_error
from rl.config import ConfigError
from rl.sft_data import load_conversations

ROOT = Path(__file__).resolve().parents[1]
CHAT = {"messages": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]}


# ------------------------------------------------------------------------------------- item 9 (a): SFT lines
@pytest.mark.parametrize("line, kind", [("[1, 2]", "a list"), ('"text"', "a string"), ("3", "a number"),
                                        ('"messages"', "a string"), ('[1, "a"]', "a list"), ("null", "null"),
                                        ("true", "a boolean")])
def test_an_sft_line_that_is_json_but_not_an_object_names_the_file_and_line(tmp_path, line, kind):
    """Before: TypeError ('argument of type int is not iterable', 'string indices must be integers', '<' between
    str and int) or a message listing the string's letters as its columns."""
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(CHAT) + "\n\n" + line + "\n" + json.dumps(CHAT) + "\n")
    with pytest.raises(ConfigError) as err:
        load_conversations({"path": str(path), "columns": {"messages": "messages"}})
    msg = str(err.value)
    assert msg.startswith(f"algorithm.dataset.path={path}: line 3 is not a JSON object") and kind in msg, msg
    assert "\n" not in msg


def test_an_sft_rows_mode_of_the_wrong_type_is_not_a_mode(tmp_path):
    """Before: TypeError (unhashable type: 'list') from `raw.get("mode") in MODES`."""
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({**CHAT, "mode": ["thinking"]}) + "\n" + json.dumps({**CHAT, "mode": "thinking"}) + "\n")
    rows = load_conversations({"path": str(path), "columns": {"messages": "messages"}})
    assert "mode" not in rows[0] and rows[1]["mode"] == "thinking"


def test_a_bad_sft_line_stops_the_run_at_start_and_frees_the_run_dir(tmp_path):
    """The loop, as `python -m launch.sft` runs it, up to the data check (before Ray): one ConfigError (so the CLI
    prints one line and removes the refused run's run_dir), and the run_dir's lock is free again. Before: TypeError,
    which the CLI shows as a traceback and after which the run_dir stays behind with its .lock."""
    from launch.loop import train

    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps(CHAT) + "\n3\n")
    run_dir = tmp_path / "run"
    cfg = compose(["+experiment=sft", f"algorithm.dataset.path={data}", f"run_dir={run_dir}", "logger.mode=disabled"])
    with pytest.raises(ConfigError, match=r"chat\.jsonl: line 2 is not a JSON object \(it is a number\)"):
        train(cfg)
    RunDirLock(run_dir).release()  # not held any more
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # nothing else written: the CLI removes the rest


# --------------------------------------------------------------------------------- item 9 (b): run_dir a file
def test_a_run_dir_that_is_a_file_is_one_config_error(tmp_path):
    """Before: FileExistsError / NotADirectoryError tracebacks (from Hydra, before the run starts)."""
    afile = tmp_path / "notes.txt"
    afile.write_text("keep me\n")
    for run_dir in (afile, afile / "run"):
        with pytest.raises(ConfigError, match=rf"run_dir={run_dir}: .*notes\.txt is a file, not a directory"):
            RunDirLock(run_dir)
        problem = override_error(["+experiment=mixed_rl", f"run_dir={run_dir}"])
        assert problem is not None and problem.startswith(f"run_dir={run_dir}: ") and "\n" not in problem, problem
    assert override_error(["+experiment=mixed_rl", f"run_dir={tmp_path / 'fresh'}"]) is None
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "WANDB_MODE": "offline"}
    proc = subprocess.run([sys.executable, "-m", "launch.train", "+experiment=mixed_rl", "logger.mode=disabled",
                           f"run_dir={afile}"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].startswith(f"config error: run_dir={afile}: ") and "is a file" in lines[0]
    assert afile.read_text() == "keep me\n"


# ------------------------------------------------------------------------ item 9 (c): damaged checkpoints
def _ckpt(root: Path, step: int, state: object = None, manifest: object = None) -> Path:
    """A whole checkpoint (as save_checkpoint leaves it); `state` / `manifest` replace its state.json /
    MANIFEST.json (a str is written as it is)."""
    p = root / "checkpoints" / f"step_{step:06d}"
    (p / "deepspeed").mkdir(parents=True)
    (p / "hf").mkdir()
    (p / "deepspeed" / "optim_states.pt").write_bytes(b"x" * 64)
    (p / "hf" / "model.safetensors").write_bytes(b"w" * 32)
    state = {"step": step, "data": {"cursor": {"math": [0, 3]}}} if state is None else state
    (p / "state.json").write_text(state if isinstance(state, str) else json.dumps(state))
    if manifest is None:
        manifest = {str(f.relative_to(p)): f.stat().st_size for f in sorted(p.rglob("*")) if f.is_file()}
    (p / "MANIFEST.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    (p / "COMPLETE").touch()
    return p


GOOD_SIZES = {"deepspeed/optim_states.pt": 64, "hf/model.safetensors": 32}
DAMAGED = {
    "manifest a list": dict(manifest=["deepspeed/optim_states.pt", 64]),
    "manifest a string": dict(manifest='"sizes"'),
    "manifest null": dict(manifest="null"),
    "a size as a string": dict(manifest={**GOOD_SIZES, "hf/model.safetensors": "32"}),
    "a size of 1e999": dict(manifest='{"deepspeed/optim_states.pt": 1e999, "hf/model.safetensors": 32}'),
    "a size of NaN": dict(manifest='{"deepspeed/optim_states.pt": NaN, "hf/model.safetensors": 32}'),
    "a size that is a list": dict(manifest={**GOOD_SIZES, "hf/model.safetensors": [32]}),
    "a path out of the checkpoint": dict(manifest={**GOOD_SIZES, "../../outside": 3}),
    "state a list": dict(state=[4, {"cursor": {}}]),
    "a string step": dict(state={"step": "4", "data": {"cursor": {}}}),
    "a step of 1e999": dict(state='{"step": 1e999, "data": {"cursor": {}}}'),
    "a step of Infinity": dict(state='{"step": Infinity, "data": {"cursor": {}}}'),
    "a step of NaN": dict(state='{"step": NaN, "data": {"cursor": {}}}'),
    "a float step": dict(state={"step": 4.5, "data": {"cursor": {}}}),
    "a bool step": dict(state={"step": True, "data": {"cursor": {}}}),
    "a negative step": dict(state={"step": -4, "data": {"cursor": {}}}),
    "data a list": dict(state={"step": 4, "data": [1]}),
    "data without a cursor": dict(state={"step": 4, "data": {}}),
}


@pytest.mark.parametrize("damage", list(DAMAGED))
def test_resume_auto_skips_a_checkpoint_with_a_damaged_manifest_or_state(tmp_path, caplog, damage):
    """trainer.resume=auto takes the newest good checkpoint, with a warning naming the damaged one. Before: the
    manifest's `.items()` on a list (AttributeError), int(inf) (OverflowError) and a string or float step taken as
    a whole checkpoint."""
    older = _ckpt(tmp_path, 2)
    newest = _ckpt(tmp_path, 4, **DAMAGED[damage])
    (tmp_path / "outside").write_bytes(b"abc")  # the file the escaping manifest entry names, of its size
    with caplog.at_level(logging.WARNING, logger="launch.checkpoint"):
        assert find_resume("auto", tmp_path) == [older]
    assert "skipping checkpoint step_000004" in caplog.text, caplog.text
    with pytest.raises(ConfigError, match=r"trainer\.resume=.*step_000004: not a complete checkpoint: "):
        find_resume(str(newest), tmp_path)


class _Cluster:
    def __init__(self):
        self.loaded: list[str] = []
        self.synced = 0

    def load(self, path: str) -> None:
        self.loaded.append(Path(path).name)

    def sync_weights(self) -> None:
        self.synced += 1


def test_resume_gives_way_to_an_older_checkpoint_when_the_data_position_does_not_load(tmp_path, caplog):
    """A checkpoint that passes the file checks but whose data position the source cannot take (here a cursor of
    the wrong shape) is skipped like one whose weights do not load. Before: the source's error ended the run."""
    from launch.loop import resume
    from rl.data import PromptMixture

    older = _ckpt(tmp_path, 2, state={"step": 2, "data": {"step": 2, "cursor": {"math": [0, 3]}}})
    newest = _ckpt(tmp_path, 4, state={"step": 4, "data": {"step": 4, "cursor": {"math": "garbage"}}})
    mixture = PromptMixture.__new__(PromptMixture)  # only its position: no data or tokenizer needed here
    mixture.step, mixture.skipped_too_long, mixture.cursor = 0, 0, {"math": [0, 0]}

    class Source:
        def state_dict(self):
            return mixture.state_dict()

        def load_state_dict(self, state):
            mixture.load_state_dict(state)

    cluster = _Cluster()
    with caplog.at_level(logging.WARNING, logger="launch.loop"):
        assert resume(cluster, Source(), find_resume("auto", tmp_path)) == 2
    assert cluster.loaded == ["step_000004", "step_000002"] and cluster.synced == 1
    assert mixture.step == 2 and mixture.cursor == {"math": [0, 3]}
    assert "step_000004 does not load" in caplog.text and newest.exists() and older.exists()


# ------------------------------------------------------------------------------------------- item 10: config
@pytest.mark.parametrize("override, key", [
    ("domains.math.weight=inf", "domains.math.weight"),
    ("domains.code.kl_coef=inf", "domains.code.kl_coef"),
    ("trainer.lr=inf", "trainer.lr"),
    ("rollout.temperature=inf", "rollout.temperature"),
    ("eval.temperature=inf", "eval.temperature"),
    ("domains.math.weight=-inf", "domains.math.weight"),
    ("trainer.lr=-inf", "trainer.lr"),
])
def test_an_infinite_number_is_refused_at_start_naming_the_key(override, key):
    """Before: inf passed check_config (weights, lr, temperature, kl_coef), and the run failed minutes later in
    sampling."""
    cfg = compose(["+experiment=mixed_rl", override])
    assert math.isinf(functools.reduce(lambda node, k: node[k], key.split("."), cfg))  # the override did parse
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    assert str(err.value).startswith(f"{key} must be a finite number, got ") and "\n" not in str(err.value)


def test_nan_is_still_refused_and_finite_values_and_an_infinite_opsm_delta_pass():
    with pytest.raises(ConfigError, match=r"^trainer\.lr must not be NaN"):
        check_config(compose(["+experiment=mixed_rl", "trainer.lr=nan"]))
    check_config(compose(["+experiment=mixed_rl", "trainer.lr=1e-3", "domains.math.weight=1e6",
                          "domains.math.opsm_delta=inf"]))  # inf: never masks, the same as null


def test_max_new_tokens_past_the_models_context_is_refused_at_start():
    """The embedded model has 2048 positions and data.max_prompt_tokens is 512: 1536 new tokens fit, 1537 do not.
    Before: accepted, and a step generated until the engine gave up (minutes on CPU)."""
    with pytest.raises(ConfigError) as err:
        prepare(compose(["+experiment=mixed_rl", "rollout.max_new_tokens=100000"]))
    msg = str(err.value)
    assert msg.startswith("rollout.max_new_tokens=100000 ") and "\n" not in msg, msg
    assert "max_position_embeddings=2048" in msg and "data.max_prompt_tokens=512" in msg and "1536" in msg, msg
    with pytest.raises(ConfigError, match=r"^rollout\.max_new_tokens=1537 .* 1536"):
        prepare(compose(["+experiment=mixed_rl", "rollout.max_new_tokens=1537"]))
    prepare(compose(["+experiment=mixed_rl", "rollout.max_new_tokens=1536"]))
    with pytest.raises(ConfigError, match=r"^rollout\.max_new_tokens=1000 .*data\.max_prompt_tokens=1200"):
        prepare(compose(["+experiment=mixed_rl", "rollout.max_new_tokens=1000", "data.max_prompt_tokens=1200"]))
    # SFT samples no tokens: its rollout keys are not used
    prepare(compose(["+experiment=sft", "rollout.max_new_tokens=100000"]))


# ------------------------------------------------------------------------- item 11: a broken demonstration
DEMO_ENV = '''
import time

from rollout.envs.base import ToolError


def lookup(state, key: str) -> str:
    """Look a key up.

    Args:
        key: the key.
    """
    if key == "slow":
        while True:  # past any deadline
            time.sleep(0.01)
    if key == "missing":
        raise ToolError("no such key")
    return key.upper()


def submit_result(state, answer: str) -> str:
    """Submit the answer.

    Args:
        answer: the answer.
    """
    return "Submitted."


TOOLS = [lookup, submit_result]


def verify(task, state):
    return (1.0, None) if state.submission == task["answer"] else (0.0, "wrong")


def solve(task, call):
    if task.get("solver_bug"):
        raise KeyError("solver_bug")
    call("submit_result", answer=call("lookup", key=task["key"]))
'''


def demo_env(root: Path, broken: dict) -> Path:
    """An environment of three tasks; t2 (the demonstration shown before t1) has `broken` in its row."""
    d = root / "demo_env"
    d.mkdir()
    (d / "env.yaml").write_text("name: demo_probe\ndescription: A probe environment.\n"
                                "limits: {tool_timeout_s: 0.2, max_output_chars: 200}\n")
    (d / "env.py").write_text(DEMO_ENV)
    tasks = [{"id": "t1", "prompt": "look up a", "key": "a", "answer": "A"},
             {"id": "t2", "prompt": "look up b", "key": "b", "answer": "B", **broken},
             {"id": "t3", "prompt": "look up c", "key": "c", "answer": "C"}]
    (d / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return d


BROKEN = {
    "a tool call that times out": ({"key": "slow"}, r"lookup\(key='slow'\) timed out"),
    "a tool call that fails": ({"key": "missing"}, r"lookup\(key='missing'\) failed \(error\): Error: no such key"),
    "a solver that raises": ({"solver_bug": True}, r"solve raised KeyError: 'solver_bug'"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_reference_solution_says_which_environment_task_and_call(tmp_path, case):
    """Before: RuntimeError('reference call lookup failed (timeout): ...') or the solver's own KeyError, naming
    neither the environment nor the task."""
    from rollout.envs.base import ReferenceSolutionError, load_env

    broken, reason = BROKEN[case]
    env = load_env(str(demo_env(tmp_path, broken)))
    assert env.reference_solution(env.tasks()[0]) == [("lookup", {"key": "a"}), ("submit_result", {"answer": "A"})]
    with pytest.raises(ReferenceSolutionError, match=r"^environment demo_probe: the reference solution of task t2 "
                                                     rf"does not run: {reason}") as err:
        env.reference_solution(env.tasks()[1])
    assert isinstance(err.value, ValueError) and "\n" not in str(err.value)


@pytest.mark.parametrize("case", list(BROKEN))
def test_an_agent_domain_whose_demonstration_breaks_is_refused_at_start(tmp_path, case):
    """agent.demo shows each task after another task solved by the environment's reference solution, built on the
    rollout worker: a solution that does not run ended the run there with a traceback. It is refused at start, by
    domain and environment, with the reason. Before: check_config passed."""
    broken, reason = BROKEN[case]
    env_dir = demo_env(tmp_path, broken)
    agent = [f"domains.agent.agent.env={env_dir}"]
    with pytest.raises(ConfigError) as err:
        check_config(compose(["+experiment=mixed_rl", *agent, "domains.agent.agent.demo=true"]))
    msg = str(err.value)
    assert msg.startswith("domains.agent.agent.demo: environment demo_probe: the reference solution of task t2 "
                          "does not run: ") and "\n" not in msg, msg
    assert re.search(reason, msg) and "domains.agent.agent.demo=false" in msg, msg
    check_config(compose(["+experiment=mixed_rl", *agent]))  # without demo the reference solution is not used


class _OneLineEngine:
    """Answers every turn with a submit call (real token ids of the real tokenizer)."""

    def __init__(self, tok):
        self.tok = tok

    def generate(self, prompts, sp, seeds=None):
        from rollout.sampling import Generation

        text = '<tool_call>\n{"name": "submit_result", "arguments": {"answer": "A"}}\n</tool_call><|im_end|>'
        ids = np.asarray(self.tok(text, add_special_tokens=False)["input_ids"], np.int32)
        return [[Generation(ids, np.full(len(ids), -1.0, np.float32), "stop")] for _ in prompts]


def test_a_demonstration_that_breaks_at_run_time_fails_its_episodes_not_the_step(tmp_path, tiny_moe_path):
    """A reference solution can also break only on the rollout worker (a tool slower there than at start): its
    request's episodes end with reason `error` naming the demonstration; the other requests of the step run."""
    from rl.models import load_tokenizer
    from rollout.agent import AgentConfig, AgentRunner
    from rollout.sampling import SamplingParams

    tok = load_tokenizer(tiny_moe_path)
    env_dir = demo_env(tmp_path, {"key": "slow"})
    runner = AgentRunner(_OneLineEngine(tok), tok, AgentConfig(env=str(env_dir), demo=True, max_turns=2,
                                                               tool_timeout_s=0.2))
    sp = SamplingParams(n=2, temperature=1.0, top_p=1.0, max_new_tokens=64, seed=1)
    requests = [{"group_id": f"g{t}", "domain": "agent", "prompt_ids": [], "prompt_text": "",
                 "sample": {"id": t, "prompt": "x"}} for t in ("t1", "t3")]  # t1's demonstration is t2
    try:
        trajs = runner.run(requests, sp)
    finally:
        runner.close()
    broken, fine = trajs[:2], trajs[2:]
    for t in broken:
        assert t.episode["termination"] == "error" and "demonstration" in t.episode["error"], t.episode
        assert "timed out" in t.episode["error"]
    assert all(t.episode["termination"] == "submitted" for t in fine)


@pytest.mark.parametrize("line", ["[1, 2]", '"a task"', "3", "{not json"])
def test_a_task_line_that_is_not_an_object_names_the_file_and_line(tmp_path, line):
    from rollout.envs.base import load_env

    d = demo_env(tmp_path, {})
    (d / "tasks.jsonl").write_text((d / "tasks.jsonl").read_text() + line + "\n")
    with pytest.raises(ValueError, match=r"tasks.jsonl:4: (a task is a JSON object|not valid JSON)"):
        load_env(str(d)).tasks()
