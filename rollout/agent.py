"""Multi-turn agent episodes: the model calls an environment's tools over several turns, token-in/token-out.

One episode per (task, sample): the first prompt is the task rendered with the environment's tools (the tool-call
format's `initial_prompt`). Each turn the engine continues the episode's context; the model's ids are appended
verbatim (never decoded and tokenised again), its text is parsed for tool calls, the episodes' calls run (episodes
concurrently; one episode's calls one after another in the order the model wrote them, each with a deadline), and
the tool results are rendered as text (the format escapes special tokens), tokenised on their own and appended with
loss mask 0. Turns of all live episodes go to the engine in one call, so vLLM batches (and prefix-caches) them.

Stitched into one `Trajectory` per episode: response = everything after the first prompt; `generated` marks the
model's tokens; `inference_logprobs` and kept sets come from the engine for generated tokens (0 and an empty kept
set for tool tokens, which have loss mask 0); routes (Keep Routing) are the first turn's rows, then each later
turn's new rows, the first of which is the previous turn's last generated token as that turn's prefill routed it.
The episode's record (`Trajectory.episode`) also holds it as chat messages (`messages`: the task, each model turn as
the tool-call format parsed it, each tool result as the model read it), which data generation writes out.

Thinking mode: an episode runs in its request's mode (`thinking`, from `domains.<d>.thinking`; else
`agent.thinking`), so one call may hold episodes of both modes; each mode has its own tool-call format object, whose
first prompt and tool-result texts (the next turn's prefill) follow that mode.

An episode ends when the model submits (the environment's final tool), answers without a tool call (unless
`require_submit`, which instead tells it to use its tools, as a tool error), reaches `max_turns`, or would pass
`max_context_tokens` / `max_episode_tokens` (reason `length`: nothing over the window is ever sent to the engine).
The environment's verifier then scores the final state; its outcome is read by the `env_verifier` reward.

Context management (`agent.context_strategy`: discard_75 | discard_all; `summary` is not available yet; default
none = the above): when a turn's tool results would bring the context to `agent.context_trigger` (0.8) of
`max_context_tokens` or past it, the episode's messages with those results are shrunk by
`rollout.thinking.manage_context` (the first 75% of the tool-call turns with their results, or all of them, dropped;
system, task and answers without calls kept), rendered by the episode's tool-call format (`initial_prompt`) and
tokenised as a NEW prompt, and the episode goes on from it (`messages` becomes the managed list). Where nothing can
be dropped or the new prompt is not shorter, the episode ends as before. `max_turns` and `max_episode_tokens` count
the whole episode. How it trains: token-in/token-out makes every managed context a new prompt, so the episode is
several context segments, each a sample of its own: prompt = the context it started from (the first prompt, then
each managed one), response/loss mask/inference logprobs/kept sets/routes = that segment's tokens only (so Keep
Sampling Mask, Keep Routing and OPSM apply per segment). The last segment is the episode's `Trajectory` (its
`episode` record, outcome, reward); the earlier ones ride along in `Trajectory.segments` through rewards, advantages
and metrics, so the GRPO baseline counts each episode once, and `rl.advantages.expand_segments` splices them in for
training with the episode's reward and advantage. The record counts `context_resets` and `discarded_tokens`
(context tokens dropped by the resets).

What the model writes and what tools return is untrusted: every text that becomes tokens goes through `safe_text`
first (a lone surrogate, e.g. from a JSON "\\ud800" in a call's arguments, becomes U+FFFD, as does a NUL). Of several
submits in one turn the first in the model's order counts, every time: the calls after it are not run (status
`skipped`), nor those after a call that was stopped at its deadline, which spends the episode's session (a
pure-Python tool is stopped there; rollout/envs/stoppable.py) and ends the episode, reason `tool_timeout`, scored 0.
Any exception inside one episode (a tool's session, rendering or tokenising its results, handling the engine's
output for it, building its record) ends that episode only: reason `error`, scored 0 with the error as the reason
(`episode.error`, the reward's reason), loss mask 0 on all its tokens; the other episodes and the step go on.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from rl.trajectory import Trajectory
from rollout.sampling import SamplingParams, decode_response

log = logging.getLogger(__name__)


@dataclass
class AgentConfig:
    """`domains.<d>.agent`: the environment and the episode's budgets (conf/experiment/mixed_rl.yaml documents them)."""

    env: str
    max_turns: int = 6
    max_context_tokens: int = 4096  # prompt + everything after it; nothing longer is sent to the engine
    max_episode_tokens: int = 2048  # generated + tool tokens after the first prompt
    max_tool_output_tokens: int = 512  # one tool result, after which it is cut in the middle with a marker
    tool_timeout_s: float | None = None  # per tool call; None = the environment's own limits.tool_timeout_s
    thinking: bool = False  # thinking mode: the assistant reasons in <think>...</think> before acting
    format: str = "auto"  # tool-call format: auto (from the tokenizer) | hermes | dsml
    require_submit: bool = True  # an answer without a tool call is sent back as an error until the model submits
    system_prompt: str | None = None  # added before the environment's description
    tool_workers: int = 16  # episodes whose tool calls run at the same time, per rollout worker
    demo: bool = False  # show one solved episode of another task first (the environment's reference solution)
    context_strategy: str = "none"  # none | discard_75 | discard_all (summary: not available yet); module docstring
    context_trigger: float = 0.8  # share of max_context_tokens at which the context is managed

    @classmethod
    def from_config(cls, block: Mapping) -> "AgentConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(block) - known)
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r}; allowed: {sorted(known)}")
        values = dict(block)
        for f in dataclasses.fields(cls):
            if f.name not in values or f.name == "env":
                continue
            # the annotation says what a value may be (a string here: `from __future__ import annotations`)
            v, kind, nullable = values[f.name], f.type.split(" | ")[0], f.type.endswith("| None")
            if v is None and nullable:
                continue
            if kind == "bool":
                ok, want = isinstance(v, bool), "true or false"
            elif kind in ("int", "float"):
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and \
                    (kind == "float" or float(v).is_integer())
                want = "a positive number"
            else:
                ok, want = isinstance(v, str), "a string"
            if not ok:
                raise ValueError(f"{f.name}={v!r}: expected {want}{' or null' if nullable else ''}")
            if kind == "int":
                values[f.name] = int(v)
        if not isinstance(values.get("env"), str) or not values["env"]:
            raise ValueError("env: name a bundled environment (smoke | search | code_interpreter | trip_planning) "
                             "or a directory")
        if values.get("demo") and values.get("thinking"):
            raise ValueError("demo: the demonstration's turns carry no reasoning; use it with thinking: false")
        strategy = values.get("context_strategy", "none")
        if strategy == "summary":
            raise ValueError("context_strategy=summary is not available yet (the policy writing its own summary); "
                             f"use one of {CONTEXT_STRATEGIES}")
        if strategy not in CONTEXT_STRATEGIES:
            raise ValueError(f"context_strategy={strategy!r}: expected one of {CONTEXT_STRATEGIES}")
        if values.get("context_trigger", 0.8) > 1:
            raise ValueError(f"context_trigger={values['context_trigger']!r}: expected a share of max_context_tokens "
                             "in (0, 1]")
        if strategy != "none" and values.get("demo"):
            raise ValueError("context_strategy: a managed context is rendered from the episode's messages, which do "
                             "not hold the demonstration; use it with demo: false")
        return cls(**values)


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


