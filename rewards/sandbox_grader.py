"""The tests' side of a graded sandbox run (sandbox_guard.py, "graded" mode): runs the tests against the program
through sandbox_remote and writes every verdict on the result channel, a descriptor only this process holds.

Two kinds of tests:
- "asserts" (the code reward): snippets run in order in one namespace that holds the program's top-level names
  (its functions and classes as handles, its plain values as copies, its stdlib imports as this process's own
  modules and functions, never a name that shadows a builtin); one record per snippet: {"unit": i, "ok": bool,
  "msg": why it failed}.
- "suite" (code_repo): test files (`tests/test_*.py`, given here, never read from the program's copy) imported as
  modules, each module-level `test_*` function called in definition order; the repository's own packages are
  imported in the program's process and used through handles. Records: {"start": id} before each test,
  {"result": {id, passed, message, output}}, {"missing": [specs that matched no test]}.
Then {"done": {...}, "program": how the program's process ended, if it did}. Standalone (stdlib only): loaded by
the guard by path.
"""

import builtins
import importlib
import importlib.util
import io
import json
import os
import sys
import time

MAX_RECORD_CHARS = 20_000
MODULE_DENYLIST = frozenset({"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo"})


class Results:
    """The result channel: JSON lines written after the guard's header, at most `limit` bytes in all."""

    def __init__(self, fd, offset, limit):
        self.fd, self.offset, self.end = fd, offset, offset + limit
        self.full = False

    def write(self, record):
        line = (json.dumps(record, default=str)[:MAX_RECORD_CHARS] + "\n").encode("utf-8", "replace")
        if self.offset + len(line) > self.end:
            if not self.full:
                self.full = True
                note = b'{"full": true}\n'
                if self.offset + len(note) <= self.end:
                    os.pwrite(self.fd, note, self.offset)
                    self.offset += len(note)
            return
        os.pwrite(self.fd, line, self.offset)
        self.offset += len(line)


class Captured(io.TextIOBase):
    """A test's stdout and stderr (its own prints and the program's during its calls): the first `cap` characters
    kept, the rest counted and dropped."""

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


def run_captured(fn, cap):
    """fn() with stdout/stderr captured: (exception or None, captured text)."""
    buf, saved = Captured(cap), (sys.stdout, sys.stderr)
    sys.stdout = sys.stderr = buf
    try:
        fn()
        error = None
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt in a test are failures too
        error = exc
    finally:
        sys.stdout, sys.stderr = saved
    return error, buf.text()


def short(value, limit=200):
    try:
        text = repr(value)
    except BaseException as exc:  # noqa: BLE001 - a broken (or dead) __repr__ is still reported
        text = f"<repr failed: {type(exc).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def local_module(name):
    """This process's own copy of a module the program imported (stdlib or an allowed package), or None."""
    top = name.split(".", 1)[0]
    if top in MODULE_DENYLIST or top not in sys.stdlib_module_names and importlib.util.find_spec(top) is None:
        return None
    try:
        return importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - a module the grader cannot import is left out
        return None


def program_names(remote, conn, names):
    """The test namespace's view of the program's globals (see the module docstring)."""
    out = {}
    for name, data in names.items():
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("__") or hasattr(builtins, name):
            continue  # a program name never shadows a builtin the tests use (abs, sorted, isinstance...)
        if isinstance(data, dict) and data.get("t") == "stdlib":
            module = local_module(str(data.get("module", "")))
            value = module
            for part in str(data.get("name", "")).split(".") if module is not None and data.get("name") else ():
                value = getattr(value, part, None)
            if value is not None:
                out[name] = value
            continue
        try:
            value = conn.decode(data)
        except Exception:  # noqa: BLE001 - a name that cannot travel is left out
            continue
        if isinstance(value, remote.RemoteModule):
            value = local_module(value.__name__)
            if value is None:
                continue
        out[name] = value
    return out


def describe(exc, limit, source_files=None):
    """The failure in one line: the exception and where it was raised (the test's line, or the program's)."""
    cls = type(exc)
    name = cls.__name__ if cls.__module__ in ("builtins", "program") or cls.__module__.startswith("_mixrl_") \
        else f"{cls.__module__}.{cls.__qualname__}"
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - a hostile or dead __str__
        text = ""
    head = f"{name}: {text}" if text else name
    where = getattr(exc, "_program_where", "") or ""
    frames = [(tb.tb_frame.f_code.co_filename, tb.tb_lineno, tb.tb_frame) for tb in _walk(exc.__traceback__)]
    tests = [f for f in frames if source_files and f[0] in source_files]
    if tests:
        path, lineno, frame = tests[-1]
        lines = source_files[path].split("\n")
        line = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
        if isinstance(exc, AssertionError) and line.startswith("assert"):
            head = f"{head}: {line}" if head == "AssertionError" else head
            values = compared_values(frame, line)
            if values:
                head += f" ({values})"
        head += f" [at {path}:{lineno}" + (f": {line}" if line and line not in head else "") + "]"
    if where:
        head += f" [raised at {where}]"
    return head if len(head) <= limit else head[:limit] + "..."


