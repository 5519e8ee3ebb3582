"""Issue 68 item 5 (b): route rows the engine did not record must never be replayed.

Keep Routing's routes flow: vLLM's `CompletionOutput.routed_experts` -> `align_routes` (rollout/vllm_engine.py) ->
`Generation.routed_experts` -> `Trajectory.routed_experts` (exactly len(prompt) + len(response) - 1 rows, checked
when the Trajectory is built) -> `collate` (rl/trajectory.py), which marks a sample's rows valid in
`TrainBatch.route_valid` -> `RouteReplay(model, routed_experts, route_valid)` (rl/routing.py), which forces the ids at
valid positions. Before the fix `align_routes` padded a short answer from vLLM with rows of zeros, and `collate` marked
them valid like every other row, so the trainer replayed expert 0 there. Which of a short answer's positions are
missing is not known (vLLM's rows start at position 0 in 0.26, but a prefill/decode-disaggregated engine leaves the
prompt's rows out), so no row of it can be trusted: `align_routes` now raises `RouteRowsMissing`, and every row that
reaches `collate` is a recorded one.

Real arrays and a tiny random Qwen3-MoE on CPU; the vLLM completion is a plain object with the fields the engine reads.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM

from rl.routing import RouteRecorder, RouteReplay, moe_layer_indices, stack_records
from rl.trajectory import Trajectory, collate
from rollout.vllm_engine import VLLMEngine, align_routes

U8 = np.dtype(np.uint8)


def _model():
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=128, num_hidden_layers=3, moe_intermediate_size=16, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1], head_dim=8, bos_token_id=1, eos_token_id=2,
        pad_token_id=0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).float().eval()


def _recorded_routes(model, ids: torch.Tensor) -> np.ndarray:
    """The model's own routes of `ids` [1, S]: [S - 1, L, K] (the last token's row dropped, as vLLM returns them)."""
    with torch.no_grad(), RouteRecorder(model) as rec:
        model(ids)
    return stack_records(rec.records)[0, :-1]


def test_rows_vllm_did_not_return_are_never_replayed():
    """vLLM returned 3 rows fewer than the sequence has. Either the rows are refused, or no position without a
    recorded route is replayed: replaying the model's own routes must change nothing. Before: the 3 padded rows
    were replayed as expert 0 (RouteReplay counted them as mismatches and the logits moved)."""
    model = _model()
    P, R = 5, 7
    ids = torch.randint(3, 100, (1, P + R), generator=torch.Generator().manual_seed(1))
    own = _recorded_routes(model, ids)
    dense = [i for i in range(3) if i not in moe_layer_indices(model.config)]
    short = own[:-3]  # what a short answer from vLLM would hold
    try:
        routes = align_routes(short, P + R - 1, dense, U8)
    except ValueError as e:  # the fix: refused, naming the counts
        assert type(e).__name__ == "RouteRowsMissing" and "for 8 of the sequence's 11 positions" in str(e), e
        return
    t = Trajectory(uid="a", group_id="g", domain="math", prompt_ids=ids[0, :P].numpy(),
                   response_ids=ids[0, P:].numpy(), inference_logprobs=np.zeros(R, np.float32), routed_experts=routes)
    batch = collate([t], pad_id=0)
    with torch.no_grad():
        ref = model(batch.input_ids).logits
        with RouteReplay(model, batch.routed_experts, batch.route_valid) as rp:
            out = model(batch.input_ids).logits
    replayed = batch.route_valid[0].nonzero().squeeze(1).tolist()
    assert rp.mismatch_count == 0, (
        f"positions {replayed} were replayed, {P + R - 1 - 3} of them recorded; the rest carried the padding "
        f"(expert 0): {rp.mismatch_count} (position, layer) pairs forced onto other experts")
    assert (out - ref).abs().max().item() < 1e-5


def test_align_routes_refuses_a_short_answer_and_takes_a_whole_one():
    routes = np.random.default_rng(0).integers(0, 8, size=(12, 4, 2)).astype(np.uint8)
    with pytest.raises(ValueError, match=r"routed_experts for 12 of the sequence's 14 positions"):
        align_routes(routes, 14, [], U8)
    whole = align_routes(routes, 12, [0], U8)
    assert whole.shape == (12, 4, 2) and (whole[:, 0] == 0).all() and (whole[:, 1:] == routes[:, 1:]).all()
    # a longer answer keeps its first rows: vLLM's rows are positions 0, 1, ... of the sequence
    assert (align_routes(routes, 10, [], U8) == routes[:10]).all()


def test_the_engine_refuses_a_completion_with_missing_route_rows():
    """The vLLM engine's conversion of one completion (`VLLMEngine._generation`) with a real route array."""
    engine = VLLMEngine.__new__(VLLMEngine)  # no vLLM here: only what _generation reads
    engine.record_routes, engine.dense_layers, engine.route_dtype = True, [1], U8
    P, R = 4, 6
    routes = np.random.default_rng(1).integers(0, 8, size=(P + R - 1, 3, 2)).astype(np.uint8)
    comp = SimpleNamespace(token_ids=list(range(10, 10 + R)), finish_reason="stop", routed_experts=routes)
    g = engine._generation(comp, P)
    assert g.routed_experts.shape == (P + R - 1, 3, 2) and (g.routed_experts[:, 1] == 0).all()
    comp.routed_experts = routes[:-1]
    with pytest.raises(ValueError, match="Keep Routing"):
        engine._generation(comp, P)


