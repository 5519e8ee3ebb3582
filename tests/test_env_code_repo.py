"""The code_repo environment (rollout/envs/code_repo): its bundled repositories and tasks, the reference episodes
and perturbations (check_env), per-episode isolation and clean-up, path confinement, apply_edit's errors, the
sandboxed test runner (timeouts, caps, odd files), the verifier's fail-to-pass / pass-to-pass rule, and the
`dataset.where` filter the smol_code_repo experiment draws its easy tasks with."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from rollout.envs.base import check_env, load_env

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ["list_files", "read_file", "search", "apply_edit", "run_tests", "submit_result"]


@pytest.fixture(scope="module")
def env():
    return load_env("code_repo")


@pytest.fixture(scope="module")
def tasks(env):
    return {t["id"]: t for t in env.tasks()}


@contextlib.contextmanager
def episode(env, task):
    s = env.reset(task)
    try:
        yield s
    finally:
        s.close()


def ok(session, name, **args):
    res = session.call(name, args)
    assert res.status == "ok", res.content
    return res.content


def fix(session, task):
    for e in task["patch"]:
        ok(session, "apply_edit", **e)


# ------------------------------------------------------------------------------------------ repositories, tasks
def test_repositories_and_tasks(env, tasks):
    assert [t["function"]["name"] for t in env.tool_schemas()] == TOOLS
    repos = env.env_dir / "repos"
    names = sorted(p.name for p in repos.iterdir() if p.is_dir())
    assert len(names) >= 3
    for name in names:
        modules = [p for p in (repos / name / name).glob("*.py") if p.name != "__init__.py"]
        lines = sum(len(p.read_text().splitlines()) for p in modules)
        n_tests = sum(len(re.findall(r"^def test_", p.read_text(), re.M))
                      for p in (repos / name / "tests").glob("*.py"))
        assert 3 <= len(modules) <= 6 and 80 <= lines <= 300 and 10 <= n_tests <= 25, (name, len(modules), lines,
                                                                                        n_tests)
    rows = list(tasks.values())
    assert len(rows) >= 30 and {t["repo"] for t in rows} == set(names)
    assert {t["difficulty"] for t in rows} == {"easy", "hard"}
    for t in rows:
        assert t["f2p"] and t["p2p"] and not set(t["f2p"]) & set(t["p2p"]) and t["sabotage"], t["id"]
        assert len(t["bug"]) == len(t["patch"]) >= 1
        assert t["bug"][0]["search"] not in t["prompt"]  # the issue describes the symptom, not the fix


def sample(tasks):
    """One easy and one hard task of every repository."""
    picked = {}
    for t in tasks.values():
        picked.setdefault((t["repo"], t["difficulty"]), t)
    return list(picked.values())


def test_reference_episodes_pass_and_perturbations_fail_on_a_sample(env, tasks):
    rows = sample(tasks)
    report = check_env(env, rows)
    assert report["ok"], report["failures"]
    assert report["reference_passed"] == len(rows) == 6
    assert report["perturbed_failed"] == report["perturbed"] == 4 * len(rows)  # no submit, no edit, sabotage, tests


@pytest.mark.slow
def test_reference_episodes_pass_and_perturbations_fail_on_every_task(env):
    report = check_env(env)
    assert report["ok"], report["failures"]
    assert report["reference_passed"] == report["tasks"] >= 30


def test_check_env_cli():
    proc = subprocess.run([sys.executable, "-m", "launch.check_env", "code_repo", "--max-tasks", "1"], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("code_repo: ok: 1 tasks, reference solutions 1/1 pass, perturbed 4/4 fail")


# ------------------------------------------------------------------------------------- isolation and clean-up
def test_episodes_are_isolated_and_cleaned_up(env, tasks):
    task = tasks["strkit-01"]
    with episode(env, task) as a, episode(env, task) as b:
        ra, rb = a.state.root, b.state.root
        assert ra != rb and stat.S_IMODE(ra.stat().st_mode) == 0o700
        fix(a, task)
        assert "0-9" in ok(a, "read_file", path="strkit/slug.py") and "0-9" not in ok(b, "read_file",
                                                                                       path="strkit/slug.py")
        assert ok(a, "run_tests", test="tests/test_slug.py").startswith("Ran 6 tests in")
        assert ", 0 failed." in ok(a, "run_tests", test="tests/test_slug.py")
        assert ", 1 failed." in ok(b, "run_tests", test="tests/test_slug.py")
        assert a.call("submit_result", {}).final
    assert not ra.exists() and not rb.exists()
    assert env.verify(task, a) == (1.0, None)  # the submitted snapshot is graded: no live copy needed
    assert env.verify(task, b)[0] == 0.0


def test_a_failed_set_up_leaves_no_directory(env, tasks, monkeypatch):
    import tempfile

    made = []

    def mkdtemp(**kw):
        made.append(Path(tempfile.mkdtemp(**kw)))
        return str(made[-1])

    monkeypatch.setattr(env.module, "tempfile", types.SimpleNamespace(mkdtemp=mkdtemp))
    broken = {**tasks["strkit-01"], "bug": [{"path": "strkit/slug.py", "search": "not in the file", "replace": "x"}]}
    with pytest.raises(ValueError, match="its bug does not apply"):
        env.reset(broken)
    assert len(made) == 1 and not made[0].exists()


def test_paths_stay_inside_the_episode_copy(env, tasks):
    with episode(env, tasks["spans-01"]) as s:
        root = s.state.root
        (root / "link.py").symlink_to("/etc/passwd")
        (root / "linkdir").symlink_to(root / "spans")
        for path, why in [("/etc/passwd", "absolute path"), ("../x", "'..' is not allowed"),
                          ("spans/../../etc/passwd", "'..' is not allowed"), ("~/x", "absolute path"),
                          ("link.py", "symbolic link"), ("linkdir/week.py", "symbolic link"), ("a\x00b", "NUL"),
                          ("spans", "is a directory"), ("spans/wek.py", "did you mean spans/week.py")]:
            res = s.call("read_file", {"path": path})
            assert res.status == "error" and why in res.content, (path, res.content)
        res = s.call("apply_edit", {"path": "/etc/passwd", "search": "root", "replace": "x"})
        assert res.status == "error" and "absolute" in res.content
        assert s.call("list_files", {"path": "linkdir"}).status == "error"
        listing = ok(s, "list_files")
        assert "link" not in listing and "spans/week.py" in listing and "tests/test_week.py" in listing
        assert ok(s, "list_files", path="./spans/").startswith("spans/__init__.py")
        assert s.call("search", {"query": "root", "path": "/etc"}).status == "error"


# -------------------------------------------------------------------------------------------------- apply_edit
def test_apply_edit_needs_exactly_one_occurrence(env, tasks):
    with episode(env, tasks["ledger-01"]) as s:
        before = (s.state.root / "ledger/money.py").read_text()
        res = s.call("apply_edit", {"path": "ledger/money.py", "search": "no such text", "replace": "x"})
        assert res.status == "error" and "occurs 0 times in ledger/money.py" in res.content
        res = s.call("apply_edit", {"path": "ledger/money.py", "search": "cents", "replace": "pennies"})
        assert res.status == "error"
        assert re.search(r"occurs \d+ times in ledger/money\.py \(starting on lines", res.content)
        res = s.call("apply_edit", {"path": "ledger/money.py", "search": "def  parse_amount", "replace": "x"})
        assert res.status == "error" and "occurs 0 times" in res.content
        res = s.call("apply_edit", {"path": "ledger/money.py", "search": "  def format_amount(cents):",
                                    "replace": "x"})
        assert res.status == "error" and "different leading or trailing whitespace" in res.content
        assert s.call("apply_edit", {"path": "ledger/money.py", "search": "", "replace": "x"}).status == "error"
        assert s.call("apply_edit", {"path": "ledger/money.py", "search": "re", "replace": "re"}).status == "error"
        assert (s.state.root / "ledger/money.py").read_text() == before  # nothing changed by the refused edits
        (s.state.root / "notes.txt").write_text("aaa\n")
        res = s.call("apply_edit", {"path": "notes.txt", "search": "aa", "replace": "b"})  # overlapping: 2 times
        assert res.status == "error" and "occurs 2 times" in res.content
        out = ok(s, "apply_edit", path="notes.txt", search="aaa", replace="one\ntwo")
        assert out.startswith("Edited notes.txt: replaced 1 occurrence (the new text is on lines 1-2)")
        assert (s.state.root / "notes.txt").read_text() == "one\ntwo\n"
        res = s.call("apply_edit", {"path": "notes.txt", "search": "one", "replace": "\ud800"})
        assert res.status == "error" and "surrogate" in res.content


# --------------------------------------------------------------------------------------------------- the tests
def test_run_tests_reports_each_failure_and_accepts_test_ids(env, tasks):
    task = tasks["spans-10"]  # two F2P tests in two files
    with episode(env, task) as s:
        out = ok(s, "run_tests")
        assert out.startswith("Ran 24 tests in") and ": 22 passed, 2 failed." in out.split("\n")[0]
        for tid in task["f2p"]:
            assert f"FAILED {tid}: AssertionError" in out
        assert "(left: [Interval(" in out  # the compared values of a failed `assert a == b`
        assert "Passed: tests/test_interval.py (6)" in out
        one = ok(s, "run_tests", test=task["f2p"][0])
        assert one.startswith("Ran 1 test in") and ": 0 passed, 1 failed." in one
        assert ok(s, "run_tests", test="test_merge.py").startswith("Ran 5 tests")
        assert ok(s, "run_tests", test="test_free_slots").startswith("Ran 1 test")
        for bad in ("tests/test_nope.py", "test_nope"):
            res = s.call("run_tests", {"test": bad})
            assert res.status == "error" and "no test matches" in res.content, res.content
        assert "is not a test" in s.call("run_tests", {"test": "rm -rf /"}).content
        (s.state.root / "tests/test_broken.py").write_text("def test_x(:\n    pass\n")
        out = ok(s, "run_tests", test="tests/test_broken.py")
        assert "FAILED tests/test_broken.py: error while importing the test file: SyntaxError" in out


def test_a_test_that_never_ends_is_stopped_and_the_episode_goes_on(env, tasks):
    task = tasks["strkit-08"]
    with episode(env, task) as s:
        ok(s, "apply_edit", path="tests/test_wrap.py", search="def test_wrap_exact_fit():\n",
           replace="def test_wrap_exact_fit():\n    while True:\n        pass\n")
        t0 = time.perf_counter()
        res = s.call("run_tests", {}, timeout_s=1.5)
        assert res.status == "timeout" and time.perf_counter() - t0 < 6, res
        assert "Timed out after 1.5 s while running tests/test_wrap.py::test_wrap_exact_fit" in res.content
        assert "Results before that:\nRan " in res.content and not s.stopped  # the sandbox killed its process
        ok(s, "apply_edit", path="tests/test_wrap.py", search="    while True:\n        pass\n", replace="")
        fix(s, task)
        assert ", 0 failed." in ok(s, "run_tests")
        # code that loops at import time is stopped the same way
        ok(s, "apply_edit", path="strkit/wrap.py", search='"""Line wrapping, truncation and indentation."""',
           replace='while True:\n    pass')
        res = s.call("run_tests", {"test": "tests/test_wrap.py"}, timeout_s=1.0)
        assert res.status == "timeout" and not s.stopped


def test_output_is_capped(env, tasks):
    with episode(env, tasks["strkit-01"]) as s:
        root = s.state.root
        body = "".join(f"def test_f{i}():\n    assert {i} == -1\n\n\n" for i in range(40))
        (root / "tests/test_many.py").write_text(body + "def test_noisy():\n    print('x' * 100000)\n"
                                                 "    raise ValueError('v' * 5000)\n\n\n"
                                                 "def test_long_values():\n    assert 'y' * 5000 == 'z'\n")
        out = ok(s, "run_tests", test="tests/test_many.py")
        assert out.startswith("Ran 42 tests in") and "[... 27 more failing tests]" in out
        assert "(left: 0, right: -1)" in out
        noisy = ok(s, "run_tests", test="test_noisy")
        assert "printed: " + "x" * 200 + " [...]" in noisy and "x" * 201 not in noisy
        message = noisy.split("FAILED tests/test_many.py::test_noisy: ", 1)[1].split("\n")[0]
        assert message.startswith("ValueError: vvv") and len(message) == 403 and message.endswith("...")
        values = ok(s, "run_tests", test="test_long_values")
        assert "(left: '" + "y" * 199 + "..., right: 'z')" in values  # each compared value cut at 200 characters
        assert len(ok(s, "run_tests")) <= env.limits["max_output_chars"]
        (root / "big.py").write_text("".join(f"x{i} = 'needle'\n" for i in range(1000)))
        found = ok(s, "search", query="needle")
        assert found.startswith("1000 matching lines") and "[... 950 more matching lines; narrow the search]" in found
        page = ok(s, "read_file", path="big.py")
        assert page.startswith("big.py (lines 1-200 of 1000)") and "ask for the next range" not in page
        assert ok(s, "read_file", path="big.py", start_line=990).startswith("big.py (lines 990-1000 of 1000)")
        assert "at most 200 lines per call" in ok(s, "read_file", path="big.py", start_line=1, end_line=500)
        assert s.call("read_file", {"path": "big.py", "start_line": 2000}).status == "error"
        assert s.call("read_file", {"path": "big.py", "start_line": 5, "end_line": 4}).status == "error"


def test_non_utf8_binary_and_huge_files(env, tasks):
    with episode(env, tasks["ledger-02"]) as s:
        root = s.state.root
        (root / "latin1.txt").write_bytes("caf\xe9 au lait\nline two\n".encode("latin-1"))
        (root / "blob.bin").write_bytes(b"\x00\x01\x02" * 100)
        (root / "long.txt").write_text("y" * 1000 + "\n")
        page = ok(s, "read_file", path="latin1.txt")
        assert "caf\ufffd au lait" in page and "not valid UTF-8" in page
        assert "[... 700 more characters]" in ok(s, "read_file", path="long.txt")
        res = s.call("apply_edit", {"path": "latin1.txt", "search": "line two", "replace": "x"})
        assert res.status == "error" and "not valid UTF-8" in res.content
        assert "binary" in s.call("read_file", {"path": "blob.bin"}).content
        found = ok(s, "search", query="au lait")
        assert "latin1.txt:1: caf\ufffd au lait" in found and "skipped" in found and "blob.bin" in found
        assert ", 1 failed." in ok(s, "run_tests")  # odd files travel into the sandbox as bytes
        big = root / "data.txt"
        with open(big, "w") as f:
            f.write(("z" * 99 + "\n") * 50_000)  # 5 MB
        assert "(5000000 bytes)" in ok(s, "list_files")
        page = ok(s, "read_file", path="data.txt", start_line=3, end_line=4)
        assert "only its first 2 MB can be read" in page and page.startswith("data.txt (lines 3-4 of 20972+)")
        assert "data.txt" in ok(s, "search", query="zzz").split("skipped", 1)[1]
        res = s.call("run_tests", {})
        assert res.status == "error" and "more than 4 MB" in res.content
        res = s.call("submit_result", {})
        assert res.status == "error" and not s.state.submitted
        big.unlink()
        res = s.call("apply_edit", {"path": "ledger/money.py", "search": '"""Amounts of money as whole cents."""',
                                    "replace": "# " + "w" * 300_000})
        assert res.status == "error" and "larger than 256 KB" in res.content


def test_regex_search_runs_in_the_sandbox(env, tasks):
    with episode(env, tasks["spans-05"]) as s:
        found = ok(s, "search", query=r"def (overlaps|contains)\(", regex=True, path="spans")
        assert found.startswith("2 matching lines in spans:")
        assert "spans/interval.py:28: def contains(self, minute):" in found
        assert "not a valid regular expression" in s.call("search", {"query": "(", "regex": True}).content
        assert "No matches" in ok(s, "search", query="nothing like this")
        (s.state.root / "evil.txt").write_text("a" * 40 + "b\n")
        t0 = time.perf_counter()
        res = s.call("search", {"query": "(a+)+$", "regex": True, "path": "evil.txt"}, timeout_s=1.0)
        assert res.status == "timeout" and "too slow" in res.content and time.perf_counter() - t0 < 5
        assert not s.stopped and ok(s, "search", query="overlaps", path="spans/interval.py")


# ---------------------------------------------------------------------------------------------- the verifier
def submit_and_verify(env, task, edits=(), graded=None):
    with episode(env, task) as s:
        for e in edits:
            ok(s, "apply_edit", **e)
        assert s.call("submit_result", {"summary": "done"}).final
    return env.verify(graded or task, s)


def test_verifier_needs_every_fail_to_pass_test_and_no_pass_to_fail(env, tasks):
    task = tasks["ledger-13"]  # two fail-to-pass tests
    with episode(env, task) as s:
        assert env.verify(task, s) == (0.0, "nothing was submitted")
    assert submit_and_verify(env, task, task["patch"]) == (1.0, None)
    score, reason = submit_and_verify(env, task)
    assert score == 0.0
    assert reason.startswith("2 of 2 fail-to-pass tests still fail: tests/test_statement.py::test_totals")
    # the fix, plus an edit that breaks another test: P2F > 0 scores 0, and the reason names the broken test
    score, reason = submit_and_verify(env, task, task["patch"] + task["sabotage"])
    assert score == 0.0 and "fail-to-pass" not in reason
    assert reason.startswith("1 of 21 pass-to-pass tests now fail: tests/test_transfer.py::test_transfer_to_itself")
    # F2P = all: with one more fail-to-pass test that the submission breaks, fixing the others is not enough
    stricter = {**task, "f2p": task["f2p"] + ["tests/test_transfer.py::test_transfer_to_itself_is_refused"],
                "p2p": [t for t in task["p2p"] if not t.endswith("test_transfer_to_itself_is_refused")]}
    score, reason = submit_and_verify(env, task, task["patch"] + task["sabotage"], graded=stricter)
    assert score == 0.0 and reason.startswith("1 of 3 fail-to-pass tests still fail")
    # graded with the original tests: making the failing tests pass by editing them gains nothing
    cheat = [{"path": t.split("::")[0], "search": f"def {t.split('::')[1]}():",
              "replace": f"def {t.split('::')[1]}():\n    return\n\n\ndef _unused():"} for t in task["f2p"]]
    score, reason = submit_and_verify(env, task, cheat)
    assert score == 0.0 and "2 of 2 fail-to-pass tests still fail" in reason


def test_the_sandbox_follows_rewards_code(env, tasks, monkeypatch):
    """require_os_isolation from the run's rewards.code reaches the tests' sandbox: without OS isolation the tools
    refuse to run, and the verifier raises (an infrastructure failure, not a wrong fix)."""
    from rewards import sandbox

    monkeypatch.setattr(sandbox, "_probe_cache", {})
    monkeypatch.setattr(sandbox, "_warned", set())
    monkeypatch.setenv(sandbox.DISABLE_ENV, "landlock,jail,netns")
    monkeypatch.setitem(env.config, "code_sandbox", {"require_os_isolation": True})
    task = tasks["strkit-01"]
    with episode(env, task) as s:
        res = s.call("run_tests", {})
        assert res.status == "error" and "refused" in res.content and "require_os_isolation" in res.content
        assert s.call("submit_result", {}).final
        with pytest.raises(sandbox.SandboxIsolationError):
            env.verify(task, s)


# ------------------------------------------------------------------------------------------ the easy tasks only
def test_dataset_where_keeps_the_easy_tasks(env, tasks):
    from rl.config import ConfigError, _validate_dataset
    from rl.data import load_domain_rows

    ds = {"path": str(env.tasks_path), "columns": {"prompt": "prompt", "id": "id"}, "where": {"difficulty": "easy"}}
    rows = load_domain_rows("agent", ds)
    assert {r["id"] for r in rows} == {t["id"] for t in tasks.values() if t["difficulty"] == "easy"}
    both = load_domain_rows("agent", {**ds, "where": {"difficulty": ["easy", "hard"], "repo": "spans"}})
    assert len(both) == sum(t["repo"] == "spans" for t in tasks.values())
    with pytest.raises(ConfigError, match="where.level: column 'level' not in the dataset"):
        load_domain_rows("agent", {**ds, "where": {"level": 1}})
    with pytest.raises(ConfigError, match="no row of"):
        load_domain_rows("agent", {**ds, "where": {"difficulty": "impossible"}})
    _validate_dataset(ds, "domains.agent.dataset")
    with pytest.raises(ConfigError, match="where must map dataset columns"):
        _validate_dataset({**ds, "where": "easy"}, "domains.agent.dataset")
