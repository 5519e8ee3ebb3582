"""Dynamic sampling (`data.dynamic_sampling`, DAPO's filter and backfill; issue 37): the pure helpers of
rl/dynamic_sampling.py, the mixture's backfill draws, the config checks, and the real loop (`launch.loop.train`, in
this process, on the embedded CPU model) with it on: what it logs, that every trained group has reward variance in
its domain's share, and that a run killed and resumed with trainer.resume=auto draws exactly what an uninterrupted
run draws (also with rollout.max_staleness=1, whose next rollout is submitted while the step is still backfilling)."""

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import ray
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from launch.loop import train
from launch.train import CONF_DIR
from rl.advantages import assign_advantages, expand_segments
from rl.config import ConfigError, validate
from rl.data import PromptMixture
from rl.dynamic_sampling import (backfill_counts, first_round_prompts, group_order, informative_groups, kept_counts,
                                 next_round, select_groups, step_quota)
from rl.metric_keys import DYNAMIC, KEYS, row_of
from rl.models import load_tokenizer
from rl.trajectory import Trajectory

MATH = {"path": "bundled:math.jsonl", "columns": {"prompt": "question", "answer": "answer"}}


def _traj(group, reward, domain="math", failed=False, j=0, segments=None):
    t = Trajectory(uid=f"{group}-{j}", group_id=group, domain=domain, prompt_ids=[1, 2], response_ids=[3, 4],
                   inference_logprobs=[-1.0, -1.0], segments=segments)
    t.reward, t.reward_failed = reward, failed
    return t


def _group(group, rewards, domain="math", failed=()):
    return [_traj(group, r, domain, j in failed, j) for j, r in enumerate(rewards)]


# -- the pure helpers ------------------------------------------------------------------------------------------------

def test_keeps_exactly_the_groups_with_reward_variance():
    trajs = (_group("a", [1.0, 0.0, 1.0]) + _group("b", [0.0, 0.0, 0.0]) + _group("c", [1.0, 1.0, 1.0])
             + _group("d", [0.5, 0.5 + 1e-15, 0.5])  # equal up to rounding: advantage 0 (rl.advantages)
             + _group("e", [0.0, 1.0, 1.0], failed={0})  # the failed sample has no say: the rest agree
             + _group("f", [0.3, 0.7, 0.0], failed={2})
             + _group("g", [0.0]) + _group("h", [0.2, 0.2], domain="distilled"))
    assert informative_groups(trajs) == {"a", "f"}
    assert informative_groups(trajs, exempt_domains={"distilled"}) == {"a", "f", "h"}
    # the same verdict as the advantages: a kept group has advantages, a dropped one none worth a gradient
    assign_advantages(trajs, normalize_std=False)
    assert {t.group_id for t in trajs if abs(t.advantage) > 1e-9} == {"a", "f"}
    assert group_order(trajs)[:3] == [("a", "math"), ("b", "math"), ("c", "math")]


def test_domain_shares_of_the_backfill():
    order = [("p0", "math"), ("p1", "logic"), ("p2", "math"), ("p3", "math"), ("p4", "logic"), ("p5", "code")]
    quota = step_quota(order, 4)  # the first prompts_per_step groups drawn set the step's shares
    assert quota == {"math": 3, "logic": 1}
    kept = kept_counts(order, {"p1", "p2", "p4"}, quota)  # logic found 2 with variance: only its share counts
    assert kept == {"math": 1, "logic": 1}
    assert backfill_counts(quota, kept, 1.0) == {"math": 2}  # each domain refills its own share
    assert backfill_counts(quota, kept, 1.5) == {"math": 3}  # oversampling, rounded up
    assert backfill_counts({"math": 3, "logic": 2}, {"math": 3, "logic": 0}, 2.0) == {"logic": 4}
    assert backfill_counts(quota, {"math": 3, "logic": 1}, 3.0) == {}
    assert first_round_prompts(4, 1.0) == 4 and first_round_prompts(4, 1.5) == 6 and first_round_prompts(3, 1.1) == 4


def test_the_round_cap():
    quota, short = {"math": 2, "logic": 2}, {"math": 0, "logic": 2}
    assert next_round(quota, short, 1, 3, 1.0) == {"math": 2}
    assert next_round(quota, short, 2, 3, 1.0) == {"math": 2}
    assert next_round(quota, short, 3, 3, 1.0) == {}  # max_rounds counts the first round
    assert next_round(quota, short, 1, 1, 1.0) == {}  # 1: filter, never backfill
    assert next_round(quota, {"math": 2, "logic": 2}, 1, 3, 1.0) == {}  # full: no more rounds


def test_selection_keeps_shares_trims_surplus_and_fills_when_the_rounds_ran_out():
    # round 1 (p*) drew 6 for a step of 4 (oversample 1.5); round 2 (r*) backfilled math
    order = [("p0", "math"), ("p1", "logic"), ("p2", "math"), ("p3", "math"), ("p4", "logic"), ("p5", "math"),
             ("r0", "math"), ("r1", "math")]
    quota = step_quota(order, 4)
    chosen, filled = select_groups(order, {"p1", "p3", "p4", "p5", "r0", "r1"}, quota)
    assert (chosen, filled) == (["p1", "p3", "p5", "r0"], 0)  # logic's surplus p4 and math's r1 are left out
    # the rounds ran out with one math group with variance: math's share is filled with its earliest others
    chosen, filled = select_groups(order, {"p1", "r1"}, quota)
    assert (chosen, filled) == (["p0", "p1", "p2", "r1"], 2)
    assert Counter(d for g, d in order if g in chosen) == Counter(quota)


