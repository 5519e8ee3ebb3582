"""The rubric judge's model: an engine from `rollout/engines.py` behind the callables `rewards.judge.RubricJudge`
takes, and `JudgeWorker`, the Ray actor body that serves one judge to every reward worker (they hold its handle).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from rewards.judge import RubricJudge, judge_config, judge_tensor_parallel_size
from rl.config import to_plain
from rl.models import resolve_model_path
from rollout.engines import make_engine, set_environment
from rollout.sampling import SamplingParams, decode_response
from trainer.dist import wait_for

logger = logging.getLogger(__name__)


def judge_from_engine(engine, **kwargs) -> RubricJudge:
    """A RubricJudge over a rollout engine: text generation through `engine.generate`, next-token logprobs through
    `engine.next_token_logprobs` when the engine has it. `kwargs` are RubricJudge's (mode, score_max, ...)."""

    def generate_texts(prompts: list[list[int]], max_new_tokens: int, temperature: float, seed: int) -> list[str]:
        sp = SamplingParams(n=1, temperature=temperature, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens,
                            seed=seed, record_kept_set=False)
        return [decode_response(engine.tokenizer, g.response_ids) for (g,) in engine.generate(prompts, sp)]

    return RubricJudge(engine.tokenizer, generate_texts, getattr(engine, "next_token_logprobs", None), **kwargs)


def judge_engine_config(cfg: Mapping, model_path: str | None = None) -> tuple[dict, dict, str]:
    """(rollout section, model section, model path) the judge's engine is built from: the run's, with the judge's own
    keys (`rewards.judge`, its own tensor parallelism) and what a judge never does (sleep, sync, capture) taken out."""
    j = judge_config(cfg.get("rewards"))
    mcfg = dict(cfg.get("model") or {})
    path = resolve_model_path(j["model"] or model_path or mcfg.get("path") or "embedded:tiny-moe")
    rcfg = {"engine": "hf", "device": "auto", "max_batch_size": 64, "top_k": 0, **dict(cfg.get("rollout") or {})}
    # An inherited `vllm` becomes `auto`: a judge actor without a GPU (rewards.judge.num_gpus=0) then runs on the
    # transformers engine instead of failing; `rewards.judge.engine=vllm` insists on vLLM.
    rcfg["engine"] = j["engine"] or ("auto" if rcfg["engine"] == "vllm" else rcfg["engine"])
    rcfg["device"] = j["device"] or rcfg["device"]
    rcfg["max_batch_size"] = int(j["batch_size"] or rcfg["max_batch_size"])
    rcfg["enable_sleep_mode"] = False  # the judge keeps its weights; nothing syncs into it
    # its own tensor parallelism (rewards.judge.tensor_parallel_size), not the rollout's: its GPUs and shares are
    # placed apart (launch/placement.py judge_env); more than one GPU is vLLM's
    rcfg["tensor_parallel_size"] = judge_tensor_parallel_size(j)
    if rcfg["tensor_parallel_size"] > 1:
        rcfg["engine"] = "vllm"
    rcfg["logprobs"] = 1  # vLLM: the judge needs no Keep-Sampling-Mask capture
    # the rollout's extra vLLM arguments were set for the policy's engine (a kv_cache_memory_bytes there is the
    # policy's KV cache, a start plan the user made for it): the judge has its own, rewards.judge.engine_args
    rcfg["engine_args"] = dict(j["engine_args"] or {})
    # so were its context and concurrency (the judge's prompts run to rewards.judge.max_prompt_tokens): vLLM's defaults
    rcfg["max_model_len"] = rcfg["max_num_seqs"] = None
    if j["gpu_memory_utilization"]:
        rcfg["gpu_memory_utilization"] = j["gpu_memory_utilization"]
    mcfg["dtype"] = j["dtype"] or mcfg.get("dtype") or "float32"
    mcfg.setdefault("attn_implementation", "sdpa")
    return rcfg, mcfg, path


def build_judge(cfg: Mapping, model_path: str | None = None) -> RubricJudge:
    """RubricJudge from the resolved config: `rewards.judge` + `rollout`/`model` as the engine's defaults.

    Model: `rewards.judge.model`, else `model_path` (the driver's resolved policy path), else `model.path`.
    The engine comes from `rollout.engines.make_engine`, so `rollout.engine` (or `rewards.judge.engine`) picks
    vLLM on GPU and transformers on CPU, exactly like the rollout workers.
    """
    j = judge_config(cfg.get("rewards"))
    rcfg, mcfg, path = judge_engine_config(cfg, model_path)
    engine = make_engine(rcfg, mcfg, path, record_routes=False, seed=int(cfg.get("seed") or 0))
    judge = judge_from_engine(engine, mode=j["mode"], score_max=int(j["score_max"]),
                              max_prompt_tokens=int(j["max_prompt_tokens"]), max_new_tokens=int(j["max_new_tokens"]),
                              temperature=float(j["temperature"]), seed=int(cfg.get("seed") or 0))
    logger.info("rubric judge: %s (%s engine, mode %s)", path, type(engine).__name__, judge.mode)
    return judge


class JudgeWorker:
    """Ray actor body: one judge model shared by every RewardWorker (they hold its handle)."""

    def __init__(self, cfg: Mapping, model_path: str | None = None, after: list = (),
                 env: dict[str, str | None] | None = None):
        """`after`: ready calls of the vLLM instances that must measure this GPU's free memory first (`wait_for`).
        `env`: where a tensor-parallel judge's Ray workers go (launch.placement.GpuPlacement.judge_env)."""
        set_environment(env)
        wait_for(after)
        self.judge = build_judge(to_plain(cfg), model_path)

    def ready(self) -> bool:
        return True

    def score(self, requests: list[dict]) -> list[dict]:
        return self.judge.score(requests)
