"""Code repository agent (the agentic-coding environment of the DeepSeek-V3.2 recipe): an issue report against a
small bundled Python repository with an injected bug; the agent explores, edits and tests the code with tools and
submits; the verifier runs the task's fail-to-pass and pass-to-pass tests.

Per episode, init_state copies the task's clean repository (repos/<repo>/) into a private temp directory (0700,
`mixrl-code-repo-*`) and injects the bug (a search/replace); close_state removes it (the session calls close_state
also when init_state fails, so nothing is left behind). Each episode has its own copy: no episode sees another's
edits. The file tools (list_files, read_file, search, apply_edit) are trusted host code that only reads and
writes text inside that copy: every path is resolved inside it (absolute paths, `..` and symbolic links are
refused). Code of the repository never runs on the host: run_tests sends a snapshot of the copy into the project's
code sandbox in graded mode (rewards/sandbox.py `run_graded`: the same OS isolation, rlimits, write quota and
clean-up as the code_interpreter environment and the code reward, with the run's `rewards.code` settings,
`state.config["code_sandbox"]`). There the repository (without its tests) is written into the program's process,
which imports its packages; the test files run in the grader's process, which the repository's code cannot reach,
import, patch or write to (rewards/sandbox_grader.py, "suite"): each test's verdict is written by the grader, on
a channel the code under test has no descriptor for. The tool timeout is the sandbox's wall-clock limit; a run
killed at it reports the tests that finished and the one that was running, and the episode goes on (the copy is
untouched by a test run). A regex search (a pattern could take exponential time) runs runner.py in the sandbox.

The verifier (`verify`): nothing submitted scores 0. Otherwise the repository as it was at submit_result (a
snapshot taken then, so verification works after the session is closed), with its tests/ directory replaced by the
original test files (editing a test to make it pass gains nothing), runs the task's fail-to-pass (F2P) and
pass-to-pass (P2P) tests in the sandbox. Score 1.0 when ALL F2P tests pass (F2P = all, not "at least one": a
partial fix of an issue with several symptoms is not a fix) and no P2P test fails (P2F = 0); else 0.0, with a
reason naming the failing tests and their messages. A test the run did not reach (it was killed at
`verify_timeout_s`, or the code ended the process) counts as failing. The submitted code runs in a process of its
own: patching the test framework, the tests' assertions or the reporting gains nothing there. What it can still
do is what its own objects do when the tests use them (e.g. an `__eq__` that always holds makes a test that compares
two of the repository's objects pass; a test that compares them with plain values is not fooled).

Tasks (tasks.jsonl, made and validated by generate.py): id, repo, difficulty (easy: a one-line fix in the function
the issue names; hard: the bug is elsewhere, e.g. a shared helper), prompt (the issue, written as a user would:
symptoms, not the fix), bug (the injection, search/replace edits on the clean repository), patch (the reference
fix, the inverse edits, as apply_edit arguments), f2p and p2p (test ids `tests/test_x.py::test_name`), sabotage
(an edit that, after the fix, breaks a P2P test: for check_env's perturbation).
"""

from __future__ import annotations

import base64
import difflib
import json
import math
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from rewards.sandbox import SandboxIsolationError, SandboxLimits, run_graded, run_program, sandbox_limits_from_config
from rollout.envs.base import ToolError, ToolTimeout, own_timeout

RUNNER = Path(__file__).resolve().with_name("runner.py")  # the regex search's program
OWN_SANDBOX_KEYS = ("memory_mb", "output_bytes", "max_procs", "max_write_mb")  # as code_interpreter's env.yaml
MAX_REPO_BYTES = 4 << 20  # what a test run or a regex search sends into the sandbox
MAX_FILE_BYTES = 256 << 10  # apply_edit does not make a file larger than this
MAX_READ_BYTES = 2 << 20  # read_file reads at most this much of a file
MAX_SEARCH_FILE_BYTES = 1 << 20  # search skips larger files
READ_MAX_LINES = 200
LINE_CHARS = 300  # longer lines are cut in read_file and search results
MAX_MATCHES = 50
MAX_LISTED = 300
MAX_QUERY_CHARS = 200
MESSAGE_CHARS = 400  # of one failing test's message
OUTPUT_CHARS = 1000  # of what one test prints (kept by the grader); 200 of it are shown
SHOWN_FAILURES = 15
SKIP_DIRS = {"__pycache__", ".git"}
SPEC = re.compile(r"(tests/)?test_\w+\.py(::test_\w+)?|test_\w+")
DIED = {"cpu_limit": "it ran out of CPU time", "memory": "it ran out of memory",
        "output_limit": "it printed too much", "write_limit": "it wrote too much to disk",
        "forbidden": "it did something the sandbox forbids", "killed": "it was killed",
        "unavailable": "it imported a module the sandbox does not provide",
        "runtime_error": "the code under test ended its process"}
