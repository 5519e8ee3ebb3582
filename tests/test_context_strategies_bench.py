"""benchmarks/context_strategies.py on CPU: end to end with the embedded tiny model (the JSON report has every field
for every strategy), with the reference policy (no model: it measures the tokens a task needs, and shows `none`
ending at the window where a strategy goes on), and a strategy the agent loop refuses reported as not available."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "context_strategies.py"
ROW_KEYS = {"available", "episodes", "success", "pass@1", "tool_calls", "turns", "context_resets", "discarded_tokens",
            "generated_tokens", "termination", "wall_s"}


@pytest.fixture(scope="module")
def bench():
    return load_script(SCRIPT)


def test_the_script_runs_end_to_end_on_the_tiny_model(bench, tmp_path, tiny_moe_path, capsys):
    """main() as the command line calls it (in this process: a fresh interpreter would spend ~10 s importing torch
    again): the embedded model on the transformers engine, 2 held-out tasks, 2 strategies."""
    out = tmp_path / "ctx.json"
    assert bench.main(["--tiny", "--tasks", "2", "--k", "1", "--strategies", "none", "discard_all", "--window", "2048",
                       "--max-turns", "3", "--max-new-tokens", "16", "--episodes", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["env"] == "search_long" and report["tasks"] == ["search_long-eval-000", "search_long-eval-001"]
    assert report["settings"]["seed"] == 0 and report["settings"]["window"] == 2048
    assert "tiny-moe" in report["policy"] and "on hf (CPU, float32)" in report["policy"]
    assert list(report["strategies"]) == ["none", "discard_all"]
    for name, row in report["strategies"].items():
        assert set(row) == ROW_KEYS, name
        assert row["available"] and row["episodes"] == 2 and sum(row["termination"].values()) == 2
        assert 0.0 <= row["success"] <= row["pass@1"] <= 1.0 and row["turns"] <= 3 and row["wall_s"] > 0
        assert [e["task"] for e in report["episodes"][name]] == report["tasks"]
    assert report["strategies"]["none"]["context_resets"] == 0
    printed = capsys.readouterr().out
    assert "| strategy | success | pass@1 |" in printed and "| discard_all |" in printed


def test_the_command_line_parses_and_refuses_a_window_the_tiny_model_lacks():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--window", "4096", "--out", "/dev/null"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "the embedded model has 2048 positions" in proc.stderr


def test_the_reference_policy_measures_tokens_and_needs_a_strategy(bench, tmp_path, tiny_moe_path):
    out = tmp_path / "ref.json"
    assert bench.main(["--reference", "--tiny", "--tasks", "3", "--window", "2048", "--max-tool-output-tokens",
                       "1024", "--strategies", "none", "discard_75", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    need = report["reference_tokens"]
    assert need["solved"] == 1.0 and need["min"] > 2 * 2048 and len(need["per_task"]) == 3
    rows = report["strategies"]
    assert rows["none"]["termination"] == {"length": 3} and rows["none"]["success"] == 0.0
    assert rows["discard_75"]["termination"] == {"submitted": 3} and rows["discard_75"]["success"] == 1.0
    assert rows["discard_75"]["context_resets"] >= 1 and rows["discard_75"]["discarded_tokens"] > 0


def test_a_strategy_the_loop_refuses_is_reported_not_available(bench, tmp_path, tiny_moe_path, monkeypatch, capsys):
    import rollout.agent

    real = rollout.agent.AgentConfig.from_config.__func__

    def refuse_summary(cls, block):
        if block.get("context_strategy") == "summary":
            raise ValueError("context_strategy=summary is not available yet")
        return real(cls, block)

    monkeypatch.setattr(rollout.agent.AgentConfig, "from_config", classmethod(refuse_summary))
    out = tmp_path / "ref.json"
    assert bench.main(["--reference", "--tiny", "--tasks", "1", "--window", "2048", "--strategies", "summary",
                       "discard_all", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["strategies"]
    assert rows["summary"] == {"available": False, "reason": "context_strategy=summary is not available yet"}
    assert rows["discard_all"]["available"]
    assert "| summary | not available: context_strategy=summary is not available yet |" in capsys.readouterr().out
