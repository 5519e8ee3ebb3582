"""`FrozenModel`: a model that is never trained and only scores sampled tokens: the KL reference (the initial
policy), and each on-policy distillation teacher (`domains.<d>.teacher`, one actor per distinct path, placed like the
reference). A teacher is another model: it never replays the policy's MoE routes.

The loop calls the reference only for samples whose domain has `kl_coef > 0`, and not at all when a batch has none.
`algorithm.ref_keep_routing` (default false) decides whether the reference replays the policy's sampled MoE
routes: off, pi_ref is the reference model's own distribution (its router picks its experts), which is what the
KL penalty is meant to anchor to; on, pi_ref is evaluated under the policy's expert choices, which hides router
drift from the KL and is only useful for comparison. Kept sets are applied when the batch carries them, exactly as
for the policy.

Two placements (`trainer.ref_placement`): `actor`, a whole copy in a Ray actor of its own (`trainer.ref_num_gpus`);
`sharded`, one FrozenModel in every trainer rank (`PolicyTrainer`), its parameters partitioned over the ranks by
DeepSpeed ZeRO-3 (inference: no optimizer, no gradients) and gathered layer by layer during the forward, so a model
whose copy does not fit one GPU next to the policy still scores. The gathers are collectives: every rank runs the
same number of forwards (`_chunks` agrees on it, `trainer.dist.agreed_counts`), and the driver gives every rank at least one sample.
"""

from __future__ import annotations

import numpy as np
import torch

from rl.batching import micro_batches
from rl.config import (head_options, logprob_temperature, micro_batch_memory, pack_sequences, rollout_placement,
                       varlen_attention)
from rl.models import load_causal_lm, load_tokenizer
from rl.trajectory import Trajectory, collate
from trainer.dist import (agreed_counts, auto_micro_batch_counts, partition_zero3, pick_device, release_cached_memory,
                          wait_for)
from trainer.forward import PolicyForward, compile_layers, forward_logprobs, logit_scale, route_replay
from trainer.payload import fetch_heavy


