"""benchmarks/run_env.py's reader of a run's JSON-lines logs, shared by the benchmark scripts' reports and watchers."""

import json
import sys

import pytest

from script_module import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from run_env import read_jsonl  # noqa: E402


def test_a_log_being_written_reads_its_complete_lines(tmp_path):
    log = tmp_path / "metrics.jsonl"
    assert read_jsonl(log) == []  # the run has not written it yet
    rows = [{"step": 1, "reward/mean": 0.25}, {"step": 2, "reward/mean": 0.5}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n" + '{"step": 3, "rew')  # a blank line, a partial one
    assert read_jsonl(log) == rows


def test_a_broken_line_before_the_last_is_an_error_naming_it(tmp_path):
    log = tmp_path / "steps.jsonl"
    log.write_text('{"step": 1}\n{"step": 2, oops\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"steps.jsonl, line 2: not JSON"):
        read_jsonl(log)
