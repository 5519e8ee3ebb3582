"""On-policy distillation (algorithm.objective=distill, issue 35): the per-token advantages and the loss against
reference implementations in float64 (its gradient is the exact reverse-KL gradient), the batch contract, teacher
placement and config refusals, and a run that pulls the student towards its teacher (slow)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from launch.config import check_config, compose, resolve_teachers
from launch.placement import check_cpu_reservations, colocated_shares, cpu_reservations, teachers_of
from rl.config import ConfigError
from rl.losses import distill_token_advantages, grpo_loss
from rl.metrics import TrainStatSums, trainer_metrics
from rl.trajectory import Trajectory, collate
from trainer.objectives import DISTILL, GRPO, OBJECTIVES, SFT

ROOT = Path(__file__).resolve().parents[1]
F64 = torch.float64


def test_distill_is_a_rollout_objective_that_needs_a_teacher():
    assert OBJECTIVES == {"grpo": GRPO, "distill": DISTILL, "sft": SFT}
    assert DISTILL.source == "rollouts" and DISTILL.needs == GRPO.needs | {"teacher"}


def test_token_advantages_are_the_reward_advantage_plus_the_teachers_grade():
    adv = torch.tensor([0.5, -1.0], dtype=F64)
    seq = torch.tensor([0, 0, 1, 1, 1])
    old = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.0], dtype=F64)
    teacher = torch.tensor([-0.5, -4.0, -0.5, -1.0, -60.0], dtype=F64)
    got = distill_token_advantages(adv, seq, old, teacher, torch.tensor([1.0, 0.0], dtype=F64),
                                   torch.tensor([2.0, 1.0], dtype=F64))
    want = [0.5 + 2 * 0.5, 0.5 + 2 * -2.0, 0.0, 2.0, -20.0]  # the last gap is clamped at -LOG_RATIO_CLAMP
    assert got.tolist() == pytest.approx(want)
    assert not got.requires_grad


def _exact_reverse_kl(student_logits, teacher_logits):
    s, t = torch.log_softmax(student_logits, -1), torch.log_softmax(teacher_logits, -1)
    return (s.exp() * (s - t)).sum()


def test_the_loss_gradient_is_the_exact_reverse_kl_gradient():
    """Over every token of a small vocabulary, weighted by its sampling probability (the expectation the sampled
    estimator takes), the distillation loss's gradient at pi_theta = pi_old is grad KL(pi_theta || pi_teacher)."""
    g = torch.Generator().manual_seed(0)
    V = 7
    theta = torch.randn(V, generator=g, dtype=F64, requires_grad=True)
    teacher_logits = torch.randn(V, generator=g, dtype=F64) * 2
    logp = torch.log_softmax(theta, -1)
    old = logp.detach()
    tokens = torch.arange(V)
    token_adv = distill_token_advantages(torch.zeros(V, dtype=F64), tokens, old, torch.log_softmax(teacher_logits, -1),
                                         torch.zeros(V, dtype=F64), torch.ones(V, dtype=F64))
    # one single-token sequence per vocabulary entry; token_mean with the probabilities as weights = the expectation
    loss, _ = grpo_loss(logp, old, None, tokens, old.exp(), torch.zeros(V, dtype=F64), torch.zeros(V, dtype=F64),
                        torch.full((V,), float("inf"), dtype=F64), eps_low=0.2, eps_high=0.2,
                        aggregation="token_mean", norm_seqs=V, norm_tokens=1, token_advantages=token_adv)
    (ours,) = torch.autograd.grad(loss, theta)
    (exact,) = torch.autograd.grad(_exact_reverse_kl(theta, teacher_logits), theta)
    assert torch.allclose(ours, exact, atol=1e-12), (ours, exact)


