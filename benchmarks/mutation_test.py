"""Mutation testing of the RL math (issue 41): do the fast CPU tests notice a wrong line?

For each target file, every single-line mutant from a fixed set of operator rewrites is written into a scratch
copy of the repository and the tests mapped to that file run against it (`pytest -x -q -p no:cacheprovider`,
with a per-mutant timeout). A mutant is

    killed     a test failed (or errored),
    timeout    the tests ran past the timeout (counted as killed: the mutant changed behaviour),
    survived   every test passed: either a gap in the tests or an equivalent mutant (judge it by hand),
    invalid    the mutated module does not compile or import (not counted),
    equivalent its bytecode is identical to the original's (not run, not counted),
    duplicate  its bytecode is identical to an earlier mutant's (not run, not counted).

score = (killed + timeout) / (killed + timeout + survived).

Mutation operators (each mutant changes one place on one line; positions come from `ast`, the text is rewritten
in place so line numbers and formatting stay):
    binary    + <-> -, * <-> /, // -> /, ** -> *, & <-> |
    augassign += <-> -=, *= <-> /=, |= <-> &=
    compare   < -> <= and >=, <= -> < and >, > -> >= and <=, >= -> > and <, == <-> !=, is <-> is not, in <-> not in
    boolean   and <-> or
    unary     drop a unary minus, `not` or `~`
    constant  a number c -> c + 1, -c, 0 (also an axis: .sum(0) -> .sum(1)); True <-> False
    swap      amax <-> amin, max <-> min, maximum <-> minimum (called names, attributes and keywords)
    dropcall  x.detach() -> x, x.clamp(...) -> x
    negate    `if C:` / `C if ... else` / `while C:` -> `not (C)`
    delete    a call statement, an augmented assignment or an assignment into a subscript -> `pass`
Never mutated: strings, docstrings, annotations, `raise` / `assert` statements, logging and warnings calls.

Usage (from the repository root; run `-h` for all options):

    python benchmarks/mutation_test.py                          # the three math files, all mutants, --jobs 1
    python benchmarks/mutation_test.py --files rl/losses.py --max-mutants 20
    python benchmarks/mutation_test.py --every 3                # a deterministic sample: every 3rd mutant
    python benchmarks/mutation_test.py --list                   # enumerate only
    python benchmarks/mutation_test.py --only rl/losses.py:17,rl/logprobs.py:4   # re-run some mutants
    python benchmarks/mutation_test.py --tests rl/losses.py=tests/test_losses.py --json /tmp/mut.json

Pure standard library (the tests themselves need the project's environment). By default each mutant's pytest runs
in a process forked from this one after torch, numpy and pytest are imported (so a mutant costs its tests, not a
torch import); --no-fork starts a fresh interpreter per mutant instead. Tests run single-threaded
(OMP_NUM_THREADS=1): on a shared machine, one job per core at most.
"""

from __future__ import annotations

import argparse
import ast
import collections
import dataclasses
import datetime
import importlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The fast CPU tests that exercise each file (found with `grep -rl "rl.losses" tests/` etc.); -x stops at the first
# failure, so the test that kills most mutants fastest goes first.
DEFAULT_TESTS = {
    "rl/losses.py": [
        "tests/test_losses.py",
        "tests/test_kl_montecarlo.py",
        "tests/test_sft.py::test_sft_loss_edges",  # sft_loss (a mapped test file that does not exist is left out)
        "tests/test_sft.py::test_sft_loss_equals_the_reference_cross_entropy_over_assistant_tokens",
    ],
    "rl/advantages.py": [
        "tests/test_advantages.py",
        "tests/test_losses.py",
        "tests/test_loop.py::test_failed_rewards_get_no_advantage_and_no_say_in_the_baseline",
    ],
    "rl/logprobs.py": ["tests/test_logprobs.py"],
}
# What the scratch copy of the repository holds (the tests import these packages).
COPY = ["rl", "rewards", "trainer", "rollout", "launch", "tests", "conf", "pyproject.toml"]
# Children run single-threaded and never write bytecode (a mutant of the same size written within the same second
# as the original could otherwise be served from a stale .pyc).
CHILD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "RAY_AUTH_MODE": "disabled",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "WANDB_MODE": "offline",
    "DS_ACCELERATOR": "cpu",
    "TOKENIZERS_PARALLELISM": "false",
}
EXIT_INVALID = 99  # the child's exit status when the mutated module does not import

