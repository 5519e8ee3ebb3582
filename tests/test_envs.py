"""Agent environments (rollout/envs): tool schemas from type hints, the session's containment of bad input, the
bundled environments' reference solutions and perturbations (check_env), the REPL, FTS search, the CLI."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Literal, TypedDict

import pytest

from rollout.envs.base import ToolResult, bundled_envs, check_env, load_env, truncate
from rollout.envs.schema import parse_docstring, tool_schema, validate_arguments

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------- schema derivation
class Point(TypedDict):
    x: Annotated[int, "the x coordinate"]
    label: str


def sample_tool(state, name: str, count: Annotated[int, {"minimum": 1, "maximum": 9}] = 3,
                ratio: float | None = None, mode: Literal["fast", "slow"] = "fast", tags: list[str] | None = None,
                weights: dict[str, float] | None = None, point: Point | None = None, answer: str | int | float = 0):
    """Do a sample thing.

    Longer explanation of the thing.

    Args:
        name: the name
            continued on a second line.
        count: how many.
        ratio: a ratio.
        mode: how.
        tags: labels.
        weights: per-key weights.
        point: a point.
        answer: anything scalar.

    Returns:
        A summary.
    """


def test_tool_schema_is_derived_from_type_hints_and_docstring():
    fn = tool_schema(sample_tool)["function"]
    assert fn["name"] == "sample_tool"
    assert fn["description"] == "Do a sample thing. Longer explanation of the thing. Returns: A summary."
    params = fn["parameters"]
    assert params["required"] == ["name"] and params["additionalProperties"] is False
    props = params["properties"]
    assert "state" not in props
    assert props["name"] == {"type": "string", "description": "the name continued on a second line."}
    assert props["count"] == {"type": "integer", "minimum": 1, "maximum": 9, "description": "how many.",
                              "default": 3}
    assert props["ratio"]["type"] == ["number", "null"] and "default" not in props["ratio"]
    assert props["mode"] == {"enum": ["fast", "slow"], "type": "string", "description": "how.", "default": "fast"}
    assert props["tags"]["anyOf"] == [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]
    assert props["weights"]["anyOf"][0] == {"type": "object", "additionalProperties": {"type": "number"}}
    point = props["point"]["anyOf"][0]
    assert point["properties"]["x"] == {"type": "integer", "description": "the x coordinate"}
    assert point["required"] == ["x", "label"] and point["additionalProperties"] is False
    assert props["answer"]["type"] == ["string", "number"]


def test_tool_schema_refuses_undocumented_or_untyped_parameters():
    def no_doc_for_arg(state, x: int):
        """Something.

        Args:
            y: not x.
        """

    def no_hint(state, x):
        """Something.

        Args:
            x: x.
        """

    with pytest.raises(TypeError, match="not described"):
        tool_schema(no_doc_for_arg)
    with pytest.raises(TypeError, match="no type hint"):
        tool_schema(no_hint)
    assert parse_docstring(None) == ("", {})


def test_validation_names_each_violation():
    schema = tool_schema(sample_tool)
    assert validate_arguments({"name": "a"}, schema) == []
    errors = validate_arguments({"count": "5", "extra": 1}, schema)
    assert "missing required argument 'name'" in errors
    assert any("argument 'count' must be an integer, got string \"5\"" in e for e in errors)
    assert any("unexpected argument 'extra'" in e for e in errors)
    assert validate_arguments({"name": "a", "count": 10}, schema) == ["argument 'count' must be <= 9, got 10"]
    assert validate_arguments({"name": "a", "count": True}, schema)[0].startswith("argument 'count' must be an integer")
    assert validate_arguments({"name": "a", "mode": "medium"}, schema)[0].startswith("argument 'mode' must be one of")
    assert validate_arguments({"name": "a", "point": {"x": 1, "label": "p"}}, schema) == []
    assert validate_arguments({"name": "a", "point": {"x": 1.5}}, schema)[0].startswith(
        "argument 'point' must be an object or null")  # a union names its alternatives
    typed = tool_schema(_typed_tool)
    errs = validate_arguments({"point": {"x": 1.5, "color": "red"}}, typed)
    assert "argument 'point'.x must be an integer, got number 1.5" in errs
    assert "argument 'point' is missing the field 'label'" in errs
    assert any("unexpected field 'color'" in e for e in errs)
    assert validate_arguments(["a"], schema)[0].startswith("the arguments must be a JSON object")


def _typed_tool(state, point: Point):
    """Take a point.

    Args:
        point: the point.
    """


# ------------------------------------------------------------------------------------- an environment of our own
PROBE_ENV = '''
import time
from rollout.envs.base import ToolError


def echo(state, text: str) -> str:
    """Echo text.

    Args:
        text: what to echo.
    """
    state.calls += 1
    return text


def boom(state) -> str:
    """Raise an unexpected error."""
    raise ValueError("kaput")


def refuse(state) -> str:
    """Raise an expected error."""
    raise ToolError("not today")


def sleepy(state, seconds: float) -> str:
    """Sleep.

    Args:
        seconds: how long.
    """
    time.sleep(seconds)
    state.slept = seconds
    return "rested"


def big(state, n: int) -> str:
    """A long output.

    Args:
        n: how many characters.
    """
    return "x" * (n // 2) + "y" * (n - n // 2)


def submit_result(state, answer: str) -> str:
    """Submit.

    Args:
        answer: the answer.
    """
    return "ok"


TOOLS = [echo, boom, refuse, sleepy, big, submit_result]


def init_state(state):
    state.calls = 0


def verify(task, state):
    if task.get("verifier_raises"):
        raise RuntimeError("verifier bug")
    if task.get("always_pass"):
        return 1.0, None
    return (1.0, None) if state.submission == task["answer"] else (0.0, f"got {state.submission!r}")


def solve(task, call):
    call("echo", text=task["answer"])
    call("submit_result", answer=task.get("reference_answer", task["answer"]))
'''


def make_env_dir(root: Path, tasks: list[dict], limits: str = "{tool_timeout_s: 2, max_output_chars: 200}") -> Path:
    d = root / "probe_env"
    d.mkdir()
    (d / "env.yaml").write_text(f"name: probe\ndescription: A probe environment.\nlimits: {limits}\n")
    (d / "env.py").write_text(PROBE_ENV)
    (d / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return d


@pytest.fixture
def probe(tmp_path):
    env = load_env(str(make_env_dir(tmp_path, [{"id": "t0", "prompt": "say hi", "answer": "hi"}])))
    session = env.reset(env.tasks()[0])
    yield env, session
    session.close()


def test_session_contains_bad_input(probe):
    env, s = probe
    r = s.call("echo", {"text": "hi"})
    assert isinstance(r, ToolResult) and (r.content, r.status, r.final, r.value) == ("hi", "ok", False, "hi")
    r = s.call("nope", {})
    assert r.status == "unknown_tool" and "echo" in r.content
    assert s.call(None, {}).status == "unknown_tool"
    r = s.call("echo", {})
    assert r.status == "bad_args" and "missing required argument 'text'" in r.content
    r = s.call("echo", {"text": "a", "loud": True})
    assert r.status == "bad_args" and "unexpected argument 'loud'" in r.content
    r = s.call("echo", {"text": 3})
    assert r.status == "bad_args" and "argument 'text' must be a string, got integer 3" in r.content
    assert s.call("echo", ["hi"]).status == "bad_args"
    assert s.call("echo", None).status == "bad_args"  # no arguments at all: 'text' is missing
    r = s.call("boom", {})
    assert r.status == "error" and "ValueError: kaput" in r.content
    r = s.call("refuse", {})
    assert r.status == "error" and r.content == "Error: not today"
    r = s.call("big", {"n": 10_000})
    assert r.status == "ok" and len(r.content) <= 200 and "[... " in r.content and "characters omitted" in r.content
    assert r.content.startswith("x") and r.content.endswith("y") and len(r.value) == 10_000


def test_a_tool_past_its_deadline_is_stopped_and_spends_the_session(probe):
    """A tool blocked in a C call (time.sleep) cannot be interrupted: the stop lands when the call returns, so
    the rest of the tool never runs; from the deadline on, every call of the episode is an error naming why."""
    env, s = probe
    t0 = time.perf_counter()
    r = s.call("sleepy", {"seconds": 1.0}, timeout_s=0.2)
    assert r.status == "timeout" and "0.2" in r.content and "stopped" in r.content and time.perf_counter() - t0 < 0.8
    assert s.stopped and "sleepy was stopped at its 0.2 s deadline" in s.stopped
    r = s.call("echo", {"text": "later"})  # at once, whether or not the first call's thread still runs
    assert r.status == "error" and "half-updated" in r.content and time.perf_counter() - t0 < 0.8
    assert _tool_threads("sleepy")  # still blocked in time.sleep
    _wait_gone("sleepy", 3.0)
    assert not hasattr(s.state, "slept") and s.state.calls == 0  # nothing after the sleep ran, nor the echo
    assert s.call("submit_result", {"answer": "hi"}).status == "error" and s.submission is None


def _tool_threads(name):
    return [t for t in threading.enumerate() if t.name == f"tool-{name}" and t.is_alive()]


def _wait_gone(name, seconds):
    end = time.perf_counter() + seconds
    while _tool_threads(name) and time.perf_counter() < end:
        time.sleep(0.01)
    assert not _tool_threads(name), f"the thread of {name} still runs {seconds} s after its deadline"


HUNG_TOOLS = '''

def spin(state) -> str:
    """Never return."""
    while True:
        pass


def swallow(state) -> str:
    """Never return, and catch whatever is raised."""
    x = 0
    while True:
        try:
            x += 1
        except BaseException:
            pass


def retry(state) -> str:
    """Never return: a retry loop around a loop, catching whatever is raised in it."""
    while True:
        try:
            while True:
                pass
        except BaseException:
            continue


def nap(state, seconds: float) -> str:
    """Sleep in one C call.

    Args:
        seconds: how long.
    """
    time.sleep(seconds)
    return "rested"


TOOLS = TOOLS + [spin, swallow, retry, nap]
'''


@pytest.fixture
def hung(tmp_path):
    d = make_env_dir(tmp_path, [{"id": "t0", "prompt": "p", "answer": "hi"}])
    (d / "env.py").write_text(PROBE_ENV + HUNG_TOOLS)
    (d / "env.yaml").write_text("name: hung\ndescription: Hangs.\nlimits: {tool_timeout_s: 0.2, max_output_chars: 200, "
                                "max_stuck_calls: 2}\n")
    return load_env(str(d))


@pytest.mark.parametrize("tool", ["spin", "swallow", "retry"])
def test_a_pure_python_tool_that_never_returns_is_stopped(hung, tool):
    """Nothing of a call runs past its deadline: the tool's thread is gone within a short time, also when the tool
    catches BaseException in a loop, and the process stops burning CPU."""
    s = hung.reset(hung.tasks()[0])
    try:
        t0 = time.perf_counter()
        r = s.call(tool, {})
        assert r.status == "timeout" and "stopped" in r.content and time.perf_counter() - t0 < 1.0
        _wait_gone(tool, 1.0)
        cpu = time.process_time()
        time.sleep(0.3)
        assert time.process_time() - cpu < 0.1  # a spinning thread would add about 0.3 s
        assert s.call("echo", {"text": "x"}).status == "error"
    finally:
        s.close()


def test_threads_blocked_in_c_calls_are_capped_per_environment(hung):
    """A thread blocked in a C call runs on until the call returns; while max_stuck_calls of them are alive, the
    environment's new calls fail at once instead of adding more."""
    sessions = [hung.reset(hung.tasks()[0]) for _ in range(3)]
    try:
        assert [s.call("nap", {"seconds": 1.5}).status for s in sessions[:2]] == ["timeout", "timeout"]
        t0 = time.perf_counter()
        r = sessions[2].call("echo", {"text": "x"})
        assert r.status == "error" and "still blocked" in r.content and time.perf_counter() - t0 < 0.1
        assert not sessions[2].stopped and sessions[2].state.calls == 0
        _wait_gone("nap", 3.0)
        assert sessions[2].call("echo", {"text": "x"}).content == "x"  # once they have returned, calls run again
    finally:
        for s in sessions:
            s.close()