def test_sampled_tokens_estimate_the_reverse_kl_gradient():
    """The same with tokens drawn from the student (what a rollout gives): the mean gradient converges to it."""
    g = torch.Generator().manual_seed(1)
    V, n = 5, 200_000
    theta = torch.randn(V, generator=g, dtype=F64, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(V, generator=g, dtype=F64), -1)
    logp_all = torch.log_softmax(theta, -1)
    draws = torch.multinomial(logp_all.detach().exp(), n, replacement=True, generator=g)
    logp = logp_all[draws]
    seq = torch.arange(n)
    token_adv = distill_token_advantages(torch.zeros(n, dtype=F64), seq, logp.detach(), teacher[draws],
                                         torch.zeros(n, dtype=F64), torch.ones(n, dtype=F64))
    loss, _ = grpo_loss(logp, logp.detach(), None, seq, torch.ones(n, dtype=F64), torch.zeros(n, dtype=F64),
                        torch.zeros(n, dtype=F64), torch.full((n,), float("inf"), dtype=F64), eps_low=0.2,
                        eps_high=0.2, aggregation="token_mean", norm_seqs=n, norm_tokens=n, token_advantages=token_adv)
    (ours,) = torch.autograd.grad(loss, theta)
    (exact,) = torch.autograd.grad(_exact_reverse_kl(theta, torch.log(teacher.exp())), theta)
    assert torch.allclose(ours, exact, atol=0.01), (ours, exact)


def _reference_loss(logprobs, old, token_adv, seq_index, mask, eps, B):
    """A loop over sequences and tokens: 1/B sum_i 1/|o_i| sum_t -min(r A, clip(r) A)."""
    total = 0.0
    for i in range(B):
        terms = []
        for t in range(len(logprobs)):
            if int(seq_index[t]) == i and mask[t] > 0:
                r = torch.exp(logprobs[t] - old[t])
                terms.append(-torch.minimum(r * token_adv[t], r.clamp(1 - eps, 1 + eps) * token_adv[t]))
        if terms:
            total = total + sum(terms) / len(terms)
    return total / B


def test_the_loss_with_token_advantages_equals_a_reference_loop_and_clips():
    g = torch.Generator().manual_seed(2)
    N, B = 9, 3
    seq = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    mask = torch.tensor([1, 1, 0, 1, 1, 1, 1, 1, 0], dtype=F64)
    old = -torch.rand(N, generator=g, dtype=F64) * 3
    logprobs = (old + torch.randn(N, generator=g, dtype=F64) * 0.4).requires_grad_(True)  # some ratios clip
    teacher = -torch.rand(N, generator=g, dtype=F64) * 3
    adv = torch.tensor([0.3, -0.2, 0.0], dtype=F64)
    token_adv = distill_token_advantages(adv, seq, old, teacher, torch.ones(B, dtype=F64),
                                         torch.full((B,), 0.5, dtype=F64))
    ours, stats = grpo_loss(logprobs, old, None, seq, mask, adv, torch.zeros(B, dtype=F64),
                            torch.full((B,), float("inf"), dtype=F64), eps_low=0.2, eps_high=0.2,
                            norm_seqs=B, norm_tokens=int(mask.sum()), token_advantages=token_adv)
    ref = _reference_loss(logprobs, old, token_adv, seq, mask, 0.2, B)
    assert float(ours.detach()) == pytest.approx(float(ref.detach()), abs=1e-12)
    (g_ours,) = torch.autograd.grad(ours, logprobs)
    (g_ref,) = torch.autograd.grad(ref, logprobs)
    assert torch.allclose(g_ours, g_ref, atol=1e-12)
    assert float(stats["clip_tok_sum"]) > 0  # the clip was exercised
    # distill_coef 0 and reward_coef 1: exactly GRPO
    plain, _ = grpo_loss(logprobs, old, None, seq, mask, adv, torch.zeros(B, dtype=F64),
                         torch.full((B,), float("inf"), dtype=F64), eps_low=0.2, eps_high=0.2, norm_seqs=B,
                         norm_tokens=int(mask.sum()))
    zero = distill_token_advantages(adv, seq, old, teacher, torch.ones(B, dtype=F64), torch.zeros(B, dtype=F64))
    same, _ = grpo_loss(logprobs, old, None, seq, mask, adv, torch.zeros(B, dtype=F64),
                        torch.full((B,), float("inf"), dtype=F64), eps_low=0.2, eps_high=0.2, norm_seqs=B,
                        norm_tokens=int(mask.sum()), token_advantages=zero)
    assert float(same.detach()) == float(plain.detach())