# The program side of a test run: writes the repository (its tests excluded) into the box and puts it first on
# sys.path; the grader then imports the repository's packages through it.
BOOTSTRAP = """import base64 as _b64, os as _os, sys as _sys
for _rel, _data in {files!r}.items():
    _full = _os.path.join(_os.getcwd(), _rel)
    _os.makedirs(_os.path.dirname(_full), exist_ok=True)
    with open(_full, "wb") as _f:
        _f.write(_b64.b64decode(_data))
_os.remove("solution.py")  # this program's own file: the box holds the repository only
_sys.path.insert(0, _os.getcwd())
"""


# ------------------------------------------------------------------------------------------- episode set-up
def _repo_source(state) -> Path:
    name = str(state.task.get("repo", ""))
    src = state.env_dir / state.config.get("repos_dir", "repos") / name
    if not name.isidentifier() or not src.is_dir():
        raise ValueError(f"task {state.task.get('id')}: no bundled repository {name!r} under {src.parent}")
    return src


def init_state(state):
    state.root = None
    state.final_files = None  # the graded repository, snapshotted by submit_result
    src = _repo_source(state)
    # mkdtemp makes a 0700 directory of ours; resolved so that path checks compare real paths
    state.root = Path(tempfile.mkdtemp(prefix="mixrl-code-repo-")).resolve()
    shutil.copytree(src, state.root, dirs_exist_ok=True, symlinks=True,
                    ignore=shutil.ignore_patterns(*SKIP_DIRS, "*.pyc"))
    os.chmod(state.root, 0o700)  # copytree gave it the source's mode: the episode's copy is ours alone
    for edit in state.task.get("bug", []):
        path = state.root / edit["path"]
        text = path.read_text(encoding="utf-8")
        n = text.count(edit["search"])
        if n != 1:
            raise ValueError(f"task {state.task.get('id')}: its bug does not apply to {edit['path']} (the search "
                             f"text occurs {n} times)")
        path.write_text(text.replace(edit["search"], edit["replace"], 1), encoding="utf-8")


def close_state(state):
    root = getattr(state, "root", None)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
        state.root = None


# ----------------------------------------------------------------------------------------------- file access
def _rel(state, path: Path) -> str:
    return path.relative_to(state.root).as_posix() or "."


def _all_files(state, under: Path | None = None) -> list[Path]:
    """Regular files under `under` (default: the repository), sorted; links and cache directories skipped."""
    out = []
    for dirpath, dirnames, filenames in os.walk(under or state.root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not os.path.islink(os.path.join(dirpath, d)))
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if not p.is_symlink() and p.is_file():
                out.append(p)
    return out


