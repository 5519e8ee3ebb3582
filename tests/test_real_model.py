"""A real model on CPU: SmolLM2-135M-Instruct. Its peaked-but-long-tailed distributions give kept sets from one id
to thousands (random weights give near-uniform ones), real EOS and a real chat template."""

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rl.trajectory import Trajectory, collate
from rollout.hf_engine import HFEngine
from rl.kept_set import KeptIdBuffer, reduce_rows_torch
from rollout.sampling import SamplingParams
from trainer.forward import forward_logprobs

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ["What is 17 + 25? Put the answer in \\boxed{}.", "Write one sentence about the sea.",
             "Name three colours.", "Solve 3x + 1 = 10 for x."]


@pytest.fixture(scope="module")
def engine(smollm2_path):
    return HFEngine(smollm2_path, dtype="float32", record_routes=False, max_batch_size=16)


@pytest.fixture(scope="module")
def sampled(engine):
    tok = engine.tokenizer
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                           add_generation_prompt=True), add_special_tokens=False)["input_ids"]
               for q in QUESTIONS]
    sp = SamplingParams(n=2, temperature=1.0, top_p=0.95, max_new_tokens=48, seed=5)
    trajs = []
    for i, (p, gens) in enumerate(zip(prompts, engine.generate(prompts, sp))):
        for j, g in enumerate(gens):
            trajs.append(Trajectory(uid=f"{i}-{j}", group_id=str(i), domain="d", prompt_ids=p,
                                    response_ids=g.response_ids, inference_logprobs=g.inference_logprobs,
                                    kept_ids=g.kept_ids, kept_offsets=g.kept_offsets, finish_reason=g.finish_reason))
    return trajs


def _logits(engine, t: Trajectory) -> torch.Tensor:
    """The model's logits at the positions that predicted each response token (float32)."""
    ids = torch.tensor(np.concatenate([t.prompt_ids, t.response_ids]), dtype=torch.long)[None]
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0].float()
    P = len(t.prompt_ids)
    return logits[P - 1 : P - 1 + len(t.response_ids)]


def _brute_force_top_p(row: torch.Tensor, p: float) -> tuple[set, float]:
    """vLLM's top-p rule in float64, written out: drop the least likely ids while their total mass stays <= 1 - p
    (the most likely id always stays). Also returns how close the decision came to the threshold."""
    probs = torch.softmax(row.double(), dim=0)
    order = torch.argsort(probs)  # ascending
    cum = torch.cumsum(probs[order], 0)
    drop = (cum <= 1 - p).tolist()
    drop[-1] = False
    kept = {int(order[k]) for k in range(len(order)) if not drop[k]}
    margin = float((cum - (1 - p)).abs().min())
    return kept, margin


def test_kept_sets_on_real_distributions_match_a_brute_force_reference(engine, sampled):
    sizes, near, checked = [], 0, 0
    for t in sampled:
        logits = _logits(engine, t)
        for j in range(t.num_response_tokens):
            kept = set(t.kept_ids[t.kept_offsets[j] : t.kept_offsets[j + 1]].tolist())
            want, margin = _brute_force_top_p(logits[j], 0.95)
            checked += 1
            sizes.append(len(kept))
            if margin < 1e-6:  # float32 vs float64 may disagree on an id sitting on the threshold
                near += 1
                assert len(kept ^ want) <= 1
            else:
                assert kept == want, (t.uid, j, len(kept), len(want))
            assert int(t.response_ids[j]) in kept
    sizes = np.array(sizes)
    print(f"\nreal kept-set sizes at top_p=0.95 over {checked} positions: median {np.median(sizes):.0f}, "
          f"p90 {np.percentile(sizes, 90):.0f}, max {sizes.max()}, >64: {(sizes > 64).mean():.1%}; "
          f"{near} on the threshold")
    assert sizes.max() > 64 and sizes.min() == 1  # real distributions: both extremes occur
    assert near <= checked // 20