def test_a_call_that_cannot_start_is_a_timeout_whichever_wait_ends_first(probe):
    """The call waits `timeout` for the episode's lock, and its caller waits as long for the call: when the lock's
    wait ends first the call has not run, and that must still read as a timeout (it read as an error)."""
    env, s = probe
    s._lock.acquire()  # an earlier call still runs
    try:
        for _ in range(40):
            r = s.call("echo", {"text": "x"}, timeout_s=0.005)
            assert r.status == "timeout" and "did not start" in r.content, r
    finally:
        s._lock.release()
    assert s.call("echo", {"text": "later"}).content == "later" and s.state.calls == 1  # the others never ran


def test_submit_twice_keeps_the_first(probe):
    env, s = probe
    assert s.submission is None
    first = s.call("submit_result", {"answer": "hi"})
    assert first.status == "ok" and first.final
    second = s.call("submit_result", {"answer": "bye"})
    assert second.status == "error" and not second.final and "first submission counts" in second.content
    assert s.submission == "hi"
    assert env.verify(env.tasks()[0], s) == (1.0, None)
    s.close()
    s.close()  # idempotent
    assert s.call("echo", {"text": "x"}).status == "error"
    assert env.verify(env.tasks()[0], s) == (1.0, None)  # still verifiable after close