def _resolve(state, path: str, kind: str = "file") -> Path:
    """`path` inside the episode's repository (kind: file | dir | any), or a ToolError saying why not."""
    if state.root is None:
        raise ToolError("this episode's repository is gone (the session was closed)")
    text = path.strip()
    if "\x00" in text:
        raise ToolError("a path cannot contain a NUL character")
    pure = PurePosixPath(text)
    if pure.is_absolute() or text.startswith("~"):
        raise ToolError(f"{text!r} is an absolute path; give a path relative to the repository root, e.g. "
                        "tests/test_x.py")
    parts = [p for p in pure.parts if p not in ("", ".")]
    if ".." in parts:
        raise ToolError(f"{text!r}: '..' is not allowed; every path is relative to the repository root")
    current = state.root
    for part in parts:
        current = current / part
        if current.is_symlink():
            raise ToolError(f"{_rel(state, current)!r} is a symbolic link; links are not followed")
    real = current.resolve()
    if real != state.root and state.root not in real.parents:  # belt and braces: nothing above gets out
        raise ToolError(f"{text!r} is outside the repository")
    if not current.exists():
        names = [_rel(state, p) for p in _all_files(state)]
        close = difflib.get_close_matches(text, names, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else "; list_files shows what there is"
        raise ToolError(f"no such file or directory: {text!r}{hint}")
    if kind == "file" and not current.is_file():
        raise ToolError(f"{text!r} is a directory, not a file")
    if kind == "dir" and not current.is_dir():
        raise ToolError(f"{text!r} is a file, not a directory")
    return current


def _lines(text: str) -> list[str]:
    """Lines as Python numbers them in tracebacks (split at \\n only; a trailing newline adds no line)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def _cut(line: str) -> str:
    return line if len(line) <= LINE_CHARS else f"{line[:LINE_CHARS]} [... {len(line) - LINE_CHARS} more characters]"


def _read_text(path: Path, limit: int) -> tuple[str, bool, bool]:
    """(text, valid UTF-8, cut at `limit` bytes); a ToolError for a binary file (a NUL byte near the start)."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if b"\x00" in data[:8192]:
        raise ToolError(f"{path.name} is a binary file")
    cut = len(data) > limit
    data = data[:limit]
    try:
        return data.decode("utf-8"), True, cut
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace"), False, cut


def snapshot(state) -> dict[str, bytes]:
    """The repository's files as {relative path: bytes} (what runs in the sandbox and what gets graded)."""
    files, total = {}, 0
    for p in _all_files(state):
        total += p.stat().st_size
        if total > MAX_REPO_BYTES:
            raise ToolError(f"the repository holds more than {MAX_REPO_BYTES >> 20} MB; it cannot be sent to the "
                            "sandbox")
        files[_rel(state, p)] = p.read_bytes()
    return files


# ----------------------------------------------------------------------------------------------- the sandbox
def _limits(state, timeout_s: float) -> SandboxLimits:
    own = dict(state.config.get("sandbox") or {})
    unknown = sorted(set(own) - set(OWN_SANDBOX_KEYS))
    if unknown:
        raise ToolError(f"env.yaml sandbox: unknown key(s) {unknown}; allowed: {list(OWN_SANDBOX_KEYS)} (the "
                        "isolation settings come from rewards.code)")
    return sandbox_limits_from_config(state.config.get("code_sandbox"), **own, wall_s=timeout_s,
                                      cpu_s=int(math.ceil(timeout_s)) + 1)


def _sandboxed(state, request: dict, files: dict[str, bytes], timeout_s: float) -> tuple[dict, object]:
    """Runs runner.py (the regex search) on `request` in the sandbox: ({kind: [payloads]} of the lines it printed,
    RunResult). SandboxIsolationError (require_os_isolation without OS isolation) is raised as it is."""
    mark = f"@@run-{secrets.token_hex(8)}"
    payload = {**request, "mark": mark, "files": {k: base64.b64encode(v).decode("ascii") for k, v in files.items()}}
    res = run_program(RUNNER.read_text(encoding="utf-8"), _limits(state, timeout_s), stdin=json.dumps(payload))
    lines: dict[str, list] = {}
    for line in res.stdout.splitlines():
        if line.startswith(mark + " "):
            kind, _, rest = line[len(mark) + 1:].partition(" ")
            try:
                lines.setdefault(kind, []).append(json.loads(rest))
            except ValueError:
                continue  # a line broken by a test writing to the descriptor directly
    return lines, res


def packages_of(files: dict[str, bytes]) -> list[str]:
    """The repository's top-level importable names (packages and modules), its tests excluded."""
    names = set()
    for rel in files:
        head, _, rest = rel.partition("/")
        name = head if rest else (head[:-3] if head.endswith(".py") else "")
        if name.isidentifier() and name != "tests":
            names.add(name)
    return sorted(names)


def run_suite(state, files: dict[str, bytes], select: list[str] | None, timeout_s: float) -> dict:
    """Runs the selected tests (None: all) of `files` in the sandbox, the tests in the grader's process and the
    repository in the program's: {results: [{id, passed, message, output}], missing: [specs], running: the test
    killed mid-run or None, status and detail (the sandbox's), seconds}."""
    tests = {k: v.decode("utf-8", errors="replace") for k, v in files.items() if k.startswith("tests/")}
    code = {k: base64.b64encode(v).decode("ascii") for k, v in files.items() if not k.startswith("tests/")}
    grader = {"kind": "suite", "tests": tests, "select": select, "packages": packages_of(files),
              "message_chars": MESSAGE_CHARS, "output_chars": OUTPUT_CHARS}
    res = run_graded(BOOTSTRAP.format(files=code), _limits(state, timeout_s), grader)
    results = [r["result"] for r in res.records if isinstance(r.get("result"), dict)]
    finished = {r.get("id") for r in results}
    started = [r["start"] for r in res.records if "start" in r and r["start"] not in finished]
    missing = next((r["missing"] for r in res.records if "missing" in r), [])
    seconds = next((r["seconds"] for r in res.records if "seconds" in r), None)
    done = any(r.get("done") for r in res.records)
    status = res.status if res.status != "ok" else "ok" if done else "killed"
    return {"results": results, "missing": missing, "running": started[-1] if started else None, "status": status,
            "detail": res.detail or res.stderr_tail.strip()[-300:], "seconds": seconds}


# -------------------------------------------------------------------------------------------------- the tools
def list_files(state, path: str = "") -> str:
    """List the repository's files (recursively), with their sizes in lines.

    Args:
        path: a directory to list, relative to the repository root (default: the whole repository).
    """
    base = _resolve(state, path, "dir")
    files = _all_files(state, base)
    rows = []
    for p in files[:MAX_LISTED]:
        size = p.stat().st_size
        if size > MAX_SEARCH_FILE_BYTES:
            rows.append(f"{_rel(state, p)}  ({size} bytes)")
        else:
            with open(p, "rb") as f:
                rows.append(f"{_rel(state, p)}  ({len(_lines(f.read().decode('utf-8', 'replace')))} lines)")
    if len(files) > MAX_LISTED:
        rows.append(f"[... {len(files) - MAX_LISTED} more files]")
    return "\n".join(rows) if rows else f"(no files under {_rel(state, base)})"


def read_file(state, path: str, start_line: int | None = None, end_line: int | None = None) -> str:
    """Read a file of the repository, with line numbers (at most 200 lines per call: ask for a range).

    Args:
        path: the file, relative to the repository root, e.g. "tests/test_x.py".
        start_line: the first line to show (1-based; default 1).
        end_line: the last line to show (default: 200 lines from start_line, or the end of the file).
    """
    target = _resolve(state, path, "file")
    text, valid, cut = _read_text(target, MAX_READ_BYTES)
    lines = _lines(text)
    n = len(lines)
    start = 1 if start_line is None else start_line
    if start < 1 or (end_line is not None and end_line < start):
        raise ToolError(f"bad line range {start_line}-{end_line}: lines are numbered from 1 and end_line may not "
                        "come before start_line")
    if n == 0:
        return f"{_rel(state, target)} is empty"
    if start > n:
        raise ToolError(f"start_line {start} is past the end of {_rel(state, target)} ({n} lines)")
    end = min(n, start + READ_MAX_LINES - 1 if end_line is None else end_line)
    notes = []
    if end - start + 1 > READ_MAX_LINES:
        end = start + READ_MAX_LINES - 1
        notes.append(f"at most {READ_MAX_LINES} lines per call; ask for the next range")
    if not valid:
        notes.append("not valid UTF-8: undecodable bytes are shown as \ufffd")
    if cut:
        notes.append(f"the file is {target.stat().st_size} bytes; only its first {MAX_READ_BYTES >> 20} MB can be "
                     "read")
    width = len(str(end))
    body = "\n".join(f"{i:>{width}}| {_cut(lines[i - 1])}" for i in range(start, end + 1))
    head = f"{_rel(state, target)} (lines {start}-{end} of {n}{'+' if cut else ''})"
    return head + "".join(f"\n[{note}]" for note in notes) + "\n" + body


@own_timeout
def search(state, query: str, path: str = "", regex: bool = False) -> str:
    """Search the repository's files for a text, line by line; matches are shown as path:line: text.

    Args:
        query: the text to find (exact, case-sensitive), or a Python regular expression when regex is true.
        path: a file or directory to search in, relative to the repository root (default: everywhere).
        regex: treat query as a regular expression.
    """
    if not query or "\n" in query or len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"the query must be one line of 1 to {MAX_QUERY_CHARS} characters")
    base = _resolve(state, path, "any")
    candidates = [base] if base.is_file() else _all_files(state, base)
    texts, skipped = {}, []
    for p in candidates:
        if p.stat().st_size > MAX_SEARCH_FILE_BYTES:
            skipped.append(_rel(state, p))
            continue
        try:
            texts[_rel(state, p)] = _read_text(p, MAX_SEARCH_FILE_BYTES)[0]
        except ToolError:
            skipped.append(_rel(state, p))  # binary
    if regex:
        try:
            re.compile(query)
        except re.error as exc:
            raise ToolError(f"not a valid regular expression: {exc}") from None
        # Matching runs in the sandbox: a pattern can take exponential time, and only a process can be killed.
        request = {"pattern": query, "max_matches": MAX_MATCHES, "line_chars": LINE_CHARS}
        try:
            lines, res = _sandboxed(state, request, {k: v.encode() for k, v in texts.items()}, state.timeout_s)
        except SandboxIsolationError as exc:
            raise ToolError(f"the sandbox refused to run: {exc}") from None
        if res.status == "timeout":
            raise ToolTimeout(f"Timed out after {state.timeout_s:g} s: the regular expression is too slow on these "
                              "files; simplify it or search for a literal text")
        if "done" not in lines:
            raise ToolError(f"the search failed ({res.status}: {res.detail or res.stderr_tail.strip()[-200:]})")
        matches, total = lines.get("match", []), lines["done"][-1]["total"]
    else:
        matches, total = [], 0
        for rel, text in texts.items():
            for number, line in enumerate(_lines(text), 1):
                if query in line:
                    total += 1
                    if total <= MAX_MATCHES:
                        matches.append([rel, number, line])
    scope = "the repository" if base == state.root else _rel(state, base)
    notes = f"\n[skipped (binary or over {MAX_SEARCH_FILE_BYTES >> 20} MB): {', '.join(skipped)}]" if skipped else ""
    if not matches:
        return f"No matches for {query!r} in {scope}.{notes}"
    body = "\n".join(f"{rel}:{number}: {_cut(text.strip())}" for rel, number, text in matches)
    more = f"\n[... {total - len(matches)} more matching lines; narrow the search]" if total > len(matches) else ""
    return f"{total} matching line{'s' if total != 1 else ''} in {scope}:\n{body}{more}{notes}"


