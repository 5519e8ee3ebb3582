"""One agent episode's state while it runs (`Episode`), how its tokens become a `Trajectory`'s arrays
(`segment_arrays`), and the text guards every model- or tool-written string passes (`safe_text`).

An episode's response is built turn by turn from two kinds of parts, kept in order in `Episode.parts`: a model turn
(the engine's `Generation`, whose tokens are trained on) and a run of tokens the model did not write (tool results,
the next turn's prefill: an int, their count; loss mask 0). The per-token arrays a sample needs (inference
logprobs, loss mask, kept sets) are read from the parts only when the trajectory is built (`segment_arrays`):
vLLM's per-episode stream fills in a turn's logprobs and kept sets when the stream closes, after the episode has
moved on (rollout/engine_stream.py). The token ids themselves and the routes are known at once (the next turn's
context needs them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rl.trajectory import Trajectory
from rollout.sampling import Generation


def safe_text(text) -> str:
    """`text` as the tokenizer (and a UTF-8 file) takes it: lone surrogates (a JSON "\\ud800", bytes decoded with
    surrogateescape) become U+FFFD, a surrogate pair held as two code points becomes its character, NULs become
    U+FFFD; anything not a string is str()-ed. Valid text comes back unchanged; idempotent."""
    if not isinstance(text, str):
        text = str(text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # only surrogates fail: utf-16 joins the pairs and replaces the lone ones
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


def safe_value(value):
    """`safe_text` over every string of a JSON-like value (a parsed tool call's arguments may hold lone surrogates)."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {safe_text(k): safe_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [safe_value(v) for v in value]
    return value


def describe(exc: BaseException) -> str:
    try:
        return safe_text(f"{type(exc).__name__}: {exc}")[:500]
    except Exception:  # noqa: BLE001 - an exception whose str() raises still has a name
        return type(exc).__name__


def renderable(fmt, messages: list[dict]) -> list[dict]:
    """An episode's messages as its format's `initial_prompt` renders them: a hermes template that does not take the
    `tool` role gets each turn's results in one user message (wrapped in <tool_response> where the format wraps
    them), as `tool_results_text` does; one without native tools gets the calls as text in the assistant turn."""
    from rollout.tool_format import RESPONSE_CLOSE, RESPONSE_OPEN

    role, wrap = getattr(fmt, "tool_role", "tool"), getattr(fmt, "wrap_results", False)
    native = getattr(fmt, "native_tools", True)
    out: list[dict] = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "tool":
            content = f"{RESPONSE_OPEN}\n{m['content']}\n{RESPONSE_CLOSE}" if wrap else m["content"]
            if role != "tool" and out and out[-1].get("role") == role and out[-1].get("_results"):
                out[-1]["content"] += "\n" + content
                continue
            m = {"role": role, "content": content, **({"_results": True} if role != "tool" else {})}
        elif m.get("role") == "assistant" and m.get("tool_calls") and not native:
            calls = [(c["function"]["name"], c["function"]["arguments"]) for c in m.pop("tool_calls")]
            m["content"] = "\n".join(x for x in ((m.get("content") or "").strip(), fmt.call_text(calls)) if x)
        out.append(m)
    return [{k: v for k, v in m.items() if k != "_results"} for m in out]


@dataclass
class Episode:
    request: dict
    index: int
    session: object
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    generated: list[bool] = field(default_factory=list)
    parts: list = field(default_factory=list)  # Generation (a model turn) | int (tokens it did not write), in order
    routes: np.ndarray | None = None
    texts: list[str] = field(default_factory=list)  # the model's decoded turns
    transcript: list[str] = field(default_factory=list)  # turns and tool results, for the logs
    calls: list[dict] = field(default_factory=list)  # {tool (as the model named it, log-safe), status, seconds, known}
    turns: int = 0  # model turns (a context summary is not one)
    generations: int = 0  # engine requests made: with sp.seed, the next one's seed (`AgentRunner._seed`)
    reason: str | None = None  # why it ended: submitted | answer | max_turns | length | tool_timeout | error
    error: str | None = None  # reason `error`: where and what
    tool_wall_s: float = 0.0
    parsed: object = None  # the last turn, parsed by the tool-call format
    cut_turn: bool = False  # the last turn stopped at max_new_tokens, without its end token
    thinking: bool = False  # the episode's thinking mode (the request's, else agent.thinking)
    format: object = None  # the tool-call format of that mode (AgentRunner.format_for)
    # The episode as chat messages (system, user, then assistant turns as the format parsed them and `tool` results
    # as the model saw them), for data generation (launch/generate.py); a demonstration's turns are not in it.
    messages: list[dict] = field(default_factory=list)
    tool_contents: list[str] = field(default_factory=list)  # the last tool message's results, as `tool` contents
    # agent.context_strategy: the closed context segments (`close_segment`), the response tokens they held (counted
    # against max_episode_tokens), resets and the context tokens they dropped; `summarizing`: the next generation
    # is the summary the policy was asked for (strategy summary)
    segments: list[dict] = field(default_factory=list)
    spent_tokens: int = 0
    context_resets: int = 0
    discarded_tokens: int = 0
    summarizing: bool = False
    held: list[dict] = field(default_factory=list)  # summary: the current turn and its results, for after it

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add_generation(self, g: Generation, turn: bool = True) -> None:
        """Appends one model turn (`turn` False: a summary, not counted in max_turns). Its logprobs and kept sets are
        read when the trajectory is built (`segment_arrays`); checked first, so that an engine output that does not
        add up fails the episode before anything of it is appended."""
        check_generation(g)
        ids = [int(t) for t in g.response_ids]
        routes = self.routes
        if g.routed_experts is not None:  # rows of this call's context + generation; keep what earlier turns had
            routes = g.routed_experts if routes is None else np.concatenate(
                [routes, g.routed_experts[len(routes):]], axis=0)
        self.response_ids += ids
        self.generated += [True] * len(ids)
        self.parts.append(g)
        self.routes = routes
        self.turns += int(turn)

    def add_tool_tokens(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.generated += [False] * len(ids)
        if ids:
            self.parts.append(len(ids))

    def segment(self) -> dict:
        """The current context segment's token state."""
        return {"prompt_ids": self.prompt_ids, "response_ids": self.response_ids, "generated": self.generated,
                "parts": self.parts, "routes": self.routes, "texts": self.texts}

    def close_segment(self, prompt: list[int], messages: list[dict], dropped: int) -> None:
        """agent.context_strategy: the current segment is closed and the episode goes on from `prompt` (the managed
        `messages` rendered), which drops `dropped` context tokens."""
        self.segments.append(self.segment())
        self.spent_tokens += len(self.response_ids)
        self.context_resets += 1
        self.discarded_tokens += dropped
        self.prompt_ids, self.response_ids, self.generated, self.parts, self.texts = prompt, [], [], [], []
        self.routes = None
        self.messages = messages


def check_generation(g: Generation) -> None:
    """Raises when an engine output does not add up: tokens, logprobs, loss mask and kept offsets of different
    lengths."""
    R = len(g.response_ids)
    n_mask = R if g.loss_mask is None else len(g.loss_mask)
    if len(g.inference_logprobs) != R or n_mask != R:
        raise ValueError(f"the engine returned {R} tokens with {len(g.inference_logprobs)} logprobs and {n_mask} "
                         "loss-mask values")
    if g.kept_offsets is not None and len(g.kept_offsets) != R + 1:
        raise ValueError(f"the engine returned {len(g.kept_offsets)} kept-set offsets for {R} tokens")


def segment_arrays(parts: list, n_tokens: int) -> dict:
    """A segment's per-token arrays from its parts: inference logprobs, loss mask (0 for tokens the model did not
    write and for positions whose kept set was cut), kept sets as CSR (None when no turn recorded any; then tokens
    the model did not write get empty sets) and the count of cut positions. Raises when an engine output does not
    add up (tokens, logprobs, loss mask and kept offsets of different lengths)."""
    logprobs, loss, kept_ids, counts, cut = [], [], [], [], 0
    with_kept = any(isinstance(p, Generation) and p.kept_offsets is not None for p in parts)
    for p in parts:
        if isinstance(p, Generation):
            check_generation(p)  # again: a stream fills logprobs and kept sets in after the turn was appended
            R = len(p.response_ids)
            lp = np.asarray(p.inference_logprobs, np.float32)
            lm = np.ones(R, np.float32) if p.loss_mask is None else np.asarray(p.loss_mask, np.float32)
            if p.kept_offsets is not None:
                offsets = np.asarray(p.kept_offsets, np.int64)
                kept_ids.append(np.asarray(p.kept_ids[offsets[0] : offsets[-1]], np.int32))
                counts.append(np.diff(offsets))
            elif with_kept:
                counts.append(np.zeros(R, np.int64))
            logprobs.append(lp)
            loss.append(lm)
            cut += int(p.kept_set_cut)
        else:
            logprobs.append(np.zeros(p, np.float32))
            loss.append(np.zeros(p, np.float32))
            if with_kept:
                counts.append(np.zeros(p, np.int64))
    lp = np.concatenate(logprobs) if logprobs else np.zeros(0, np.float32)
    if len(lp) != n_tokens:
        raise ValueError(f"the episode's parts hold {len(lp)} tokens, its response {n_tokens}")
    out = {"logprobs": lp, "loss": np.concatenate(loss) if loss else np.zeros(0, np.float32),
           "kept_ids": None, "kept_offsets": None, "kept_set_cut": cut}
    if with_kept:
        offsets = np.zeros(n_tokens + 1, np.int64)
        np.cumsum(np.concatenate(counts) if counts else np.zeros(0, np.int64), out=offsets[1:])
        out["kept_ids"] = np.concatenate(kept_ids) if kept_ids else np.zeros(0, np.int32)
        out["kept_offsets"] = offsets
    return out


def episode_trajectory(ep: Episode, env_name: str, outcome: dict, tok, managed: bool) -> Trajectory:
    """The episode as its `Trajectory`: the last context segment's sample (the whole episode when its context was
    never managed) with the episode's record, and the earlier segments' samples in `segments`. `managed`: a context
    strategy is on (the record counts resets and discarded tokens)."""
    generated = sum(sum(s["generated"]) for s in ep.segments) + sum(ep.generated)
    R = ep.spent_tokens + len(ep.response_ids)
    episode = {
        "env": env_name, "turns": ep.turns, "termination": ep.reason, "calls": ep.calls,
        "generated_tokens": int(generated), "tool_tokens": int(R - generated),
        "tool_wall_s": round(ep.tool_wall_s, 4), "outcome": outcome,
        "transcript": "".join(ep.transcript), "messages": safe_value(ep.messages),
        **({"error": ep.error} if ep.error else {}),
        **({"context_resets": ep.context_resets, "discarded_tokens": ep.discarded_tokens} if managed else {}),
    }
    t = segment_trajectory(ep, ep.segment(), f"{ep.request['group_id']}-{ep.index}",
                           "length" if ep.reason == "length" else "stop", tok)
    t.episode = episode
    if ep.segments:
        t.segments = [segment_trajectory(ep, s, f"{t.uid}-seg{k}", "stop", tok) for k, s in enumerate(ep.segments)]
    return t


def segment_trajectory(ep: Episode, seg: dict, uid: str, finish_reason: str, tok) -> Trajectory:
    """One context segment as a sample."""
    req = ep.request
    arrays = segment_arrays(seg["parts"], len(seg["response_ids"]))
    loss = arrays["loss"]
    if ep.reason == "error":  # nothing of a failed episode is trained on: the failure may not be the model's
        loss = np.zeros_like(loss)
    return Trajectory(
        uid=uid, group_id=req["group_id"], domain=req["domain"],
        prompt_ids=np.asarray(seg["prompt_ids"], np.int32), response_ids=np.asarray(seg["response_ids"], np.int32),
        inference_logprobs=arrays["logprobs"], finish_reason=finish_reason,
        loss_mask=loss, generated=np.asarray(seg["generated"], bool),
        kept_ids=arrays["kept_ids"], kept_offsets=arrays["kept_offsets"], kept_set_cut=arrays["kept_set_cut"],
        routed_experts=seg["routes"], prompt_text=tok.decode(seg["prompt_ids"]),
        response_text="\n".join(seg["texts"]), sample=req["sample"], thinking=req.get("thinking"),
    )
