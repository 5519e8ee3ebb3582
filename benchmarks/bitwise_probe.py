"""Issue 39's measurement: are the trainer's logprobs of sampled tokens the engine's, bit for bit?

One process, one GPU: our VLLMEngine (capture=sampler, the engine core in this process) samples; the trainer's side
runs on an HF copy of the same weights in the same process. Printed per run, over every sampled token:
- `bitwise`: trainer/bitwise.py's logprobs against the engine's captured ones (the mode's claim: all equal);
- `prefill`: vLLM's own prompt logprobs of the finished sequences (a prefill over each whole sequence) against the
  trainer's bitwise logits through the same log-softmax (vLLM's batch-invariant one);
- `ordinary`: the trainer's ordinary forward (transformers, sdpa) against the captured ones: the mismatch the mode
  removes;
- `rope_table`: the trainer's cos/sin table against the engine's (in this process we can read the engine's model).

    python benchmarks/bitwise_probe.py --model smollm2 --prompts 32 --n 4 --max-new-tokens 128
    python benchmarks/bitwise_probe.py --model qwen3 --top-p 0.95 --temperature 0.8    # a random Qwen3-0.6B shape

Needs a Hopper GPU with vLLM (FA3); prints one JSON line per comparison (`RESULT {...}`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def compare(name: str, a, b, **extra) -> dict:
    import numpy as np

    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    diff = np.abs(a - b)
    row = dict(check=name, tokens=int(a.size), equal_frac=round(float((a == b).mean()), 6),
               max_abs=float(diff.max()) if a.size else 0.0, mean_abs=float(diff.mean()) if a.size else 0.0, **extra)
    print("RESULT " + json.dumps(row), flush=True)
    return row


def _engine_rope(worker):  # runs in the (in-process) vLLM worker
    for module in worker.model_runner.model.modules():
        table = getattr(module, "cos_sin_cache", None)
        if table is not None:
            return table.detach().clone()
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "qwen3"])
    ap.add_argument("--workdir", default="/tmp/bitwise_probe")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--gpu-mem", type=float, default=0.3)
    ap.add_argument("--dump", default=None, help="write per-token arrays (npz) here")
    args = ap.parse_args()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import numpy as np
    import torch

    from launch.testbed import QWEN3_06B, build_model, chat_prompts
    from rl.models import SMOLLM2, load_causal_lm, resolve_model_path
    from rollout.sampling import SamplingParams
    from rollout.vllm_engine import VLLMEngine
    from trainer.bitwise import BitwiseForward

    path = resolve_model_path(SMOLLM2) if args.model == "smollm2" else build_model(Path(args.workdir) / "qwen3",
                                                                                  QWEN3_06B)
    t0 = time.perf_counter()
    engine = VLLMEngine(path, dtype="bfloat16", gpu_memory_utilization=args.gpu_mem, max_model_len=2048,
                        capture="sampler", bitwise=True)
    print(f"engine up in {time.perf_counter() - t0:.1f}s, capture={engine.capture}", flush=True)
    sp = SamplingParams(n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=0,
                        max_new_tokens=args.max_new_tokens, seed=None)
    prompts = chat_prompts(engine.tokenizer, args.prompts)
    t0 = time.perf_counter()
    gens = [(p, g) for p, grp in zip(prompts, engine.generate(prompts, sp)) for g in grp]
    tokens = sum(len(g.response_ids) for _, g in gens)
    print(f"generated {tokens} tokens in {time.perf_counter() - t0:.1f}s", flush=True)

    model = load_causal_lm(path, "bfloat16", "sdpa", "cuda").eval()
    bf = BitwiseForward(model)
    dev = torch.device("cuda")
    seqs = [list(p) + list(g.response_ids) for p, g in gens]
    ids = torch.tensor([t for s in seqs for t in s], device=dev)
    positions = torch.cat([torch.arange(len(s), device=dev) for s in seqs])
    lens = torch.tensor([len(s) for s in seqs])
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(dev, torch.int32)
    # the position before each response token predicts it
    index = torch.cat([int(cu[i]) + torch.arange(len(p) - 1, len(s) - 1)
                       for i, ((p, _), s) in enumerate(zip(gens, seqs))])
    targets = torch.tensor([t for _, g in gens for t in g.response_ids], device=dev)
    captured = np.concatenate([np.asarray(g.inference_logprobs, dtype=np.float32) for _, g in gens])
    kept = [g for _, g in gens if g.kept_offsets is not None]
    kept_ids = kept_offsets = None
    if kept and len(kept) == len(gens):
        kept_ids = torch.from_numpy(np.concatenate([np.asarray(g.kept_ids) for _, g in gens]).astype(np.int64)).to(dev)
        offs, base = [np.zeros(1, dtype=np.int64)], 0
        for _, g in gens:
            o = np.asarray(g.kept_offsets, dtype=np.int64)
            offs.append(o[1:] + base)
            base += int(o[-1])
        kept_offsets = torch.from_numpy(np.concatenate(offs))

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    hidden = bf.hidden(ids, positions, cu, int(lens.max()))
    lp = bf.token_logprobs(hidden[index.to(dev)], targets, args.temperature, kept_ids, kept_offsets)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    # positions whose kept set did not fit the capture's buffer are out of the loss in training (their set is the
    # sampled id alone, Generation.loss_mask 0): compared without them, and counted
    recorded = np.concatenate([np.ones(len(g.response_ids), bool) if g.loss_mask is None else g.loss_mask > 0
                               for _, g in gens])
    compare("bitwise", lp.cpu().numpy()[recorded], captured[recorded], seconds=round(seconds, 3), model=args.model,
            temperature=args.temperature, top_p=args.top_p, cut=int((~recorded).sum()))
    # where the differences are: by response index (the decode step: the batch's samples decode in lockstep) and by
    # the number of keys the position attends to
    resp_index = np.concatenate([np.arange(len(g.response_ids)) for _, g in gens])
    keys = np.concatenate([len(p) + np.arange(len(g.response_ids)) for p, g in gens])
    sample = np.concatenate([np.full(len(g.response_ids), i) for i, (_, g) in enumerate(gens)])
    equal = lp.cpu().numpy() == captured
    unequal = recorded & ~equal  # cut positions are neither: each bucket's share is over its recorded ones
    for name, arr, edges in (("by_response_index", resp_index, [0, 1, 8, 32, 64, 96, 128, 10**9]),
                             ("by_keys", keys, [0, 64, 128, 192, 256, 384, 10**9])):
        buckets = {}
        for lo, hi in zip(edges[:-1], edges[1:]):
            sel = (arr >= lo) & (arr < hi) & recorded
            if sel.any():
                buckets[f"{lo}-{hi}"] = [int(sel.sum()), round(float(equal[sel].mean()), 4)]
        print("RESULT " + json.dumps(dict(check=name, equal_frac=buckets)), flush=True)
    steps = np.unique(resp_index[unequal])
    print("RESULT " + json.dumps(dict(check="unequal_steps", n=int(len(steps)), first=steps[:40].tolist(),
                                      samples_with_unequal=int(len(np.unique(sample[unequal]))),
                                      samples=len(gens))), flush=True)
    if args.dump:
        np.savez(args.dump, lp=lp.cpu().numpy(), captured=captured, resp_index=resp_index, keys=keys, sample=sample)

    table = engine.llm.collective_rpc(_engine_rope)[0]
    mine = bf.rope(dev, torch.bfloat16)
    if table is not None:
        print("RESULT " + json.dumps(dict(check="rope_table", equal=bool(torch.equal(table.to(dev), mine)),
                                          engine_dtype=str(table.dtype), shape=list(table.shape))), flush=True)

    if args.temperature == 1.0 and args.top_p == 1.0:  # the prompt-logprob path is plain softmax at temperature 1
        from vllm.model_executor.layers.batch_invariant import linear_batch_invariant, log_softmax

        head = model.get_output_embeddings().weight
        with torch.no_grad():
            z = linear_batch_invariant(hidden[index.to(dev)], head)
            mine_prefill = log_softmax(z.float(), dim=-1).gather(1, targets[:, None]).squeeze(1)
        theirs = engine.continuation_logprobs([list(p) for p, _ in gens], [list(g.response_ids) for _, g in gens])
        compare("prefill", mine_prefill.cpu().numpy(), np.concatenate(theirs))
        compare("prefill_vs_captured", np.concatenate(theirs), captured)

    from rl.logprobs import token_logprobs

    with torch.no_grad():  # the ordinary forward: transformers + sdpa, our chunked head
        body = model.get_decoder()
        rows = [torch.tensor(s, device=dev) for s in seqs]
        ordinary = []
        for i, r in enumerate(rows):
            h = body(input_ids=r[None]).last_hidden_state[0]
            p = len(gens[i][0])
            ordinary.append(h[p - 1 : len(r) - 1])
        h = torch.cat(ordinary)
        lp_ord = token_logprobs(h, model.get_output_embeddings().weight, targets, temperature=args.temperature,
                                kept_ids=kept_ids, kept_offsets=kept_offsets)[0]
    compare("ordinary", lp_ord.float().cpu().numpy(), captured)


if __name__ == "__main__":
    main()