def _occurrences(text: str, search: str) -> list[int]:
    """Start offsets of every occurrence of `search`, overlapping ones included."""
    out, at = [], text.find(search)
    while at != -1:
        out.append(at)
        at = text.find(search, at + 1)
    return out


def apply_edit(state, path: str, search: str, replace: str) -> str:
    """Replace a piece of a file: `search` must occur in the file exactly once (copy it exactly, indentation and
    line breaks included; add surrounding lines to make it unique).

    Args:
        path: the file, relative to the repository root.
        search: the exact text to replace (one or more whole or partial lines).
        replace: the new text (may be empty to delete).
    """
    target = _resolve(state, path, "file")
    rel = _rel(state, target)
    if not search:
        raise ToolError("search is empty: give the exact text to replace")
    if search == replace:
        raise ToolError("search and replace are the same: nothing would change")
    if target.stat().st_size > MAX_FILE_BYTES:
        raise ToolError(f"{rel} is over {MAX_FILE_BYTES >> 10} KB; apply_edit edits smaller files only")
    text, valid, _ = _read_text(target, MAX_FILE_BYTES)
    if not valid:
        raise ToolError(f"{rel} is not valid UTF-8 text; apply_edit edits UTF-8 text files only")
    found = _occurrences(text, search)
    if len(found) != 1:
        if not found:
            why = f"the search text occurs 0 times in {rel}"
            if search.strip() and search.strip() in text:
                why += " (it does with different leading or trailing whitespace: copy the text exactly)"
            raise ToolError(why + "; read the file and copy the text to replace exactly")
        lines = ", ".join(str(n) for n in sorted({text.count("\n", 0, at) + 1 for at in found})[:10])
        raise ToolError(f"the search text occurs {len(found)} times in {rel} (starting on lines {lines}); include "
                        "more of the surrounding lines so that it occurs exactly once")
    new = text[:found[0]] + replace + text[found[0] + len(search):]
    try:
        data = new.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError("the replacement is not valid text (it holds a lone surrogate)") from None
    if len(data) > MAX_FILE_BYTES:
        raise ToolError(f"the edit would make {rel} larger than {MAX_FILE_BYTES >> 10} KB")
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)  # a stopped call leaves the old file or the new one, never half of it
    first = text.count("\n", 0, found[0]) + 1
    last = first + replace.count("\n")
    lines = _lines(new)
    lo, hi = max(1, first - 2), min(len(lines), last + 2, first + 30)
    shown = "\n".join(f"{i:>{len(str(hi))}}| {_cut(lines[i - 1])}" for i in range(lo, hi + 1))
    where = f"line {first}" if first == last else f"lines {first}-{last}"
    return f"Edited {rel}: replaced 1 occurrence (the new text is on {where}).\n{shown}"


