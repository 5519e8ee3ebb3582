"""`PolicyTrainer`: one Ray actor per data-parallel rank, each owning a DeepSpeed ZeRO engine.

The driver hands every rank its share of each mini-batch; a rank runs micro-batches (gradient accumulation) and
one optimizer step per mini-batch, so `trainer.mini_batches` > 1 gives several updates per rollout batch. The
loss of a micro-batch is already normalised by the mini-batch's global sequence/token counts (see
`rl.losses.aggregate`), so it is multiplied by the world size to undo DeepSpeed's gradient averaging and
backpropagated without DeepSpeed's 1/GAS scaling.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from rl.batching import micro_batches, micro_batches_per_minibatch, per_rank_samples
from rl.bitwise import gpu_unsupported_reason, unsupported_reason
from rl.config import (
    bitwise_on_policy, engine_memory_share, engines_per_gpu, frozen_models_sharded, head_options, logprob_temperature,
    micro_batch_memory, needs_reference, pack_sequences, rollout_placement, teacher_paths,
)
from rl.memory import activation_bytes, head_logit_bytes, micro_batch_tokens, should_checkpoint
from rl.metrics import TrainStatSums, forward_sums
from rl.models import load_causal_lm, load_tokenizer, torch_dtype
from rl.trajectory import Trajectory, collate
from trainer.dist import (
    agreed_counts, auto_micro_batch_counts, free_memory_bytes, free_port, init_process_group, init_process_group_env,
    memory_gib, node_address,
    partition_zero3, pick_device, release_cached_memory, wait_for,
)
from trainer.forward import ForwardOut, PolicyForward, compile_layers, logit_scale, route_replay
from trainer.frozen import FrozenModel
from trainer.profiling import profiled
from trainer.objectives import objective_of
from trainer.payload import fetch_heavy


def deepspeed_config(tcfg: dict, dtype: str, grad_accum: int, world_size: int, micro: int) -> dict:
    """`micro` samples per micro-batch (with `trainer.micro_batch_size=auto` a rank's whole share: the trainer then
    marks the accumulation boundary itself)."""
    zero = {"stage": int(tcfg["zero_stage"])}
    if zero["stage"] == 3:
        # Without this tiny models keep every parameter whole on each rank.
        zero.update(stage3_param_persistence_threshold=0, stage3_gather_16bit_weights_on_model_save=True)
    offload = optimizer_offloaded(tcfg)
    if offload:
        # The float32 master weights, Adam moments and gradient partitions live in host memory; torch's fused AdamW
        # steps them on the CPU (one pass over memory; DeepSpeed's CPU Adam would JIT-compile). Not pinned: page-
        # locking hundreds of GB stalls the start and starves everything else on the host
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": micro * grad_accum * world_size,
        "gradient_clipping": float(tcfg["grad_clip"]),
        "zero_optimization": zero,
        "bf16": {"enabled": dtype == "bfloat16"},
        "fp16": {"enabled": dtype == "float16"},
        # torch's AdamW: DeepSpeed's fused/CPU Adam would JIT-compile for minutes (and failed on the GPU image).
        # trainer.fused_adam: torch's fused kernel (DeepSpeed hands the extra key to torch.optim.AdamW)
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": float(tcfg["lr"]),
                "betas": list(tcfg["betas"]),
                "weight_decay": float(tcfg["weight_decay"]),
                "eps": 1e-8,
                "torch_adam": True,
                **({"fused": True} if tcfg.get("fused_adam") or offload else {}),
            },
        },
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    warmup = int(tcfg["warmup_steps"])
    if warmup > 0:  # otherwise a constant LR
        # DeepSpeed's WarmupLR gives min_lr to the first optimizer step; lr/W makes it lr/W, 2lr/W, ... -> lr.
        config["scheduler"] = {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": float(tcfg["lr"]) / warmup,
                "warmup_max_lr": float(tcfg["lr"]),
                "warmup_num_steps": warmup,
                "warmup_type": "linear",
            },
        }
    return config


def optimizer_offloaded(tcfg: dict) -> bool:
    """`trainer.offload_optimizer`: none | cpu."""
    return str(tcfg.get("offload_optimizer") or "none").lower() == "cpu"


def drop_per_gradient_overflow_check(optimizer) -> bool:
    """bf16 ZeRO-1/2 tests for inf/NaN twice before each optimizer step: every gradient on its own (a handful of
    kernels per parameter and a host sync: 30-46 ms of GPU idle per step of a 0.6B model, benchmarks/README.md),
    then the global gradient norm, which is inf/NaN whenever any gradient is (DeepSpeed maps a non-finite norm to
    inf and skips the step). The norm test alone skips the same steps, so the first is dropped. Only where
    DeepSpeed computes the norm and runs its test (`compute_grad_norm`, `check_grad_overflow`), not with CPU
    offload (which tracks overflow as gradients arrive). Returns whether it was dropped."""
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer  # ZeRO-1/2's step() (read for 0.19.8)

    if not (isinstance(optimizer, DeepSpeedZeroOptimizer) and optimizer.dtype == torch.bfloat16
            and optimizer.check_grad_overflow and optimizer.compute_grad_norm and not optimizer.cpu_offload):
        return False
    optimizer.check_overflow = lambda partition_gradients=True: None  # step() has already set overflow = False
    return True


class PolicyTrainer:
    def __init__(self, cfg: dict, model_path: str, rank: int, world_size: int, master_addr: str, master_port: int,
                 after: list = ()):
        """`after`: ready calls of the actors that must measure this GPU's free memory first (`wait_for`): the model
        loads into host memory meanwhile."""
        tcfg, acfg = cfg["trainer"], cfg["algorithm"]
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.device = pick_device(tcfg["device"])
        if tcfg.get("threads"):
            torch.set_num_threads(int(tcfg["threads"]))
        torch.manual_seed(int(cfg["seed"]) + rank)
        # DeepSpeed picks its accelerator once, at import: the environment (DS_ACCELERATOR=cpu for trainer.device=cpu
        # on a host with GPUs) first; the process group after the wait
        init_process_group_env(rank, world_size, master_addr, master_port, self.device)
        import deepspeed

        self.tokenizer = load_tokenizer(model_path)
        model = load_causal_lm(model_path, cfg["model"]["dtype"], cfg["model"].get("attn_implementation"))
        if bitwise_on_policy(cfg):  # said at start, by name
            reason = unsupported_reason(model.config) or gpu_unsupported_reason()
            if reason:
                raise ValueError(f"algorithm.on_policy=bitwise cannot match the engine here: {reason}")
        wait_for(after)
        init_process_group(rank, world_size, master_addr, master_port, self.device)  # a store at the address
        # the engine samples from the model's own logits; the trainer's come from the head's weight (forward.py)
        scale = logit_scale(model)  # before ZeRO-3 partitions the weights
        self.keep_routing = bool(acfg["keep_routing"])
        if self.keep_routing:
            from rl.routing import moe_layers

            moe_layers(model)  # raises UnsupportedMoEError now rather than mid-run
        self.model = model
        model.config.use_cache = False
        if tcfg.get("compile"):  # before DeepSpeed wraps it (ZeRO stages <= 2: rl/config.py refuses ZeRO-3 with it)
            compile_layers(model)
        self.checkpointing_mode = str(tcfg["gradient_checkpointing"]).lower()  # true | false | auto (per step)
        self._set_checkpointing(self.checkpointing_mode == "true")
        # trainer.micro_batch_size=auto: each step is cut into the fewest micro-batches whose activations fit a share
        # of the free GPU memory (rl/memory.py), and the trainer marks DeepSpeed's accumulation boundary itself
        self.auto_micro = str(tcfg["micro_batch_size"]) == "auto"
        self.micro_tokens = tcfg.get("micro_batch_tokens")  # with auto: a fixed token budget instead of the memory
        self.objective = objective_of(cfg)
        # only rollout engines share the trainer's GPU: an SFT step (a dataset source: no rollout worker starts) keeps
        # its cached memory, where handing it back made the next step allocate every activation again (cudaMalloc)
        self.colocated = self.objective.source == "rollouts" and rollout_placement(cfg["rollout"]) == "colocated"
        self.engine_share = engine_memory_share(cfg["rollout"], engines_per_gpu(cfg))  # what colocated vLLM wakes into
        self.grad_accum = micro_batches_per_minibatch(cfg, world_size)
        micro = per_rank_samples(cfg, world_size) if self.auto_micro else int(tcfg["micro_batch_size"])
        ds_cfg = deepspeed_config(tcfg, cfg["model"]["dtype"], self.grad_accum, world_size, micro)
        self.zero_stage = int(tcfg["zero_stage"])
        # ZeRO-0 in float32: DeepSpeed keeps no gradient norm, the trainer takes it (`_step`)
        self.own_grad_norm = self.zero_stage == 0 and cfg["model"]["dtype"] == "float32"
        self._grad_norm = 0.0
        module = PolicyForward(model)
        if self.zero_stage == 3:  # partitioned here, never whole on this rank's GPU
            partition_zero3(module, ds_cfg)
        # trainer.ref_placement=sharded: the reference and the distillation teachers live here, partitioned over the
        # ranks (trainer/frozen.py); by name: "reference", or a teacher's model path. Built before the policy's
        # optimizer, whose offloaded state (trainer.offload_optimizer) fills the host: each frozen model passes
        # through host memory whole while it loads
        self.frozen: dict[str, FrozenModel] = {}
        if frozen_models_sharded(cfg):
            if needs_reference(cfg) and "reference" in self.objective.needs:
                self.frozen["reference"] = FrozenModel(cfg, model_path, "reference", sharded=True)
            if "teacher" in self.objective.needs:
                for path in teacher_paths(cfg):
                    self.frozen[path] = FrozenModel(cfg, path, "teacher", sharded=True)
        self.engine, _, _, _ = deepspeed.initialize(
            model=module, model_parameters=[p for p in model.parameters() if p.requires_grad], config=ds_cfg
        )
        # ZeRO-1/2: a mini-batch's micro-batches leave their gradients on the parameters (autograd adds them up, in
        # the model's dtype as ZeRO's own buffers would) and ZeRO reduces them once, when the mini-batch ends
        # (DeepSpeed's coalesce_grad_reduction), instead of copying every parameter's gradient into its buckets
        # after every micro-batch: those per-parameter hooks ran on the CPU while the GPU waited (benchmarks/README.md)
        self.coalesce = (bool(tcfg.get("coalesce_grad_reduction", True)) and self.zero_stage in (1, 2)
                         and not optimizer_offloaded(tcfg)  # the offloaded ZeRO-2 copies gradients to the host itself
                         and hasattr(self.engine, "coalesce_grad_reduction")
                         and hasattr(self.engine.optimizer, "_coalesce_grad_reduction"))
        drop_per_gradient_overflow_check(self.engine.optimizer)
        if self.zero_stage == 3:
            self.engine.module.register_zero3_external_head()
        # an engine's samples are scored at the temperature it sampled at; dataset rows at 1 (the model's own logits)
        sampled_at = logprob_temperature(cfg["rollout"]) if self.objective.source == "rollouts" else 1.0
        self.temperature = sampled_at / scale
        self.head = head_options(cfg)  # chunk size, float32 head, support-only head
        self.packed = pack_sequences(cfg)  # one unpadded row per micro-batch (trainer.pack_sequences)
        self.profile_step, self.steps_run = int(tcfg.get("profile_step") or 0), 0

    def ready(self) -> int:
        return self.rank

    def frozen_logprobs(self, name: str, trajs: list[Trajectory]) -> list[np.ndarray]:
        """This rank's share of a sharded frozen model's scoring (`name`: "reference" or a teacher's path); every
        rank must be called, each with at least one sample (its forwards gather partitions from all ranks)."""
        if name not in self.frozen:
            raise KeyError(f"rank {self.rank} has no sharded frozen model {name!r} (it has {sorted(self.frozen)})")
        return self.frozen[name].logprobs(trajs)

    def device_name(self) -> str:
        """The GPU's name (for its peak FLOP/s, perf/mfu), "cpu" on CPU."""
        device = torch.device(self.engine.device)
        return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"

    # -- one rollout batch ------------------------------------------------------------------------------------
    def train_step(self, minibatches: list[list[Trajectory]], norms: list[tuple[int, int]]) -> dict:
        """Run every mini-batch (this rank's share) with one optimizer step each; return metric sums. The
        `trainer.profile_step`-th call runs under torch.profiler (trainer/profiling.py)."""
        self.steps_run += 1
        out = None
        if self.steps_run == self.profile_step and self.cfg.get("run_dir"):
            out = Path(self.cfg["run_dir"]) / "profile" / f"train_step{self.steps_run}_rank{self.rank}"
        start = time.perf_counter()
        with profiled(out, self.engine.device):
            sums = self._train_step(minibatches, norms)  # its sums are read back: the GPU's work is done
        sums["rank_seconds"] = time.perf_counter() - start
        return sums

    def _train_step(self, minibatches: list[list[Trajectory]], norms: list[tuple[int, int]]) -> dict:
        sums: dict[str, float] = defaultdict(float)
        fetched = fetch_heavy([t for trajs in minibatches for t in trajs])  # this rank's samples' per-token arrays
        if fetched["bytes"]:
            sums.update(payload_fetch_s=fetched["seconds"], payload_bytes=fetched["bytes"])
        stat_sums = TrainStatSums()  # on the GPU until the step is done (no wait for the GPU per micro-batch)
        memory = memory_gib(self.engine.device)  # as the step starts (a colocated vLLM asleep)
        if memory:
            torch.cuda.reset_peak_memory_stats(self.engine.device)
        self.engine.train()
        layout = "packed" if self.packed else "padded"
        if self.auto_micro:
            plan = self._auto_micro_batches(minibatches, layout)
        else:
            plan = [micro_batches(trajs, self.grad_accum, layout) for trajs in minibatches]
            for trajs, micro in zip(minibatches, plan):
                if len(micro) != self.grad_accum:  # DeepSpeed steps the optimizer every grad_accum micro-steps
                    raise ValueError(f"rank {self.rank}: mini-batch of {len(trajs)} gives {len(micro)} micro-batches, expected {self.grad_accum}")
        sums["micro_batches"] = float(sum(len(micro) for micro in plan))
        if self.checkpointing_mode == "auto":
            self._auto_checkpointing(plan)
        sums["gradient_checkpointing"] = float(self.checkpointing)
        # algorithm.old_logprobs=trainer: pi_old is this policy's own logprob before the first update
        recompute = self.cfg["algorithm"].get("old_logprobs") == "trainer" and "inference_logprobs" in self.objective.needs
        old = self._recompute_old(plan) if recompute else None
        for mb_index, (micro, norm) in enumerate(zip(plan, norms)):
            with self._one_reduction():
                for mc_index, chunk in enumerate(micro):
                    batch = collate(chunk, self.tokenizer.pad_token_id, self.packed).to(self.engine.device)
                    if "inference_logprobs" in self.objective.needs and batch.inference_logprobs is None:
                        raise ValueError(f"algorithm.objective={self.objective.name} needs the engine's logprobs of "
                                         "each sample, and these samples have none (dataset rows)")
                    if old is not None:
                        batch.old_logprobs = old[mb_index][mc_index]
                    with route_replay(self.model, batch, self.keep_routing) as replay:
                        out = self._forward(batch, with_entropy=True)
                        loss, stats = self.objective.loss(out.logprobs, batch, self.cfg["algorithm"], norm)
                        if self.auto_micro and not self.coalesce:  # before backward: ZeRO's gradient hooks read it
                            self.engine.set_gradient_accumulation_boundary(mc_index == len(micro) - 1)
                        self.engine.backward(loss * self.world_size, scale_wrt_gas=False)
                    if not self.coalesce:
                        self._step()
                    routing = replay.device_counts()  # read with the other sums, once the step is done
                    stat_sums.add(forward_sums(batch, out, routing, first_minibatch=mb_index == 0))
                    stat_sums.add(self.objective.sums(batch, stats))
            if self.coalesce:  # the mini-batch's gradients were reduced as the block ended: its one update
                self.engine.set_gradient_accumulation_boundary(True)
                self._step()
            norm = self.engine.get_global_grad_norm()
            sums["grad_norm"] += float(self._grad_norm if norm is None else norm)
            sums["optimizer_steps"] += 1
        sums["lr"] = float(self.engine.get_lr()[0])
        sums.update(stat_sums.totals())
        if memory:
            sums.update(gpu_free_gib=memory["gpu_free"], gpu_others_gib=memory["gpu_others"],
                        gpu_peak_gib=memory_gib(self.engine.device)["gpu_peak"])
        if self.colocated:
            release_cached_memory(self.engine.device, self.engine_share)
        return dict(sums)

    def _step(self) -> None:
        """`engine.step()`. Where DeepSpeed keeps no gradient norm (ZeRO-0 in float32: torch's optimizer, clipped by
        a `clip_grad_norm_` whose value DeepSpeed drops), the norm of the gradients is taken here first, at the
        accumulation boundary (they are already reduced over the ranks then), for `grad_norm`."""
        if self.own_grad_norm and self.engine.is_gradient_accumulation_boundary():
            grads = [p.grad.detach().float() for p in self.model.parameters() if p.grad is not None]
            self._grad_norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
                                    ) if grads else 0.0
        self.engine.step()

    def _one_reduction(self):
        """The block of one mini-batch's micro-batches (see `self.coalesce`); a plain block otherwise."""
        return self.engine.coalesce_grad_reduction() if self.coalesce else contextlib.nullcontext()

    def _set_checkpointing(self, on: bool) -> None:
        m = self.model  # transformers >= 5.22 names it activation checkpointing (the old names warn)
        if on and not getattr(self, "checkpointing", False):
            if hasattr(m, "activation_checkpointing_enable"):
                m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif not on and getattr(self, "checkpointing", False):
            (getattr(m, "activation_checkpointing_disable", None) or m.gradient_checkpointing_disable)()
        self.checkpointing = bool(on)

    def _auto_micro_batches(self, minibatches: list[list[Trajectory]], layout: str) -> list[list[list[Trajectory]]]:
        """trainer.micro_batch_size=auto: each mini-batch in as few micro-batches as the free GPU memory allows
        (`trainer.dist.auto_micro_batch_counts`), or as trainer.micro_batch_tokens allows when set. Every rank runs the same count (the largest any rank needs: ZeRO
        reduces gradients every micro-step)."""
        counts, budget = auto_micro_batch_counts(minibatches, layout, self.engine.device, self.model.config,
                                                 self.cfg["model"]["dtype"], self.head, micro_batch_memory(self.cfg),
                                                 max_tokens=self.micro_tokens)
        if self.world_size > 1:
            counts = agreed_counts(counts, [len(t) for t in minibatches], self.engine.device)
        return [micro_batches(trajs, n, layout, budget) for trajs, n in zip(minibatches, counts)]

    def _auto_checkpointing(self, plan: list[list[list[Trajectory]]]) -> None:
        """trainer.gradient_checkpointing=auto: on for this step only when the largest micro-batch's activations
        (rl/memory.py) would take more than 80% of the GPU memory free now (a colocated vLLM is asleep); off on CPU."""
        free = free_memory_bytes(self.engine.device)
        if free is None:
            return self._set_checkpointing(False)
        tokens = max(micro_batch_tokens(chunk, self.packed) for micro in plan for chunk in micro)
        dtype_bytes = torch_dtype(self.cfg["model"]["dtype"]).itemsize
        need = activation_bytes(self.model.config, tokens, dtype_bytes, False, int(self.head["chunk_size"]),
                                head_logit_bytes(self.head, dtype_bytes))
        on = torch.tensor([float(should_checkpoint(need, free))], device=self.engine.device)
        if self.world_size > 1:  # one choice for all ranks: ZeRO-3's recompute gathers parameters again (collectives)
            torch.distributed.all_reduce(on, op=torch.distributed.ReduceOp.MAX)
        self._set_checkpointing(bool(on.item()))

    def _forward(self, batch, with_entropy: bool) -> ForwardOut:
        return ForwardOut(*self.engine(batch, temperature=self.temperature, with_entropy=with_entropy, **self.head))

    @torch.no_grad()
    def _recompute_old(self, plan: list[list[list[Trajectory]]]) -> list[list[torch.Tensor]]:
        """The current policy's logprobs of every micro-batch, before any update (same routes and kept sets)."""
        out = []
        for micro in plan:
            out.append([])
            for chunk in micro:
                batch = collate(chunk, self.tokenizer.pad_token_id, self.packed).to(self.engine.device)
                with route_replay(self.model, batch, self.keep_routing):
                    out[-1].append(self._forward(batch, with_entropy=False).logprobs.detach())
        return out

    # -- weights out ---------------------------------------------------------------------------------------
    def full_state_dict(self, dtype: str | None = None) -> dict[str, torch.Tensor] | None:
        """Whole weights on rank 0 (None elsewhere); a collective under ZeRO-3, so call it on every rank."""
        module = self.model
        cast = torch_dtype(dtype) if dtype else None
        out = {}
        if self.zero_stage == 3:
            import deepspeed

            for name, p in module.named_parameters():
                with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
                    if self.rank == 0:
                        out[name] = p.detach().to("cpu", cast or p.dtype).clone()
            # Buffers (rotary tables...) never change in training; the receiver keeps its own.
        elif self.rank == 0:
            out = {k: v.detach().to("cpu", cast or v.dtype).clone() for k, v in module.state_dict().items()}
        return out if self.rank == 0 else None

    # -- GPU weight sync to vLLM rollout workers (trainer/weight_sync.py) ---------------------------------------
    def weight_sync_address(self) -> tuple[str, int]:
        """(this node's IP, a free port) for the NCCL weight-transfer rendezvous (split placement)."""
        return node_address(), free_port()

    def init_weight_sync(self, backend: str, master_address: str | None = None, master_port: int | None = None,
                         world_size: int | None = None, wave: int = 0) -> None:
        """backend ipc (colocated) | nccl (split; rank 0 joins the group of wave `wave` of vLLM workers: called once
        per wave, `launch.weight_sync.gpu_waves`)."""
        from trainer.weight_sync import WeightSender

        rcfg = self.cfg["rollout"]
        if getattr(self, "weight_sender", None) is None or self.weight_sender.backend != backend:
            self.weight_sender = WeightSender(
                backend, self.rank, self.zero_stage, torch_dtype(self.cfg["model"]["dtype"]),
                bucket_mb=float(rcfg.get("weight_sync_bucket_mb", 512)),
                packed=bool(rcfg.get("weight_sync_packed", True)),
            )
        if backend == "nccl" and self.rank == 0:
            self.weight_sender.init_nccl(master_address, master_port, world_size, wave)

    def send_weights(self, waves: list[list]) -> dict:
        """Stream the current weights to each wave of workers (RolloutWorker handles; `launch.weight_sync.gpu_waves`);
        on every rank (ZeRO-3 gathers)."""
        return self.weight_sender.send(self.model, waves)  # the HF model, not the DeepSpeed wrapper

    # -- checkpoints ---------------------------------------------------------------------------------------
    def save(self, ckpt_dir: str, client_state: dict) -> None:
        """HF weights (rank 0) + DeepSpeed engine state (optimizer, scheduler; every rank)."""
        path = Path(ckpt_dir)
        state = self.full_state_dict()
        if self.rank == 0:
            self.model.save_pretrained(path / "hf", state_dict=state)
            self.tokenizer.save_pretrained(path / "hf")
        self.engine.save_checkpoint(str(path / "deepspeed"), tag="state", client_state={"mixrl": client_state})
        # Every rank's RNG in its own file: DeepSpeed writes client_state from one rank only.
        rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
               "cuda": torch.cuda.get_rng_state() if str(self.device).startswith("cuda") else None}
        torch.save(rng, path / "deepspeed" / "state" / f"rng_rank{self.rank}.pt")

    def load(self, ckpt_dir: str) -> dict:
        _, client_state = self.engine.load_checkpoint(
            str(Path(ckpt_dir) / "deepspeed"), tag="state", load_optimizer_states=True, load_lr_scheduler_states=True
        )
        rng_file = Path(ckpt_dir) / "deepspeed" / "state" / f"rng_rank{self.rank}.pt"
        if rng_file.exists():  # a checkpoint saved with another number of ranks has none for the new ones
            rng = torch.load(rng_file, weights_only=False)
            torch.set_rng_state(rng["torch"])
            np.random.set_state(rng["numpy"])
            random.setstate(rng["python"])
            if rng.get("cuda") is not None and str(self.device).startswith("cuda"):
                torch.cuda.set_rng_state(rng["cuda"])
        return client_state.get("mixrl", {})