def test_agent_episodes_are_filtered_as_episodes_before_their_segments_expand():
    def episode(group, j, reward):
        earlier = Trajectory(uid=f"{group}-{j}-seg0", group_id=group, domain="agent", prompt_ids=[1],
                             response_ids=[2, 3], inference_logprobs=[-1.0, -1.0])
        return _traj(group, reward, "agent", j=j, segments=[earlier])

    trajs = [episode("a", 0, 1.0), episode("a", 1, 0.0), episode("b", 0, 1.0), episode("b", 1, 1.0)]
    order = group_order(trajs)
    chosen, _ = select_groups(order, informative_groups(trajs), step_quota(order, 1))
    kept = [t for t in trajs if t.group_id in chosen]
    assign_advantages(kept, normalize_std=False)
    train = expand_segments(kept)
    assert [t.uid for t in train] == ["a-0-seg0", "a-0", "a-1-seg0", "a-1"]  # one count per episode, not per segment
    assert [t.advantage for t in train] == [0.5, 0.5, -0.5, -0.5]


# -- the mixture's draws ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tok(tiny_moe_path):
    return load_tokenizer(tiny_moe_path)


def _mixture(tok):
    domains = {"math": {"weight": 3.0, "dataset": MATH, "thinking": "both"},
               "plain": {"weight": 1.0, "dataset": {**MATH, "system_prompt": "Be brief."}}}
    return PromptMixture(domains, tok, seed=1, max_prompt_tokens=512)


def _ids(batch):
    return [(p["domain"], p["index"], p["thinking"]) for p in batch]


def test_backfill_draws_count_in_the_checkpointed_position(tok):
    a, plain = _mixture(tok), _mixture(tok)
    # an oversampled first round starts with the prompts the step draws without dynamic sampling
    assert _ids(a.next_batch(6))[:4] == _ids(plain.next_batch(4))
    backfill = a.next_of_domains({"math": 3, "plain": 1})
    assert [p["domain"] for p in backfill] == ["math"] * 3 + ["plain"]
    assert [p["thinking"] for p in backfill[:3]] in ([True, False, True], [False, True, False])  # `both` alternates
    state = json.loads(json.dumps(a.state_dict()))
    upcoming = [_ids(a.next_batch(4)), _ids(a.next_of_domains({"plain": 2})), _ids(a.next_batch(4))]
    resumed = _mixture(tok)
    resumed.load_state_dict(state)
    assert [_ids(resumed.next_batch(4)), _ids(resumed.next_of_domains({"plain": 2})),
            _ids(resumed.next_batch(4))] == upcoming


# -- config ----------------------------------------------------------------------------------------------------------