def _spec(test: str) -> str:
    spec = test.strip()
    if spec.startswith("test_") and spec.endswith(".py") or spec.startswith("test_") and "::" in spec:
        spec = "tests/" + spec  # a file given without its directory
    if not SPEC.fullmatch(spec):
        raise ToolError(f"{test!r} is not a test: give a test id like tests/test_x.py::test_name, a test file like "
                        "tests/test_x.py, or a test function name (or nothing, to run every test)")
    return spec


@own_timeout
def run_tests(state, test: str | None = None) -> str:
    """Run the repository's tests (plain functions named test_* in tests/test_*.py; pytest is not used) in a
    sandbox, on the files as they are now. Shows how many passed and, for each failing test, why.

    Args:
        test: one test id (tests/test_x.py::test_name), test file (tests/test_x.py) or test function name;
            default: every test.
    """
    select = None if test is None or not test.strip() else [_spec(test)]
    files = snapshot(state)
    try:
        out = run_suite(state, files, select, state.timeout_s)
    except SandboxIsolationError as exc:
        raise ToolError(f"the sandbox refused to run: {exc}") from None
    if out["status"] == "setup_error":
        raise ToolError(f"the sandbox failed ({out['status']}: {out['detail']}); the tests did not run")
    if select and out["missing"] and not out["results"]:
        raise ToolError(f"no test matches {select[0]!r}; run_tests without an argument runs (and lists) them all")
    report = _report(out)
    if out["status"] == "timeout":
        where = f" while running {out['running']}" if out["running"] else ""
        raise ToolTimeout(f"Timed out after {state.timeout_s:g} s{where}: the test process was killed (does a test "
                          f"or the code it calls loop forever?). Results before that:\n{report}")
    if out["status"] != "ok":
        where = f" while running {out['running']}" if out["running"] else ""
        why = DIED.get(out["status"], out["status"])
        raise ToolError(f"the test process died{where}: {why} ({out['detail'][:200]}). Results before that:\n"
                        f"{report}")
    return report


