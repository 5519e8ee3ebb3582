"""A user's reward that returns something other than a finite real, or prints without end (issue 33, items 5 and 7):
the sample scores 0 with a reason, and what the reward prints reaches the run's log capped per sample and per
pool process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rewards.compose import RewardComposer, describe_value, finite_real
from rewards.output_cap import CappedOutput
from rl.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[1]
BAD = ["huge_int", "unprintable_int", "neg_huge_int", "decimal_inf", "complex", "string", "array2", "numpy_bool",
       "none"]
GOOD = {"numpy_f32": 0.25, "fraction": 0.25, "decimal": 0.25}


def _traj(uid, domain="chat", text="x"):
    return Trajectory(uid=uid, group_id="g", domain=domain, prompt_ids=[1], response_ids=[2, 3],
                      inference_logprobs=[-1.0, -1.0], response_text=text)


def test_finite_real_takes_real_numbers_only():
    import decimal
    import fractions

    import numpy as np
    import torch

    for value in (10 ** 400, -(10 ** 400), float("inf"), float("nan"), True, np.bool_(False), "1", b"1", 1j, None,
                  [1.0], np.array([1.0, 2.0]), torch.tensor([1.0, 2.0]), decimal.Decimal("sNaN"),
                  decimal.Decimal("1e400"), np.array(np.nan)):
        assert finite_real(value) is None, value
    for value, want in ((3, 3.0), (0.5, 0.5), (np.float32(0.25), 0.25), (np.int64(-2), -2.0),
                        (np.array([0.5]), 0.5), (torch.tensor(0.75), 0.75), (fractions.Fraction(1, 4), 0.25),
                        (decimal.Decimal("0.1"), 0.1)):
        assert finite_real(value) == want, value


def test_describe_value_is_bounded_and_never_raises():
    assert describe_value(10 ** 5000) == "<int without a printable value>"  # repr raises past 4300 digits
    text = describe_value("y" * 10_000)
    assert len(text) < 130 and "10002 characters" in text


def test_odd_return_values_score_zero_with_a_reason():
    parts = [{"name": "custom_reward_example:returns", "label": kind, "kind": kind, "weight": 1.0}
             for kind in BAD + list(GOOD)]
    with RewardComposer({"chat": {"rewards": parts}}, {"num_workers": 1}, 16) as c:
        t = c.score([_traj("a")])[0]
    for kind in BAD:
        assert t.reward_parts[kind] == 0.0
        assert f"{kind}: returned " in t.reward_error and "not a finite real number" in t.reward_error, kind
    for kind, want in GOOD.items():
        assert t.reward_parts[kind] == want
    assert t.reward_failed and t.reward == pytest.approx(sum(GOOD.values()))
    assert len(t.reward_error) < 2000  # the 10**400 and 10**5000 are not spelled out


def test_score_cli_writes_every_row_when_a_reward_returns_a_huge_int(tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"domains": {"chat": {"rewards": [
        {"name": "custom_reward_example:returns", "kind": "huge_int", "weight": 1.0},
        {"name": "custom_reward_example:contains_keyword", "keyword": "blue", "weight": 1.0}]}},
        "rewards": {"num_workers": 1}, "rollout": {"max_new_tokens": 16}}))
    rows = [{"domain": "chat", "prompt": "q", "response": r} for r in ("blue sky", "grey")]
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-m", "launch.score", str(data), "--out", str(tmp_path / "out.jsonl"),
                           "--config", str(cfg)], cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in out] == [2.5, -0.5]
    assert all("not a finite real number" in r["error"] for r in out)


# ------------------------------------------------------------------------------------------------ output cap
def test_capped_output_keeps_the_head_of_each_sample_and_a_budget_per_worker():
    kept = []
    cap = CappedOutput(kept.append, per_sample_bytes=10, per_worker_bytes=25)
    cap.begin("a")
    cap.feed(b"0123456")
    cap.feed(b"789abcdef")  # 6 bytes past the sample's 10
    cap.begin("b")  # closing "a" says what was dropped
    cap.feed(b"ABCDEFGHIJKL")
    cap.end()
    cap.begin("c")
    cap.feed(b"zzzzzzzzzz")  # 5 left in the worker's budget
    cap.end()
    cap.begin("d")
    cap.feed(b"more")
    cap.end()
    text = b"".join(kept).decode()
    assert text.startswith("0123456789")
    assert "6 more bytes of output of a dropped" in text and "2 more bytes of output of b dropped" in text
    assert "ABCDEFGHIJ" in text and "zzzzz" in text and "zzzzzz" not in text
    assert text.count("are used up") == 1  # said once, then silence
    assert cap.kept_total == 25


def test_a_reward_that_prints_without_end_cannot_flood_the_log(tmp_path):
    """The pool processes inherit the reward worker's stderr (train.log in a run): 8 samples printing 512 KB each
    (print, sys.stderr and os.write alike) leave at most 4 KB per sample and 10 KB per process there."""
    script = """
import numpy as np
from rewards.compose import RewardComposer
from rl.trajectory import Trajectory
parts = [{"name": "custom_reward_example:prints", "kb": 512, "weight": 1.0}]
with RewardComposer({"chat": {"rewards": parts}}, {"num_workers": 2, "output": {"max_kb_per_sample": 4,
                    "max_mb_per_worker": 10 / 1024}}, 16) as c:
    ts = c.score([Trajectory(uid=str(i), group_id="g", domain="chat", prompt_ids=[1], response_ids=[2],
                             inference_logprobs=[-1.0], response_text="x") for i in range(8)])
print("REWARDS", [t.reward for t in ts], flush=True)
"""
    log = tmp_path / "train.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    with open(log, "wb") as err:
        proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=err,
                              timeout=180, env=env, text=True)
    assert proc.returncode == 0, log.read_text()[-2000:]
    assert "REWARDS [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]" in proc.stdout
    size = log.stat().st_size
    text = log.read_text()
    assert size < 2 * (10 * 1024 + 2000), size  # two processes, each within its budget (+ the marker lines)
    assert "bytes of output of custom_reward_example.prints dropped" in text
    assert "are used up" in text
