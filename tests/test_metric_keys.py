"""The table of metric keys (rl/metric_keys.py) against the README and against what the code logs (issue 34)."""

import re
from pathlib import Path

import numpy as np
import pytest

from rl.metric_keys import DISTILL, DYNAMIC, KEYS, markdown_table, row_of
from rl.metrics import eval_metrics, rollout_metrics, step_metrics, trainer_metrics
from rl.trajectory import Trajectory
from trainer.objectives import DISTILL as DISTILL_OBJECTIVE
from trainer.objectives import GRPO

ROOT = Path(__file__).resolve().parents[1]
# Rows the embedded CPU default cannot show: vLLM's sync pieces, the overlap's wait, MFU (no GPU peak), sparse tool
# call counts (its untrained policy may never call a tool).
NOT_ON_THE_CPU_DEFAULT = {"time/sync_<piece>", "time/rollout_wait", "perf/mfu", "episode/<d>/calls/<tool>/<status>"}


def test_the_readme_holds_the_table():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- metric-keys:start[^>]*-->\n(.*?)<!-- metric-keys:end -->", readme, re.S)
    assert block, "README.md: the metric-keys markers are missing"
    assert block.group(1) == markdown_table(), "README's table differs: paste `python -m rl.metric_keys` between the markers"


def test_rows_are_distinct_and_complete():
    patterns = [p for p, _, _ in KEYS]
    assert len(patterns) == len(set(patterns))
    assert all(when and meaning for _, when, meaning in KEYS)


def _traj(uid, domain, reward, episode=None):
    t = Trajectory(uid=uid, group_id=uid[:1], domain=domain, prompt_ids=[1, 2], response_ids=np.array([3, 4, 5]),
                   inference_logprobs=np.zeros(3), response_text="x")
    t.reward, t.reward_parts, t.episode = reward, {"exact_match": reward, "length": 0.0}, episode
    return t


def test_every_key_the_metric_functions_make_has_a_row():
    episode = {"env": "smoke", "turns": 2, "calls": [{"tool": "lookup", "status": "ok", "seconds": 0.1}],
               "generated_tokens": 9, "tool_tokens": 4, "outcome": {"score": 1.0}, "termination": "submitted",
               "tool_wall_s": 0.2}
    trajs = [_traj("a1", "logic", 1.0), _traj("a2", "logic", 0.0), _traj("b1", "agent", 1.0, episode)]
    keys = set(rollout_metrics(trajs, {"logic": ["exact_match", "length"], "math": ["math"], "agent": []},
                               agent_domains=["agent"]))
    keys |= set(rollout_metrics(trajs[:2], {"logic": ["exact_match"]}, agent_domains=["agent"]))
    sums = {"loss/pg": 1.0, "loss/kl": 0.0, "tokens": 3, "clip_tokens": 1, "is_weight_sum": 3.0, "is_clip_sum": 0.0,
            "gpu_free_gib": 1.0, "gpu_others_gib": 1.0, "gpu_peak_gib": 1.0, "seqs/logic": 2, "kl_seqs/logic": 2,
            "rank_seconds": 1.0}
    keys |= set(trainer_metrics([sums], ["logic", "math"], 1, GRPO.metrics))
    distilled = {**sums, "distill_gap/logic": 0.5, "distill_tokens/logic": 3}
    keys |= set(trainer_metrics([distilled], ["logic", "math"], 1, DISTILL_OBJECTIVE.metrics))
    times = {f"time/{p}": 1.0 for p in ("rollout", "reward", "ref", "train", "sync", "step", "generate", "teacher")}
    keys |= set(step_metrics(3, times, 10, 0))
    keys |= set(eval_metrics(trajs[:2], 4, {"logic": "exact_match"}, 1.0))
    assert [k for k in sorted(keys) if row_of(k) is None] == []


def test_an_agent_domain_without_episodes_has_its_success_key_null():
    m = rollout_metrics([_traj("a1", "logic", 1.0)], {"logic": ["exact_match"]}, agent_domains=["agent"])
    assert "episode/agent/success" in m and m["episode/agent/success"] is None
    assert not any(k.startswith("agent/") for k in m)  # one prefix per concept: episode/<d>/..., never agent/agent/


@pytest.mark.slow
def test_a_real_runs_keys_are_the_table(quick_start_run):
    keys = {k for row in quick_start_run.rows for k in row}
    assert [k for k in sorted(keys) if row_of(k) is None] == [], "keys logged with no row in rl/metric_keys.py"
    seen = {row_of(k) for k in keys}
    # the SFT rows: tests/test_sft.py's run; the distillation rows: tests/test_distill.py's; the dynamic sampling
    # rows (off by default): tests/test_dynamic_sampling.py's
    rl_rows = {p for p, when, _ in KEYS if when not in ("SFT", DISTILL, DYNAMIC)}
    assert rl_rows - seen - NOT_ON_THE_CPU_DEFAULT == set(), "rows the run never logged"
    always = [p for p, when, _ in KEYS if when == "every step" or when.startswith("null")]
    for row in quick_start_run.rows:  # every-step rows are on every step (null allowed where the row says)
        rows_here = {row_of(k) for k in row}
        assert [p for p in always if p not in rows_here] == [], row["step"]


def test_tool_names_from_the_model_become_keys_only_when_plain_and_known():
    """rl.metric_keys.key_segment is the one bounding of key segments made from model text (a call's tool name):
    a tool the environment does not have (run or skipped) and any name that is not a plain segment count as
    `_unknown`; records made before the `known` flag still count unknown_tool calls there."""
    from rl.metric_keys import key_segment
    from rl.metrics import agent_metrics

    calls = [{"tool": "lookup", "status": "ok", "seconds": 0.1, "known": True},
             {"tool": "lookup", "status": "skipped", "seconds": 0.0, "known": True},
             {"tool": "fly", "status": "skipped", "seconds": 0.0, "known": False},  # no such tool, not run
             {"tool": "fly", "status": "unknown_tool", "seconds": 0.0},  # an older record: no `known`
             {"tool": "a/b/../c", "status": "skipped", "seconds": 0.0},
             {"tool": "x\nstep 99 reward 1.000", "status": "skipped", "seconds": 0.0},
             {"tool": "x" * 10_000, "status": "skipped", "seconds": 0.0},
             {"tool": "..", "status": "skipped", "seconds": 0.0}]
    episode = {"env": "smoke", "turns": 1, "calls": calls, "generated_tokens": 9, "tool_tokens": 4,
               "outcome": {"score": 0.0}, "termination": "submitted", "tool_wall_s": 0.2}
    m = agent_metrics([_traj("b1", "agent", 0.0, episode)], ["agent"])
    counts = {k: v for k, v in m.items() if "/calls/" in k}
    assert counts == {"episode/agent/calls/lookup/ok": 1.0, "episode/agent/calls/lookup/skipped": 1.0,
                      "episode/agent/calls/_unknown/skipped": 5.0, "episode/agent/calls/_unknown/unknown_tool": 1.0}
    assert all(row_of(k) for k in m)
    assert key_segment("submit_result") == "submit_result" and key_segment("web.search-v2") == "web.search-v2"
    assert key_segment("lookup", known=False) == key_segment(".hidden") == key_segment(None) == "_unknown"
    assert key_segment("é") == key_segment("") == key_segment("a" * 65) == "_unknown"
