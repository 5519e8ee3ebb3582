"""The transformers rollout engine: batched sampling with a KV cache, token-in/token-out.

It reports exactly what the trainer needs to be on-policy-aware: the processed logprob of every sampled token
(after temperature/top-k/top-p, like vLLM's `processed_logprobs`), the kept set per position (Keep Sampling
Mask, CSR) and the MoE routes of every processed position (Keep Routing). It is the CPU engine and the
reference the vLLM engine is checked against; real GPU runs use `rollout=vllm`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import nullcontext

import numpy as np
import torch

from rl.models import load_causal_lm, load_tokenizer
from rollout.sampling import Generation, SamplingParams, eos_token_ids, process_logits

log = logging.getLogger(__name__)


class HFEngine:
    def __init__(
        self,
        model_path: str,
        dtype: str = "float32",
        device: str = "cpu",
        attn_implementation: str | None = "sdpa",
        record_routes: bool = True,
        max_batch_size: int = 64,
    ):
        self.tokenizer = load_tokenizer(model_path)
        self.model = load_causal_lm(model_path, dtype, attn_implementation, device).eval()
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.eos_ids = eos_token_ids(model_path, self.tokenizer)
        self.moe = None
        if record_routes:
            from rl.routing import moe_layers

            self.moe = moe_layers(self.model)

    # -- weights -------------------------------------------------------------------------------------------
    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        # Tied or buffer-only keys may legitimately be absent; real parameters may not.
        own = {n for n, _ in self.model.named_parameters()}
        if set(missing) & own or unexpected:
            raise RuntimeError(f"weight sync mismatch: missing={sorted(set(missing) & own)[:5]} unexpected={unexpected[:5]}")

    # -- sampling ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sp: SamplingParams,
                 on_groups_done: Callable[[list[tuple[int, list[Generation]]]], None] | None = None,
                 ) -> list[list[Generation]]:
        """Sample `sp.n` continuations of every prompt; returns them grouped per prompt. `on_groups_done`: called
        with [(prompt index, its n generations)] for the groups complete after each batch of `max_batch_size`
        samples but the last, before the next batch generates (the rollout worker scores them meanwhile)."""
        expanded = [list(p) for p in prompts for _ in range(sp.n)]
        gen = torch.Generator(device=self.device)
        gen.manual_seed(sp.seed if sp.seed is not None else int(torch.seed() % (2**63)))
        flat: list[Generation] = []
        reported = 0
        for start in range(0, len(expanded), self.max_batch_size):
            flat.extend(self._generate_batch(expanded[start : start + self.max_batch_size], sp, gen))
            complete = len(flat) // sp.n
            last = start + self.max_batch_size >= len(expanded)  # the rest go out with the returned groups
            if on_groups_done is not None and complete > reported and not last:
                try:
                    on_groups_done([(i, flat[i * sp.n : (i + 1) * sp.n]) for i in range(reported, complete)])
                except Exception as e:  # noqa: BLE001 - early scoring is an optimisation; generation goes on
                    log.warning("reporting finished groups failed (%s: %s); the rest are scored after generation",
                                type(e).__name__, e)
                    on_groups_done = None
                reported = complete
        return [flat[i * sp.n : (i + 1) * sp.n] for i in range(len(prompts))]

    def _left_pad(self, prompts: list[list[int]]):
        B, P = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((B, P), self.tokenizer.pad_token_id, dtype=torch.long)
        attn = torch.zeros((B, P), dtype=torch.long)
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError("cannot generate from an empty prompt")
            ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
            attn[i, P - len(p) :] = 1
        return ids.to(self.device), attn.to(self.device)

    def _generate_batch(self, prompts: list[list[int]], sp: SamplingParams, gen: torch.Generator) -> list[Generation]:
        from transformers import DynamicCache

        from rl.routing import RouteRecorder

        B = len(prompts)
        ids, attn = self._left_pad(prompts)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        stop = torch.tensor(sorted({*self.eos_ids, *sp.stop_token_ids}), device=self.device)
        record_kept = sp.records_kept_sets
        tokens, logprobs, kept_cols, kept_counts = [], [], [], []
        finished = torch.zeros(B, dtype=torch.bool, device=self.device)
        lengths = torch.zeros(B, dtype=torch.long, device=self.device)
        recorder = RouteRecorder(self.model) if self.moe is not None else nullcontext()
        with recorder:
            logits = self.model(
                input_ids=ids, attention_mask=attn, position_ids=positions, past_key_values=cache, use_cache=True
            ).logits[:, -1]
            for step in range(sp.max_new_tokens):
                if sp.temperature > 0:
                    logp = process_logits(logits, sp.temperature, sp.top_k, sp.top_p)
                    tok = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
                else:  # greedy: report the plain logprob of the argmax
                    logp = torch.log_softmax(logits.float(), dim=-1)
                    tok = logp.argmax(-1)
                tok = torch.where(finished, torch.full_like(tok, self.tokenizer.pad_token_id), tok)
                tokens.append(tok)
                logprobs.append(logp.gather(-1, tok[:, None]).squeeze(-1))
                if record_kept:
                    kept = torch.isfinite(logp)
                    kept_counts.append(kept.sum(-1))
                    kept_cols.append(kept.nonzero()[:, 1].to(torch.int32))
                lengths += (~finished).long()
                finished |= torch.isin(tok, stop)
                if bool(finished.all()) or step == sp.max_new_tokens - 1:
                    break
                attn = torch.cat([attn, torch.ones((B, 1), dtype=attn.dtype, device=self.device)], dim=-1)
                positions = positions[:, -1:] + 1
                logits = self.model(
                    input_ids=tok[:, None],
                    attention_mask=attn,
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                ).logits[:, -1]
        tokens_t = torch.stack(tokens, 1).cpu().numpy()
        logprobs_t = torch.stack(logprobs, 1).float().cpu().numpy()
        lengths_np = lengths.cpu().numpy()
        finished_np = finished.cpu().numpy()
        kept_sets = self._split_kept(kept_cols, kept_counts, B) if record_kept else None
        routes = self._split_routes(recorder.records, prompts, lengths_np) if self.moe is not None else None
        out = []
        for i in range(B):
            R = int(lengths_np[i])
            g = Generation(
                response_ids=tokens_t[i, :R].astype(np.int32),
                inference_logprobs=logprobs_t[i, :R].astype(np.float32),
                finish_reason="stop" if finished_np[i] else "length",
            )
            if kept_sets is not None:
                g.kept_ids, g.kept_offsets = kept_sets[i][0], kept_sets[i][1][: R + 1]
                g.kept_ids = g.kept_ids[: g.kept_offsets[-1]]
            if routes is not None:
                g.routed_experts = routes[i]
            out.append(g)
        return out

    @staticmethod
    def _split_kept(cols: list[torch.Tensor], counts: list[torch.Tensor], B: int):
        """Per-step (row-major) kept columns -> per-sample CSR (kept_ids, kept_offsets)."""
        counts_t = torch.stack(counts, 1).cpu()  # [B, S]
        per_sample = [[] for _ in range(B)]
        for step, c in enumerate(cols):
            for i, part in enumerate(torch.split(c.cpu(), counts_t[:, step].tolist())):
                per_sample[i].append(part)
        result = []
        for i in range(B):
            offsets = np.concatenate([[0], np.cumsum(counts_t[i].numpy())]).astype(np.int64)
            result.append((torch.cat(per_sample[i]).numpy().astype(np.int32), offsets))
        return result

    @staticmethod
    def _split_routes(records: list[np.ndarray], prompts: list[list[int]], lengths: np.ndarray) -> list[np.ndarray]:
        """Prefill record [B, Pmax, L, K] + one [B, 1, L, K] per decode step -> [P + R - 1, L, K] per sample."""
        prefill, decode = records[0], records[1:]
        decode_cat = np.concatenate(decode, axis=1) if decode else prefill[:, :0]
        Pmax = prefill.shape[1]
        out = []
        for i, p in enumerate(prompts):
            R = int(lengths[i])
            out.append(np.concatenate([prefill[i, Pmax - len(p) :], decode_cat[i, : max(R - 1, 0)]], axis=0))
        return out

    # -- scoring (used by the rubric judge's expected-score mode) -------------------------------------------
    @torch.no_grad()
    def next_token_logprobs(self, prompts: list[list[int]], token_ids: list[int]) -> np.ndarray:
        """log p(token | prompt) at the position after each prompt, for the given candidate tokens: [B, C]."""
        out = []
        for start in range(0, len(prompts), self.max_batch_size):
            ids, attn = self._left_pad(prompts[start : start + self.max_batch_size])
            positions = (attn.cumsum(-1) - 1).clamp(min=0)
            logits = self.model(input_ids=ids, attention_mask=attn, position_ids=positions).logits[:, -1]
            logp = torch.log_softmax(logits.float(), dim=-1)[:, torch.tensor(token_ids, device=self.device)]
            out.append(logp.cpu().numpy())
        return np.concatenate(out, axis=0)