def _report(out: dict) -> str:
    results = out["results"]
    failed = [r for r in results if not r["passed"]]
    passed = [r["id"] for r in results if r["passed"]]
    secs = f" in {out['seconds']:.2f} s" if out.get("seconds") is not None else ""
    lines = [f"Ran {len(results)} test{'s' if len(results) != 1 else ''}{secs}: {len(passed)} passed, "
             f"{len(failed)} failed."]
    for r in failed[:SHOWN_FAILURES]:
        lines.append(f"FAILED {r['id']}: {r['message']}")
        if r.get("output", "").strip():
            printed = r["output"].strip()
            lines.append("  printed: " + (printed if len(printed) <= 200 else printed[:200] + " [...]"))
    if len(failed) > SHOWN_FAILURES:
        lines.append(f"[... {len(failed) - SHOWN_FAILURES} more failing tests]")
    if passed:  # per file: the failures are named above, and every other test of a file passed
        per_file = {}
        for tid in passed:
            per_file[tid.split("::")[0]] = per_file.get(tid.split("::")[0], 0) + 1
        lines.append("Passed: " + ", ".join(f"{path} ({n})" for path, n in per_file.items()))
    if out["missing"]:
        lines.append("No such test: " + ", ".join(out["missing"]))
    return "\n".join(lines)


def submit_result(state, summary: str = "") -> str:
    """Submit the repository as it is now as your fix; this ends the episode. Only the first submission counts.

    Args:
        summary: one or two sentences on what you changed and why (not graded).
    """
    state.final_files = snapshot(state)  # the graded state: verification needs no live repository
    return "Submitted; the fix will be checked with the repository's tests."