def test_check_env_reports_failing_references_passing_perturbations_and_raising_verifiers(tmp_path):
    tasks = [{"id": "good", "prompt": "p", "answer": "hi"},
             {"id": "bad_ref", "prompt": "p", "answer": "hi", "reference_answer": "ho"},
             {"id": "lenient", "prompt": "p", "answer": "hi", "always_pass": True},
             {"id": "raises", "prompt": "p", "answer": "hi", "verifier_raises": True}]
    report = check_env(load_env(str(make_env_dir(tmp_path, tasks))))
    assert not report["ok"] and report["tasks"] == 4 and report["with_reference"] == 4
    text = "\n".join(report["failures"])
    assert "bad_ref: the reference solution scores 0.0" in text
    assert "lenient: the perturbed solution (no_submit) passes" in text
    assert "raises: the reference solution scores None: the verifier raised RuntimeError: verifier bug" in text
    assert not any(f.startswith("good") for f in report["failures"])
    assert report["reference_passed"] == 2


def test_load_env_and_bundled_list(tmp_path):
    assert set(bundled_envs()) >= {"smoke", "trip_planning", "code_interpreter", "search", "code_repo",
                                   "search_long"}
    with pytest.raises(ValueError, match="unknown environment"):
        load_env("no_such_env")
    with pytest.raises(FileNotFoundError):
        load_env(str(tmp_path))
    assert truncate("abc", 10) == "abc"


