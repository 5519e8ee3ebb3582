"""Generation requests submitted and finished one at a time: how the agent's per-episode scheduling
(`agent.schedule=per_episode`, rollout/agent.py) drives an engine.

A stream takes requests at any time (`submit(prompt_ids, sp, seed) -> key`, one sample each) and hands back the
finished ones (`wait() -> [(key, Generation)]`) while others are still generating, so the caller can submit an
episode's next turn as soon as that episode's tool results are in, with no barrier across episodes.

- `VLLMStream` (`VLLMEngine.stream`): vLLM's engine loop driven directly (`LLM.enqueue` adds a request, each
  `wait` runs one `LLMEngine.step`), so a request joins the running batch at the next step (continuous batching)
  and comes back at the step it ends. With the sampler capture (rollout.capture=sampler) recording runs from the
  stream's start to `close()`, which fills in the logprobs and kept sets of every Generation the stream handed
  out (zeros until then: read them after `close`). Tokens, finish reason and routes come at once.
- `BatchStream`: any engine with `generate(prompts, sp, seeds=)` (the transformers engine): `wait` generates every
  request pending at that moment in one call per distinct sampling setting and returns them all.

Seeds: a request carries its own seed (used when sp.seed is set; vLLM honours it with rollout.per_request_seed),
so its sample depends on its prompt and seed, not on which other requests share its batch. That is what makes
per-episode scheduling give the same episodes as lockstep: exactly on the transformers engine when it generates one
request per batch (rollout.max_batch_size=1); batched kernels may differ in their last bits otherwise.
"""

from __future__ import annotations

import dataclasses
import logging

from rollout.sampling import Generation, SamplingParams

log = logging.getLogger(__name__)


def open_stream(engine, sp: SamplingParams):
    """The engine's own stream where it has one (vLLM), else a `BatchStream` over its `generate`."""
    return engine.stream(sp) if callable(getattr(engine, "stream", None)) else BatchStream(engine)


class BatchStream:
    """Requests pending until the next `wait`, which generates them all (see the module docstring)."""

    def __init__(self, engine):
        self.engine = engine
        self._pending: list[tuple[int, list[int], SamplingParams, int | None]] = []
        self._next = 0

    def __len__(self) -> int:
        """Requests submitted and not handed back yet."""
        return len(self._pending)

    def submit(self, prompt_ids: list[int], sp: SamplingParams, seed: int | None = None) -> int:
        key, self._next = self._next, self._next + 1
        self._pending.append((key, list(prompt_ids), dataclasses.replace(sp, n=1), seed))
        return key

    def wait(self) -> list[tuple[int, Generation]]:
        pending, self._pending = self._pending, []
        groups: dict[str, list] = {}
        for item in pending:  # one engine call per sampling setting (budgets differ between episodes)
            groups.setdefault(repr(dataclasses.replace(item[2], seed=None)), []).append(item)
        out = []
        for items in groups.values():
            sp = items[0][2]
            seeds = None if sp.seed is None else [sp.seed if s is None else s for *_, s in items]
            for (key, *_), (g,) in zip(items, self.engine.generate([p for _, p, _, _ in items], sp, seeds=seeds)):
                out.append((key, g))
        return out

    def close(self) -> None:
        self._pending = []


class VLLMStream:
    """vLLM's engine stepped by the caller (see the module docstring). Built by `VLLMEngine.stream`."""

    def __init__(self, engine, sp: SamplingParams):
        self.engine = engine
        self.hook = engine.capture == "sampler"
        self.want_mask = sp.records_kept_sets
        self._live: dict[str, int] = {}  # vLLM's request id (as outputs carry it) -> prompt length
        self._handed: list[tuple[str, int, Generation]] = []  # for close's capture
        if self.hook:
            from rollout.vllm_capture import start_rpc

            engine.llm.collective_rpc(start_rpc, args=(engine.kept_buffer_ids if self.want_mask else 0,
                                                       engine.capture_profile))

    def __len__(self) -> int:
        return len(self._live)

    def submit(self, prompt_ids: list[int], sp: SamplingParams, seed: int | None = None) -> str:
        from rollout.vllm_capture import request_key

        one = dataclasses.replace(sp, n=1, seed=sp.seed if seed is None or sp.seed is None else seed)
        vsp = self.engine._sampling_params(one, capture=not self.hook)
        (internal,) = self.engine.llm.enqueue(self.engine._prompts([prompt_ids]), vsp, use_tqdm=False)
        key = request_key(internal)  # outputs carry the id without vLLM's random suffix
        self._live[key] = len(prompt_ids)
        return key

    def wait(self) -> list[tuple[str, Generation]]:
        """One engine step; the requests it finished (often none)."""
        if not self._live:
            return []
        out = []
        for o in self.engine.llm.llm_engine.step():
            if not getattr(o, "finished", False) or o.request_id not in self._live:
                continue
            P = self._live.pop(o.request_id)
            (comp,) = o.outputs
            g = self.engine._generation(comp, P)
            if self.hook:
                self._handed.append((o.request_id, P, g))
            else:
                self.engine._apply_logprobs_output(g, comp, self.want_mask)
            out.append((o.request_id, g))
        return out

    def close(self) -> None:
        """Abort what is still running; with the sampler capture, stop recording and fill in the logprobs and kept
        sets of every Generation handed out."""
        if self._live:
            self.engine.llm.llm_engine.abort_request(list(self._live))
            while self.engine.llm.llm_engine.has_unfinished_requests():  # let the aborts go through
                self.engine.llm.llm_engine.step()
            self._live = {}
        if not self.hook:
            return
        from rollout.vllm_capture import assemble, collect_rpc, completion_key

        rows = next((r for r in self.engine.llm.collective_rpc(collect_rpc) if r is not None),
                    {"error": "no vLLM worker returned the recorded rows"})
        if "error" in rows:
            raise RuntimeError(f"rollout.capture=sampler failed inside vLLM ({rows['error']}); set "
                               "rollout.capture=logprobs to take vLLM's logprobs output instead")
        handed, self._handed = self._handed, []
        keys = [(completion_key(rid, 0, 1), P, g.response_ids) for rid, P, g in handed]
        for (_, _, g), c in zip(handed, assemble(rows, keys)):
            self.engine._apply_sampler_rows(g, c)
        cut = sum(g.kept_set_cut for _, _, g in handed)
        if cut:
            log.warning("Keep Sampling Mask: the kept sets of %d sampled positions could not be recorded whole; they "
                        "are left out of the loss (rollout/kept_set_cut_frac): raise rollout.kept_set_buffer_mb", cut)