def test_opsm_takes_the_sign_of_the_reward_part_not_the_teachers_grade():
    """The teacher term averages to minus the reverse KL (<= 0): OPSM decides by the reward part reward_coef * A_i, so
    a drifted sequence the teacher grades badly is kept when its reward advantage is not negative, and one with a
    negative reward advantage is masked."""
    seq, mask = torch.tensor([0, 0, 1, 1]), torch.ones(4, dtype=F64)
    old = torch.tensor([-1.0, -1.0, -1.0, -1.0], dtype=F64)
    logprobs = torch.tensor([-2.0, -2.0, -2.0, -2.0], dtype=F64)  # drift log(pi_old/pi_theta) = 1 > delta
    teacher = torch.tensor([-5.0, -5.0, 0.0, 0.0], dtype=F64)
    adv = torch.tensor([0.0, -0.5], dtype=F64)
    token_adv = distill_token_advantages(adv, seq, old, teacher, torch.ones(2, dtype=F64), torch.ones(2, dtype=F64))
    _, stats = grpo_loss(logprobs, old, None, seq, mask, adv, torch.zeros(2, dtype=F64),
                         torch.full((2,), 0.5, dtype=F64), eps_low=0.2, eps_high=0.2, norm_seqs=2, norm_tokens=4,
                         token_advantages=token_adv)
    assert stats["opsm_keep"].tolist() == [True, False]


def test_reward_coef_holds_in_every_micro_batch_with_or_without_a_teacher():
    """A domain without a teacher and reward_coef 0 gets no gradient, whether its micro-batch holds a teacher's
    sample or not (and whether the step drew any teacher domain at all)."""
    acfg = {"clip_eps_low": 0.2, "clip_eps_high": 0.2, "unbiased_kl": True, "loss_aggregation": "seq_mean_token_mean"}

    def grad_of_first(trajs):
        batch = collate(trajs, pad_id=0)
        logprobs = torch.full((batch.targets.numel(),), -1.0, requires_grad=True)
        loss, _ = DISTILL.loss(logprobs, batch, acfg, (len(trajs), batch.targets.numel()))
        return torch.autograd.grad(loss, logprobs)[0][:3]

    code = _traj("c", "code")
    code.reward_coef = 0.0
    assert grad_of_first([code]).abs().sum() == 0
    assert grad_of_first([code, _traj("m", "math", [-0.5, -1.0, -3.0])]).abs().sum() == 0
    code.reward_coef = 1.0
    assert grad_of_first([code]).abs().sum() > 0


def _traj(uid, domain, teacher=None, coef=1.0):
    t = Trajectory(uid=uid, group_id=uid, domain=domain, prompt_ids=[1, 2], response_ids=[3, 4, 5],
                   inference_logprobs=np.full(3, -1.0, dtype=np.float32))
    t.advantage, t.distill_coef = 0.5, coef
    t.teacher_logprobs = None if teacher is None else np.asarray(teacher, dtype=np.float32)
    return t


