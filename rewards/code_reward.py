"""Code outcome reward: run the last fenced Python block of the answer against the sample's tests in the sandbox.

`sample["tests"]` is one test block or a list of them:
  {"type": "stdio", "cases": [{"input": "...", "output": "..."}, ...]}   one unit per case, one process per case;
      stdout matches when its whitespace-separated tokens equal the expected ones (line breaks/spacing ignored).
      A case's input and output must be strings (numbers are taken as their text); null is refused as a data
      error ("None" is not what a dataset means by it).
  {"type": "assert", "code": "assert f(1) == 2\\nassert f(2) == 3"}       one unit per top-level `assert`; the
      program runs in one process and the snippets in another (rewards/sandbox.py `run_graded`): the expected
      values never enter the program's process (other top-level statements are setup, run in order with them).
Score: `mode: fraction` -> passed units / units; `mode: all` -> 1 only if every unit passed.
`prelude` (null: none): Python code run before the program, in its process, for datasets whose solutions assume
names they do not import (LeetCode / LiveCodeBench style: `List`, `Optional`, `defaultdict`...); "typing" is the
preset of PRELUDES below.
A zero score carries a reason when a guard fired (timeout, CPU/memory/output limit, forbidden operation, killed)
or there was no code block; wrong output and ordinary exceptions are plain zeros (the program was just wrong).
A failure only the sandbox can cause (its set-up failed) or a sandbox that refuses to run without OS-level isolation
(`require_os_isolation`) is a part error, whatever the score: both are read from the guard's own report, never from
anything the program prints or returns (its exit code and stderr only label its own zeros).
Runs on the composer's "threads" runner: the untrusted part is a subprocess this module kills itself.
"""

from __future__ import annotations

import ast
import time

from .spec import RewardZero, SampleView
from .sandbox import RunResult, SandboxLimits, run_program, sandbox_limits_from_config
from .text import last_python_block

GUARD_STATUSES = ("timeout", "cpu_limit", "memory", "output_limit", "write_limit", "forbidden", "unavailable", "killed")
# `prelude` presets: the names competitive-programming solutions use without importing them (one line, so the
# program's own line numbers move by one).
PRELUDES = {
    "typing": "from typing import *; from collections import *; from itertools import *; from functools import *; "
              "from heapq import *; from bisect import *; from math import *; import math, heapq, bisect, "
              "itertools, functools, collections, string, re, random, operator, sys",
}


def _blocks(tests) -> list[dict]:
    if isinstance(tests, dict):
        tests = [tests]
    if not isinstance(tests, list) or not tests:
        raise ValueError("sample has no 'tests' (a test block or a list of them)")
    for t in tests:
        if not isinstance(t, dict) or t.get("type") not in ("stdio", "assert"):
            raise ValueError(f"bad test block {str(t)[:100]!r}: needs type 'stdio' or 'assert'")
        if t["type"] == "stdio" and not isinstance(t.get("cases"), list):
            raise ValueError("stdio test block needs a 'cases' list")
        if t["type"] == "stdio":
            for k, case in enumerate(t["cases"]):
                if not isinstance(case, dict):
                    raise ValueError(f"stdio case {k} is not an object with 'input' and 'output'")
                for key in ("input", "output"):
                    value = case.get(key, "")
                    if value is None or isinstance(value, bool) or not isinstance(value, (str, int, float)):
                        raise ValueError(f"stdio case {k} has {key} {str(value)[:40]!r}: give a string ('' for none)")
        if t["type"] == "assert" and not isinstance(t.get("code"), str):
            raise ValueError("assert test block needs a 'code' string")
    return tests


def split_asserts(code: str) -> tuple[list[str], int]:
    """Test code -> snippets to run in order, and how many of them are asserts (the scored units).

    Setup statements are merged into the following assert's snippet, so every snippet that reports a pass is an
    assert. Unparsable test code is one unit (all or nothing)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return [code], 1
    snippets, pending = [], []
    for node in tree.body:
        pending.append(ast.get_source_segment(code, node) or ast.unparse(node))
        if isinstance(node, ast.Assert):
            snippets.append("\n".join(pending))
            pending = []
    if pending and snippets:
        snippets[-1] += "\n" + "\n".join(pending)
    if not snippets:
        return [code], 1
    return snippets, len(snippets)


def outputs_match(got: str, expected: str) -> bool:
    return got.split() == str(expected).split()


def run_tests(program: str, tests, limits: SandboxLimits, deadline: float | None = None) -> tuple[int, int, list[RunResult]]:
    """(units passed, units total, one RunResult per process). Units left when the deadline passes count failed."""
    passed = total = 0
    runs: list[RunResult] = []
    for block in _blocks(tests):
        if block["type"] == "stdio":
            for case in block["cases"]:
                total += 1
                if deadline is not None and time.monotonic() >= deadline:
                    runs.append(RunResult(status="timeout", detail="reward deadline reached"))
                    continue
                res = run_program(program, limits, stdin=str(case.get("input", "")))
                runs.append(res)
                if res.status == "ok" and outputs_match(res.stdout, case.get("output", "")):
                    passed += 1
        else:
            snippets, n = split_asserts(block["code"])
            total += n
            if deadline is not None and time.monotonic() >= deadline:
                runs.append(RunResult(status="timeout", detail="reward deadline reached"))
                continue
            res = run_program(program, limits, asserts=snippets)
            runs.append(res)
            passed += len(res.passed)
    return passed, total, runs


def with_prelude(program: str, prelude: str | None) -> str:
    """The program with the configured prelude (a PRELUDES name or code) run first; unchanged without one."""
    if not prelude:
        return program
    return f"{PRELUDES.get(prelude, prelude)}\n{program}"


def code_reward(view: SampleView, params: dict) -> float:
    tests = view.sample.get("tests")
    blocks = _blocks(tests)  # bad/missing tests -> ValueError -> a reported part error
    program = last_python_block(view.answer)
    if program is None or not program.strip():
        raise RewardZero("no python code block in the answer")
    if len(program) > params["max_program_chars"]:
        raise RewardZero(f"program longer than {params['max_program_chars']} characters")
    program = with_prelude(program, params.get("prelude"))
    passed, total, runs = run_tests(program, blocks, sandbox_limits_from_config(params), params.get("_deadline"))
    if total == 0:
        raise ValueError("sample has no test cases")
    score = passed / total if params["mode"] == "fraction" else float(passed == total)
    broken = next((r for r in runs if r.status == "setup_error"), None)
    if broken is not None:  # the sandbox, not the program, failed (its own report): the score would be wrong
        raise RuntimeError(f"sandbox setup failed: {broken.detail}")
    if score == 0.0:
        guard = next((r for r in runs if r.status in GUARD_STATUSES), None)
        if guard is not None:
            raise RewardZero(f"{guard.status}: {guard.detail}")
    return score
