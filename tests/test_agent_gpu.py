"""Multi-turn agent episodes on vLLM (`-m gpu`): a 3-turn episode at top_p < 1 on a small random MoE in float32;
the trainer's logprob of every generated token over its kept set matches vLLM's and the stitched routes replay
(the CPU version, on the transformers engine, is tests/test_agent.py)."""

import os

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("vllm")
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")

from launch.testbed import MOE_SMALL, build_model  # noqa: E402
from rl.models import load_causal_lm  # noqa: E402
from rl.trajectory import Trajectory, collate  # noqa: E402
from rollout.agent import AgentConfig, AgentRunner  # noqa: E402
from rollout.sampling import SamplingParams  # noqa: E402
from trainer.forward import forward_logprobs, route_replay  # noqa: E402


def _diff(model, trajs, pad_id):
    batch = collate(trajs, pad_id).to("cuda")
    with torch.no_grad(), route_replay(model, batch, True) as replay:
        out = forward_logprobs(model, batch, temperature=1.0)
    return (out.logprobs - batch.inference_logprobs).abs()[batch.loss_mask > 0], replay


@pytest.mark.parametrize("schedule", ["lockstep", "per_episode"])
def test_three_turn_episodes_on_vllm_are_exact(tmp_path, schedule):
    """Stitching adds no error: the trainer-vs-vLLM gap over 3-turn episodes is the gap of plain single-turn
    generations from the same prompts (vLLM's fp32 MoE kernels multiply in TF32, so neither is ~1e-6); a token
    misaligned by the stitching would differ by nats, not thousandths. per_episode: the turns go through vLLM's
    stream (rollout/engine_stream.py), whose capture fills each turn's logprobs and kept sets in at its close."""
    from rollout.vllm_engine import VLLMEngine

    path = build_model(tmp_path / "moe", MOE_SMALL)
    engine = VLLMEngine(path, dtype="float32", gpu_memory_utilization=0.3, capture="sampler", record_routes=True,
                        enforce_eager=True, max_logprobs=64)
    runner = AgentRunner(engine, engine.tokenizer, AgentConfig(env="smoke", max_turns=3, max_context_tokens=3000,
                                                               schedule=schedule))
    requests = [{"group_id": f"g{i}", "domain": "agent", "prompt_ids": [], "prompt_text": "",
                 "sample": {"id": f"smoke-{i}", "prompt": ""}} for i in range(4)]
    sp = SamplingParams(n=2, temperature=1.0, top_p=0.9, max_new_tokens=32, seed=None)
    trajs = runner.run(requests, sp)
    assert len(trajs) == 8 and all(t.episode["turns"] == 3 for t in trajs)
    for t in trajs:
        assert t.routed_experts.shape[0] == len(t.prompt_ids) + t.num_response_tokens - 1 and t.kept_set_cut == 0
    prompts = [t.prompt_ids.tolist() for t in trajs[::2]]
    single = [Trajectory(uid=f"s{i}-{j}", group_id=f"s{i}", domain="agent", prompt_ids=p, response_ids=g.response_ids,
                         inference_logprobs=g.inference_logprobs, kept_ids=g.kept_ids, kept_offsets=g.kept_offsets,
                         routed_experts=g.routed_experts)
              for i, (p, gs) in enumerate(zip(prompts, engine.generate(prompts, sp))) for j, g in enumerate(gs)]
    model = load_causal_lm(path, "float32", "sdpa", "cuda").eval()
    multi, replay = _diff(model, trajs, engine.tokenizer.pad_token_id)
    base, _ = _diff(model, single, engine.tokenizer.pad_token_id)
    print(f"\nvLLM multi-turn, fp32: mean |dlogp| {float(multi.mean()):.2e} (max {float(multi.max()):.2e}) over "
          f"{multi.numel()} tokens; single-turn from the same prompts {float(base.mean()):.2e} (max "
          f"{float(base.max()):.2e}); route mismatch {replay.mismatch_frac:.4f}")
    assert replay.total_count > 0 and replay.mismatch_frac < 0.01
    assert float(multi.mean()) < 2 * float(base.mean()) + 1e-4 and float(multi.max()) < 0.05


def test_seeded_episodes_of_a_task_differ_and_repeat(tmp_path):
    """rollout.per_request_seed: the n episodes of a task start from one prompt in one engine call, so each prompt
    of the call needs its own seed; the same seed gives the same episodes again."""
    from rollout.vllm_engine import VLLMEngine

    path = build_model(tmp_path / "moe", MOE_SMALL)
    engine = VLLMEngine(path, dtype="float32", gpu_memory_utilization=0.3, enforce_eager=True, per_request_seed=True)
    runner = AgentRunner(engine, engine.tokenizer, AgentConfig(env="smoke", max_turns=2, max_context_tokens=3000))
    requests = [{"group_id": "g", "domain": "agent", "prompt_ids": [], "prompt_text": "",
                 "sample": {"id": "smoke-0", "prompt": ""}}]
    sp = SamplingParams(n=4, temperature=1.0, top_p=1.0, max_new_tokens=32, seed=1234)
    first = [t.response_ids.tolist() for t in runner.run(requests, sp)]
    again = [t.response_ids.tolist() for t in runner.run(requests, sp)]
    assert len({tuple(r) for r in first}) == 4, first
    assert first == again


def test_per_episode_and_lockstep_sample_alike_on_vllm(tmp_path):
    """rollout.per_request_seed: each turn's request carries the episode's own seed under both schedules, so the
    episodes agree wherever vLLM's batched kernels give the same numbers (prints how many agree; CPU: exactly,
    tests/test_agent_schedule.py)."""
    from rollout.vllm_engine import VLLMEngine

    path = build_model(tmp_path / "moe", MOE_SMALL)
    engine = VLLMEngine(path, dtype="float32", gpu_memory_utilization=0.3, enforce_eager=True, per_request_seed=True)
    requests = [{"group_id": f"g{i}", "domain": "agent", "prompt_ids": [], "prompt_text": "",
                 "sample": {"id": f"smoke-{i}", "prompt": ""}} for i in range(4)]
    sp = SamplingParams(n=4, temperature=1.0, top_p=0.9, max_new_tokens=32, seed=77)
    runs = {}
    for schedule in ("lockstep", "per_episode"):
        runner = AgentRunner(engine, engine.tokenizer, AgentConfig(env="smoke", max_turns=3, max_context_tokens=3000,
                                                                   schedule=schedule))
        runs[schedule] = [t.response_ids.tolist() for t in runner.run(requests, sp)]
    same = sum(a == b for a, b in zip(runs["lockstep"], runs["per_episode"]))
    firsts = sum(a[:8] == b[:8] for a, b in zip(runs["lockstep"], runs["per_episode"]))
    print(f"\nvLLM fp32, seeded: {same}/16 episodes identical under both schedules, {firsts}/16 agree on 8 tokens")
    assert firsts >= 12 and len({tuple(r) for r in runs["per_episode"]}) > 1
