"""The program the code_repo environment runs in the code sandbox (rewards/sandbox.py `run_program`, stdio mode):
a tiny test runner, and the regex search over the repository. Self-contained on purpose: it runs inside the box
with the standard library only (no pytest, no project package), so it starts fast and needs no allowed packages.

Input (stdin, one JSON object): `mark` (a random token per run that starts every line the host reads back, so
what a test prints cannot pass for a result by accident), `files` ({relative path: base64 bytes}: the repository,
written into the box first), `mode` ("tests" or "search") and the mode's own keys.

tests: `select` (null: every test; else a list of specs, each a test id `tests/test_x.py::test_name`, a test file
`tests/test_x.py` or a bare function name `test_name`), `message_chars`, `output_chars`. Every `tests/test_*.py`
the selection needs is imported as a module (the repository root is first on sys.path, so tests import the
package), and each of its module-level functions named `test_*` is called in definition order. Output lines:
  <mark> start "<id>"                      before a test runs or a test file is imported (so a run killed at
                                           its deadline names what it was doing)
  <mark> result {"id", "passed", "message", "output"}   message: the exception, where it was raised, and for a
                                           failed `assert a == b` the two values; output: what the test printed
  <mark> missing [specs]                   specs that matched no test
  <mark> done {"seconds"}
A test file that fails to import gives one failed result whose id is the file.

search: `pattern` (a regex), `max_matches`, `line_chars`; prints `<mark> match [path, line, text]` lines (the
first max_matches), then `<mark> done {"total"}` with the number of matching lines.

Limits: a single process (no subprocess: the sandbox forbids it), no per-test deadline: the whole run has the
sandbox's wall-clock limit, and the host reports the tests finished before it. Code of the repository runs in
this process, so it could tamper with the runner on purpose (e.g. find the mark in the runner's frames); the host
makes accidents impossible (the mark, stdin closed once read) and grades with the original test files, nothing
more: deliberate tampering is a reward hack this environment does not prevent.
"""

import ast
import base64
import io
import json
import os
import re
import sys
import time
import traceback

REAL_OUT = sys.stdout
DUMPS = json.dumps


class Capture(io.TextIOBase):
    """A test's stdout and stderr: the first `cap` characters kept, the rest counted and dropped."""

    def __init__(self, cap):
        self.cap, self.parts, self.seen = cap, [], 0

    def write(self, s):
        s = str(s)
        room = self.cap - self.seen
        if room > 0:
            self.parts.append(s[:room])
        self.seen += len(s)
        return len(s)

    def writable(self):
        return True

    def text(self):
        kept = "".join(self.parts)
        return kept + (f"\n[... {self.seen - self.cap} characters omitted ...]" if self.seen > self.cap else "")


def emit(mark, kind, payload):
    REAL_OUT.write(f"{mark} {kind} {DUMPS(payload)}\n")
    REAL_OUT.flush()