def test_the_database_is_read_only():
    env = load_env("smoke")
    s = env.reset(env.tasks()[0])
    try:
        with pytest.raises(sqlite3.OperationalError):
            s.state.db.execute("DELETE FROM entries")
        assert s.call("lookup", {"key": "alpha"}).content == "17"
    finally:
        s.close()


# ------------------------------------------------------------------------------------ the bundled environments
def test_smoke_and_search_reference_solutions_pass_and_perturbations_fail():
    for name in ("smoke", "search"):
        report = check_env(load_env(name))
        assert report["ok"], report["failures"]
        assert report["reference_passed"] == report["tasks"] >= 5
        assert report["perturbed_failed"] == report["perturbed"] >= 2 * report["tasks"]


def test_smoke_held_out_keys_are_solvable_and_never_trained_on():
    """The held-out tool-use set (rl/bundled/eval/smoke.jsonl, smol_mixed's eval) asks only for keys that no training
    task asks for, enough of them to stand for more than a handful, and each one's reference solution passes."""
    env = load_env("smoke")
    root = Path(__file__).resolve().parents[1]
    held_out = [json.loads(x) for x in (root / "rl/bundled/eval/smoke.jsonl").read_text().splitlines() if x.strip()]
    trained = {t["key"] for t in env.tasks()}
    assert len(held_out) >= 20 and len({t["key"] for t in held_out}) == len(held_out)
    assert not trained & {t["key"] for t in held_out}
    report = check_env(env, tasks=held_out)
    assert report["ok"], report["failures"]
    assert report["reference_passed"] == len(held_out)


