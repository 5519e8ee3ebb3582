"""A managed agent episode trains as one sequence of the paper however often its context was reset (issue 68 item 6):
its k+1 context segments share its weight under the seq-mean aggregations, and the rollout metrics count every
segment. Float64, CPU."""

import numpy as np
import pytest
import torch

from rl.advantages import expand_segments
from rl.batching import minibatch_norm
from rl.metrics import rollout_metrics
from rl.trajectory import Trajectory, collate
from trainer.objectives import grpo

D = torch.float64
AGGREGATIONS = ["seq_mean_token_mean", "seq_mean_token_sum", "token_mean"]


def _traj(uid, response, loss_mask, advantage, inference, ref, prompt=(1, 2)):
    t = Trajectory(uid=uid, group_id="g", domain="agent", prompt_ids=list(prompt), response_ids=list(response),
                   inference_logprobs=np.asarray(inference), loss_mask=np.asarray(loss_mask, np.float32),
                   ref_logprobs=np.asarray(ref, np.float32))
    t.advantage, t.kl_coef, t.opsm_delta = advantage, 0.1, None
    return t


def _f64(batch):
    for k, v in vars(batch).items():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            setattr(batch, k, v.to(D))
    return batch


RESPONSE = list(range(10, 19))  # one episode's 9 response tokens; 0 = a tool token (not trained on)
MASK = [1, 1, 0, 0, 1, 1, 1, 0, 1]
INFERENCE = np.linspace(-0.4, -2.0, 9)  # the engine's logprob of each
REF = np.linspace(-1.5, -0.5, 9)  # the reference's


def _episode(cuts):
    """The episode as context segments cut before the given response positions (no cut: one segment), and a plain
    sample beside it; each segment's prompt is the context it continued from (here: a placeholder)."""
    bounds = [0, *cuts, len(RESPONSE)]
    parts = [_traj(f"e-seg{k}", RESPONSE[a:b], MASK[a:b], -0.7, INFERENCE[a:b], REF[a:b], prompt=(1, 2, 3 + k))
             for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
    last = parts.pop()
    last.uid, last.segments = "e", parts or None
    return [last, _traj("x", [20, 21, 22, 23, 24], [1] * 5, 0.4, [-0.2, -1.0, -3.0, -0.5, -0.9], [-1.0] * 5)]


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_an_episode_in_one_or_three_segments_weighs_the_same(aggregation):
    """The same 9 tokens (6 trained on) as one sequence, or cut into 3 context segments of 4, 3 and 2 tokens: the
    mini-batch's loss and every token's gradient are equal under every aggregation, so the plain sample beside it
    keeps its weight too. seq_mean_token_mean: each segment weighs its share of the episode's loss tokens (2/6,
    3/6, 1/6), which makes its segments' means the episode's 1/|o_i| sum_t; seq_mean_token_sum: each segment
    weighs 1; the normaliser counts the episode once. On main each segment was a sequence of its own (the episode
    weighed 3x under the seq-mean aggregations)."""
    acfg = dict(clip_eps_low=0.2, clip_eps_high=0.28, unbiased_kl=True, loss_aggregation=aggregation, tis_cap=None)
    theta = torch.linspace(-0.3, -2.4, 14, dtype=D)  # the trainer's logprob of each token, in batch order
    out = []
    for cuts in ([], [4, 7]):
        train = expand_segments(_episode(cuts))
        assert len(train) == len(cuts) + 2
        norm = minibatch_norm(train)
        batch = _f64(collate(train, pad_id=0))
        logp = theta.clone().requires_grad_()
        loss, _ = grpo(logp, batch, acfg, norm)
        out.append((loss.detach(), torch.autograd.grad(loss, logp)[0]))
    (loss1, g1), (loss3, g3) = out
    torch.testing.assert_close(loss3, loss1, rtol=1e-12, atol=0)
    torch.testing.assert_close(g3, g1, rtol=1e-12, atol=1e-15)
    assert g1[MASK.index(1)] != 0 and g1[-1] != 0


def test_segment_shares_are_the_episodes_loss_tokens():
    """expand_segments: a segment's share of its episode is its loss tokens over the episode's (they sum to 1); a
    sample of one segment has share 1; an episode with no loss token (a failed one) splits its weight evenly."""
    e = expand_segments(_episode([]))
    assert [t.episode_share for t in e] == [1.0, 1.0]
    train = expand_segments(_episode([4, 7]))
    assert [t.uid for t in train] == ["e-seg0", "e-seg1", "e", "x"]
    assert [t.episode_share for t in train] == pytest.approx([2 / 6, 3 / 6, 1 / 6, 1.0])
    assert minibatch_norm(train) == (pytest.approx(2.0), 11)
    failed = _episode([4, 7])
    for t in [*failed[0].segments, failed[0]]:
        t.loss_mask = np.zeros_like(t.loss_mask)
    assert [t.episode_share for t in expand_segments(failed)] == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1.0])


def test_kept_set_cut_frac_counts_every_segment():
    """rollout/kept_set_cut_frac = cut positions / response tokens over every context segment of the step's
    episodes: (3 + 2 + 1) / (4 + 3 + 2 + 5) here (on main only the last segment's: 1 / (2 + 5))."""
    episode, plain = _episode([4, 7])
    for k, t in enumerate([*episode.segments, episode]):
        t.kept_set_cut = 3 - k
    m = rollout_metrics([episode, plain])
    assert m["rollout/kept_set_cut_frac"] == pytest.approx(6 / 14)
