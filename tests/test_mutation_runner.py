"""benchmarks/mutation_test.py (issue 41): the mutants it makes, its bytecode equivalence check, and one run."""

import subprocess
import sys
from pathlib import Path

import pytest

from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
mt = load_script(Path("benchmarks/mutation_test.py"), register=True)  # dataclasses look their module up there

SOURCE = '''"""Docstring: a + b < c is never mutated."""
import torch


def f(x: torch.Tensor | None, n: int = 2) -> torch.Tensor:
    if n < 1:
        raise ValueError("n - 1 must be >= 0")
    y = (x - 1.0).clamp(-3, 3).sum(-1) * n
    y += x.detach()
    keep = (y > 0) & ~(y == 2) and n >= 1
    out[0] = y
    return torch.maximum(y, -y) if keep else None


z = 1.0 * 0
'''


def _after(mutants):
    return {(m.line, m.op, m.after) for m in mutants}


def test_the_operators_and_what_is_never_mutated():
    ms = mt.enumerate_mutants("m.py", SOURCE)
    got = _after(ms)
    for want in [
        (6, "compare < -> <=", "if n <= 1:"),
        (6, "compare < -> >=", "if n >= 1:"),
        (6, "negate condition", "if not (n < 1):"),
        (8, "binary - -> +", "y = (x + 1.0).clamp(-3, 3).sum(-1) * n"),
        (8, "binary * -> /", "y = (x - 1.0).clamp(-3, 3).sum(-1) / n"),
        (8, "dropcall .clamp()", "y = (x - 1.0).sum(-1) * n"),
        (8, "unary drop -", "y = (x - 1.0).clamp(-3, 3).sum(1) * n"),
        (8, "constant 1.0 -> 2.0", "y = (x - 2.0).clamp(-3, 3).sum(-1) * n"),
        (8, "constant 3 -> -3", "y = (x - 1.0).clamp(-3, (-3)).sum(-1) * n"),
        (9, "augassign += -> -=", "y -= x.detach()"),
        (9, "dropcall .detach()", "y += x"),
        (9, "delete statement", "pass"),
        (10, "binary & -> |", "keep = (y > 0) | ~(y == 2) and n >= 1"),
        (10, "unary drop ~", "keep = (y > 0) & (y == 2) and n >= 1"),
        (10, "compare == -> !=", "keep = (y > 0) & ~(y != 2) and n >= 1"),
        (10, "boolean and -> or", "keep = (y > 0) & ~(y == 2) or n >= 1"),
        (11, "delete statement", "pass"),
        (12, "swap maximum -> minimum", "return torch.minimum(y, -y) if keep else None"),
        (12, "negate condition", "return torch.maximum(y, -y) if not (keep) else None"),
        (5, "constant 2 -> 3", "def f(x: torch.Tensor | None, n: int = 3) -> torch.Tensor:"),
    ]:
        assert want in got, want
    lines = {m.line for m in ms}
    assert not lines & {1, 2, 7}  # docstring, import, raise
    assert not any("&" in m.after.split("=")[0] or "Tensor &" in m.after for m in ms)  # annotations
    assert all(m.scope == "f" for m in ms if 5 <= m.line <= 12)
    for m in ms:  # each mutant changes one line and still parses
        diff = [(a, b) for a, b in zip(SOURCE.splitlines(), m.source.splitlines()) if a != b]
        assert len(diff) == 1 and diff[0][0].strip() == m.before
        compile(m.source, "m.py", "exec")


def test_equivalent_and_duplicate_mutants_by_bytecode():
    ms = mt.enumerate_mutants("m.py", SOURCE)
    mt.classify_statically(ms, SOURCE)
    status = {(m.line, m.op): m for m in ms}
    assert status[(15, "constant 1.0 -> 2.0")].status == "equivalent"  # 2.0 * 0 folds to the same 0.0
    assert status[(8, "constant 1.0 -> 2.0")].status == ""  # to run
    by_text = {m.after: m for m in ms}
    dropped = by_text["y = (x - 1.0).clamp(3, 3).sum(-1) * n"]  # unary minus dropped: runs
    negated_twice = by_text["y = (x - 1.0).clamp(-(-3), 3).sum(-1) * n"]  # folds to the same constant 3
    assert dropped.status == "" and (negated_twice.status, negated_twice.same_as) == ("duplicate", dropped.id)
    negated = status[(6, "negate condition")]  # `not (n < 1)` vs `n >= 1`: different bytecode, both run
    assert negated.status == "" and status[(6, "compare < -> >=")].status == ""


@pytest.mark.slow
def test_one_killed_and_one_surviving_mutant_end_to_end():
    """Two mutants of rl/advantages.py through the real runner: `rewards - mean` -> `+` is killed, an unused
    group slot (`+ 1` -> `+ 2`) survives."""
    ms = mt.enumerate_mutants("rl/advantages.py", (ROOT / "rl" / "advantages.py").read_text())
    killed = next(m for m in ms if m.after == "centered = rewards + mean[inv]")
    survives = next(m for m in ms if m.after.startswith("G = int(inv.max()) + 2"))
    proc = subprocess.run([sys.executable, "benchmarks/mutation_test.py", "--files", "rl/advantages.py",
                           "--tests", "rl/advantages.py=tests/test_advantages.py", "--only",
                           f"{killed.id},{survives.id}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "score: 1 / 2 behaviour-changing mutants" in proc.stdout, proc.stdout
    assert f"{survives.id}" in proc.stdout.split("survivors (1):")[1]