def _cfg(run_dir, *overrides: str) -> dict:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=["+experiment=smoke_learn", f"run_dir={run_dir}", "run_name=ds",
                                                      "logger.progress_bar=false", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def test_off_by_default_and_config_errors(tmp_path):
    assert _cfg(tmp_path)["data"]["dynamic_sampling"]["enabled"] is False
    validate(_cfg(tmp_path, "data.dynamic_sampling.enabled=true"))
    for override, message in [("data.dynamic_sampling.max_rounds=0", r"max_rounds=0: give a bound"),
                              ("data.dynamic_sampling.oversample=0.5", r"oversample must be >= 1"),
                              ("data.dynamic_sampling.enabled=maybe", r"data\.dynamic_sampling\.enabled")]:
        with pytest.raises(ConfigError, match=message):
            validate(_cfg(tmp_path, override))


# -- the real loop ---------------------------------------------------------------------------------------------------

# An untrained model's 2-token answers often hold no digit in any of a group's 4 samples (all reward 0), so
# groups get dropped and backfilled; a second domain (vowels) makes the shares matter.
SMALL = ["rollout.n_samples=4", "rollout.max_new_tokens=2", "data.dynamic_sampling.enabled=true"]
VOWELS = {"weight": 1.0, "dataset": {"path": "bundled:math.jsonl", "columns": {"prompt": "question"}},
          "kl_coef": 0.0, "opsm_delta": None, "rewards": [{"name": "char_fraction", "weight": 1.0, "chars": "aeiou"}]}


@pytest.fixture(scope="module", autouse=True)
def one_ray_for_the_module():
    """The runs share one local Ray (start_ray joins an initialised one); it stops with the module."""
    yield
    if ray.is_initialized():
        ray.shutdown()


def _run(run_dir: Path, *overrides: str, domains: dict | None = None) -> list[dict]:
    cfg = _cfg(run_dir, *SMALL, *overrides)
    for name, spec in (domains or {}).items():
        cfg["domains"].setdefault(name, {}).update(spec)
    train(cfg)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _rollouts(run_dir: Path, name: str) -> list[dict]:
    path = run_dir / "rollouts" / f"{name}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _groups(samples: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for s in samples:
        out.setdefault(s["uid"].rsplit("-", 1)[0], []).append(s)
    return out


def _varies(samples: list[dict]) -> bool:
    return max(s["reward"] for s in samples) - min(s["reward"] for s in samples) > 1e-12


def test_a_run_trains_only_on_groups_with_variance_in_each_domains_share(tmp_path):
    held_out = {"eval_dataset": {"path": "bundled:eval/math.jsonl", "columns": {"prompt": "question"}}}
    rows = _run(tmp_path, "trainer.total_steps=3", "data.dynamic_sampling.oversample=1.5", "eval.every=3",
                "eval.max_prompts=6", "eval.n_samples=2", domains={"vowels": VOWELS, "digits": held_out})
    # the held-out eval is never filtered: every prompt's samples, those that all scored the same included
    evaluated = _groups(_rollouts(tmp_path, "eval_step_000003"))
    assert rows[-1]["eval/digits/prompts"] == 6 and len(evaluated) == 6
    assert all(len(s) == 2 for s in evaluated.values()) and not all(map(_varies, evaluated.values()))
    dynamic_rows = {p for p, when, _ in KEYS if when == DYNAMIC}
    for r in rows:
        assert [k for k in r if row_of(k) is None] == []
        assert dynamic_rows <= {row_of(k) for k in r}, r["step"]  # every dynamic sampling key, every step
        step, trained, unused = r["step"], _groups(_rollouts(tmp_path, f"step_{r['step']:06d}")), \
            _groups(_rollouts(tmp_path, f"step_{r['step']:06d}_unused"))
        generated = {**trained, **unused}
        assert len(trained) == 4 and all(len(s) == 4 for s in generated.values())  # the step's shape is kept
        # each trained group has reward variance, but for those that fill a share once the rounds ran out
        assert sum(not _varies(s) for s in trained.values()) == r["dynamic_sampling/filled_groups"]
        assert r["advantage/zero_variance_group_frac"] == r["dynamic_sampling/filled_groups"] / 4
        assert sum(not _varies(s) for s in generated.values()) == r["dynamic_sampling/dropped_groups"]
        # the shares: the domains of the step's first 4 groups drawn (oversampling drew 6 in its first round)
        first = [g for g in generated if g.startswith(f"s{step}-p")]
        assert sorted(first) == [f"s{step}-p{i}" for i in range(6)]
        domain = {g: s[0]["domain"] for g, s in generated.items()}
        assert Counter(domain[g] for g in trained) == Counter(domain[f"s{step}-p{i}"] for i in range(4))
        assert len(generated) == 4 + r["dynamic_sampling/extra_prompts"]
        assert 1 <= r["dynamic_sampling/rounds"] <= 3
        backfilled = [g for g in trained if not g.startswith(f"s{step}-p")]
        assert r["dynamic_sampling/backfilled_frac"] == len(backfilled) / 4
        everything = [x for s in generated.values() for x in s]
        assert r["dynamic_sampling/reward_mean"] == pytest.approx(np.mean([x["reward"] for x in everything]))
        assert r["throughput/rollout_tokens_per_s"] * r["time/generate"] == \
            pytest.approx(sum(x["response_tokens"] for x in everything))
    assert any(r["dynamic_sampling/rounds"] > 1 and r["dynamic_sampling/backfilled_frac"] > 0 for r in rows)


def test_resume_draws_exactly_what_an_uninterrupted_run_draws(tmp_path):
    """max_staleness=1 (step n+1's first round is submitted once step n's backfill is in) and lr=0, so the
    uninterrupted run's one-update-old rollouts sample the same weights as the resumed run's fresh ones: every
    prompt, response and filter decision must then be the same, backfill rounds included."""
    common = ["rollout.max_staleness=1", "trainer.lr=0.0", "trainer.save_every=2"]
    straight = _run(tmp_path / "a", *common, "trainer.total_steps=3")
    _run(tmp_path / "b", *common, "trainer.total_steps=2")
    resumed = _run(tmp_path / "b", *common, "trainer.total_steps=3", "trainer.resume=auto")
    assert [r["step"] for r in resumed] == [1, 2, 3]
    assert [r["rollout/staleness"] for r in straight] == [0.0, 1.0, 1.0]
    # step 2 backfilled after step 3's first round was due: those draws must be in the checkpoint's position
    assert straight[1]["dynamic_sampling/extra_prompts"] > 0 and straight[2]["dynamic_sampling/rounds"] > 1
    for name in ("step_000003", "step_000003_unused"):
        a, b = _rollouts(tmp_path / "a", name), _rollouts(tmp_path / "b", name)
        assert [(x["uid"], x["prompt"], x["response"], x["reward"]) for x in a] == \
               [(x["uid"], x["prompt"], x["response"], x["reward"]) for x in b], name
    keys = [k for k in straight[2] if k.startswith("dynamic_sampling/")]
    assert {k: straight[2][k] for k in keys} == {k: resumed[2][k] for k in keys}
