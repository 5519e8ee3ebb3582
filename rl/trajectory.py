"""The one data contract: a `Trajectory` per sample, flowing rollout -> rewards -> trainer.

A rollout engine fills the token fields (token-in/token-out: nothing the model produced is ever re-tokenised),
the reward worker fills `reward`/`reward_parts`/`reward_error`, the loop fills `advantage` and the per-domain
coefficients (`rl.advantages`), and `collate` turns a list of them into the padded tensors the trainer consumes.
Names (the README's glossary): `inference_logprobs` (the engine's, pi_old), `kept_ids`/`kept_offsets` (the kept
set), `loss_mask` (which response tokens are trained on), `routed_experts` (Keep Routing).

Alignment convention used everywhere: position `p` of `input_ids` predicts token `p + 1`. The trainer works on
the generated positions only, flattened in sample order: row `j` of a sample's generated part is the logits row
that predicted `response_ids[j]`, i.e. absolute position `len(prompt_ids) + j - 1`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


# The per-token arrays that travel by reference (`Trajectory.payload`): what the trainer and the frozen models read and
# rewards, metrics and the driver never do. The kept ids and routes are most of a step's bytes (tens of MB on a real
# model); the light view keeps the token ids, loss mask and texts.
HEAVY_FIELDS = ("inference_logprobs", "kept_ids", "kept_offsets", "routed_experts")


@dataclass
class Trajectory:
    uid: str  # unique per sample
    group_id: str  # the G samples of one prompt share it (GRPO group)
    domain: str  # key under `domains.` in the config
    prompt_ids: np.ndarray  # int32 [P]
    response_ids: np.ndarray  # int32 [R]; multi-turn: everything after the first prompt, tool output included
    # float32 [R]; the inference engine's logprob of each response token under the distribution it sampled from
    # (after temperature/top-k/top-p: "processed"). pi_old of the loss. None for a sample no engine sampled (a
    # dataset row for SFT): objectives that need it say so (trainer/objectives.py), and the trainer checks.
    inference_logprobs: np.ndarray | None
    finish_reason: str = "stop"  # "stop" (EOS/stop token) | "length" (hit max_new_tokens)
    # 1 for tokens the loss is taken over: 0 for tool/environment tokens (multi-turn) and for positions whose kept
    # set the engine could not record completely (vLLM top-K cut; see rollout/vllm_engine.py). None = all 1.
    loss_mask: np.ndarray | None = None
    # The kept set (Keep Sampling Mask) as CSR over response positions: the ids that survived top-k/top-p at
    # position j are kept_ids[kept_offsets[j]:kept_offsets[j+1]]. None = the full vocabulary (no truncation at
    # sampling, or algorithm.keep_sampling_mask off: then the engine does not record them).
    kept_ids: np.ndarray | None = None  # int32; uint16 from vLLM when the vocabulary fits (half the bytes to move)
    kept_offsets: np.ndarray | None = None  # int64 [R + 1]
    # Keep Routing: expert ids per position of prompt+response minus the last token, per layer, per slot:
    # [P + R - 1, num_hidden_layers, top_k], uint8 (uint16 above 256 experts); dense layers are zero rows.
    routed_experts: np.ndarray | None = None
    # Positions whose kept set the engine could not record completely (more than K ids); they have loss_mask 0.
    kept_set_cut: int = 0
    prompt_text: str = ""  # rendered prompt (chat template applied), for rewards and logs
    response_text: str = ""  # decoded once by the engine, for rewards; never tokenised again
    sample: dict[str, Any] = field(default_factory=dict)  # dataset row in our field names (answer, rubric, tests...)
    ref_logprobs: np.ndarray | None = None  # float32 [R]; reference policy, filled only when kl_coef > 0
    reward: float = 0.0
    reward_parts: dict[str, float] = field(default_factory=dict)
    reward_error: str | None = None  # why a part scored 0: an expected zero (no code block...) or a failure
    # A part raised or timed out (not an expected zero): the sample keeps reward 0 for the logs but gets advantage
    # 0 and stays out of its group's baseline, so nobody's answer is pushed down for a reward that never ran.
    reward_failed: bool = False
    # Multi-turn (agent) episodes: True for the response tokens the model generated, False for tool/environment
    # tokens (which also have loss_mask 0). None = every response token was generated.
    generated: np.ndarray | None = None
    # Multi-turn: what happened in the episode (environment, turns, tool calls, termination, the verifier's outcome),
    # filled by the rollout; the `env_verifier` reward reads its outcome. None for single-turn samples.
    episode: dict[str, Any] | None = None
    # The chat template's thinking mode the prompt was rendered in (`domains.<d>.thinking`, from the prompt request);
    # None where the domain sets no mode (the template's default). Metrics split by it (`mode/<d>/...`).
    thinking: bool | None = None
    advantage: float = 0.0
    kl_coef: float = 0.0  # this sample's domain KL strength (domains.<d>.kl_coef)
    opsm_delta: float | None = None  # this sample's domain OPSM threshold (domains.<d>.opsm_delta), None = off
    # On-policy distillation (algorithm.objective=distill, a domain with a teacher): the teacher's logprob of every
    # response token (float32 [R]), and the domain's weights of the GRPO advantage and the teacher term
    teacher_logprobs: np.ndarray | None = None
    reward_coef: float = 1.0  # domains.<d>.reward_coef
    distill_coef: float = 0.0  # domains.<d>.distill_coef (0 where the domain has no teacher)
    # An agent episode whose context was managed (`agent.context_strategy`, rollout/agent.py): its earlier context
    # segments, in order, each a Trajectory of its own (own prompt = the context it continued from, own response,
    # loss mask, kept sets and routes). This trajectory is the last segment and stands for the episode in rewards,
    # advantages and metrics; `rl.advantages.expand_segments` splices the earlier ones in for training, with the
    # episode's reward and advantage. None = one segment (every other sample).
    segments: list["Trajectory"] | None = None
    # This sample's share of its episode in the seq-mean losses (`rl.losses.aggregate`): 1, or for a context segment
    # its loss tokens over the episode's, set by `rl.advantages.expand_segments` (an episode weighs one sequence).
    episode_share: float = 1.0
    # Payload by reference: while this sample travels rollout worker -> reward worker -> driver -> trainer, its
    # HEAVY_FIELDS are None here and this is an object-store reference to them (put by the rollout worker,
    # rollout/worker.py); the trainer ranks and the frozen models fetch their own samples' arrays
    # (trainer/payload.py). None: the arrays are in the fields (the default outside Ray, and after the fetch).
    payload: Any = None

    def __post_init__(self) -> None:
        self.prompt_ids = np.asarray(self.prompt_ids, dtype=np.int32)
        self.response_ids = np.asarray(self.response_ids, dtype=np.int32)
        if self.inference_logprobs is not None:
            self.inference_logprobs = np.asarray(self.inference_logprobs, dtype=np.float32)
        if self.inference_logprobs is not None and self.inference_logprobs.shape != self.response_ids.shape:
            raise ValueError(
                f"trajectory {self.uid}: {len(self.inference_logprobs)} inference logprobs for "
                f"{len(self.response_ids)} response tokens"
            )
        if (self.kept_offsets is None) != (self.kept_ids is None):
            raise ValueError(f"trajectory {self.uid}: kept_ids and kept_offsets come together")
        if self.kept_offsets is not None:
            offsets = np.asarray(self.kept_offsets)
            if len(offsets) != len(self.response_ids) + 1 or offsets[0] != 0 or (np.diff(offsets) < 0).any():
                raise ValueError(f"trajectory {self.uid}: kept_offsets must be non-decreasing from 0 with len(response_ids) + 1 entries")
            if offsets[-1] != len(self.kept_ids):
                raise ValueError(f"trajectory {self.uid}: kept_offsets[-1]={offsets[-1]} but {len(self.kept_ids)} kept_ids")
        if self.loss_mask is not None and len(self.loss_mask) != len(self.response_ids):
            raise ValueError(f"trajectory {self.uid}: loss_mask must have one entry per response token")
        if self.generated is not None and len(self.generated) != len(self.response_ids):
            raise ValueError(f"trajectory {self.uid}: generated must have one entry per response token")
        if self.routed_experts is not None:
            expect = len(self.prompt_ids) + len(self.response_ids) - 1
            if self.routed_experts.shape[0] != expect:
                raise ValueError(
                    f"trajectory {self.uid}: routed_experts has {self.routed_experts.shape[0]} rows, "
                    f"expected len(prompt)+len(response)-1 = {expect}"
                )

    @property
    def num_response_tokens(self) -> int:
        """Every token after the prompt (tool output of a multi-turn episode included)."""
        return int(len(self.response_ids))

    @property
    def num_tokens(self) -> int:
        """Prompt + response: the positions the trainer runs the model over."""
        return int(len(self.prompt_ids) + len(self.response_ids))

    @property
    def num_generated_tokens(self) -> int:
        """The tokens the model generated: what length penalties, response lengths and throughput count."""
        return int(len(self.response_ids)) if self.generated is None else int(np.count_nonzero(self.generated))

    def take_heavy(self) -> dict[str, Any]:
        """Hand over the per-token arrays that only the trainer and the frozen models read (HEAVY_FIELDS), leaving
        None in their place: the light view that rewards, metrics and the driver need."""
        heavy = {name: getattr(self, name) for name in HEAVY_FIELDS}
        for name in HEAVY_FIELDS:
            setattr(self, name, None)
        return heavy

    def attach_heavy(self, heavy: dict[str, Any]) -> None:
        """Put back what `take_heavy` handed over (checked as at construction); the payload reference is dropped."""
        for name in HEAVY_FIELDS:
            setattr(self, name, heavy.get(name))
        self.payload = None
        self.__post_init__()

    def loss_mask_or_ones(self) -> np.ndarray:
        """`loss_mask` as float32, all ones when it is None (every response token is trained on)."""
        if self.loss_mask is None:
            return np.ones(len(self.response_ids), dtype=np.float32)
        return np.asarray(self.loss_mask, dtype=np.float32)


@dataclass
class TrainBatch:
    """The tensors of one micro-batch; built by `collate`, consumed by the trainer.

    B = number of samples, T = longest prompt+response, N = total number of response tokens (flattened).
    Packed (`collate(..., packed=True)`): one row of all samples back to back, T = their total length, no padding;
    `position_ids` restart at 0 for each sample, from which transformers attends within each sample only
    (sdpa/eager: a block-diagonal mask), and `cu_seqlens` / `max_seqlen` give the samples' boundaries to varlen
    kernels (flash-attn, torch's: rl/attention.py) without a device read. No attention mask either way: padded rows are
    right-padded and the model is causal, so every scored position sees real tokens only (trainer/forward.py).
    """

    input_ids: torch.Tensor  # long [B, T], right padded with pad_id; packed: [1, T]
    # Flat view of the response positions (sample order, then position order):
    logit_index: torch.Tensor  # long [N]; index into the [B*T] flattened hidden states predicting each token
    targets: torch.Tensor  # long [N]; the sampled token ids
    seq_index: torch.Tensor  # long [N]; which sample (0..B-1) each token belongs to
    loss_mask: torch.Tensor  # float [N]; 1 for policy-generated tokens
    inference_logprobs: torch.Tensor | None  # float [N]; the engine's logprob of each sampled token (pi_old); None
    # when the samples come from a dataset (no engine sampled them)
    advantages: torch.Tensor  # float [B]
    kl_coef: torch.Tensor  # float [B]
    opsm_delta: torch.Tensor  # float [B]; +inf where OPSM is off for the sample's domain
    kept_ids: torch.Tensor | None  # int32 [M] concatenated kept sets, or None when no sample has one
    kept_offsets: torch.Tensor | None  # long [N + 1]
    routed_experts: torch.Tensor | None  # long [B, T-1, L, K] (rows beyond a sample's length are 0); packed [1, T]
    route_valid: torch.Tensor | None  # bool [B, T-1]; False where no route was recorded (padding, a sample's end)
    num_seqs: int
    domains: list[str]
    position_ids: torch.Tensor | None = None  # long [1, T], packed only
    cu_seqlens: torch.Tensor | None = None  # int32 [B + 1], packed only: where each sample starts, and T
    max_seqlen: int = 0  # packed only: the longest sample
    ref_logprobs: torch.Tensor | None = None  # float [N]; reference logprobs (0 for samples with kl_coef == 0)
    # On-policy distillation: float [N] teacher logprobs (0 for samples without a teacher; None when no sample of the
    # batch has one), and float [B] reward_coef / distill_coef (0 where the sample has no teacher logprobs)
    teacher_logprobs: torch.Tensor | None = None
    reward_coef: torch.Tensor | None = None
    distill_coef: torch.Tensor | None = None
    # float [N]; pi_old recomputed by the trainer before its first update (algorithm.old_logprobs=trainer), else
    # None: pi_old is the engine's inference_logprobs
    old_logprobs: torch.Tensor | None = None
    episode_share: torch.Tensor | None = None  # float [B]; `Trajectory.episode_share` (None = all 1)

    def to(self, device: torch.device | str) -> "TrainBatch":
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(self, name, host_to_device(value, device))
        return self


def host_to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`t.to(device)`; a CPU tensor goes to a GPU through pinned memory without blocking. A plain copy from pageable
    memory waits for every kernel queued before it (the previous micro-batch's backward), so the CPU could not queue
    the next micro-batch's work while the GPU is busy. torch keeps the pinned buffer until the copy has run."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def collate(trajs: list[Trajectory], pad_id: int, packed: bool = False) -> TrainBatch:
    """Right-pad a list of trajectories into a `TrainBatch` (see the alignment convention above), or with
    `packed` put them back to back in one row (no padding; see `TrainBatch`)."""
    if not trajs:
        raise ValueError("collate needs at least one trajectory")
    if any(t.payload is not None for t in trajs):  # else they would read as dataset rows without kept sets or routes
        raise ValueError("trajectories whose per-token arrays are still in the object store (Trajectory.payload): "
                         "fetch them first (trainer/payload.py fetch_heavy)")
    lengths = [t.num_tokens for t in trajs]
    B = len(trajs)
    # where each sample starts in the flattened [rows * T] layout
    if packed:
        T = int(sum(lengths))
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    else:
        T = max(lengths)
        starts = np.arange(B, dtype=np.int64) * T
    rows = 1 if packed else B
    input_ids = torch.full((rows, T), pad_id, dtype=torch.long)
    position_ids = torch.from_numpy(np.concatenate([np.arange(n) for n in lengths]))[None] if packed else None
    flat_ids = input_ids.view(-1)
    logit_index, seq_index = [], []
    for i, t in enumerate(trajs):
        ids = np.concatenate([t.prompt_ids, t.response_ids])
        a = int(starts[i])
        flat_ids[a : a + len(ids)] = torch.from_numpy(ids.astype(np.int64))
        P, R = len(t.prompt_ids), len(t.response_ids)
        logit_index.append(torch.arange(P - 1, P + R - 1) + a)
        seq_index.append(torch.full((R,), i, dtype=torch.long))
    cat = lambda xs, dtype: torch.from_numpy(np.concatenate(xs).astype(dtype)) if xs else torch.empty(0)  # noqa: E731

    # An empty response (an agent episode whose first prompt did not fit its window) has no positions, so no kept
    # sets or routes to agree on: it joins a batch of either kind.
    has = [t for t in trajs if len(t.response_ids)]
    with_logprobs = [t.inference_logprobs is not None for t in has]
    if any(with_logprobs) and not all(with_logprobs):
        raise ValueError("some trajectories of a batch carry inference_logprobs (sampled by an engine) and some do not "
                         "(dataset rows): one batch holds samples of one source")
    kept_ids = kept_offsets = None
    with_kept = [t.kept_offsets is not None for t in has]
    if any(with_kept):
        # "No kept set" means the full vocabulary; a batch mixing both would need a full-vocabulary row per
        # position, so the engines record sets for all samples of a step or for none.
        if not all(with_kept):
            raise ValueError("some trajectories of a batch carry a kept set (kept_ids) and some do not")
        kept = [t for t in trajs if t.kept_offsets is not None]
        kept_ids = torch.from_numpy(np.concatenate([np.asarray(t.kept_ids) for t in kept], dtype=np.int32))
        lens = np.concatenate([np.diff(np.asarray(t.kept_offsets, dtype=np.int64)) for t in kept])
        kept_offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))

    routed = route_valid = None
    with_routes = [t for t in trajs if t.routed_experts is not None]
    if with_routes:
        if any(t.routed_experts is None for t in has):
            raise ValueError("some trajectories of a batch carry routed_experts and some do not")
        L, K = with_routes[0].routed_experts.shape[1:]
        width = T if packed else max(T - 1, 1)
        routed = torch.zeros((rows, width, L, K), dtype=torch.long)
        route_valid = torch.zeros((rows, width), dtype=torch.bool)
        flat_routes, flat_valid = routed.view(rows * width, L, K), route_valid.view(-1)
        for i, t in enumerate(trajs):
            if t.routed_experts is None:
                continue
            n, a = t.routed_experts.shape[0], (int(starts[i]) if packed else i * width)
            flat_routes[a : a + n] = torch.from_numpy(t.routed_experts.astype(np.int64))
            # Every row of a sample's routes is one the engine recorded: __post_init__ holds them to exactly
            # len(prompt) + len(response) - 1 rows, and the vLLM engine refuses a short answer rather than pad it
            # (rollout/vllm_engine.py align_routes), so only the batch's padding stays invalid (own routing there).
            flat_valid[a : a + n] = True

    inference_logprobs = None  # dataset rows: no engine sampled them
    if any(with_logprobs) or not has:
        inference_logprobs = cat([np.zeros(0) if t.inference_logprobs is None else t.inference_logprobs for t in trajs],
                                 np.float32)
    teacher_logprobs = None
    if any(t.teacher_logprobs is not None for t in trajs):
        teacher_logprobs = cat([t.teacher_logprobs if t.teacher_logprobs is not None else np.zeros(len(t.response_ids))
                                for t in trajs], np.float32)
    reward_coef = torch.tensor([t.reward_coef for t in trajs], dtype=torch.float32)
    distill_coef = torch.tensor([t.distill_coef if t.teacher_logprobs is not None else 0.0 for t in trajs],
                                dtype=torch.float32)
    return TrainBatch(
        input_ids=input_ids,
        logit_index=torch.cat(logit_index),
        targets=cat([t.response_ids for t in trajs], np.int64),
        seq_index=torch.cat(seq_index),
        loss_mask=cat([t.loss_mask_or_ones() for t in trajs], np.float32),
        inference_logprobs=inference_logprobs,
        advantages=torch.tensor([t.advantage for t in trajs], dtype=torch.float32),
        kl_coef=torch.tensor([t.kl_coef for t in trajs], dtype=torch.float32),
        opsm_delta=torch.tensor(
            [float("inf") if t.opsm_delta is None else t.opsm_delta for t in trajs], dtype=torch.float32
        ),
        kept_ids=kept_ids,
        kept_offsets=kept_offsets,
        routed_experts=routed,
        route_valid=route_valid,
        num_seqs=B,
        domains=[t.domain for t in trajs],
        position_ids=position_ids,
        cu_seqlens=torch.from_numpy(np.append(starts, T).astype(np.int32)) if packed else None,
        max_seqlen=max(lengths) if packed else 0,
        ref_logprobs=(
            cat([t.ref_logprobs if t.ref_logprobs is not None else np.zeros(len(t.response_ids)) for t in trajs], np.float32)
            if any(t.ref_logprobs is not None for t in trajs)
            else None
        ),
        teacher_logprobs=teacher_logprobs,
        reward_coef=reward_coef,
        distill_coef=distill_coef,
        episode_share=torch.tensor([t.episode_share for t in trajs], dtype=torch.float64),  # exact ratios of counts
    )
