"""Issue 68 item 5 (a): a weight sync whose prefix-cache reset vLLM refuses must not pass silently.

vLLM's `LLM.reset_prefix_cache()` returns False when it could not reset (running requests still hold KV blocks).
Before the fix the engine ignored that answer: requests sent after the sync would reuse prefix KV computed with the
old weights (and, with Keep Routing, the routes cached with it). Now a refused reset raises `PrefixCacheNotReset`
(at once: the engine core runs in the rollout worker's process, so nothing a retry could wait for moves meanwhile).

vLLM cannot run on this CPU machine, so the CPU tests drive `VLLMEngine.reset_prefix_cache` with an object standing
in for `vllm.LLM` (only the reset call and the engine's request count). The `gpu` test checks the same contract
against a real vLLM 0.26 engine on the device machine.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp

import pytest

from rollout.vllm_engine import VLLMEngine


class _LLMStandIn:
    """Stands in for vllm.LLM: `reset_prefix_cache()` gives `answer`; its engine counts `running` requests."""

    def __init__(self, answer, running: int = 2):
        self.answer, self.calls = answer, 0
        self.llm_engine = type("Engine", (), {"get_num_unfinished_requests": lambda _self: running})()

    def reset_prefix_cache(self):
        self.calls += 1
        return self.answer


def _engine(llm) -> VLLMEngine:
    engine = VLLMEngine.__new__(VLLMEngine)  # no vLLM here: only the attribute reset_prefix_cache uses
    engine.llm = llm
    return engine


def test_a_refused_prefix_cache_reset_raises_a_named_error():
    """Before: reset_prefix_cache() returned None after vLLM answered False (pytest.raises: DID NOT RAISE)."""
    llm = _LLMStandIn(False)
    with pytest.raises(RuntimeError, match=r"prefix cache") as err:
        _engine(llm).reset_prefix_cache()
    assert type(err.value).__name__ == "PrefixCacheNotReset"
    msg = str(err.value)
    assert "2 requests still running" in msg and "old weights" in msg and "\n" not in msg, msg
    assert llm.calls == 1


def test_a_reset_that_goes_through_is_called_once():
    llm = _LLMStandIn(True)
    _engine(llm).reset_prefix_cache()
    assert llm.calls == 1


def test_the_rollout_worker_weight_sync_passes_the_error_on():
    """The sync's last call on a rollout worker (`end_weight_update`, which the driver's weight sync waits for) ends
    with the error rather than carrying on with a stale cache."""
    from rollout.worker import RolloutWorker

    engine = _engine(_LLMStandIn(False))
    engine.finish_weight_update = engine.wake_up = lambda *a, **k: None
    worker = RolloutWorker.__new__(RolloutWorker)
    worker.engine = engine
    with pytest.raises(RuntimeError, match="prefix cache"):
        worker.end_weight_update()


@pytest.mark.gpu
def test_real_vllm_refuses_a_reset_while_a_request_runs_and_the_engine_raises(tmp_path):
    """vLLM 0.26 on the device: reset_prefix_cache() answers True when idle and False while a request holds blocks;
    VLLMEngine then raises PrefixCacheNotReset; once the request is aborted the reset goes through."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from launch.testbed import DENSE_SMALL, build_model

    path = build_model(tmp_path / "dense", DENSE_SMALL)
    # In a process of its own: vLLM keeps process-wide state (parallel groups) that a later engine of another
    # model in the same pytest process would trip over.
    with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        pool.submit(_reset_refused_while_a_request_runs, path).result()


def _reset_refused_while_a_request_runs(path):
    from vllm import SamplingParams as VSP

    from rollout.vllm_engine import PrefixCacheNotReset

    engine = VLLMEngine(path, gpu_memory_utilization=0.2, record_routes=False, enforce_eager=True)
    assert engine.llm.reset_prefix_cache() is True  # idle: a bool, True
    core = engine.llm.llm_engine
    core.add_request("long", {"prompt_token_ids": list(range(10, 60))},
                     VSP(max_tokens=3000, ignore_eos=True, temperature=1.0, detokenize=False))
    for _ in range(3):
        core.step()  # the request is running and holds KV blocks
    assert engine.llm.reset_prefix_cache() is False
    with pytest.raises(PrefixCacheNotReset):
        engine.reset_prefix_cache()
    core.abort_request(["long"])
    while core.has_unfinished_requests():
        core.step()
    engine.reset_prefix_cache()
    assert engine.llm.reset_prefix_cache() is True