BINOP = {
    ast.Add: ("+", ["-"]), ast.Sub: ("-", ["+"]), ast.Mult: ("*", ["/"]), ast.Div: ("/", ["*"]),
    ast.FloorDiv: ("//", ["/"]), ast.Pow: ("**", ["*"]), ast.BitAnd: ("&", ["|"]), ast.BitOr: ("|", ["&"]),
}
AUGOP = {
    ast.Add: ("+=", ["-="]), ast.Sub: ("-=", ["+="]), ast.Mult: ("*=", ["/="]), ast.Div: ("/=", ["*="]),
    ast.BitOr: ("|=", ["&="]), ast.BitAnd: ("&=", ["|="]),
}
CMPOP = {
    ast.Lt: ("<", ["<=", ">="]), ast.LtE: ("<=", ["<", ">"]), ast.Gt: (">", [">=", "<="]),
    ast.GtE: (">=", [">", "<"]), ast.Eq: ("==", ["!="]), ast.NotEq: ("!=", ["=="]),
    ast.Is: ("is", ["is not"]), ast.IsNot: ("is not", ["is"]), ast.In: ("in", ["not in"]),
    ast.NotIn: ("not in", ["in"]),
}
BOOLOP = {ast.And: ("and", ["or"]), ast.Or: ("or", ["and"])}
UNARY = {ast.USub: "-", ast.Not: "not", ast.Invert: "~"}
SWAP = {"amax": "amin", "amin": "amax", "max": "min", "min": "max", "maximum": "minimum", "minimum": "maximum"}
DROP_CALLS = {"detach", "clamp"}
SKIP_CALL_OWNERS = {"log", "logging", "logger", "warnings"}


@dataclasses.dataclass
class Mutant:
    file: str
    index: int  # position in the file's enumeration (stable for a given source): the id is file:index
    line: int
    op: str
    before: str  # the original line
    after: str  # the mutated line
    source: str = dataclasses.field(repr=False, default="")
    status: str = ""  # killed / survived / timeout / invalid / equivalent / duplicate
    seconds: float = 0.0
    same_as: str = ""  # for a duplicate: the id of the mutant with the same bytecode
    scope: str = ""  # the innermost function or class around the line
    killer: str = ""  # the first test that failed

    @property
    def id(self) -> str:
        return f"{self.file}:{self.index}"


# ----------------------------------------------------------------------------------------------- enumeration
class _Source:
    """The file as UTF-8 byte lines (ast columns are byte offsets), with single-line rewrites."""

    def __init__(self, text: str):
        self.text = text
        self.lines = text.encode().splitlines(keepends=True)

    def between(self, a: tuple[int, int], b: tuple[int, int]) -> list[tuple[int, int, str]]:
        """The characters from position a to b as (line, col, char), 1-based lines, byte columns."""
        out = []
        line, col = a
        while (line, col) < b and line <= len(self.lines):
            raw = self.lines[line - 1]
            if col >= len(raw):
                line, col = line + 1, 0
                continue
            out.append((line, col, chr(raw[col])))
            col += 1
        return out

    def find_op(self, a, b, op: str) -> tuple[int, int] | None:
        """Where `op` stands between the end of one operand (a) and the start of the next (b): only brackets,
        white space, line continuations and comments may surround it."""
        chars = self.between(a, b)
        text = "".join(c for _, _, c in chars)
        i = 0
        while i < len(text):
            c = text[i]
            if c in " \t\r\n\\()":
                i += 1
            elif c == "#":
                while i < len(text) and text[i] != "\n":
                    i += 1
            else:
                break
        pattern = re.escape(op).replace(r"\ ", r"\s+")
        m = re.match(pattern + (r"\b" if op[-1].isalpha() else r"(?![=<>*/&|])"), text[i:])
        if not m or "\n" in m.group(0):
            return None
        return chars[i][0], chars[i][1]

    def replace(self, line: int, col: int, end_col: int, new: str) -> tuple[str, str, str] | None:
        """(mutated source, original line, mutated line) with bytes col..end_col of `line` replaced by `new`."""
        raw = self.lines[line - 1]
        if end_col > len(raw.rstrip(b"\r\n")):
            return None
        mutated = raw[:col] + new.encode() + raw[end_col:]
        lines = list(self.lines)
        lines[line - 1] = mutated
        return b"".join(lines).decode(), raw.decode().rstrip("\n"), mutated.decode().rstrip("\n")


def _literal(value) -> str:
    text = repr(value)
    return f"({text})" if text.startswith("-") else text


