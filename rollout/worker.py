"""`RolloutWorker`: a Ray actor that turns prompts into `Trajectory` objects with one of the engines.

`rollout.engine=hf` is the transformers engine (CPU default, any device); `rollout.engine=vllm` is vLLM
(`rollout/vllm_engine.py`, GPU) behind the same `generate` / `load_state_dict` methods, plus the GPU weight-sync
and sleep-mode entry points; `auto` picks vLLM when CUDA and vllm are importable. Sampling is seeded from
(seed, step, worker rank) so a resumed run draws the same samples as an uninterrupted one (vLLM: per request
only with `rollout.per_request_seed=true`, which is slower; otherwise the engine is seeded once per worker).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError

from rl.config import ROLLOUT_DEFAULTS, bitwise_on_policy, engines_per_gpu
from rl.engine_specs import engine_spec
from rl.trajectory import Trajectory
from rollout.engines import (
    EngineStart, import_engine, make_engine, resolve_engine, sampling_params, set_environment,
)
from rollout.sampling import Generation, decode_response
from trainer.dist import wait_for

log = logging.getLogger(__name__)

# Samples that end during generation go to the reward worker once EARLY_BATCH of them (at most a group's n) are
# waiting, or EARLY_WAIT_S after the last ones went (a call per sample would cost more in overhead than the scoring)
EARLY_BATCH = 16
EARLY_WAIT_S = 0.2
# How long a rollout worker waits for its node's payload holder to take a share's per-token arrays (a copy within the
# node's object store: well under a second a share) before it keeps them itself
HOLD_TIMEOUT_S = 120.0


class RolloutWorker:
    def __init__(self, cfg: dict, model_path: str, rank: int, env: dict[str, str | None] | None = None,
                 after: list | None = (), plans_before: float | None = None):
        """`env`: variables set (None: unset) before the engine starts: where a tensor-parallel vLLM instance's Ray
        workers go (launch.placement.GpuPlacement.worker_env). `after`: ready calls of the instances that must
        measure this GPU's free memory first (an earlier start wave, launch.cluster.ActorPool): the engine's own
        imports run meanwhile, then the engine starts (vLLM with a start plan does not wait: rollout/vllm_start_plan.py).
        `after` None: a restarted worker (launch.cluster.ActorPool.replace), which records no start plan.
        `plans_before`: when the run created its workers; start plans written later are for the next run."""
        set_environment(env)
        rcfg = cfg["rollout"]
        if rcfg.get("threads"):
            torch.set_num_threads(int(rcfg["threads"]))
        self.cfg, self.rank = cfg, rank
        self.engine_kind = resolve_engine(rcfg)
        if after:
            import_engine(self.engine_kind)
        # this instance's wave among those sharing its GPU, as launch.cluster.ActorPool numbers them
        waves = engines_per_gpu(cfg) if engine_spec(self.engine_kind).gpu_memory else 1
        start = EngineStart(wait=lambda: wait_for(after), wave=rank % waves, waves=waves,
                            plan=bool(rcfg.get("start_plan", ROLLOUT_DEFAULTS["start_plan"])),
                            plans_before=plans_before,
                            record=after is not None)
        self.engine = make_engine(
            rcfg, cfg["model"], model_path, record_routes=bool(cfg["algorithm"]["keep_routing"]),
            seed=int(cfg["seed"]) * 1_000_003 + rank, start=start, bitwise=bitwise_on_policy(cfg),
        )
        self.tokenizer = self.engine.tokenizer
        # Keep Sampling Mask is decided here, once: the engine records kept sets only when it is on.
        self.record_kept_set = bool(cfg["algorithm"]["keep_sampling_mask"])
        # Payload by reference (rollout.payload_by_reference): the samples leave with their per-token arrays in the
        # object store. Only inside Ray: a worker built in-process (tests, tools) returns whole samples.
        self.by_reference = (bool(rcfg.get("payload_by_reference", ROLLOUT_DEFAULTS["payload_by_reference"]))
                             and ray.is_initialized())
        self.payload_holder = None  # this node's PayloadHolder (`set_payload_holder`), the owner of the arrays
        # Agent domains (an `agent` block): multi-turn episodes against their environment (rollout/agent.py).
        self._agents = {}
        for name, block in cfg["domains"].items():
            if block.get("agent"):
                from rollout.agent import AgentConfig, AgentRunner

                agent = dict(block["agent"])
                if isinstance(block.get("thinking"), bool):  # domains.<d>.thinking wins over agent.thinking
                    agent["thinking"] = block["thinking"]
                self._agents[name] = AgentRunner(self.engine, self.tokenizer, AgentConfig.from_config(agent),
                                                 code_sandbox=(cfg.get("rewards") or {}).get("code"))

    def ready(self) -> int:
        return self.rank

    def engine_name(self) -> str:
        return self.engine_kind

    def node_id(self) -> str:
        """The Ray node this worker runs on (where its payload holder must run)."""
        return ray.get_runtime_context().get_node_id()

    def set_payload_holder(self, holder) -> None:
        """`holder`: the `PayloadHolder` actor of this worker's node; the samples' per-token arrays are put by it from
        now on, so they outlive this worker (`put_heavy`)."""
        self.payload_holder = holder

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

    def continuation_logprobs(self, prompts: list[list[int]], continuations: list[list[int]]) -> list:
        """vLLM only: logprob of each continuation token under the engine's current weights (tests, checks)."""
        return self.engine.continuation_logprobs(prompts, continuations)

    def sleep(self, level: int) -> None:
        t0 = time.perf_counter()
        self.engine.sleep(level)
        log.info("rollout worker %d: engine asleep (level %d) in %.2f s", self.rank, level, time.perf_counter() - t0)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.engine.wake_up(tags)

    def generate(self, requests: list[dict], step: int, overrides: dict | None = None,
                 scorers: list | None = None) -> list[Trajectory]:
        """requests: {group_id, domain, prompt_ids, prompt_text, sample, thinking (optional: the mode the prompt was
        rendered in, copied to the trajectories)}; returns n trajectories per request, in request order. A domain
        with an `agent` block runs multi-turn episodes (rollout/agent.py).
        `overrides`: rollout keys (n_samples, temperature, top_p, top_k) for this call only: held-out evaluation,
        whose samples are never trained on (so no kept sets are recorded for them).
        `scorers`: the RewardWorker handles; this worker's share is scored by scorers[rank mod len] (the driver's
        `RolloutInFlight` sends it there), which gets the single-turn samples as they end, in small batches
        (`RewardWorker.prescore`), so scoring runs while the rest generates."""
        if not requests:
            return []
        seed = (int(self.cfg["seed"]) * 1_000_003 + step * 1009 + self.rank) % (2**63)
        rcfg = {**self.cfg["rollout"], **{k: v for k, v in (overrides or {}).items() if v is not None}}
        sp = sampling_params(rcfg, seed, self.record_kept_set if overrides is None else False)
        by_domain: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            by_domain.setdefault(req["domain"] if req["domain"] in self._agents else "", []).append(i)
        out: list[list[Trajectory]] = [[] for _ in requests]
        for domain, idx in by_domain.items():
            part = [requests[i] for i in idx]
            scorer = scorers[self.rank % len(scorers)] if scorers else None
            trajs = self._agents[domain].run(part, sp) if domain else self._single_turn(part, sp, scorer)
            n = sp.n
            for k, i in enumerate(idx):
                out[i] = trajs[k * n : (k + 1) * n]
        samples = [t for group in out for t in group]
        if self.by_reference and not put_heavy(samples, self.payload_holder):
            self.payload_holder = None  # gone or hung: not waited for again
        return samples

    def _single_turn(self, requests: list[dict], sp, scorer=None) -> list[Trajectory]:
        texts: dict[tuple[int, bytes], str] = {}  # (prompt index, response) -> text, decoded for early scoring
        early = {"samples": 0, "calls": 0}
        pending: list[Trajectory] = []
        last_sent = [time.perf_counter()]

        def score_early(done: list) -> None:
            for i, gens in done:
                for g in gens:
                    text = texts[i, g.response_ids.tobytes()] = decode_response(self.tokenizer, g.response_ids)
                    # what rewards read: tokens, text, finish reason (no logprobs, kept sets or routes to ship); the
                    # reward worker matches it to the returned sample by group and response, not by uid
                    bare = Generation(g.response_ids, np.zeros(len(g.response_ids), np.float32), g.finish_reason)
                    pending.append(self._trajectory(requests[i], "early", bare, text))
            if len(pending) >= min(EARLY_BATCH, sp.n) or time.perf_counter() - last_sent[0] >= EARLY_WAIT_S:
                scorer.prescore.remote(list(pending))  # not awaited: `score` takes what it finished, scores the rest
                early["samples"] += len(pending)
                early["calls"] += 1
                pending.clear()
                last_sent[0] = time.perf_counter()

        t0 = time.perf_counter()
        kwargs = {"on_samples_done": score_early} if scorer is not None else {}
        groups = self.engine.generate([r["prompt_ids"] for r in requests], sp, **kwargs)
        seconds = time.perf_counter() - t0
        tokens = sum(len(g.response_ids) for gens in groups for g in gens)
        log.info("rollout worker %d: %d samples, %d new tokens in %.2f s (%.0f tokens/s, capture and conversion "
                 "included); %d samples sent to scoring before the end (%d calls)", self.rank,
                 sum(map(len, groups)), tokens, seconds, tokens / max(seconds, 1e-9), early["samples"], early["calls"])
        out = []
        for i, (req, gens) in enumerate(zip(requests, groups)):
            for j, g in enumerate(gens):
                text = texts.get((i, g.response_ids.tobytes()))
                out.append(self._trajectory(req, j, g, decode_response(self.tokenizer, g.response_ids) if text is None
                                            else text))
        return out

    @staticmethod
    def _trajectory(req: dict, j: int | str, g, response_text: str) -> Trajectory:
        return Trajectory(
            uid=f"{req['group_id']}-{j}",
            group_id=req["group_id"],
            domain=req["domain"],
            prompt_ids=req["prompt_ids"],
            response_ids=g.response_ids,
            inference_logprobs=g.inference_logprobs,
            finish_reason=g.finish_reason,
            kept_ids=g.kept_ids,
            kept_offsets=g.kept_offsets,
            kept_set_cut=int(g.kept_set_cut),
            loss_mask=g.loss_mask,
            routed_experts=g.routed_experts,
            prompt_text=req["prompt_text"],
            response_text=response_text,
            sample=req["sample"],
            thinking=req.get("thinking"),
        )


