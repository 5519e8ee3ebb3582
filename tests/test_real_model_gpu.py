"""The real SmolLM2-135M-Instruct on vLLM (`-m gpu`): Keep Sampling Mask records every kept set whole at
top_p=0.95 (sets of thousands of ids), and the trainer's logprob over those sets matches vLLM's; samples that have
ended are reported while the rest generate (real EOS: lengths differ)."""

import os

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("vllm")
# the test process may touch CUDA before vLLM starts its engine process: forking would then fail
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")

from rl.trajectory import Trajectory, collate  # noqa: E402
from rollout.sampling import SamplingParams  # noqa: E402


def test_whole_kept_sets_on_vllm_and_the_trainer_agrees(smollm2_path):
    from rl.data import BUNDLED_DIR
    from rl.models import load_causal_lm
    from rollout.vllm_engine import VLLMEngine
    from trainer.forward import forward_logprobs

    engine = VLLMEngine(smollm2_path, dtype="bfloat16", gpu_memory_utilization=0.3, capture="sampler",
                        max_logprobs=64, record_routes=False)
    assert engine.capture == "sampler"
    tok = engine.tokenizer
    import json

    rows = [json.loads(x) for x in (BUNDLED_DIR / "math.jsonl").read_text().splitlines()[:32]]
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": r["question"]}], tokenize=False,
                                           add_generation_prompt=True), add_special_tokens=False)["input_ids"]
               for r in rows]
    early: list = []  # samples handed on as they end, while generation goes on (the rollout worker scores them)
    engine.per_request_seed = True  # seeded: one request per sample must draw what one request of n draws
    sp = SamplingParams(n=4, temperature=1.0, top_p=0.95, max_new_tokens=128, seed=1234)
    groups = engine.generate(prompts, sp, on_samples_done=early.extend)
    gens = [g for grp in groups for g in grp]
    print(f"\n{len(early)} of {len(gens)} samples reported before generate returned")
    assert 0 < len(early) < len(gens) and all(len(reported) == 1 for _, reported in early)
    for i, (g,) in early:  # each is one of the samples generate returns for its prompt
        assert (g.response_ids.tolist(), g.finish_reason) in \
            [(x.response_ids.tolist(), x.finish_reason) for x in groups[i]]
    # each of a prompt's one-sample requests has its own seed (seed + j): its samples are not copies of one another
    assert sum(len({tuple(x.response_ids.tolist()) for x in grp}) == len(grp) for grp in groups) >= len(groups) - 2
    engine.per_request_seed = False
    sizes = np.concatenate([np.diff(g.kept_offsets) for g in gens])
    cut = sum(g.kept_set_cut for g in gens)
    print(f"\nvLLM kept sets at top_p=0.95: {len(sizes)} positions, median {np.median(sizes):.0f}, p90 "
          f"{np.percentile(sizes, 90):.0f}, p99 {np.percentile(sizes, 99):.0f}, max {sizes.max()}, "
          f">64 {np.mean(sizes > 64):.1%}, cut {cut}")
    assert cut == 0 and sizes.max() > 64  # sets past the 64 inline ids are whole (overflow buffer), none cut
    for g in gens:
        for j, t in enumerate(g.response_ids):
            assert t in g.kept_ids[g.kept_offsets[j] : g.kept_offsets[j + 1]]
    trajs = [Trajectory(uid=str(k), group_id=str(k), domain="math", prompt_ids=prompts[k // 4], response_ids=g.response_ids,
                        inference_logprobs=g.inference_logprobs, kept_ids=g.kept_ids, kept_offsets=g.kept_offsets)
             for k, g in enumerate(gens)]
    model = load_causal_lm(smollm2_path, "bfloat16", "sdpa", "cuda").eval()
    diffs, full = [], []
    with torch.no_grad():
        for start in range(0, len(trajs), 32):
            chunk = trajs[start : start + 32]
            batch = collate(chunk, tok.pad_token_id).to("cuda")
            diffs.append((forward_logprobs(model, batch, temperature=1.0).logprobs - batch.inference_logprobs).abs())
            nomask = collate([Trajectory(**{**vars(t), "kept_ids": None, "kept_offsets": None}) for t in chunk],
                             tok.pad_token_id).to("cuda")
            full.append((forward_logprobs(model, nomask, temperature=1.0).logprobs - nomask.inference_logprobs).abs())
    on, off = float(torch.cat(diffs).mean()), float(torch.cat(full).mean())
    print(f"mean |logp_trainer - logp_vllm|: over the kept sets {on:.4f}, full vocabulary {off:.4f}")
    assert on < 0.06 and on < off  # bf16 noise only; a cut set would shift the renormalised logprob further