def _skipped_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes (with their subtrees) that are never mutated."""
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Raise, ast.Assert, ast.JoinedStr, ast.Import, ast.ImportFrom)):
            roots.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            roots += [a.annotation for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs
                      if a.annotation is not None]
            roots += [a.annotation for a in (node.args.vararg, node.args.kwarg) if a is not None and a.annotation]
            if node.returns is not None:
                roots.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in SKIP_CALL_OWNERS:
                roots.append(node)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            roots.append(node)  # docstrings
    skip = set()
    for r in roots:
        skip.update(id(n) for n in ast.walk(r))
    return skip


def enumerate_mutants(rel: str, text: str) -> list[Mutant]:
    """Every single-line mutant of one file, in source order (ties: operator order), deduplicated by text."""
    src = _Source(text)
    tree = ast.parse(text)
    skip = _skipped_nodes(tree)
    found: list[tuple[int, int, str, tuple[str, str, str]]] = []

    def add(line, col, end_col, new, op):
        res = src.replace(line, col, end_col, new)
        if res is not None:
            found.append((line, col, op, res))

    def operator_between(left, right, op, alternatives, kind):
        if left.end_lineno is None or right.lineno is None:
            return
        at = src.find_op((left.end_lineno, left.end_col_offset), (right.lineno, right.col_offset), op)
        if at is None:
            return
        raw = src.lines[at[0] - 1].decode("utf-8", "replace")
        end = at[1] + len(re.match(re.escape(op).replace(r"\ ", r"\s+"), raw.encode()[at[1]:].decode()).group(0))
        for alt in alternatives:
            add(at[0], at[1], end, alt, f"{kind} {op} -> {alt}")

    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.BinOp) and type(node.op) in BINOP:
            op, alts = BINOP[type(node.op)]
            operator_between(node.left, node.right, op, alts, "binary")
        elif isinstance(node, ast.AugAssign) and type(node.op) in AUGOP:
            op, alts = AUGOP[type(node.op)]
            operator_between(node.target, node.value, op, alts, "augassign")
        elif isinstance(node, ast.Compare):
            operands = [node.left] + node.comparators
            for k, cmp in enumerate(node.ops):
                if type(cmp) in CMPOP:
                    op, alts = CMPOP[type(cmp)]
                    operator_between(operands[k], operands[k + 1], op, alts, "compare")
        elif isinstance(node, ast.BoolOp):
            op, alts = BOOLOP[type(node.op)]
            for a, b in zip(node.values, node.values[1:]):
                operator_between(a, b, op, alts, "boolean")
        elif isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
            sym = UNARY[type(node.op)]
            m = re.match(re.escape(sym) + r"\s*", src.lines[node.lineno - 1][node.col_offset:].decode())
            if m:  # the operator and the blanks after it (never the operand's brackets)
                add(node.lineno, node.col_offset, node.col_offset + len(m.group(0).encode()), "", f"unary drop {sym}")
        elif isinstance(node, ast.Constant) and node.lineno == node.end_lineno:
            v = node.value
            if isinstance(v, bool):
                add(node.lineno, node.col_offset, node.end_col_offset, str(not v), f"constant {v} -> {not v}")
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                for new in ([v + 1] + ([-v, 0 * v] if v != 0 else [])):
                    add(node.lineno, node.col_offset, node.end_col_offset, _literal(new), f"constant {v!r} -> {new!r}")
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in SWAP and f.end_lineno == f.lineno:
                add(f.end_lineno, f.end_col_offset - len(name), f.end_col_offset, SWAP[name],
                    f"swap {name} -> {SWAP[name]}")
            for kw in node.keywords:
                if kw.arg in SWAP and id(kw) not in skip:
                    add(kw.lineno, kw.col_offset, kw.col_offset + len(kw.arg), SWAP[kw.arg],
                        f"swap {kw.arg}= -> {SWAP[kw.arg]}=")
            if isinstance(f, ast.Attribute) and f.attr in DROP_CALLS and f.end_lineno == node.end_lineno:
                # from the dot (the value may end in a bracket its own position leaves out) to the call's end
                dot = src.lines[f.end_lineno - 1].rfind(b".", 0, f.end_col_offset - len(f.attr))
                if dot >= 0:
                    add(node.end_lineno, dot, node.end_col_offset, "", f"dropcall .{f.attr}()")
        if isinstance(node, (ast.If, ast.While, ast.IfExp)) and id(node.test) not in skip:
            test = node.test
            if test.lineno == test.end_lineno:
                seg = src.lines[test.lineno - 1][test.col_offset:test.end_col_offset].decode()
                add(test.lineno, test.col_offset, test.end_col_offset, f"not ({seg})", "negate condition")
        is_stmt = (
            (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call))
            or isinstance(node, ast.AugAssign)
            or (isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) for t in node.targets))
        )
        if is_stmt and node.lineno == node.end_lineno:
            add(node.lineno, node.col_offset, node.end_col_offset, "pass", "delete statement")

    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    scopes = sorted(((n.lineno, n.end_lineno, n.name) for n in ast.walk(tree) if isinstance(n, defs)),
                    key=lambda x: x[1] - x[0])  # innermost first
    found.sort(key=lambda f: (f[0], f[1]))
    out, seen = [], set()
    for line, _col, op, (source, before, after) in found:
        if source in seen or source == text:
            continue
        seen.add(source)
        scope = next((name for lo, hi, name in scopes if lo <= line <= hi), "<module>")
        out.append(Mutant(rel, len(out), line, op, before.strip(), after.strip(), source, scope=scope))
    return out


# ----------------------------------------------------------------------------------------------- equivalence
def _fingerprint(code: types.CodeType):
    """The code object without its line table, file name and line numbers (recursively)."""
    consts = tuple(_fingerprint(c) if isinstance(c, types.CodeType) else (type(c).__name__, repr(c))
                   for c in code.co_consts)
    return (code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
            code.co_flags, code.co_argcount, code.co_kwonlyargcount, code.co_posonlyargcount, code.co_name)


def classify_statically(mutants: list[Mutant], original: str) -> None:
    """invalid (does not compile), equivalent (the original's bytecode), duplicate (an earlier mutant's)."""
    base = _fingerprint(compile(original, "m.py", "exec"))
    seen: dict = {}
    for m in mutants:
        try:
            fp = _fingerprint(compile(m.source, "m.py", "exec"))
        except (SyntaxError, ValueError):
            m.status = "invalid"
            continue
        if fp == base:
            m.status = "equivalent"
        elif fp in seen:
            m.status, m.same_as = "duplicate", seen[fp]
        else:
            seen[fp] = m.id


# ----------------------------------------------------------------------------------------------- running
def _pytest_args(tests: list[str]) -> list[str]:
    return ["-x", "-q", "-p", "no:cacheprovider", "--no-header", "-o", "console_output_style=classic", *tests]


def _child(scratch: str, module: str, tests: list[str]) -> int:
    """In the mutant's process: import the mutated module (EXIT_INVALID if it cannot), then run its tests."""
    os.chdir(scratch)
    sys.path.insert(0, scratch)
    sys.dont_write_bytecode = True
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any import-time failure makes the mutant invalid
        return EXIT_INVALID
    import pytest

    return int(pytest.main(_pytest_args(tests)))


