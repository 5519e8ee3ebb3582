"""benchmarks/learn_pipeline.py's report: each "within 0.02 of the specialist" check prints the standard error of the
difference from the samples behind the two held-out scores, so a reader sees whether the evaluation can resolve it."""

import importlib.util
import json
from argparse import Namespace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("learn_pipeline", ROOT / "benchmarks" / "learn_pipeline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write(path: Path, rows: list[dict]) -> None:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_report_gives_the_standard_error_of_each_difference(tmp_path):
    lp = _load()
    assert lp.difference_se(0.75, 12, 0.583, 12) == pytest.approx(0.1894, abs=1e-4)
    assert lp.difference_se(0.5, 10_000, 0.5, 10_000) == pytest.approx(0.00707, abs=1e-5)
    ev = lambda step, d, p, prompts: {"step": step, f"eval/{d}/pass@1": p, f"eval/{d}/prompts": prompts, "eval/k": 4}  # noqa: E731
    _write(tmp_path / "pipeline" / "specialists" / "math", [ev(25, "math", 0.441, 64)])
    _write(tmp_path / "pipeline" / "specialists" / "agent", [ev(25, "agent", 0.75, 3)])
    _write(tmp_path / "pipeline" / "mixed_rl", [{**ev(0, "math", 0.512, 64), **ev(0, "agent", 0.75, 3)},
                                                {**ev(15, "math", 0.477, 64), **ev(15, "agent", 0.583, 3)}])
    text = lp.report(Namespace(out=tmp_path, plot=None, readme=False))
    assert "ends -0.167 from the specialist (target within 0.02; standard error of that difference 0.189, on 12 and 12" in text
    assert "ends +0.036 from the specialist (target within 0.02; standard error of that difference 0.044, on 256 and 256" in text