def compared_values(frame, line):
    """For a failed one-line `assert a == b`, the two sides evaluated again in the test's frame (what pytest's
    assertion rewriting would show); None on any trouble."""
    import ast

    try:
        node = ast.parse(line.strip()).body[0]
        test = node.test if isinstance(node, ast.Assert) else None
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
            return None
        env = dict(frame.f_globals)
        env.update(frame.f_locals)
        left = eval(compile(ast.Expression(test.left), "<assert>", "eval"), env)
        right = eval(compile(ast.Expression(test.comparators[0]), "<assert>", "eval"), env)
        return f"left: {short(left)}, right: {short(right)}"
    except BaseException:  # noqa: BLE001
        return None


def _walk(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


# ------------------------------------------------------------------------------------------------- the kinds
def grade_asserts(remote, conn, loaded, payload, results):
    sys.stdout = sys.stderr = Captured(0)  # what the tests and the program print is not graded
    ns = {"__name__": "__test__", "__builtins__": builtins}
    conn.test_modules.add("__test__")
    sys.meta_path.insert(0, remote.RemoteFinder(conn, ("solution",)))  # `from solution import f` in a test
    ns.update(program_names(remote, conn, loaded.get("names") or {}))
    failure = loaded.get("error")
    for i, snippet in enumerate(payload["snippets"]):
        if failure is not None:
            results.write({"unit": i, "ok": False, "msg": failure})
            continue
        try:
            code = compile(snippet, f"test_{i}.py", "exec", dont_inherit=True)
            exec(code, ns)
        except remote.ProgramGone as exc:
            failure = f"the program's process ended: {exc}"
            results.write({"unit": i, "ok": False, "msg": failure})
        except BaseException as exc:  # noqa: BLE001 - a failed test, whatever it raised
            results.write({"unit": i, "ok": False, "msg": describe(exc, 300)})
        else:
            results.write({"unit": i, "ok": True})


def grade_suite(remote, conn, loaded, payload, results):
    """code_repo's test runner (see the module docstring); `payload`: tests {path: source}, select (None: all),
    packages (the repository's top-level importable names), message_chars, output_chars."""
    msg_cap, out_cap = int(payload["message_chars"]), int(payload["output_chars"])
    specs = None if payload.get("select") is None else [str(s) for s in payload["select"]]
    sources = {str(k): str(v) for k, v in payload["tests"].items()}
    sys.meta_path.insert(0, remote.RemoteFinder(conn, payload.get("packages") or ()))
    used = set()
    t0 = time.perf_counter()
    for rel in sorted(p for p in sources if p.startswith("tests/test_") and p.endswith(".py") and p.count("/") == 1):
        if specs is not None and not any(s == rel or s.startswith(rel + "::") or "/" not in s for s in specs):
            continue
        name = f"_test_{rel[len('tests/'):-3]}"
        module = type(sys)(name)
        module.__file__ = rel
        conn.test_modules.add(name)
        sys.modules[name] = module

        def load(module=module, rel=rel):
            exec(compile(sources[rel], rel, "exec", dont_inherit=True), module.__dict__)

        results.write({"start": rel})
        error, printed = run_captured(load, out_cap)
        if error is not None:
            used.update(s for s in specs or () if s == rel or s.startswith(rel + "::"))
            results.write({"result": {"id": rel, "passed": False, "output": printed, "message":
                                      "error while importing the test file: " + describe(error, msg_cap, sources)}})
            continue
        for fname, fn in list(module.__dict__.items()):
            if not (fname.startswith("test_") and callable(fn) and getattr(fn, "__module__", None) == name):
                continue
            tid = f"{rel}::{fname}"
            if specs is not None:
                hits = [s for s in specs if s in (rel, tid, fname)]
                if not hits:
                    continue
                used.update(hits)
            results.write({"start": tid})
            error, printed = run_captured(fn, out_cap)
            results.write({"result": {"id": tid, "passed": error is None, "output": printed,
                                      "message": "" if error is None else describe(error, msg_cap, sources)}})
    if specs is not None:
        results.write({"missing": [s for s in specs if s not in used]})
    results.write({"seconds": round(time.perf_counter() - t0, 3)})


KINDS = {"asserts": grade_asserts, "suite": grade_suite}


def run(remote, conn, payload, results, program_status):
    """The grader's whole run. `program_status(wait_s)` -> how the program's process ended (None while it runs;
    after a lost connection it waits up to wait_s for the process to end)."""
    msg = _first(conn)
    if msg is None or msg.get("ready") is not True:
        # The program's side failed during its own set-up, before any of the program's code ran.
        results.write({"setup_error": f"the program's process did not start: {program_status() or 'no reply'}"})
        return
    loaded = _first(conn)
    if loaded is None:
        status = program_status()
        loaded = {"error": f"the program's process ended before the tests ran ({status or 'no reply'})"}
    elif "error" in loaded:
        err = conn.decode_error(loaded["error"])
        loaded = {"error": "the program failed before the tests ran: " + describe(err, 300)}
    try:
        KINDS[payload["kind"]](remote, conn, loaded, payload, results)
    finally:
        results.write({"done": True, "program": program_status(0.0)})


def _first(conn):
    try:
        return conn.receive()
    except Exception:  # noqa: BLE001 - a closed or broken connection
        return None