class _Run:
    """One mutant's test run, in a forked process or a fresh interpreter, in its own process group."""

    def __init__(self, scratch, module, tests, log_path, fork: bool):
        self.t0 = time.monotonic()
        self.log = open(log_path, "wb")
        if fork:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # child
                rc = 1
                try:
                    os.setpgid(0, 0)
                    os.dup2(self.log.fileno(), 1)
                    os.dup2(self.log.fileno(), 2)
                    rc = _child(scratch, module, tests)
                finally:
                    os._exit(rc)
            self.pid, self.proc = pid, None
        else:
            cmd = [sys.executable, os.path.abspath(__file__), "--_child", scratch, module, "--", *tests]
            self.proc = subprocess.Popen(cmd, cwd=scratch, stdout=self.log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **CHILD_ENV}, start_new_session=True)
            self.pid = self.proc.pid

    def poll(self) -> int | None:
        if self.proc is not None:
            return self.proc.poll()
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return None
        return os.waitstatus_to_exitcode(status)

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc is not None:
            self.proc.wait()
        else:
            os.waitpid(self.pid, 0)

    def close(self) -> None:
        self.log.close()


def _module_name(rel: str) -> str:
    return rel[:-3].replace("/", ".").removesuffix(".__init__")


def make_scratch(parent: str, k: int) -> str:
    path = os.path.join(parent, f"repo{k}")
    os.makedirs(path)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in COPY:
        s = os.path.join(ROOT, name)
        if os.path.isdir(s):
            shutil.copytree(s, os.path.join(path, name), ignore=ignore)
        elif os.path.exists(s):
            shutil.copy2(s, os.path.join(path, name))
    return path


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+?\.py::[A-Za-z0-9_]+)", re.M)