def write_files(root, files):
    for rel, data in files.items():
        full = os.path.join(root, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(base64.b64decode(data))


def short(value, limit=200):
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - a broken __repr__ is still reported
        text = f"<repr failed: {type(exc).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def compared_values(tb_frame, line):
    """For a failed `assert a == b` (one line), the two sides evaluated again in the test's frame: what pytest's
    assertion rewriting would show. Any trouble (a multi-line assert, an exception) gives None."""
    try:
        node = ast.parse(line.strip()).body[0]
        test = node.test if isinstance(node, ast.Assert) else None
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
            return None
        env = dict(tb_frame.f_globals)
        env.update(tb_frame.f_locals)
        left = eval(compile(ast.Expression(test.left), "<assert>", "eval"), env)
        right = eval(compile(ast.Expression(test.comparators[0]), "<assert>", "eval"), env)
        return f"left: {short(left)}, right: {short(right)}"
    except Exception:  # noqa: BLE001
        return None


def describe(exc, root, limit):
    """The exception in one line, with the innermost place in the repository it came from."""
    head = traceback.format_exception_only(type(exc), exc)[-1].strip()
    inside = [(tb.tb_frame, tb.tb_lineno) for tb in walk(exc.__traceback__)
              if tb.tb_frame.f_code.co_filename.startswith(root + os.sep)]
    if inside:
        frame, lineno = inside[-1]
        rel = os.path.relpath(frame.f_code.co_filename, root)
        line = ""
        try:
            with open(frame.f_code.co_filename, encoding="utf-8", errors="replace") as f:
                line = f.read().split("\n")[lineno - 1].strip()
        except (OSError, IndexError):
            pass
        if isinstance(exc, AssertionError) and line.startswith("assert"):
            values = compared_values(frame, line)
            head = f"{head}: {line}" if head == "AssertionError" else head
            if values:
                head += f" ({values})"
        head += f" [at {rel}:{lineno}" + (f": {line}" if line and line not in head else "") + "]"
    return head if len(head) <= limit else head[:limit] + "..."


def walk(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def call_captured(fn, cap):
    """fn() with stdout/stderr captured: (exception or None, captured text)."""
    buf = Capture(cap)
    sys.stdout = sys.stderr = buf
    try:
        fn()
        error = None
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt in a test are failures too
        error = exc
    finally:
        sys.stdout, sys.stderr = REAL_OUT, sys.__stderr__
    return error, buf.text()


def run_tests(req, root):
    mark, msg_cap, out_cap = req["mark"], int(req["message_chars"]), int(req["output_chars"])
    select = req.get("select")
    specs = None if select is None else [str(s) for s in select]
    used = set()
    tests_dir = os.path.join(root, "tests")
    names = sorted(n for n in os.listdir(tests_dir) if n.startswith("test_") and n.endswith(".py")) \
        if os.path.isdir(tests_dir) else []
    sys.path.insert(0, root)
    t0 = time.perf_counter()
    for name in names:
        rel = f"tests/{name}"
        if specs is not None and not any(s == rel or s.startswith(rel + "::") or "/" not in s for s in specs):
            continue
        module = type(sys)(f"_test_{name[:-3]}")
        module.__file__ = os.path.join(tests_dir, name)

        def load(module=module):
            with open(module.__file__, encoding="utf-8") as f:
                source = f.read()
            exec(compile(source, module.__file__, "exec"), module.__dict__)

        sys.modules[module.__name__] = module
        emit(mark, "start", rel)
        error, printed = call_captured(load, out_cap)
        if error is not None:
            for s in specs or ():
                if s == rel or s.startswith(rel + "::"):
                    used.add(s)
            emit(mark, "result", {"id": rel, "passed": False, "output": printed,
                                  "message": "error while importing the test file: " + describe(error, root, msg_cap)})
            continue
        for fname, fn in list(module.__dict__.items()):
            if not (fname.startswith("test_") and callable(fn) and getattr(fn, "__module__", None) == module.__name__):
                continue
            tid = f"{rel}::{fname}"
            if specs is not None:
                hits = [s for s in specs if s in (rel, tid, fname)]
                if not hits:
                    continue
                used.update(hits)
            emit(mark, "start", tid)
            error, printed = call_captured(fn, out_cap)
            emit(mark, "result", {"id": tid, "passed": error is None, "output": printed,
                                  "message": "" if error is None else describe(error, root, msg_cap)})
    if specs is not None:
        emit(mark, "missing", [s for s in specs if s not in used])
    emit(mark, "done", {"seconds": round(time.perf_counter() - t0, 3)})


def search(req):
    mark, cap, line_chars = req["mark"], int(req["max_matches"]), int(req["line_chars"])
    pattern = re.compile(req["pattern"])
    total = 0
    for rel in sorted(req["files"]):
        text = base64.b64decode(req["files"][rel]).decode("utf-8", errors="replace")
        for number, line in enumerate(text.split("\n"), 1):
            line = line.rstrip("\r")
            if pattern.search(line):
                total += 1
                if total <= cap:
                    emit(mark, "match", [rel, number, line[:line_chars]])
    emit(mark, "done", {"total": total})


def main():
    req = json.loads(sys.stdin.read())
    os.close(0)  # the request (and its mark) cannot be read again by the repository's code
    sys.stdin = io.StringIO("")  # a test that reads input gets end-of-file
    root = os.getcwd()
    program = os.path.join(root, "solution.py")  # this program's own file: the box should hold the repository only
    if os.path.exists(program):
        os.remove(program)
    if req["mode"] == "search":
        search(req)
    else:
        write_files(root, req["files"])
        run_tests(req, root)


main()
REAL_OUT.flush()
os._exit(0)  # do not wait for threads a test left running