def test_every_row_collate_marks_valid_was_recorded():
    """collate marks all of a sample's rows valid because a Trajectory's routes have exactly one row per position
    the model processed: a route array of any other length is refused where the sample is built."""
    base = dict(uid="a", group_id="g", domain="math", prompt_ids=[1, 2, 3], response_ids=[4, 5],
                inference_logprobs=np.zeros(2, np.float32))
    for rows in (3, 5):
        with pytest.raises(ValueError, match=r"routed_experts has \d rows, expected len\(prompt\)\+len\(response\)-1"):
            Trajectory(**base, routed_experts=np.zeros((rows, 2, 1), np.uint8))
    t = Trajectory(**base, routed_experts=np.ones((4, 2, 1), np.uint8))
    short = Trajectory(**{**base, "uid": "b", "response_ids": [4], "inference_logprobs": np.zeros(1, np.float32)},
                       routed_experts=np.ones((3, 2, 1), np.uint8))
    batch = collate([t, short], pad_id=0)
    assert batch.route_valid.tolist() == [[True] * 4, [True] * 3 + [False]]  # the padding of the batch only


@pytest.mark.gpu
def test_real_vllm_returns_a_route_row_for_every_position(tmp_path):
    """vLLM 0.26 on the device, a small Qwen3-MoE with a dense layer: every completion's routes have one row per
    position, also when the prompts hit the prefix cache (the same prompts again), so align_routes never refuses a
    real answer."""
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from launch.testbed import MOE_SMALL, build_model

    path = build_model(tmp_path / "moe", MOE_SMALL)
    # In a process of its own: vLLM keeps process-wide state (parallel groups) that this MoE engine would trip over
    # after another test's engine in the same pytest process.
    with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        pool.submit(_every_position_has_a_route_row, path).result()


def _every_position_has_a_route_row(path):
    from launch.testbed import chat_prompts
    from rollout.sampling import SamplingParams

    engine = VLLMEngine(path, gpu_memory_utilization=0.2, record_routes=True, enforce_eager=True)
    prompts = chat_prompts(engine.tokenizer, 4)
    sp = SamplingParams(n=2, temperature=1.0, top_p=0.9, top_k=32, max_new_tokens=48)
    for _ in range(2):  # the second pass reuses the first one's cached prompt blocks
        for prompt, gens in zip(prompts, engine.generate(prompts, sp)):
            for g in gens:
                assert g.routed_experts.shape == (len(prompt) + len(g.response_ids) - 1, 4, 2)
                assert (g.routed_experts[:, 0] == 0).all() and (g.routed_experts[:, 1:] < 8).all()