def _first_failure(log_path: str) -> str:
    """The node id (without parameters) of the first failing test in a pytest -q log, or ''."""
    try:
        with open(log_path, errors="replace") as f:
            m = _FAILED.search(f.read())
    except OSError:
        return ""
    return m.group(1) if m else ""


def run_mutants(jobs_list, tests_for, originals, scratches, timeout_for, fork, logdir, progress):
    """Run each (mutant) with at most len(scratches) at a time; fills in status, seconds and killer.

    The test that killed the last mutant of the same function runs first (pytest runs its arguments in order and
    collects a test once), so -x stops a mutant of, say, a torch.compile'd function at the compiled test instead
    of after every eager one."""
    pending = collections.deque(jobs_list)
    free = list(scratches)
    running: dict = {}
    last_killer: dict = {}
    done = 0
    while pending or running:
        while pending and free:
            m = pending.popleft()
            scratch = free.pop()
            with open(os.path.join(scratch, m.file), "w") as f:
                f.write(m.source)
            log_path = os.path.join(logdir, m.id.replace("/", "_").replace(":", "_") + ".log")
            first = last_killer.get((m.file, m.scope))
            tests = ([first] if first else []) + tests_for[m.file]
            running[id(m)] = (m, scratch, _Run(scratch, _module_name(m.file), tests, log_path, fork), log_path)
        time.sleep(0.05)
        for key, (m, scratch, run, log_path) in list(running.items()):
            rc = run.poll()
            elapsed = time.monotonic() - run.t0
            if rc is None and elapsed < timeout_for[m.file]:
                continue
            if rc is None:
                run.kill()
                m.status = "timeout"
            else:
                m.status = "invalid" if rc == EXIT_INVALID else "survived" if rc == 0 else "killed"
            run.close()
            if m.status == "killed":
                m.killer = _first_failure(log_path)
                if m.killer:
                    last_killer[(m.file, m.scope)] = m.killer
            m.seconds = elapsed
            with open(os.path.join(scratch, m.file), "w") as f:
                f.write(originals[m.file])
            del running[key]
            free.append(scratch)
            done += 1
            progress(done, m)