def _renderable(fmt, messages: list[dict]) -> list[dict]:
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


def _describe(exc: BaseException) -> str:
    try:
        return safe_text(f"{type(exc).__name__}: {exc}")[:500]
    except Exception:  # noqa: BLE001 - an exception whose str() raises still has a name
        return type(exc).__name__


CONTEXT_STRATEGIES = ("none", "discard_75", "discard_all")  # agent.context_strategy (thinking.py's, less summary)
NO_TOOL_CALLED = "No tool was called. Use the tools, and call the submit tool with your final result."


@dataclass
class _Episode:
    request: dict
    index: int
    session: object
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    generated: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    kept: list[np.ndarray] | None = None  # per response position (None: no kept sets recorded)
    loss: list[float] = field(default_factory=list)  # 0 for tool tokens and for positions whose kept set was cut
    routes: np.ndarray | None = None
    texts: list[str] = field(default_factory=list)  # the model's decoded turns
    transcript: list[str] = field(default_factory=list)  # turns and tool results, for the logs
    calls: list[dict] = field(default_factory=list)  # {tool, status, seconds}
    turns: int = 0
    kept_set_cut: int = 0
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
    # agent.context_strategy: the closed context segments (each one's token arrays, as `_manage` keeps them), the
    # response tokens they held (counted against max_episode_tokens), resets and the tokens they dropped
    segments: list[dict] = field(default_factory=list)
    spent_tokens: int = 0
    context_resets: int = 0
    discarded_tokens: int = 0

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add_generation(self, g) -> None:
        """Appends one turn; checked first and applied whole, so that an engine output that does not add up fails
        the episode with its token arrays still aligned."""
        ids = [int(t) for t in g.response_ids]
        logprobs = [float(x) for x in g.inference_logprobs]
        loss = list(g.loss_mask) if g.loss_mask is not None else [1.0] * len(ids)
        if len(logprobs) != len(ids) or len(loss) != len(ids):
            raise ValueError(f"the engine returned {len(ids)} tokens with {len(logprobs)} logprobs and {len(loss)} "
                             "loss-mask values")
        kept = None
        if g.kept_offsets is not None:
            if len(g.kept_offsets) != len(ids) + 1:
                raise ValueError(f"the engine returned {len(g.kept_offsets)} kept-set offsets for {len(ids)} tokens")
            kept = [g.kept_ids[g.kept_offsets[j] : g.kept_offsets[j + 1]] for j in range(len(ids))]
        routes = self.routes
        if g.routed_experts is not None:  # rows of this call's context + generation; keep what earlier turns had
            routes = g.routed_experts if routes is None else np.concatenate(
                [routes, g.routed_experts[len(routes):]], axis=0)
        if kept is not None:
            earlier = self.kept if self.kept is not None else [np.zeros(0, np.int32)] * len(self.response_ids)
            self.kept = earlier + kept
        self.response_ids += ids
        self.generated += [True] * len(ids)
        self.logprobs += logprobs
        self.loss += loss
        self.kept_set_cut += int(g.kept_set_cut)
        self.routes = routes
        self.turns += 1

    def add_tool_tokens(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.generated += [False] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.loss += [0.0] * len(ids)
        if self.kept is not None:
            self.kept += [np.zeros(0, np.int32)] * len(ids)


class AgentRunner:
    """Runs episodes of one environment with one engine; owned by a RolloutWorker (one per agent domain)."""

    def __init__(self, engine, tokenizer, cfg: AgentConfig, code_sandbox: Mapping | None = None):
        from rollout.envs.base import load_env

        self.engine, self.tok, self.cfg = engine, tokenizer, cfg
        self.env = load_env(cfg.env)
        # The run's `rewards.code` section: tools that run code (code_interpreter) build their sandbox from it, so
        # require_os_isolation, the package allow-list and the write quota hold there as in the code reward.
        self.env.config["code_sandbox"] = dict(code_sandbox or {})
        # One format per thinking mode: a format keeps its mode between an episode's texts (initial_prompt sets it),
        # so episodes of both modes in one call must not share one. `format` is agent.thinking's.
        self._formats: dict = {}
        self.format = self.format_for(cfg.thinking)
        self.tools = self.env.tool_schemas()
        # A request's sample may be just {id, prompt}: the environment's own task row (with its data) is used then.
        self._tasks = {str(t["id"]): t for t in self.env.tasks()}
        self._demos: dict[tuple, str] = {}  # agent.demo: the solved episode's turns, per demonstration task
        self._pool = cf.ThreadPoolExecutor(max(1, int(cfg.tool_workers)), thread_name_prefix="agent-tools")

    # -- episode set-up ------------------------------------------------------------------------------------
    def task_of(self, sample: dict) -> dict:
        """The task an episode runs: the environment's own row with the sample's id, else the sample itself."""
        return self._tasks.get(str(sample.get("id")), sample)

    def format_for(self, thinking: bool):
        """The tool-call format of one thinking mode (built once per mode)."""
        from rollout.tool_format import tool_format

        if bool(thinking) not in self._formats:
            self._formats[bool(thinking)] = tool_format(self.cfg.format, self.tok, thinking=bool(thinking))
        return self._formats[bool(thinking)]

    def _messages(self, sample: dict) -> list[dict]:
        system = "\n\n".join(x for x in (self.cfg.system_prompt, self.env.description) if x)
        return [{"role": "system", "content": system}, {"role": "user", "content": str(sample["prompt"])}]

    def _prompt_ids(self, sample: dict, thinking: bool | None = None) -> list[int]:
        """The episode's first prompt in `thinking` mode (None: agent.thinking)."""
        thinking = self.cfg.thinking if thinking is None else bool(thinking)
        fmt = self.format_for(thinking)
        demo = self._demo_task(sample) if self.cfg.demo else None
        text = fmt.initial_prompt(self._messages(demo if demo is not None else sample), self.tools, thinking=thinking)
        if demo is not None:
            text += self._demo_turns(demo, fmt) + fmt.user_text(str(sample["prompt"]))
        return self._encode(text)  # our own text and the task's, not model output

    def _demo_task(self, sample: dict) -> dict:
        """The task shown solved before `sample`: the environment's next task after it by id (the first one after
        the last), so that no episode sees its own answer."""
        tasks = [t for tid, t in self._tasks.items() if tid != str(sample.get("id"))]
        if not tasks:
            raise ValueError(f"agent.demo: environment {self.env.name} has no other task to show solved")
        after = [t for t in tasks if str(t["id"]) > str(sample.get("id"))]
        return (after or tasks)[0]

    def _demo_turns(self, task: dict, fmt) -> str:
        """The assistant turns of `task` solved by the environment's reference solution, each call run through the
        tools in a fresh session and its real result shown, as the loop would append them; ends with the submit
        call's turn. Cached per task and format (mode)."""
        key = (str(task["id"]), fmt.thinking)
        if key not in self._demos:
            calls = self.env.reference_solution(task)
            if calls is None:
                raise ValueError(f"agent.demo: environment {self.env.name} has no reference solution (solve)")
            session, text = self.env.reset(task), []
            try:
                for name, args in calls:
                    text.append(fmt.call_text([(name, args)]) + fmt.end_token)
                    if name == self.env.submit_tool:
                        break
                    res = session.call(name, dict(args))
                    result = self._fit(safe_text(res.content), self.cfg.max_tool_output_tokens)
                    text.append(fmt.tool_results_text([(None, result)]))
            finally:
                session.close()
            self._demos[key] = "".join(text)
        return self._demos[key]

    def _encode(self, text: str) -> list[int]:
        """The only way text becomes ids here: made safe for the tokenizer first."""
        return self.tok(safe_text(text), add_special_tokens=False)["input_ids"]

    def _fit(self, text: str, limit: int) -> str:
        """A tool result cut in the middle to `limit` tokens, with a marker saying how much went."""
        ids = self._encode(text)
        if len(ids) <= limit:
            return text
        keep = max(limit - 16, 2)
        return (self.tok.decode(ids[: keep // 2]) + f"\n[... {len(ids) - keep} tokens omitted ...]\n"
                + self.tok.decode(ids[len(ids) - keep // 2:]))

    # -- the loop ------------------------------------------------------------------------------------------
    def run(self, requests: list[dict], sp: SamplingParams) -> list[Trajectory]:
        """requests: {group_id, domain, sample (the task row), thinking (optional: the episodes' mode; None or absent:
        agent.thinking), ...}; sp.n episodes per request."""
        episodes: list[_Episode] = []
        try:
            for req in requests:
                task = self.task_of(req["sample"])
                thinking = self.cfg.thinking if req.get("thinking") is None else bool(req["thinking"])
                prompt_ids = self._prompt_ids(task, thinking)
                if len(prompt_ids) >= self.cfg.max_context_tokens:
                    log.warning("agent task %s: its first prompt is %d tokens, not below max_context_tokens=%d; its "
                                "episodes end before the first turn (raise the limit or shorten the task)",
                                task.get("id"), len(prompt_ids), self.cfg.max_context_tokens)
                for j in range(sp.n):
                    ep = _Episode({**req, "task": task}, j, None, prompt_ids, thinking=thinking,
                                  format=self.format_for(thinking), messages=self._messages(task))
                    episodes.append(ep)  # before anything else can fail, so that `finally` closes every session
                    try:
                        ep.session = self.env.reset(task)
                    except Exception as exc:  # noqa: BLE001 - the environment's init_state: this episode fails
                        self._fail(ep, "reset", exc)
                        continue
                    if len(prompt_ids) >= self.cfg.max_context_tokens:
                        ep.reason = "length"
            turn = 0
            while True:
                live = [ep for ep in episodes if ep.reason is None]
                if not live:
                    break
                self._generate(live, sp, turn)
                self._act([ep for ep in live if ep.reason is None])
                turn += 1
            return [self._record(ep) for ep in episodes]
        finally:
            for ep in episodes:
                try:
                    if ep.session is not None:
                        ep.session.close()
                except Exception:  # noqa: BLE001 - one environment's clean-up must not leave the others open
                    log.warning("agent: closing an episode's session failed", exc_info=True)

    def _fail(self, ep: _Episode, where: str, exc: BaseException) -> None:
        """An error inside one episode ends that episode (see the module docstring), never the step."""
        ep.reason, ep.error = "error", f"{where}: {_describe(exc)}"
        log.warning("agent episode %s-%s failed in %s", ep.request.get("group_id"), ep.index, where, exc_info=exc)

    def _room(self, ep: _Episode, sp: SamplingParams) -> int:
        return min(sp.max_new_tokens, self.cfg.max_context_tokens - len(ep.context),
                   self.cfg.max_episode_tokens - ep.spent_tokens - len(ep.response_ids))

    def _generate(self, live: list[_Episode], sp: SamplingParams, turn: int) -> None:
        """One turn of every live episode: one engine call per distinct token budget (usually just one)."""
        by_room: dict[int, list[_Episode]] = {}
        for ep in live:
            room = self._room(ep, sp)
            if room <= 0:
                ep.reason = "length"
            else:
                by_room.setdefault(room, []).append(ep)
        for room, eps in sorted(by_room.items()):
            seed = None if sp.seed is None else (sp.seed + 7919 * (turn + 1)) % (2**63)
            # a turn ends at the format's end token even where it is not the tokenizer's EOS (a base model with
            # ChatML markup: EOS <|endoftext|>, turns end at <|im_end|>)
            stops = {i for ep in eps for i in ep.format.stop_ids}  # one set per format name: the modes' are equal
            tsp = dataclasses.replace(sp, n=1, max_new_tokens=room, seed=seed,
                                      stop_token_ids=sorted({*sp.stop_token_ids, *stops}))
            for ep, gens in zip(eps, self.engine.generate([ep.context for ep in eps], tsp)):
                try:
                    (g,) = gens
                    ep.add_generation(g)
                    text = decode_response(self.tok, g.response_ids)
                    ep.texts.append(text)
                    ep.transcript.append(text)
                    ep.cut_turn = g.finish_reason == "length"
                    if ep.cut_turn and room < sp.max_new_tokens:
                        ep.reason = "length"  # the episode's budget, not the turn's, ran out
                    ep.parsed = ep.format.parse(text)
                    ep.messages.append(ep.parsed.to_message())
                except Exception as exc:  # noqa: BLE001
                    self._fail(ep, "model turn", exc)

    def _act(self, live: list[_Episode]) -> None:
        """Run the tool calls of every episode, episodes concurrently; append their results, or end the episode."""
        jobs = []
        for ep in live:
            parsed = ep.parsed
            if not parsed.tool_calls and not parsed.errors and not self.cfg.require_submit:
                ep.reason = "answer"
            else:  # also on the last turn: a submit there counts
                jobs.append(ep)
        t0 = time.perf_counter()
        futures = [(ep, self._pool.submit(self._run_calls, ep)) for ep in jobs]
        results: dict[int, list] = {}
        for ep, fut in futures:
            try:
                results[id(ep)] = fut.result()  # Session.call bounds its own time
            except Exception as exc:  # noqa: BLE001
                self._fail(ep, "tool calls", exc)
        wall = time.perf_counter() - t0
        for ep in jobs:
            if ep.reason is not None:
                continue
            ep.tool_wall_s += wall
            try:
                self._after_calls(ep, results[id(ep)])
            except Exception as exc:  # noqa: BLE001
                self._fail(ep, "tool results", exc)

    def _run_calls(self, ep: _Episode) -> list:
        """One turn's calls in the model's order, so that its first submit is the one that counts and its state
        changes happen as written (they serialise on the session anyway); none runs after the call that ended the
        episode or spent its session."""
        done = []
        for call in ep.parsed.tool_calls:
            label = safe_text(call.name)[:80]  # a metric key and a log field: whatever the model named
            if done and (done[-1][1].final or ep.session.stopped):
                ep.calls.append({"tool": label, "status": "skipped", "seconds": 0.0})
                continue
            res = ep.session.call(call.name, call.arguments, self.cfg.tool_timeout_s)
            ep.calls.append({"tool": label, "status": res.status, "seconds": round(res.seconds, 4)})
            done.append((call, res))
        return done

    def _after_calls(self, ep: _Episode, done: list) -> None:
        if any(res.final for _, res in done):
            ep.reason = "submitted"
            return
        if ep.session.stopped:
            ep.reason = "tool_timeout"
            return
        if ep.turns >= self.cfg.max_turns:  # the last turn's results are not shown: no turn follows
            ep.reason = "max_turns"
            return
        text, ids = self._tool_message(ep, done)
        if ep.spent_tokens + len(ep.response_ids) + len(ids) >= self.cfg.max_episode_tokens:
            ep.reason = "length"  # the episode's token budget: it ends before the results
            return
        if self.cfg.context_strategy != "none" and \
                len(ep.context) + len(ids) >= self.cfg.context_trigger * self.cfg.max_context_tokens and \
                self._manage(ep, len(ep.context) + len(ids)):
            return
        if len(ep.context) + len(ids) >= self.cfg.max_context_tokens:
            ep.reason = "length"  # the results would not fit: the episode ends before them
            return
        ep.add_tool_tokens(ids)
        ep.transcript.append(text)
        ep.messages += [{"role": "tool", "content": content} for content in ep.tool_contents]

    def _manage(self, ep: _Episode, size: int) -> bool:
        """agent.context_strategy: the episode's messages with this turn's tool results (`size` tokens as the context
        would hold them) shrunk by `rollout.thinking.manage_context` and rendered by the episode's format as a new
        prompt; the current segment is closed and the episode goes on from that prompt. False (nothing changed)
        when there is no tool-call history to drop or the new prompt would not be shorter."""
        from rollout.thinking import manage_context

        fmt = ep.format or self.format_for(ep.thinking)
        messages = ep.messages + [{"role": "tool", "content": c} for c in ep.tool_contents]
        managed = manage_context(messages, lambda _: size, self.cfg.max_context_tokens, self.cfg.context_strategy,
                                 threshold=self.cfg.context_trigger * (1 - 1e-9))  # ours is >=, theirs >
        if len(managed) == len(messages):
            return False
        text = fmt.initial_prompt(_renderable(fmt, managed), self.tools, thinking=ep.thinking)
        prompt = self._encode(text)  # our rendering of the managed messages: a new prompt, not the model's output
        if len(prompt) >= min(size, self.cfg.max_context_tokens):
            return False
        ep.segments.append({"prompt_ids": ep.prompt_ids, "response_ids": ep.response_ids, "generated": ep.generated,
                            "logprobs": ep.logprobs, "kept": ep.kept, "loss": ep.loss, "routes": ep.routes,
                            "kept_set_cut": ep.kept_set_cut, "texts": ep.texts})
        ep.spent_tokens += len(ep.response_ids)
        ep.context_resets += 1
        ep.discarded_tokens += size - len(prompt)
        ep.prompt_ids, ep.response_ids, ep.generated, ep.logprobs, ep.loss, ep.texts = prompt, [], [], [], [], []
        ep.kept, ep.routes, ep.kept_set_cut = None, None, 0
        ep.messages = managed
        ep.transcript.append(f"\n[context {self.cfg.context_strategy}: {size} -> {len(prompt)} tokens]\n")
        return True

    def _tool_message(self, ep: _Episode, done: list) -> tuple[str, list[int]]:
        """The one place where tool results and the environment's messages become tokens: each text made safe for
        the tokenizer, each result cut to max_tool_output_tokens, all in ONE message of the format (a malformed
        call's error beside the real results), tokenised."""
        limit = self.cfg.max_tool_output_tokens
        items = [(call, self._fit(safe_text(res.content), limit)) for call, res in done]
        errors = [safe_text(e) for e in ep.parsed.errors]
        if not done and not errors:  # require_submit: an answer without a tool call
            errors = [NO_TOOL_CALLED]
        fmt = ep.format or self.format_for(ep.thinking)
        text = fmt.tool_results_text(items + [(None, e) for e in errors]) if items else fmt.error_text(errors)
        # the results as the model read them (escaped), one `tool` message each, for the episode's messages
        ep.tool_contents = [fmt.escape(c if isinstance(c, str) else str(c)) for _, c in items] + \
            [fmt.escape(e) for e in errors]
        if ep.cut_turn:  # the turn hit max_new_tokens before its end token: close it first (not trained on)
            text = fmt.end_token + text
        text = safe_text(text)
        return text, self._encode(text)

    # -- the record ----------------------------------------------------------------------------------------
    def _outcome(self, ep: _Episode) -> dict:
        # a failed or spent episode's state is not worth a verdict (a stopped tool may still be blocked in it)
        if ep.reason == "error":
            return {"score": 0.0, "reason": f"the episode failed: {ep.error}"}
        if ep.reason == "tool_timeout":
            return {"score": 0.0, "reason": f"tool_timeout: {ep.session.stopped}"}
        try:
            score, reason = self.env.verify(ep.request["task"], ep.session)
            return {"score": float(score), "reason": None if reason is None else safe_text(reason)}
        except Exception as exc:  # noqa: BLE001 - a broken verifier fails the reward part, not the run
            return {"score": 0.0, "error": _describe(exc)[:300]}

    def _record(self, ep: _Episode) -> Trajectory:
        try:
            return self._trajectory(ep)
        except Exception as exc:  # noqa: BLE001 - the record of what went wrong, without its tokens
            self._fail(ep, "record", exc)
            ep.response_ids, ep.generated, ep.logprobs, ep.loss = [], [], [], []
            ep.kept, ep.segments, ep.spent_tokens = None, [], 0
            ep.routes = None if ep.routes is None else ep.routes[: max(len(ep.prompt_ids) - 1, 0)]
            return self._trajectory(ep)

    def _trajectory(self, ep: _Episode) -> Trajectory:
        generated = sum(sum(s["generated"]) for s in ep.segments) + sum(ep.generated)
        R = ep.spent_tokens + len(ep.response_ids)
        episode = {
            "env": self.env.name, "turns": ep.turns, "termination": ep.reason, "calls": ep.calls,
            "generated_tokens": int(generated), "tool_tokens": int(R - generated),
            "tool_wall_s": round(ep.tool_wall_s, 4), "outcome": self._outcome(ep),
            "transcript": "".join(ep.transcript), "messages": safe_value(ep.messages),
            **({"error": ep.error} if ep.error else {}),
            **({"context_resets": ep.context_resets, "discarded_tokens": ep.discarded_tokens}
               if self.cfg.context_strategy != "none" else {}),
        }
        last = {"prompt_ids": ep.prompt_ids, "response_ids": ep.response_ids, "generated": ep.generated,
                "logprobs": ep.logprobs, "kept": ep.kept, "loss": ep.loss, "routes": ep.routes,
                "kept_set_cut": ep.kept_set_cut, "texts": ep.texts}
        t = self._segment_trajectory(ep, last, f"{ep.request['group_id']}-{ep.index}",
                                     "length" if ep.reason == "length" else "stop")
        t.episode = episode
        if ep.segments:
            t.segments = [self._segment_trajectory(ep, s, f"{t.uid}-seg{k}", "stop") for k, s in enumerate(ep.segments)]
        return t

    def _segment_trajectory(self, ep: _Episode, seg: dict, uid: str, finish_reason: str) -> Trajectory:
        """One context segment as a sample (the whole episode when its context was never managed)."""
        req = ep.request
        R = len(seg["response_ids"])
        kept_ids = kept_offsets = None
        if seg["kept"] is not None:
            kept_offsets = np.zeros(R + 1, np.int64)
            np.cumsum([len(k) for k in seg["kept"]], out=kept_offsets[1:])
            kept_ids = np.concatenate(seg["kept"], dtype=np.int32) if R else np.zeros(0, np.int32)
        loss = np.asarray(seg["loss"], np.float32)
        if ep.reason == "error":  # nothing of a failed episode is trained on: the failure may not be the model's
            loss = np.zeros_like(loss)
        return Trajectory(
            uid=uid, group_id=req["group_id"], domain=req["domain"],
            prompt_ids=np.asarray(seg["prompt_ids"], np.int32), response_ids=np.asarray(seg["response_ids"], np.int32),
            inference_logprobs=np.asarray(seg["logprobs"], np.float32), finish_reason=finish_reason,
            loss_mask=loss, generated=np.asarray(seg["generated"], bool),
            kept_ids=kept_ids, kept_offsets=kept_offsets, kept_set_cut=seg["kept_set_cut"],
            routed_experts=seg["routes"], prompt_text=self.tok.decode(seg["prompt_ids"]),
            response_text="\n".join(seg["texts"]), sample=req["sample"], thinking=req.get("thinking"),
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