def test_search_finds_the_documents_each_question_needs():
    env = load_env("search")
    tasks = env.tasks()
    assert len(tasks) >= 20 and all(len(t["hops"]) >= 2 for t in tasks)
    s = env.reset(tasks[0])
    try:
        for task in tasks:
            for hop in task["hops"]:
                found = [r["doc_id"] for r in s.call("search", {"query": hop["query"], "k": 5}).value]
                assert hop["doc"] in found, (task["id"], hop)
        assert s.call("search", {"query": '"unbalanced AND (NEAR -*'}).status == "ok"  # no FTS syntax gets through
        assert s.call("search", {"query": "?!"}).status == "error"
        doc = s.call("open_document", {"doc_id": "marta_osk"}).value
        assert "Ilvane" in doc["text"]
        assert s.call("open_document", {"doc_id": "nobody"}).status == "error"
    finally:
        s.close()


def test_code_interpreter_reference_solutions_pass_and_perturbations_fail():
    env = load_env("code_interpreter")
    tasks = env.tasks()
    assert len(tasks) >= 20
    # A sample that covers multi-cell references (REPL state), the data files and text answers; the CLI test
    # below and `python -m launch.check_env` cover all of them.
    sample = [t for t in tasks if len(t["reference_cells"]) > 1][:3] + [t for t in tasks if t["answer_type"] == "str"][:1]
    report = check_env(env, sample)
    assert report["ok"], report["failures"]
    assert report["reference_passed"] == 4 and report["perturbed_failed"] == report["perturbed"] == 8


def test_repl_keeps_state_and_restarts_after_a_timeout():
    env = load_env("code_interpreter")
    s = env.reset(env.tasks()[0])
    try:
        assert s.call("run_python", {"code": "x = 40\ndef f(a):\n    return a + 2"}).content == "(no output)"
        assert s.call("run_python", {"code": "f(x)"}).content == "42"
        r = s.call("run_python", {"code": "print(len(open('sales.csv').read().splitlines()))\n1/0"})
        assert r.status == "error" and "81" in r.content and "ZeroDivisionError" in r.content
        assert "<cell 3>" in r.content and "solution.py" not in r.content
        assert s.call("run_python", {"code": "f(x)"}).content == "42"  # a failed cell does not lose state
        r = s.call("run_python", {"code": "while True:\n    pass"}, timeout_s=1.0)
        assert r.status == "timeout" and "restarted" in r.content and "lost" in r.content
        r = s.call("run_python", {"code": "x"})
        assert r.status == "error" and "NameError" in r.content
        r = s.call("run_python", {"code": "print('a' * 50_000)"})
        assert r.status == "ok" and "characters omitted" in r.content
        r = s.call("run_python", {"code": "import os\nos.system('true')"})
        assert r.status == "error" and "forbidden" in r.content
        assert s.call("submit_result", {"answer": 40}).final
        assert env.verify(env.tasks()[0], s) == (1.0, None)
    finally:
        s.close()