# ----------------------------------------------------------------------------------------------- report
def _summary(mutants: list[Mutant], files: list[str]) -> tuple[str, dict]:
    cols = ["mutants", "equivalent", "duplicate", "invalid", "killed", "timeout", "survived", "score"]
    rows, totals = [], collections.Counter()
    for f in files + ["total"]:
        ms = [m for m in mutants if f == "total" or m.file == f]
        c = collections.Counter(m.status for m in ms)
        c["mutants"] = len(ms)
        if f != "total":
            totals.update(c)
        c = totals if f == "total" else c
        changed = c["killed"] + c["timeout"] + c["survived"]
        score = f"{(c['killed'] + c['timeout']) / changed:.1%}" if changed else "-"
        rows.append([f] + [str(c[k]) for k in cols[:-1]] + [score])
    widths = [max(len(r[i]) for r in rows + [["file"] + cols]) for i in range(len(cols) + 1)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(["file"] + cols, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines), dict(totals)


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--_child":
        scratch, module, _, *tests = sys.argv[2:]
        sys.exit(_child(scratch, module, tests))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", nargs="+", default=list(DEFAULT_TESTS), help="files to mutate (repository-relative)")
    p.add_argument("--tests", action="append", default=[], metavar="FILE=TEST[,TEST...]",
                   help="the tests for a file (replaces its default mapping; repeatable)")
    p.add_argument("--max-mutants", type=int, default=None, help="at most this many mutants per file (after --every)")
    p.add_argument("--every", type=int, default=1, help="deterministic sample: only every k-th mutant of each file")
    p.add_argument("--only", default="", help="comma-separated mutant ids (file:index) to run")
    p.add_argument("--jobs", type=int, default=1, help="mutants run at the same time (default 1)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per mutant (default: 3x the unmutated run of the file's tests + 30)")
    p.add_argument("--no-fork", action="store_true", help="a fresh interpreter per mutant instead of a fork")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("--json", default=None, help="write every mutant's result here")
    p.add_argument("--keep", default=None, help="keep the scratch copies and the per-mutant pytest logs here")
    args = p.parse_args(argv)

    tests_for = {f: list(DEFAULT_TESTS.get(f, [])) for f in args.files}
    for spec in args.tests:
        f, _, t = spec.partition("=")
        tests_for[f] = [x for x in t.split(",") if x]
    for f in args.files:
        tests_for[f] = [t for t in tests_for.get(f, []) if os.path.exists(os.path.join(ROOT, t.split("::")[0]))]
        if not tests_for[f]:
            p.error(f"no tests for {f}: pass --tests {f}=tests/...")

    originals = {f: open(os.path.join(ROOT, f)).read() for f in args.files}
    mutants: list[Mutant] = []
    for f in args.files:
        ms = enumerate_mutants(f, originals[f])
        classify_statically(ms, originals[f])
        ms = ms[:: args.every]
        if args.max_mutants is not None:
            ms = ms[: args.max_mutants]
        mutants += ms
    if args.only:
        wanted = set(args.only.split(","))
        mutants = [m for m in mutants if m.id in wanted]
    to_run = [m for m in mutants if not m.status]

    if args.list:
        for m in mutants:
            print(f"{m.id:22} {m.file}:{m.line:<4} {m.status or '-':10} {m.op:28} {m.after}")
        print(f"{len(mutants)} mutants, {len(to_run)} to run")
        return 0

    os.environ.update(CHILD_ENV)
    fork = not args.no_fork and hasattr(os, "fork")
    if fork:  # what every mutant imports anyway, once, before the first fork
        import numpy  # noqa: F401
        import pytest  # noqa: F401
        import torch  # noqa: F401

    parent = args.keep or tempfile.mkdtemp(prefix="mutation-")
    os.makedirs(parent, exist_ok=True)
    logdir = os.path.join(parent, "logs")
    os.makedirs(logdir, exist_ok=True)
    scratches = [make_scratch(parent, k) for k in range(max(1, args.jobs))]
    start = time.monotonic()
    try:
        # the unmutated tests must pass, and their time sets the timeout
        timeout_for = {}
        for f in args.files:
            base = Mutant(f, -1, 0, "none", "", "", originals[f])
            run_mutants([base], tests_for, originals, scratches[:1], {f: 1800.0}, fork, logdir, lambda *_: None)
            if base.status != "survived":
                print(f"the unmutated tests of {f} do not pass ({base.status}): see {logdir}", file=sys.stderr)
                return 2
            timeout_for[f] = args.timeout or 3 * base.seconds + 30
            print(f"{f}: {sum(m.file == f for m in to_run)} mutants to run, tests {' '.join(tests_for[f])} "
                  f"({base.seconds:.1f} s unmutated, timeout {timeout_for[f]:.0f} s)", flush=True)

        def progress(done, m):
            print(f"[{done}/{len(to_run)} {time.monotonic() - start:6.0f}s] {m.status:8} {m.id:22} "
                  f"line {m.line:<4} {m.op:28} {m.after[:90]}", flush=True)

        run_mutants(to_run, tests_for, originals, scratches, timeout_for, fork, logdir, progress)
    finally:
        if not args.keep:
            shutil.rmtree(parent, ignore_errors=True)
    wall = time.monotonic() - start

    table, totals = _summary(mutants, args.files)
    changed = totals.get("killed", 0) + totals.get("timeout", 0) + totals.get("survived", 0)
    print()
    print(f"{datetime.date.today()}, {platform.node()}, {os.cpu_count()} CPUs, jobs {args.jobs}, "
          f"{'fork' if fork else 'no-fork'}, every {args.every}, wall {wall / 60:.1f} min")
    print(table)
    if changed:
        print(f"score: {totals.get('killed', 0) + totals.get('timeout', 0)} / {changed} behaviour-changing mutants")
    survivors = [m for m in mutants if m.status == "survived"]
    if survivors:
        print(f"\nsurvivors ({len(survivors)}):")
        for m in survivors:
            print(f"  {m.id:22} {m.file}:{m.line}  [{m.op}]\n      - {m.before}\n      + {m.after}")
    equivalent = [m for m in mutants if m.status == "equivalent"]
    if equivalent:
        print(f"\nequivalent by bytecode ({len(equivalent)}):")
        for m in equivalent:
            print(f"  {m.id:22} {m.file}:{m.line}  [{m.op}]  {m.after}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": str(datetime.date.today()), "wall_s": wall, "argv": sys.argv[1:],
                       "cpus": os.cpu_count(), "totals": totals,
                       "mutants": [{k: v for k, v in dataclasses.asdict(m).items() if k != "source"} | {"id": m.id}
                                   for m in mutants]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