def test_the_vllm_capture_path_records_whole_real_kept_sets(engine, sampled):
    """rl/kept_set.py (the sampler capture's reduction, its torch path here) on the model's processed
    distribution: the sampled logprob (exactly the processed distribution's, and the transformers engine's up to
    float32 noise) and the whole kept set of every position (back to back in the kept-id buffer)."""
    from rollout.sampling import process_logits

    t = max(sampled, key=lambda t: int(np.diff(t.kept_offsets).max()))  # the sample with the largest set
    processed = process_logits(_logits(engine, t), 1.0, 0, 0.95)
    buffer = KeptIdBuffer(1_000_000, "cpu")
    lp, total, start = reduce_rows_torch(processed, torch.as_tensor(t.response_ids), False, buffer)
    flat, asked = buffer.drain()
    assert (total > 64).any()  # at least one set larger than the 64 ids vLLM's logprobs would give
    assert (start >= 0).all() and asked == len(flat) == len(t.kept_ids)
    assert np.array_equal(total.numpy(), np.diff(t.kept_offsets)) and np.array_equal(flat, t.kept_ids)
    ids = torch.as_tensor(t.response_ids, dtype=torch.long)[:, None]
    exact = torch.log_softmax(processed.double(), -1).gather(1, ids)[:, 0].numpy()
    np.testing.assert_allclose(lp.numpy(), exact, atol=1e-5)  # the reduction itself, on the same logits
    # the engine sampled with cached decoding; these logits come from one full forward: float32 noise apart
    np.testing.assert_allclose(lp.numpy(), t.inference_logprobs, atol=1e-4)


def test_engine_and_trainer_agree_on_every_kept_set(engine, sampled):
    """The trainer renormalises over the engine's kept set at every position: its logprob is the engine's (fp32);
    over the full vocabulary it would not be."""
    batch = collate(sampled, engine.tokenizer.pad_token_id)
    with torch.no_grad():
        kept = forward_logprobs(engine.model, batch, temperature=1.0).logprobs
    diff = (kept - batch.inference_logprobs).abs()
    assert float(diff.max()) < 1e-4, float(diff.max())
    full_batch = collate([Trajectory(**{**vars(t), "kept_ids": None, "kept_offsets": None}) for t in sampled],
                         engine.tokenizer.pad_token_id)
    with torch.no_grad():
        full = forward_logprobs(engine.model, full_batch, temperature=1.0).logprobs
    gap = float((full - batch.inference_logprobs).abs().mean())
    print(f"\nmean |logp_trainer - logp_engine|: over the kept set {float(diff.mean()):.2e}, full vocabulary {gap:.3f}")
    assert gap > 1e-2 and gap < -math.log(0.95) + 1e-3  # renormalising a >= 0.95 mass moves logp by < -log 0.95
    # the support-only head (trainer.logprob_head=support) on real kept sets: same logprobs, a fraction of the head
    with torch.no_grad():
        support = forward_logprobs(engine.model, batch, temperature=1.0, support_head=True, chunk_size=64).logprobs
    torch.testing.assert_close(support, kept, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_one_training_step_of_smol_math_on_cpu(smollm2_path, tmp_path):
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "launch.train", "+experiment=smol_math", f"run_dir={tmp_path / 'run'}",
         "rollout.engine=hf", "rollout.num_workers=1", "rollout.num_gpus=0", "trainer.num_gpus=0", "trainer.device=cpu",
         "model.dtype=float32",
         "trainer.total_steps=1", "data.prompts_per_step=2", "rollout.n_samples=2", "rollout.max_new_tokens=16",
         "rollout.top_p=0.95", "trainer.micro_batch_size=4", "eval.every=0", "logger.progress_bar=false",
         "rewards.num_workers=2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    import json

    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["step"] == 1 and row["samples/math"] == 4.0 and row["mismatch/logprob_abs"] < 1e-3
    assert row["entropy/full_vocab"] > row["entropy/kept_set"]  # top_p=0.95 cuts the real model's tail


@pytest.mark.slow
def test_one_training_step_of_smol_agent_on_cpu(smollm2_path, tmp_path):
    """`+experiment=smol_agent` (the tool-use learning run) on the real model: its episodes start from a solved
    demonstration of another task and the step trains."""
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "launch.train", "+experiment=smol_agent", f"run_dir={tmp_path / 'run'}",
         "rollout.engine=hf", "rollout.num_gpus=0", "trainer.num_gpus=0", "trainer.device=cpu", "model.dtype=float32",
         "trainer.total_steps=1", "data.prompts_per_step=2", "rollout.n_samples=2", "rollout.max_new_tokens=16",
         "trainer.micro_batch_size=2", "logger.progress_bar=false"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    import json

    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["step"] == 1 and row["samples/agent"] == 4.0 and row["episode/agent/turns"] >= 1
    assert row["mismatch/logprob_abs"] < 1e-3
    sample = json.loads((tmp_path / "run" / "rollouts" / "step_000001.jsonl").read_text().splitlines()[0])
    prompt = sample["prompt"]
    assert prompt.count("<|im_start|>user") == 2 and "submit_result" in prompt and "<tool_response>" in prompt