def test_a_batch_carries_the_teachers_logprobs_and_the_objective_sums_them_per_domain():
    trajs = [_traj("a", "math", [-0.5, -1.0, -3.0], coef=2.0), _traj("b", "logic")]
    batch = collate(trajs, pad_id=0)
    assert batch.teacher_logprobs.tolist() == [-0.5, -1.0, -3.0, 0.0, 0.0, 0.0]
    assert batch.distill_coef.tolist() == [2.0, 0.0]  # no teacher logprobs: no teacher term
    assert collate([_traj("c", "logic")], pad_id=0).teacher_logprobs is None
    logprobs = torch.full((6,), -1.0)
    acfg = {"clip_eps_low": 0.2, "clip_eps_high": 0.2, "unbiased_kl": True, "loss_aggregation": "seq_mean_token_mean"}
    loss, stats = DISTILL.loss(logprobs, batch, acfg, (2, 6))
    # sequence a: 1/3 sum_t -(0.5 + 2 (teacher - old)); sequence b: -0.5; mean over the 2 sequences
    a = -np.mean([0.5 + 2 * 0.5, 0.5 + 2 * 0.0, 0.5 + 2 * -2.0])
    assert float(loss) == pytest.approx((a - 0.5) / 2)
    sums = TrainStatSums()
    sums.add({"tokens": 6.0})
    sums.add(DISTILL.sums(batch, stats))
    m = trainer_metrics([sums.totals()], ["math", "logic"], 1, DISTILL.metrics)
    assert m["distill/math/reverse_kl"] == pytest.approx(np.mean([-0.5, 0.0, 2.0]))
    assert m["distill/logic/reverse_kl"] is None and m["distill/reverse_kl"] == pytest.approx(0.5)
    plain = collate([_traj("d", "math")], pad_id=0)  # a batch without a teacher is plain GRPO
    assert float(DISTILL.loss(logprobs[:3], plain, acfg, (1, 3))[0]) == float(GRPO.loss(logprobs[:3], plain, acfg, (1, 3))[0])


def test_config_refusals_and_teacher_resolution(tmp_path, tiny_moe_path):
    with pytest.raises(ConfigError, match="no domain has a teacher"):
        check_config(compose(["+experiment=mixed_rl", "algorithm.objective=distill"]))
    with pytest.raises(ConfigError, match=r"domains.math.teacher: read only by on-policy distillation"):
        check_config(compose(["+experiment=mixed_rl", "++domains.math.teacher=embedded:tiny-dense"]))
    with pytest.raises(ConfigError, match=r"domains.math.distill_coef"):
        check_config(compose(["+experiment=mixed_rl", "algorithm.objective=distill",
                              "++domains.math.teacher=embedded:tiny-dense", "++domains.math.distill_coef=-1"]))
    with pytest.raises(ConfigError, match="every domain with a teacher is switched off"):
        check_config(compose(["+experiment=mixed_rl", "algorithm.objective=distill", "domains.math.weight=0",
                              "++domains.math.teacher=embedded:tiny-dense"]))
    cfg = compose(["+experiment=mixed_rl", "algorithm.objective=distill", "++domains.math.teacher=embedded:tiny-dense",
                   "++domains.logic.teacher=embedded:tiny-dense"])
    check_config(cfg)
    resolve_teachers(cfg, tiny_moe_path)
    assert cfg["domains"]["math"]["teacher"] == cfg["domains"]["logic"]["teacher"] and Path(
        cfg["domains"]["math"]["teacher"]).is_dir()
    assert len(teachers_of(cfg)) == 1  # one actor per distinct path
    # a teacher with another vocabulary cannot grade the student's token ids
    from rl.models import build_tokenizer

    build_tokenizer(tmp_path / "other", vocab_size=1024)
    other = compose(["+experiment=mixed_rl", "algorithm.objective=distill", f"++domains.math.teacher={tmp_path / 'other'}"])
    with pytest.raises(ConfigError, match="tokenizer differs"):
        resolve_teachers(other, tiny_moe_path)
    # the checks model.path gets apply to a teacher: compiled layers need a dense teacher
    moe = compose(["+experiment=mixed_rl", "algorithm.objective=distill", "++domains.math.teacher=embedded:tiny-moe",
                   "trainer.compile=true"])
    with pytest.raises(ConfigError, match="teacher=embedded:tiny-moe: trainer.compile=true supports dense models"):
        resolve_teachers(moe, tiny_moe_path)


