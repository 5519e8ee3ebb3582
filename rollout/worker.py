"""`RolloutWorker`: a Ray actor that turns prompts into `Trajectory` objects with one of the engines.

`rollout.engine=hf` is the transformers engine (CPU default, any device); `rollout.engine=vllm` is vLLM
(`rollout/vllm_engine.py`, GPU) behind the same `generate` / `load_state_dict` methods, plus the GPU weight-sync
and sleep-mode entry points; `auto` picks vLLM when CUDA and vllm are importable. Sampling is seeded from
(seed, step, worker rank) so a resumed run draws the same samples as an uninterrupted one (vLLM: per request
only with `rollout.per_request_seed=true`, which is slower; otherwise the engine is seeded once per worker).
"""

from __future__ import annotations

import torch

from rl.trajectory import Trajectory
from rollout.sampling import SamplingParams


def sampling_params(rcfg: dict, seed: int) -> SamplingParams:
    return SamplingParams(
        n=int(rcfg["n_samples"]),
        temperature=float(rcfg["temperature"]),
        top_p=float(rcfg["top_p"]),
        top_k=int(rcfg["top_k"]),
        max_new_tokens=int(rcfg["max_new_tokens"]),
        stop_token_ids=list(rcfg.get("stop_token_ids") or []),
        seed=seed,
    )


def resolve_engine(rcfg: dict) -> str:
    """`rollout.engine`: hf | vllm | auto (vLLM when CUDA and vllm are importable, else hf)."""
    engine = rcfg["engine"]
    if engine == "auto":
        from rollout.vllm_engine import vllm_available

        return "vllm" if vllm_available() else "hf"
    return engine


def make_engine(rcfg: dict, model_cfg: dict, model_path: str, record_routes: bool, seed: int = 0):
    engine = resolve_engine(rcfg)
    if engine == "vllm":
        from rollout.vllm_engine import VLLMEngine, default_num_logprobs

        k = rcfg.get("logprobs")
        return VLLMEngine(
            model_path,
            dtype=model_cfg["dtype"],
            tensor_parallel_size=int(rcfg.get("tensor_parallel_size", 1)),
            gpu_memory_utilization=float(rcfg.get("gpu_memory_utilization", 0.4)),
            enable_sleep_mode=bool(rcfg.get("enable_sleep_mode", False)),
            max_logprobs=int(k) if k else default_num_logprobs(int(rcfg["top_k"])),
            record_routes=record_routes,
            weight_transfer_backend="ipc" if rcfg.get("placement", "colocated") == "colocated" else "nccl",
            max_model_len=rcfg.get("max_model_len"),
            enforce_eager=bool(rcfg.get("enforce_eager", False)),
            seed=seed,
            per_request_seed=bool(rcfg.get("per_request_seed", False)),
            capture=str(rcfg.get("capture", "sampler")),
            extra_args=dict(rcfg.get("engine_args") or {}),
        )
    if engine == "hf":
        from rollout.hf_engine import HFEngine

        device = rcfg["device"]
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return HFEngine(
            model_path,
            dtype=model_cfg["dtype"],
            device=device,
            attn_implementation=model_cfg.get("attn_implementation"),
            record_routes=record_routes,
            max_batch_size=int(rcfg["max_batch_size"]),
        )
    raise ValueError(f"rollout.engine={engine!r}: unknown engine (available: hf, vllm, auto)")


class RolloutWorker:
    def __init__(self, cfg: dict, model_path: str, rank: int):
        rcfg = cfg["rollout"]
        if rcfg.get("threads"):
            torch.set_num_threads(int(rcfg["threads"]))
        self.cfg, self.rank = cfg, rank
        self.engine_kind = resolve_engine(rcfg)
        self.engine = make_engine(
            rcfg, cfg["model"], model_path, record_routes=bool(cfg["algorithm"]["keep_routing"]),
            seed=int(cfg["seed"]) * 1_000_003 + rank,
        )
        self.tokenizer = self.engine.tokenizer
        self.keep_mask = bool(cfg["algorithm"]["keep_sampling_mask"])

    def ready(self) -> int:
        return self.rank

    def engine_name(self) -> str:
        return self.engine_kind

    def load_state_dict(self, state_dict: dict) -> None:
        self.engine.load_state_dict(state_dict)

    # -- vLLM only: GPU weight sync and sleep mode (driven by trainer/weight_sync.py) ----------------------------
    def init_weight_transfer_engine(self, request: dict) -> None:
        self.engine.init_weight_transfer_engine(request)

    def update_weights(self, request: dict) -> None:  # called by the trainer (IPC and NCCL senders)
        self.engine.update_weights(request)

    def begin_weight_update(self) -> None:
        self.engine.wake_up(["weights"])
        self.engine.start_weight_update()

    def end_weight_update(self) -> None:
        self.engine.finish_weight_update()
        self.engine.wake_up(["kv_cache"])
        self.engine.reset_prefix_cache()

    def score(self, prompts: list[list[int]], continuations: list[list[int]]) -> list:
        """vLLM only: logprob of each continuation token under the engine's current weights (tests, checks)."""
        return self.engine.score(prompts, continuations)

    def sleep(self, level: int) -> None:
        self.engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.engine.wake_up(tags)

    def _decode(self, ids) -> str:
        # Special tokens such as <think> stay in the text (rewards read them); EOS/pad do not.
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        for tok in {self.tokenizer.eos_token, self.tokenizer.pad_token} - {None}:
            text = text.replace(tok, "")
        return text

    def generate(self, requests: list[dict], step: int) -> list[Trajectory]:
        """requests: {group_id, domain, prompt_ids, prompt_text, sample}; returns n trajectories per request."""
        if not requests:
            return []
        seed = (int(self.cfg["seed"]) * 1_000_003 + step * 1009 + self.rank) % (2**63)
        sp = sampling_params(self.cfg["rollout"], seed)
        groups = self.engine.generate([r["prompt_ids"] for r in requests], sp)
        out = []
        for req, gens in zip(requests, groups):
            for j, g in enumerate(gens):
                out.append(
                    Trajectory(
                        uid=f"{req['group_id']}-{j}",
                        group_id=req["group_id"],
                        domain=req["domain"],
                        prompt_ids=req["prompt_ids"],
                        response_ids=g.response_ids,
                        sampling_logprobs=g.logprobs,
                        finish_reason=g.finish_reason,
                        mask_ids=g.mask_ids if self.keep_mask else None,
                        mask_offsets=g.mask_offsets if self.keep_mask else None,
                        mask_truncated=int(g.mask_truncated) if self.keep_mask else 0,
                        loss_mask=g.loss_mask if self.keep_mask else None,  # cut kept sets matter only with the mask
                        routed_experts=g.routed_experts,
                        prompt_text=req["prompt_text"],
                        response_text=self._decode(g.response_ids),
                        sample=req["sample"],
                    )
                )
        return out