TOOLS = [list_files, read_file, search, apply_edit, run_tests, submit_result]


# ----------------------------------------------------------------------------------------------- verification
def graded_files(state) -> dict[str, bytes]:
    """The submitted files with tests/ exactly as in the clean repository (edits to the tests do not count)."""
    src = _repo_source(state)
    files = {k: v for k, v in state.final_files.items() if not k.startswith("tests/")}
    for p in sorted((src / "tests").rglob("*")):
        if p.is_file() and not set(p.relative_to(src).parts) & SKIP_DIRS and p.suffix != ".pyc":
            files[p.relative_to(src).as_posix()] = p.read_bytes()
    return files


def verify(task, state):
    if not state.submitted or getattr(state, "final_files", None) is None:
        return 0.0, "nothing was submitted"
    f2p, p2p = list(task["f2p"]), list(task["p2p"])
    timeout = float(state.config.get("verify_timeout_s", 30))
    out = run_suite(state, graded_files(state), f2p + p2p, timeout)
    if out["status"] == "setup_error":  # the sandbox's own report: its failure, not the submission's
        raise RuntimeError(f"the sandbox failed while verifying ({out['status']}: {out['detail']})")
    by_id = {r["id"]: r for r in out["results"]}

    def failing(ids):
        return [t for t in ids if not by_id.get(t, {}).get("passed")]

    def named(ids):
        parts = [f"{t} ({by_id[t]['message'][:150]})" if t in by_id else f"{t} (did not run)" for t in ids[:5]]
        return "; ".join(parts) + (f"; and {len(ids) - 5} more" if len(ids) > 5 else "")

    still, broken = failing(f2p), failing(p2p)
    if not still and not broken:
        return 1.0, None
    reasons = []
    if still:
        reasons.append(f"{len(still)} of {len(f2p)} fail-to-pass tests still fail: {named(still)}")
    if broken:
        reasons.append(f"{len(broken)} of {len(p2p)} pass-to-pass tests now fail: {named(broken)}")
    if out["status"] != "ok":
        where = f" while running {out['running']}" if out["running"] else ""
        reasons.append(f"the test run ended early{where} ({out['status']}: {out['detail'][:150]})")
    return 0.0, "; ".join(reasons)


# ------------------------------------------------------------------------------------------- check_env hooks
def solve(task, call):
    """The reference episode: per patch edit, find the buggy line with search, read the lines around it and apply
    the edit; then run the tests (all must pass) and submit."""
    for edit in task["patch"]:
        anchor = max(edit["search"].split("\n"), key=lambda line: len(line.strip())).strip()
        found = call("search", query=anchor, path=edit["path"])
        m = re.search(rf"^{re.escape(edit['path'])}:(\d+):", found, re.M)
        line = int(m.group(1)) if m else 1
        call("read_file", path=edit["path"], start_line=max(1, line - 4),
             end_line=line + edit["search"].count("\n") + 4)
        call("apply_edit", path=edit["path"], search=edit["search"], replace=edit["replace"])
    report = call("run_tests")
    if ", 0 failed." not in report.split("\n", 1)[0]:
        raise RuntimeError(f"the reference patch leaves failing tests: {report[:500]}")
    call("submit_result", summary="Fixed the bug in " + ", ".join(sorted({e["path"] for e in task["patch"]})) + ".")


def perturb_submission(task, value) -> dict:
    return {}  # the submission's summary is not graded: changing it must not change the score


def perturb(task, calls) -> dict:
    """Wrong episodes: no edit at all; the fix plus an edit that breaks a pass-to-pass test (the task's sabotage);
    and, instead of the fix, the fail-to-pass tests edited to pass trivially (graded with the original tests)."""
    unedited = [c for c in calls if c[0] != "apply_edit"]
    out = {"no_edit": unedited}
    if task.get("sabotage"):
        out["breaks_a_passing_test"] = calls[:-1] + [("apply_edit", dict(e)) for e in task["sabotage"]] + calls[-1:]
    disabled = []
    for tid in task["f2p"]:
        path, name = tid.split("::")
        disabled.append(("apply_edit", {"path": path, "search": f"def {name}():",
                                        "replace": f"def {name}():\n    return\n\n\ndef _{name}_disabled():"}))
    out["edits_the_tests"] = unedited[:-1] + disabled + unedited[-1:]
    return out