def test_teachers_take_gpu_shares_like_the_reference():
    cfg = compose(["+experiment=mixed_rl", "rollout=vllm", "trainer.device=cuda", "trainer.num_gpus=0.5",
                   "rollout.num_gpus=0.2", "trainer.ref_num_gpus=0.1", "algorithm.objective=distill",
                   "++domains.math.teacher=/a", "++domains.code.teacher=/b", "++domains.logic.teacher=/a"])
    shares = colocated_shares(cfg)
    assert shares["2 x trainer.ref_num_gpus (teachers)"] == pytest.approx(0.2)
    cfg["trainer"]["ref_num_gpus"] = 0.2  # 0.5 + 0.2 + 0.2 reference + 2 x 0.2 teachers > 1
    with pytest.raises(ConfigError, match="teachers"):
        colocated_shares(cfg)
    cfg["trainer"].update(ref_num_gpus=0.5, num_gpus=0.1)  # 2 x 0.5 teachers alone fill GPU 0: refused, not a hang
    cfg["domains"]["math"]["kl_coef"] = cfg["domains"]["code"]["kl_coef"] = 0.0
    with pytest.raises(ConfigError, match=r"2 x trainer.ref_num_gpus \(teachers\) 1.0"):
        colocated_shares(cfg)


def test_a_local_cluster_too_small_for_the_teachers_is_refused_by_name():
    cfg = compose(["+experiment=mixed_rl", "algorithm.objective=distill", "++domains.math.teacher=/a"])
    need = cpu_reservations(cfg)
    assert need["1 x trainer.num_cpus (teachers)"] == 0.5 and sum(need.values()) == 2.5  # the CPU default has 2
    with pytest.raises(ConfigError, match=r"reserve 2.5 CPUs .*teachers.* e.g. ray.num_cpus=3"):
        check_cpu_reservations(cfg, 2.0)
    check_cpu_reservations(cfg, 3.0)


def _sharp_teacher(out: Path, tiny_dense_path: str) -> Path:
    """The tiny dense model with its output logits scaled 5x: a teacher far from the near-uniform random student
    (the two random models alone are within ~0.04 nats of each other, too close to show learning)."""
    from rl.models import load_causal_lm, load_tokenizer

    model = load_causal_lm(tiny_dense_path, "float32", "sdpa")
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone() * 5)
    model.save_pretrained(out)
    load_tokenizer(tiny_dense_path).save_pretrained(out)
    return out


@pytest.mark.slow
def test_distillation_pulls_the_student_towards_its_teacher(tmp_path, tiny_dense_path):
    """The embedded tiny MoE student distilled from a sharp teacher on the math and logic domains, with the
    teacher term alone (reward_coef 0): the sampled reverse KL falls, the teacher ran every step, and the GRPO
    rows are there too. Also eval.before_train: a step-0 row of held-out scores."""
    path = _sharp_teacher(tmp_path / "teacher", tiny_dense_path)
    teacher = ["algorithm.objective=distill", f"++domains.math.teacher={path}",
               f"++domains.logic.teacher={path}", "++domains.math.reward_coef=0",
               "++domains.logic.reward_coef=0", "domains.code.weight=0", "domains.general.weight=0",
               "domains.agent.weight=0"]
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "launch.train", "+experiment=mixed_rl", f"run_dir={run_dir}",
                           "logger.progress_bar=false", "trainer.total_steps=10", "trainer.save_every=0",
                           "trainer.lr=3e-3", "eval.every=10", "eval.before_train=true", "eval.max_prompts=2",
                           "data.prompts_per_step=16", "ray.num_cpus=3", *teacher],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    first, *rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # eval.before_train: the starting weights' held-out scores come first, as step 0
    assert first["step"] == 0 and first["eval/math/prompts"] == 2 and "loss/pg" not in first
    assert [r["step"] for r in rows] == list(range(1, 11)) and "eval/math/pass@1" in rows[-1]
    kl = [r["distill/reverse_kl"] for r in rows]
    assert all(k is not None for k in kl) and all(r["time/teacher"] > 0 for r in rows)
    assert np.mean(kl[-4:]) < 0.85 * np.mean(kl[:2]), kl
    assert "loss/pg" in rows[-1] and "distill/math/reverse_kl" in rows[-1]
