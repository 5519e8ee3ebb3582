"""`python -m launch.score` end to end (subprocess), with a plain config file and, when present, the Hydra conf."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launch.score import score_lines

REPO = Path(__file__).resolve().parents[1]
CFG = {
    "domains": {
        "math": {"rewards": [{"name": "math", "weight": 1.0}, {"name": "format", "weight": 0.2, "thinking": False},
                             {"name": "length", "weight": 0.1, "mode": "overlong", "buffer": 4}]},
        "code": {"rewards": [{"name": "code", "weight": 1.0}]},
        "logic": {"rewards": [{"name": "exact_match", "weight": 1.0}]},
        "general": {"rewards": [{"name": "language", "weight": 1.0}]},
    },
    "rewards": {"num_workers": 1, "code": {"wall_s": 3, "cpu_s": 2}},
    "rollout": {"max_new_tokens": 16},
}
LINES = [
    {"domain": "math", "prompt": "1/2 as a decimal?", "response": "It is \\boxed{0.5}", "answer": "1/2"},
    {"domain": "math", "prompt": "q", "response": "\\boxed{0.5}", "answer": "1/2", "response_tokens": 16,
     "finish_reason": "length"},
    {"domain": "code", "prompt": "sum", "response": "```python\nprint(sum(map(int, input().split())))\n```",
     "tests": {"type": "stdio", "cases": [{"input": "1 2", "output": "3"}]}},
    {"domain": "logic", "prompt": "who?", "response": "Answer: Carol", "answer": "carol"},
    {"domain": "general", "prompt": "解释一下。", "response": "This is English.", "rubric": []},
    {"domain": "poetry", "prompt": "x", "response": "y"},
    {"domain": "logic", "prompt": "no answer field", "response": "Answer: 1"},
    {"prompt": "no domain", "response": "y"},
]


def write_input(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(x, ensure_ascii=False) for x in LINES) + "\n{not json\n")
    return path


def check(rows):
    assert len(rows) == len(LINES) + 1
    assert rows[0]["reward"] == pytest.approx(1.2) and rows[0]["error"] is None
    assert rows[1]["parts"]["length"] == -1.0 and rows[1]["reward"] == pytest.approx(1.1)
    assert rows[2]["reward"] == 1.0 and rows[3]["reward"] == 1.0
    assert rows[4]["reward"] < 0.5
    assert rows[5]["reward"] == 0.0 and "unknown domain" in rows[5]["error"]
    assert rows[6]["reward"] == 0.0 and "missing 'answer'" in rows[6]["error"]
    assert rows[7]["reward"] == 0.0 and "domain" in rows[7]["error"]
    assert rows[8]["reward"] == 0.0 and "invalid JSON" in rows[8]["error"]
    assert rows[3]["prompt"] == "who?"  # the input fields are kept


def test_score_lines_plain_dict(tmp_path):
    rows = list(score_lines(write_input(tmp_path).read_text().splitlines(), CFG))
    check(rows)


def test_cli_subprocess_with_plain_config(tmp_path):
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(json.dumps(CFG))
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, "-m", "launch.score", str(write_input(tmp_path)), "--out", str(out),
                           "--config", str(cfg_path), "rewards.code.wall_s=4"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    check([json.loads(x) for x in out.read_text().splitlines()])
    assert "scored 9 lines" in proc.stderr


def test_cli_subprocess_with_hydra_config(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"domain": "logic", "prompt": "q", "response": "Answer: 7", "answer": "7"}) + "\n")
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, "-m", "launch.score", str(inp), "--out", str(out),
                           "+domains.logic={rewards:[{name:exact_match,weight:2.0}]}", "rewards.timeout_s=5"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(out.read_text())
    assert row["reward"] == 2.0 and row["parts"] == {"exact_match": 1.0} and row["error"] is None