def zero3_inference_config(dtype: str) -> dict:
    """DeepSpeed config of a partitioned model that is only run forward (no optimizer: ZeRO-3's parameter offload
    manager alone, which gathers each submodule's parameters around its forward)."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        # every parameter partitioned, however small (the default keeps those under 100k elements whole on each rank)
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "bf16": {"enabled": dtype == "bfloat16"},
        "fp16": {"enabled": dtype == "float16"},
        "steps_per_print": 10**9,
    }


class FrozenModel:
    def __init__(self, cfg: dict, model_path: str, role: str = "reference", sharded: bool = False, after: list = ()):
        """`sharded`: built inside a trainer rank, torch.distributed already set up (see the module's docstring).
        `after`: ready calls of the actors that must measure this GPU's free memory first (`wait_for`): the model
        loads into host memory meanwhile."""
        self.cfg = cfg
        if cfg["trainer"].get("threads") and not sharded:
            torch.set_num_threads(int(cfg["trainer"]["threads"]))
        self.device = pick_device(cfg["trainer"]["device"])
        self.tokenizer = load_tokenizer(model_path)
        self.model = load_causal_lm(model_path, cfg["model"]["dtype"], cfg["model"].get("attn_implementation")).eval()
        wait_for(after)
        if not sharded:  # sharded: each partition goes to the rank's GPU (below)
            self.model.to(self.device)
        self.model.requires_grad_(False)
        scale = logit_scale(self.model)  # before ZeRO-3 partitions the weights
        if cfg["trainer"].get("compile") and not sharded:  # rl/config.py: compile needs whole weights
            compile_layers(self.model)
        self.engine = None
        if sharded:
            import deepspeed

            module = PolicyForward(self.model)
            config = zero3_inference_config(cfg["model"]["dtype"])
            partition_zero3(module, config)  # never whole on this rank's GPU, next to the policy and a colocated vLLM
            self.engine = deepspeed.initialize(model=module, config=config)[0]
            module.register_zero3_external_head()  # the chunked logprob reads the head's weight directly
            self.engine.eval()
            self.device = str(self.engine.device)
        self.temperature = logprob_temperature(cfg["rollout"]) / scale
        acfg = cfg["algorithm"]
        self.replay_routes = role == "reference" and bool(acfg["keep_routing"]) and bool(acfg["ref_keep_routing"])
        # Kept sets (Keep Sampling Mask) are applied to a teacher too: its logprob renormalised over the student's kept
        # set differs from its full-vocabulary one by a constant of the position, which leaves the distillation
        # gradient's expectation unchanged (E[grad log pi] = 0) and takes that constant out of its variance
        self.packed = pack_sequences(cfg)
        self.head = head_options(cfg)
        # algorithm.on_policy=bitwise: the reference is the policy's family, scored like the policy; a teacher may be
        # any family, and its grade gains nothing from the engine's bits
        self.head["bitwise"] = self.head["bitwise"] and role == "reference"
        # vLLM wakes up after us; sharded, the policy trains next in this same process and reuses the cache
        self.colocated = rollout_placement(cfg["rollout"]) == "colocated" and not sharded
        # Packed rows without varlen attention get a block-diagonal mask over their whole length (memory grows with its
        # square, which the estimate does not count): then the forwards are sized like the trainer's micro-batches
        self.forward_only_estimate = not self.packed or varlen_attention(cfg)

    def ready(self) -> bool:
        return True

    @torch.no_grad()
    def logprobs(self, trajs: list[Trajectory]) -> list[np.ndarray]:
        """log pi_frozen of every response token, one array per trajectory (in the caller's order)."""
        fetch_heavy(trajs)  # payload by reference: this model's samples' logprobs, kept sets and routes
        at = {id(t): i for i, t in enumerate(trajs)}
        out: list[np.ndarray | None] = [None] * len(trajs)
        for chunk in self._chunks(trajs):
            batch = collate(chunk, self.tokenizer.pad_token_id, self.packed)
            if not self.replay_routes:  # the policy's routes stay on the host (a teacher is another model)
                batch.routed_experts = batch.route_valid = None
            batch = batch.to(self.device)
            with route_replay(self.model, batch, self.replay_routes):
                if self.engine is not None:  # through DeepSpeed's module: its hooks gather each layer's partitions
                    logp = self.engine(batch, temperature=self.temperature, **self.head)[0]
                else:
                    logp = forward_logprobs(self.model, batch, temperature=self.temperature, **self.head).logprobs
            logp = logp.float().cpu().numpy()
            bounds = np.cumsum([0] + [t.num_response_tokens for t in chunk])
            for t, a, b in zip(chunk, bounds[:-1], bounds[1:]):
                out[at[id(t)]] = logp[a:b]
        if self.colocated:
            # always: the policy trains next in another process, which cannot take memory this one caches
            release_cached_memory(self.device)
        return out

    def _chunks(self, trajs: list[Trajectory]) -> list[list[Trajectory]]:
        """Forward batches of samples of similar length (little padding when not packed): `trainer.micro_batch_size`
        samples each, or with `auto` as few as the free GPU memory allows (`trainer.dist.auto_micro_batch_counts`,
        with the estimate of a forward without autograd or KV cache: one layer's tensors at a time, not every
        layer's as training keeps for backward, so a step's reference forward usually runs in one or two batches;
        packed without varlen attention, the trainer's estimate, see `forward_only_estimate`)."""
        layout = "packed" if self.packed else "padded"
        size = self.cfg["trainer"]["micro_batch_size"]
        budget = None
        if str(size) != "auto":
            n = -(-len(trajs) // int(size))
        else:
            (n,), budget = auto_micro_batch_counts([trajs], layout, self.device, self.model.config,
                                                   self.cfg["model"]["dtype"], self.head, micro_batch_memory(self.cfg),
                                                   self.forward_only_estimate)
        if self.engine is not None and torch.distributed.get_world_size() > 1:  # sharded: one count on every rank
            n = max(1, agreed_counts([n], [len(trajs)], self.device)[0])
        return micro_batches(trajs, n, layout, budget)
