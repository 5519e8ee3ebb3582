"""Multi-turn agent episodes: the model calls an environment's tools over several turns, token-in/token-out.

One episode per (task, sample): the first prompt is the task rendered with the environment's tools (the tool-call
format's `initial_prompt`). Each turn the engine continues the episode's context; the model's ids are appended
verbatim (never decoded and tokenised again), its text is parsed for tool calls, the episodes' calls run (episodes
concurrently; one episode's calls one after another in the order the model wrote them, each with a deadline), and
the tool results are rendered as text (the format escapes special tokens), tokenised on their own and appended with
loss mask 0.

Scheduling (`agent.schedule`): lockstep (the default) sends the turns of all live episodes to the engine in one call,
so vLLM batches (and prefix-caches) them, and every turn waits for the slowest episode's tool calls. per_episode
sends an episode's next turn as soon as its own tool results are back, while the others generate or wait on their
tools (rollout/engine_stream.py: vLLM's engine loop stepped directly, one request per turn; the transformers engine
generates whatever is pending in one call). With sp.seed every request has a seed of its own (the episode's identity
and its request count), so both schedules give the same episodes for a fixed engine (exactly on the transformers
engine; vLLM honours the seeds with rollout.per_request_seed). An episode's tool seconds (`tool_wall_s`) are the
wall time of its own calls per_episode, of the slowest episode's in lockstep.

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

Context management (`agent.context_strategy`: summary | discard_75 | discard_all; default none = the above): when a
turn's tool results would bring the context to `agent.context_trigger` (0.8) of `max_context_tokens` or past it, the
episode's messages with those results are shrunk by `rollout.thinking.manage_context` (the first 75% of the tool-call
turns with their results, or all of them, dropped; system, task and answers without calls kept), rendered by the
episode's tool-call format (`initial_prompt`) and tokenised as a NEW prompt, and the episode goes on from it
(`messages` becomes the managed list). Where nothing can be dropped or the new prompt is not shorter, the episode
ends as before. `summary`: the policy writes the summary itself, through the same engine: in place of the turn's
tool results it is shown SUMMARY_REQUEST (as the environment's message), its next generation is the summary (not a
turn: max_turns does not count it), and the new context is the system prompt, the task, one user message holding
the summary (escaped, under SUMMARY_HEADER) in place of every earlier tool-call turn, then the current turn's calls
and their results, held back until now; the summary's tokens end the closing segment and train like a turn's. Where
there is no earlier tool-call turn, or the request and MIN_SUMMARY_TOKENS do not fit, the results go on as without a
strategy. `max_turns` and `max_episode_tokens` count
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
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from rewards.text import log_safe
from rl.trajectory import Trajectory
from rollout.episode import Episode, describe, episode_trajectory, renderable, safe_text
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
    context_strategy: str = "none"  # none | summary | discard_75 | discard_all; module docstring
    context_trigger: float = 0.8  # share of max_context_tokens at which the context is managed
    schedule: str = "lockstep"  # lockstep | per_episode: when an episode's next turn goes to the engine

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
            raise ValueError("env: name a bundled environment (smoke | search | search_long | code_interpreter | "
                             "trip_planning | code_repo) or a directory")
        if values.get("demo") and values.get("thinking"):
            raise ValueError("demo: the demonstration's turns carry no reasoning; use it with thinking: false")
        strategy = values.get("context_strategy", "none")
        if values.get("schedule", "lockstep") not in SCHEDULES:
            raise ValueError(f"schedule={values['schedule']!r}: expected one of {SCHEDULES}")
        if strategy not in CONTEXT_STRATEGIES:
            raise ValueError(f"context_strategy={strategy!r}: expected one of {CONTEXT_STRATEGIES}")
        if values.get("context_trigger", 0.8) > 1:
            raise ValueError(f"context_trigger={values['context_trigger']!r}: expected a share of max_context_tokens "
                             "in (0, 1]")
        if strategy != "none" and values.get("demo"):
            raise ValueError("context_strategy: a managed context is rendered from the episode's messages, which do "
                             "not hold the demonstration; use it with demo: false")
        return cls(**values)


CONTEXT_STRATEGIES = ("none", "summary", "discard_75", "discard_all")  # agent.context_strategy
SCHEDULES = ("lockstep", "per_episode")  # agent.schedule
NO_TOOL_CALLED = "No tool was called. Use the tools, and call the submit tool with your final result."
# context_strategy=summary: shown beside the tool results that reach the trigger; the policy's answer replaces the
# tool-call history (under SUMMARY_HEADER, as a user message)
SUMMARY_REQUEST = ("Your context is almost full. Do not call a tool now. Write a summary of your work so far: every "
                   "fact, id and value you found that the task still needs, and what is left to do. Your earlier tool "
                   "calls and their results will be replaced by this summary.")
SUMMARY_HEADER = "Summary of your work so far (your earlier tool calls and their results were removed):"
MIN_SUMMARY_TOKENS = 16  # the summary is asked for only when at least this many tokens fit after the request


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

    def _prompt_ids(self, sample: dict, thinking: bool | None = None, demo: bool | None = None) -> list[int]:
        """The episode's first prompt in `thinking` mode (None: agent.thinking), with the solved demonstration
        when `demo` (None: agent.demo)."""
        thinking = self.cfg.thinking if thinking is None else bool(thinking)
        fmt = self.format_for(thinking)
        demo = self._demo_task(sample) if (self.cfg.demo if demo is None else demo) else None
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
        episodes: list[Episode] = []
        try:
            for req in requests:
                task = self.task_of(req["sample"])
                thinking = self.cfg.thinking if req.get("thinking") is None else bool(req["thinking"])
                broken = None
                try:
                    prompt_ids = self._prompt_ids(task, thinking)
                except Exception as exc:  # noqa: BLE001 - the demonstration does not build: its episodes fail
                    broken, prompt_ids = exc, self._prompt_ids(task, thinking, demo=False)
                if broken is None and len(prompt_ids) >= self.cfg.max_context_tokens:
                    log.warning("agent task %s: its first prompt is %d tokens, not below max_context_tokens=%d; its "
                                "episodes end before the first turn (raise the limit or shorten the task)",
                                log_safe(task.get("id"), 80), len(prompt_ids), self.cfg.max_context_tokens)
                for j in range(sp.n):
                    ep = Episode({**req, "task": task}, j, None, prompt_ids, thinking=thinking,
                                 format=self.format_for(thinking), messages=self._messages(task))
                    episodes.append(ep)  # before anything else can fail, so that `finally` closes every session
                    if broken is not None:
                        self._fail(ep, "demonstration", broken)
                        continue
                    try:
                        ep.session = self.env.reset(task)
                    except Exception as exc:  # noqa: BLE001 - the environment's init_state: this episode fails
                        self._fail(ep, "reset", exc)
                        continue
                    if len(prompt_ids) >= self.cfg.max_context_tokens:
                        ep.reason = "length"
            if self.cfg.schedule == "per_episode":
                self._run_per_episode(episodes, sp)
            else:
                self._run_lockstep(episodes, sp)
            return [self._record(ep) for ep in episodes]
        finally:
            for ep in episodes:
                try:
                    if ep.session is not None:
                        ep.session.close()
                except Exception:  # noqa: BLE001 - one environment's clean-up must not leave the others open
                    log.warning("agent: closing an episode's session failed", exc_info=True)

    def _run_lockstep(self, episodes: list[Episode], sp: SamplingParams) -> None:
        """Turn by turn: every live episode's next generation in one engine call (one per distinct token budget),
        then every episode's tool calls, concurrently; the next turn starts when the slowest tool call is back."""
        while True:
            live = [ep for ep in episodes if ep.reason is None]
            if not live:
                break
            by_sp: dict[str, list] = {}
            for ep in live:
                request = self._next_request(ep, sp)
                if request is not None:
                    by_sp.setdefault(repr(request[1]), []).append((ep, *request))
            acting = []
            for items in by_sp.values():
                tsp = items[0][2]
                seeds = {"seeds": [seed for *_, seed in items]} if tsp.seed is not None else {}
                for (ep, *_), gens in zip(items, self.engine.generate([ctx for _, ctx, _, _ in items], tsp, **seeds)):
                    try:
                        (g,) = gens
                    except Exception as exc:  # noqa: BLE001 - an engine answer of the wrong shape fails the episode
                        self._fail(ep, "model turn", exc)
                        continue
                    if self._take(ep, g, tsp, sp):
                        acting.append(ep)
            self._act(acting)

    def _run_per_episode(self, episodes: list[Episode], sp: SamplingParams) -> None:
        """agent.schedule=per_episode: each episode's next generation goes to the engine as soon as its own tool
        results are back (rollout/engine_stream.py), while the others generate or wait on their tools."""
        from rollout.engine_stream import open_stream

        stream = open_stream(self.engine, sp)
        generating: dict = {}  # stream key -> (episode, its SamplingParams)
        tools: dict[cf.Future, tuple[Episode, float]] = {}

        def advance(ep: Episode) -> None:
            request = ep.reason is None and self._next_request(ep, sp)
            if request:
                context, tsp, seed = request
                generating[stream.submit(context, tsp, seed)] = (ep, tsp)

        try:
            for ep in episodes:
                advance(ep)
            while generating or tools:
                if generating:
                    finished = stream.wait()
                else:  # nothing generating: wait for the first episode whose tool calls are back
                    cf.wait(tools, return_when=cf.FIRST_COMPLETED)
                    finished = []
                for key, g in finished:
                    ep, tsp = generating.pop(key)
                    if self._take(ep, g, tsp, sp):
                        tools[self._pool.submit(self._run_calls, ep)] = (ep, time.perf_counter())
                    else:
                        advance(ep)  # a summary was written: the episode goes on from its new context
                for fut in [f for f in tools if f.done()]:
                    ep, t0 = tools.pop(fut)
                    ep.tool_wall_s += time.perf_counter() - t0
                    try:
                        self._after_calls(ep, fut.result())
                    except Exception as exc:  # noqa: BLE001
                        self._fail(ep, "tool calls", exc)
                    advance(ep)
        finally:
            stream.close()  # fills in the logprobs and kept sets of what vLLM's stream returned

    def _fail(self, ep: Episode, where: str, exc: BaseException) -> None:
        """An error inside one episode ends that episode (see the module docstring), never the step."""
        ep.reason, ep.error = "error", f"{where}: {describe(exc)}"
        # one line: the exception may quote the model's turn or a tool's output (where it was raised is on it too)
        log.warning("agent episode %s-%s failed in %s: %s", log_safe(ep.request.get("group_id"), 80), ep.index, where,
                    log_safe(exc, 2000))

    def _room(self, ep: Episode, sp: SamplingParams) -> int:
        return min(sp.max_new_tokens, self.cfg.max_context_tokens - len(ep.context),
                   self.cfg.max_episode_tokens - ep.spent_tokens - len(ep.response_ids))

    def _next_request(self, ep: Episode, sp: SamplingParams) -> tuple[list[int], SamplingParams, int | None] | None:
        """The episode's next generation: (context, sampling settings, seed), or None when no token fits (reason
        `length`). With sp.seed each request has a seed of its own, from the episode's identity and how many
        requests it made before, so its sample does not depend on what else the engine batches with it."""
        room = self._room(ep, sp)
        if room <= 0:
            ep.reason = "length"
            return None
        # a turn ends at the format's end token even where it is not the tokenizer's EOS (a base model with ChatML
        # markup: EOS <|endoftext|>, turns end at <|im_end|>); one set per format name: the modes' are equal
        tsp = dataclasses.replace(sp, n=1, max_new_tokens=room,
                                  stop_token_ids=sorted({*sp.stop_token_ids, *ep.format.stop_ids}))
        seed = None
        if sp.seed is not None:
            key = f"{ep.request.get('group_id')}\0{ep.index}\0{ep.generations}".encode("utf-8", "replace")
            seed = (sp.seed + zlib.crc32(key) * 1_000_003) % (2**63)
        ep.generations += 1
        return ep.context, tsp, seed

    def _take(self, ep: Episode, g, tsp: SamplingParams, sp: SamplingParams) -> bool:
        """One generation of the episode: appended, decoded, parsed. True when the episode calls its tools next;
        False when it ended or (a summary was written) generates again."""
        try:
            if ep.summarizing:
                self._summarized(ep, g)
                return False
            ep.add_generation(g)
            text = decode_response(self.tok, g.response_ids)
            ep.texts.append(text)
            ep.transcript.append(text)
            ep.cut_turn = g.finish_reason == "length"
            if ep.cut_turn and tsp.max_new_tokens < sp.max_new_tokens:
                ep.reason = "length"  # the episode's budget, not the turn's, ran out
            ep.parsed = ep.format.parse(text)
            ep.messages.append(ep.parsed.to_message())
            parsed = ep.parsed
            if ep.reason is None and not parsed.tool_calls and not parsed.errors and not self.cfg.require_submit:
                ep.reason = "answer"
            return ep.reason is None  # else: also on the last turn (a submit there counts)
        except Exception as exc:  # noqa: BLE001
            self._fail(ep, "model turn", exc)
            return False

    def _act(self, live: list[Episode]) -> None:
        """Lockstep: the tool calls of every episode, episodes concurrently; their results appended, or the episode
        ended."""
        t0 = time.perf_counter()
        futures = [(ep, self._pool.submit(self._run_calls, ep)) for ep in live]
        results: dict[int, list] = {}
        for ep, fut in futures:
            try:
                results[id(ep)] = fut.result()  # Session.call bounds its own time
            except Exception as exc:  # noqa: BLE001
                self._fail(ep, "tool calls", exc)
        wall = time.perf_counter() - t0
        for ep in live:
            if ep.reason is not None:
                continue
            ep.tool_wall_s += wall
            try:
                self._after_calls(ep, results[id(ep)])
            except Exception as exc:  # noqa: BLE001
                self._fail(ep, "tool results", exc)

    def _run_calls(self, ep: Episode) -> list:
        """One turn's calls in the model's order, so that its first submit is the one that counts and its state
        changes happen as written (they serialise on the session anyway); none runs after the call that ended the
        episode or spent its session."""
        done = []
        for call in ep.parsed.tool_calls:
            # whatever the model named, as a log field (one line, bounded); `known`: a tool of the environment, the
            # only names that become metric keys (rl.metric_keys.tool_call_segments), whether the call ran or not
            label = log_safe(call.name, 80)
            known = isinstance(call.name, str) and call.name in self.env.tools
            if done and (done[-1][1].final or ep.session.stopped):
                ep.calls.append({"tool": label, "status": "skipped", "seconds": 0.0, "known": known})
                continue
            res = ep.session.call(call.name, call.arguments, self.cfg.tool_timeout_s)
            ep.calls.append({"tool": label, "status": res.status, "seconds": round(res.seconds, 4), "known": known})
            done.append((call, res))
        return done

    def _after_calls(self, ep: Episode, done: list) -> None:
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
        size = len(ep.context) + len(ids)
        if self.cfg.context_strategy != "none" and size >= self.cfg.context_trigger * self.cfg.max_context_tokens:
            managed = self._ask_summary(ep, done) if self.cfg.context_strategy == "summary" else self._manage(ep, size)
            if managed:
                return
        if size >= self.cfg.max_context_tokens:
            ep.reason = "length"  # the results would not fit: the episode ends before them
            return
        ep.add_tool_tokens(ids)
        ep.transcript.append(text)
        ep.messages += [{"role": "tool", "content": content} for content in ep.tool_contents]

    def _restart(self, ep: Episode, managed: list[dict], size: int) -> bool:
        """The episode goes on from its `managed` messages rendered by its format as a new prompt: the current
        segment (`size` tokens of context, this turn's results counted) is closed. False (nothing changed) when that
        prompt would not be shorter than the context or would not fit below the window."""
        fmt = ep.format or self.format_for(ep.thinking)
        text = fmt.initial_prompt(renderable(fmt, managed), self.tools, thinking=ep.thinking)
        prompt = self._encode(text)  # our rendering of the managed messages: a new prompt, not the model's output
        if len(prompt) >= min(size, self.cfg.max_context_tokens):
            return False
        ep.close_segment(prompt, managed, size - len(prompt))
        ep.transcript.append(f"\n[context {self.cfg.context_strategy}: {size} -> {len(prompt)} tokens]\n")
        return True

    def _manage(self, ep: Episode, size: int) -> bool:
        """discard_75 | discard_all: the episode's messages with this turn's tool results shrunk by
        `rollout.thinking.manage_context`, and the episode restarted from them (`_restart`). False (nothing changed)
        when nothing can be dropped or the new prompt would not be shorter."""
        from rollout.thinking import manage_context

        messages = ep.messages + [{"role": "tool", "content": c} for c in ep.tool_contents]
        managed = manage_context(messages, lambda _: size, self.cfg.max_context_tokens, self.cfg.context_strategy,
                                 threshold=self.cfg.context_trigger * (1 - 1e-9))  # ours is >=, theirs >
        return len(managed) != len(messages) and self._restart(ep, managed, size)

    def _ask_summary(self, ep: Episode, done: list) -> bool:
        """summary: instead of this turn's tool results the model is shown SUMMARY_REQUEST (as the environment's
        message), and its next generation is the summary (`_summarized`); the turn's call and its results are held
        back and come after the summary in the new context, so the request needs room for itself and the summary
        only. False (nothing changed) when there is no earlier tool-call turn to summarize, or the request and
        MIN_SUMMARY_TOKENS would not fit the window or the episode's budget."""
        from rollout.thinking import tool_history

        earlier = ep.messages[:-1]  # the current turn (the calls just run) stays, with its results
        if not tool_history(earlier):
            return False
        results = [{"role": "tool", "content": c} for c in ep.tool_contents]  # as `_tool_message` just made them
        text, ids = self._note_message(ep, SUMMARY_REQUEST)
        if len(ep.context) + len(ids) + MIN_SUMMARY_TOKENS > self.cfg.max_context_tokens or \
                ep.spent_tokens + len(ep.response_ids) + len(ids) + MIN_SUMMARY_TOKENS > self.cfg.max_episode_tokens:
            return False
        ep.add_tool_tokens(ids)
        ep.transcript.append(text)
        ep.held = [ep.messages[-1], *results]
        ep.messages = earlier
        ep.summarizing = True
        return True

    def _summarized(self, ep: Episode, g) -> None:
        """The policy's summary (a generation of this segment, trained on like a turn) replaces the tool-call
        history before the current turn, which follows it with its results; the segment is closed and the episode
        goes on from that context rendered as a new prompt. Ends the episode (reason `length`) when the prompt
        would not be shorter than the context or would not leave room below the window."""
        from rollout.thinking import manage_context

        ep.summarizing = False
        ep.add_generation(g, turn=False)
        text = decode_response(self.tok, g.response_ids)
        ep.texts.append(text)
        ep.transcript.append(text)
        fmt = ep.format or self.format_for(ep.thinking)
        summary = (fmt.parse(text).to_message().get("content") or "").strip() or text.strip()
        # escaped: the model's text must not become markup of the new prompt
        managed = manage_context(ep.messages, lambda _: 1, 1, "summary", summary_role="user", threshold=0.0,
                                 summarize=lambda _: f"{SUMMARY_HEADER}\n{fmt.escape(summary)}") + ep.held
        ep.held = []
        if not self._restart(ep, managed, len(ep.context)):
            ep.reason = "length"

    def _note_message(self, ep: Episode, note: str) -> tuple[str, list[int]]:
        """Our own message to the model in place of tool results (as `_tool_message` renders an error alone)."""
        fmt = ep.format or self.format_for(ep.thinking)
        return self._environment_text(ep, fmt.error_text([note]))

    def _environment_text(self, ep: Episode, text: str) -> tuple[str, list[int]]:
        """A message of ours or the environment's after the model's turn, as text and ids: closing that turn first
        where it hit max_new_tokens before its end token (the end token is not trained on), made safe, tokenised."""
        if ep.cut_turn:
            text = (ep.format or self.format_for(ep.thinking)).end_token + text
        text = safe_text(text)
        return text, self._encode(text)

    def _tool_message(self, ep: Episode, done: list) -> tuple[str, list[int]]:
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
        return self._environment_text(ep, text)

    # -- the record ----------------------------------------------------------------------------------------
    def _outcome(self, ep: Episode) -> dict:
        # a failed or spent episode's state is not worth a verdict (a stopped tool may still be blocked in it)
        if ep.reason == "error":
            return {"score": 0.0, "reason": f"the episode failed: {ep.error}"}
        if ep.reason == "tool_timeout":
            return {"score": 0.0, "reason": f"tool_timeout: {ep.session.stopped}"}
        try:
            score, reason = self.env.verify(ep.request["task"], ep.session)
            return {"score": float(score), "reason": None if reason is None else safe_text(reason)}
        except Exception as exc:  # noqa: BLE001 - a broken verifier fails the reward part, not the run
            return {"score": 0.0, "error": describe(exc)[:300]}

    def _record(self, ep: Episode) -> Trajectory:
        record = lambda: episode_trajectory(ep, self.env.name, self._outcome(ep), self.tok,  # noqa: E731
                                            self.cfg.context_strategy != "none")
        try:
            return record()
        except Exception as exc:  # noqa: BLE001 - the record of what went wrong, without its tokens
            self._fail(ep, "record", exc)
            ep.response_ids, ep.generated, ep.parts, ep.segments, ep.spent_tokens = [], [], [], [], 0
            ep.routes = None if ep.routes is None else ep.routes[: max(len(ep.prompt_ids) - 1, 0)]
            return record()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