def put_heavy(samples: list[Trajectory], holder=None) -> bool:
    """Each sample's per-token arrays (and each earlier context segment's) go to the object store as one object per
    sample; the sample keeps the reference (`Trajectory.payload`). One object per sample, so a trainer rank fetches
    exactly its own samples' arrays, whichever rank the driver's split gives them to.

    Who owns them decides how long they live: an object dies with its owner (Ray's ownership; Ray 2.56 removed
    `ray.put(_owner=...)`). `holder`: this node's `rollout.payload_holder.PayloadHolder` (the driver's,
    launch/cluster.py PayloadHolders), which puts them, so they outlive this worker: the pool replaces a hung or dead
    worker and retries its share, and the samples it made before (dynamic sampling's earlier rounds, the step that
    trains next under max_staleness=1) must still train. Costs one more copy within the node's object store (under
    1 ms a MB on a 2-core CPU machine). Without a holder (a worker outside a Cluster, or a holder that is gone) this
    worker owns them, as before. Returns whether the holder took them."""
    parts = [part for t in samples for part in [*(t.segments or ()), t]]
    heavy = [part.take_heavy() for part in parts]
    refs = None
    if holder is not None and heavy:
        try:
            refs = ray.get(holder.hold.remote(heavy), timeout=HOLD_TIMEOUT_S)
        except (RayActorError, GetTimeoutError) as e:
            log.warning("the payload holder of this node did not take %d samples' per-token arrays (%s): this rollout "
                        "worker keeps them, and they are lost if it is replaced", len(heavy), type(e).__name__)
    held = refs is not None
    if refs is None:
        refs = [ray.put(h) for h in heavy]
    for part, ref in zip(parts, refs):
        part.payload = ref
    return held or not heavy