def _code_interpreter_of_a_worker(monkeypatch, tokenizer, rewards_code):
    """The code_interpreter environment as a rollout worker builds it for an agent domain of a run whose
    `rewards.code` section is `rewards_code` (the engine stands in: only its tokenizer is used)."""
    import types

    import rollout.worker as worker

    monkeypatch.setattr(worker, "resolve_engine", lambda rcfg: "hf")
    monkeypatch.setattr(worker, "make_engine", lambda *a, **k: types.SimpleNamespace(tokenizer=tokenizer))
    cfg = {"rollout": {}, "model": {}, "algorithm": {"keep_routing": False, "keep_sampling_mask": False}, "seed": 0,
           "domains": {"agent": {"agent": {"env": "code_interpreter"}}}, "rewards": {"code": rewards_code}}
    return worker.RolloutWorker(cfg, "unused", 0)._agents["agent"].env


def test_code_interpreter_sandbox_follows_rewards_code(monkeypatch, tiny_moe_path):
    from rewards import sandbox
    from rewards.code_reward import code_reward
    from rewards.spec import SampleView
    from rl.models import load_tokenizer

    tok = load_tokenizer(tiny_moe_path)
    # The package allow-list is the run's.
    for packages, allowed in (([], False), (["numpy"], True)):
        env = _code_interpreter_of_a_worker(monkeypatch, tok, {"packages": packages})
        s = env.reset(env.tasks()[0])
        try:
            r = s.call("run_python", {"code": "import numpy\nint(numpy.arange(3).sum())"})
        finally:
            s.close()
        if allowed:
            assert (r.status, r.content) == ("ok", "3")
        else:
            assert r.status == "error" and "No module named 'numpy'" in r.content, r.content
    # So is require_os_isolation: without OS-level isolation it refuses, as the code reward does.
    monkeypatch.setattr(sandbox, "_probe_cache", {})
    monkeypatch.setattr(sandbox, "_warned", set())
    monkeypatch.setenv(sandbox.DISABLE_ENV, "landlock,jail,netns")
    env = _code_interpreter_of_a_worker(monkeypatch, tok, {"require_os_isolation": True})
    s = env.reset(env.tasks()[0])
    try:
        r = s.call("run_python", {"code": "print(7)"})
    finally:
        s.close()
    assert r.status == "error" and "refused" in r.content and "require_os_isolation" in r.content, r.content
    answer = "```python\nprint(7)\n```"
    sample = SampleView(response=answer, answer=answer, sample={"tests": {"type": "stdio", "cases": [
        {"input": "", "output": "7"}]}}, finish_reason="stop", num_response_tokens=5, domain="code", max_new_tokens=9)
    with pytest.raises(sandbox.SandboxIsolationError, match="require_os_isolation"):
        code_reward(sample, {"mode": "fraction", "max_program_chars": 1000, "require_os_isolation": True})


# ---------------------------------------------------------------------------------------------------------- CLI
def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "launch.check_env", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_exit_code(tmp_path):
    good = _cli("smoke")
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.startswith("smoke: ok: 5 tasks, reference solutions 5/5 pass, perturbed 10/10 fail")
    broken = make_env_dir(tmp_path, [{"id": "t", "prompt": "p", "answer": "hi", "reference_answer": "no"}])
    bad = _cli(str(broken), "smoke")
    assert bad.returncode == 1
    assert "probe: FAILED" in bad.stdout and "t: the reference solution scores 0.0" in bad.stdout
    assert "smoke: ok" in bad.stdout  # the other environments are still checked
    assert _cli("no_such_env").returncode == 1
