"""Per-domain reward composition: total = sum(weight * part) over the domain's `rewards` list.

Failure policy (rewards never take the run down):
- a bad config (unknown reward name, bad parameter) raises ValueError at construction, naming
  `domains.<d>.rewards[i]`;
- a sample of an unknown domain, or missing a field one of its parts needs (answer/tests/...), gets reward 0 and
  a reason: a data error must not be rewarded through its other parts;
- a part that raises scores 0 for that part, `reward_error` says which part and why, the other parts still count;
- a part past its timeout (`timeout_s` of the part > `rewards.<name>.timeout_s` > `rewards.timeout_s`) scores 0
  with reason "timeout". Parts that could hang never run in the composer's own threads: "pool" parts run in
  processes that are SIGKILLed on timeout, "threads" parts (code) only wait on sandbox subprocesses they kill.
- "judge" parts (rubric_judge) of the whole batch go to the judge in ONE call: an in-process `RubricJudge` (CLI,
  tests) or a Ray handle of `JudgeWorker` (`RewardWorker(cfg, judge=handle)`). A call that raises or exceeds
  `rewards.judge.timeout_s` scores 0 for those parts with the reason; the run goes on. A part's own `timeout_s`
  does not apply to it (the call is per batch, not per sample).
`reward_parts[label]` is the UNWEIGHTED part score (0 for a failed part); `reward_error` joins "label: reason".
Reasons come from the sample (a program's stderr, a verifier quoting the submission): `reward_error` keeps them as
they are (it is stored as JSON, which escapes them, and read by people), and every log line that carries one passes
it through `rewards.text.log_safe` (one line, control characters escaped, bounded).
"""

from __future__ import annotations

import concurrent.futures as cf
import decimal
import logging
import math
import numbers
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Mapping

from rl.config import to_plain
from rl.trajectory import Trajectory

from .registry import REWARDS, resolve_reward
from .math_reward import warm_up_math
from .process_pool import KillablePool
from .judge import judge_config
from .spec import RewardSpec, RewardZero, SampleView, validate_params
from .text import answer_part, log_safe, sanitize

logger = logging.getLogger(__name__)


def finite_real(value: Any) -> float | None:
    """`value` as a float if it is a finite real number (int, float, Fraction, Decimal, numpy scalars, a
    one-element numpy array or tensor), else None. A bool is not a score; an int too large for a float is not finite."""
    if isinstance(value, (bool, str, bytes, complex)) or value is None:
        return None
    if not isinstance(value, (numbers.Real, decimal.Decimal)):
        item = getattr(value, "item", None)  # numpy arrays and torch tensors: item() raises unless one element
        try:
            value = item() if callable(item) else None
        except Exception:  # noqa: BLE001 - whatever it is, it is not a score
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return None
    try:
        score = float(value)
    except (OverflowError, ValueError, TypeError, ArithmeticError):  # 10**400, Decimal('sNaN'), odd __float__
        return None
    return score if math.isfinite(score) else None


def describe_value(value: Any, limit: int = 80) -> str:
    """A bounded description of a reward's return value for its failure reason (a huge int has no repr at all
    past Python's digit limit, a huge string would flood the rollout dump)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - e.g. ValueError: exceeds the limit for integer string conversion
        text = f"<{type(value).__name__} without a printable value>"
    if len(text) > limit:
        text = f"{text[:limit]}... ({type(value).__name__}, {len(text)} characters)"
    return text


# Sample fields a reward cannot work without.
NEEDED_FIELDS = {"math": ("answer",), "exact_match": ("answer",), "code": ("tests",), "rubric_judge": ("rubric",)}


def required_fields(parts_cfg) -> set[str]:
    """Dataset fields a domain's `rewards` list reads (checked against the dataset's columns at start)."""
    return {f for spec in parts_cfg for f in NEEDED_FIELDS.get(spec["name"], ())}
# Grace on top of a "threads" part's timeout: the sandbox finishes its current run (<= wall_s) before stopping.
THREAD_GRACE_S = 30.0
MAX_WARNINGS_PER_BATCH = 5


@dataclass
class Part:
    label: str  # key in reward_parts (the reward name unless the config gives a `label`)
    name: str
    spec: RewardSpec
    weight: float
    params: dict
    timeout_s: float
    runner: str  # inline | pool | threads | judge
    where: str  # config path, for messages


@dataclass
class _Result:
    value: float = 0.0
    reason: str | None = None
    failed: bool = False  # True: an error/timeout (warned per sample); False with a reason: an expected zero


def build_domain_parts(domain: str, parts_cfg: Any, rewards_cfg: Mapping, max_new_tokens: int) -> list[Part]:
    """Parse and check one domain's `rewards` list; ValueError names `domains.<d>.rewards[i]`."""
    base = f"domains.{domain}.rewards"
    if not isinstance(parts_cfg, list) or not parts_cfg:
        raise ValueError(f"{base}: must be a non-empty list of {{name, weight, ...params}}")
    parts, labels = [], set()
    for i, raw in enumerate(parts_cfg):
        where = f"{base}[{i}]"
        if not isinstance(raw, Mapping) or "name" not in raw:
            raise ValueError(f"{where}: must be a mapping with a 'name' (got {raw!r})")
        name = raw["name"]
        try:
            spec = resolve_reward(str(name))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        weight = raw.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"{where}: 'weight' must be a finite number, got {weight!r}")
        section = rewards_cfg.get(name) or {}
        defaults = {k: v for k, v in section.items() if k in spec.params} if isinstance(section, Mapping) else {}
        params = validate_params(spec, {**defaults, **dict(raw)}, where)
        if spec.cross_check is not None:
            try:
                spec.cross_check(params, max_new_tokens)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        timeout_s = raw.get("timeout_s", section.get("timeout_s") if isinstance(section, Mapping) else None)
        timeout_s = float(timeout_s if timeout_s is not None else rewards_cfg.get("timeout_s", 30.0))
        if not timeout_s > 0:
            raise ValueError(f"{where}: 'timeout_s' must be > 0")
        isolated = raw.get("isolated", False)
        if not isinstance(isolated, bool):
            raise ValueError(f"{where}: 'isolated' must be a bool")
        runner = "pool" if isolated and spec.runner == "inline" else spec.runner
        label = str(raw.get("label", name))
        if label in labels:
            raise ValueError(f"{where}: a second '{label}' part in domain '{domain}': give it a distinct 'label'")
        labels.add(label)
        parts.append(Part(label, name, spec, float(weight), params, timeout_s, runner, where))
    return parts


def check_reward_specs(domains_cfg: Mapping[str, Any], rewards_cfg: Mapping, max_new_tokens: int) -> None:
    """The driver's start-up check of every domain's rewards (no pools or judge started)."""
    for domain, block in (to_plain(domains_cfg) or {}).items():
        build_domain_parts(domain, block.get("rewards") if isinstance(block, Mapping) else block,
                           dict(to_plain(rewards_cfg) or {}), int(max_new_tokens or 0))


def reward_section_keys(name: str) -> set[str] | None:
    """Keys a `rewards.<name>` config section may hold for the reward `name` (its parameters and `timeout_s`);
    None when `name` is not a reward."""
    spec = REWARDS.get(name)
    return None if spec is None else {*spec.params, "timeout_s"}


class RewardComposer:
    def __init__(self, domains_cfg: Mapping[str, Any], rewards_cfg: Mapping | None = None, max_new_tokens: int = 0,
                 judge: Any = None):
        self.rewards_cfg = dict(to_plain(rewards_cfg) or {})
        self.max_new_tokens = int(max_new_tokens or 0)
        self.domains: dict[str, list[Part]] = {}
        for domain, block in (to_plain(domains_cfg) or {}).items():
            parts_cfg = block.get("rewards") if isinstance(block, Mapping) else block
            self.domains[domain] = self._build_domain(domain, parts_cfg)
        # The judge: anything with `score(requests) -> results`, or a Ray actor handle of rewards.judge.JudgeWorker.
        self.judge = judge
        self.judge_timeout_s = float(judge_config(self.rewards_cfg)["timeout_s"])
        self._judge_exec: cf.ThreadPoolExecutor | None = None  # in-process judge: runs beside the other parts
        for parts in self.domains.values():
            for p in parts:
                if p.runner == "judge" and judge is None:
                    raise ValueError(f"{p.where}: reward '{p.name}' needs a judge model, and none was given "
                                     f"(the driver starts one from rewards.judge; in code pass judge=RubricJudge(...))")
        workers = int(self.rewards_cfg.get("num_workers") or 1)
        math_cfg = self.rewards_cfg.get("math") or {}
        code_cfg = self.rewards_cfg.get("code") or {}
        self.pool_size = int(math_cfg.get("pool_size") or workers)
        self.pool_memory_mb = int(math_cfg.get("memory_mb") or 0)
        self.code_parallel = int(code_cfg.get("parallel") or workers)
        runners = {p.runner for parts in self.domains.values() for p in parts}
        uses_math = any(p.name == "math" for parts in self.domains.values() for p in parts)
        out_cfg = self.rewards_cfg.get("output") or {}
        output_caps = (int(float(out_cfg.get("max_kb_per_sample", 4)) * 1024),
                       int(float(out_cfg.get("max_mb_per_worker", 1)) * 1024 * 1024))
        self._pool = (KillablePool(self.pool_size, self.pool_memory_mb, warmup=warm_up_math if uses_math else None,
                                   output_caps=output_caps)
                      if "pool" in runners else None)
        self._threads = (cf.ThreadPoolExecutor(self.code_parallel, thread_name_prefix="reward-code")
                         if "threads" in runners else None)
        # reward parts whose zeros with a reason were warned about: later batches log them at INFO (a batch scored
        # during generation is ~16 samples, so an untrained model's format misses would warn every few steps' worth)
        self._zeros_warned: set[str] = set()
        self.last_pool_run: dict = {}  # set by each `score` call

    # --------------------------------------------------------------------------------------------- building
    def _build_domain(self, domain: str, parts_cfg: Any) -> list[Part]:
        return build_domain_parts(domain, parts_cfg, self.rewards_cfg, self.max_new_tokens)

    # ---------------------------------------------------------------------------------------------- scoring
    def ready(self) -> bool:
        return True

    def uses_judge(self, domain: str) -> bool:
        return any(p.runner == "judge" for p in self.domains.get(domain, ()))

    def _view(self, t: Trajectory) -> SampleView:
        response = sanitize(t.response_text)
        return SampleView(
            response=response, answer=answer_part(response),
            sample=t.sample if isinstance(t.sample, dict) else {}, finish_reason=str(t.finish_reason),
            num_response_tokens=t.num_generated_tokens, domain=t.domain, max_new_tokens=self.max_new_tokens,
            episode=t.episode, thinking=getattr(t, "thinking", None),
        )

    def score(self, trajs: list[Trajectory]) -> list[Trajectory]:
        self.last_pool_run = {}  # what this call's pool parts cost (`_run_pool`; the reward worker logs it)
        jobs: dict[str, list[tuple[int, int, SampleView]]] = defaultdict(list)  # runner -> (traj, part, view)
        results: dict[tuple[int, int], _Result] = {}
        for ti, t in enumerate(trajs):
            t.reward, t.reward_parts, t.reward_error, t.reward_failed = 0.0, {}, None, False
            parts = self.domains.get(t.domain)
            if parts is None:
                t.reward_failed = True
                t.reward_error = f"unknown domain {t.domain!r} (configured: {sorted(self.domains)})"
                logger.warning("reward: sample %s: %s", log_safe(t.uid), log_safe(t.reward_error))
                continue
            view = self._view(t)
            missing = [f"'{f}' (needed by {p.label})" for p in parts for f in NEEDED_FIELDS.get(p.name, ())
                       if view.sample.get(f) in (None, "", [], {})]
            if missing:
                t.reward_parts = {p.label: 0.0 for p in parts}
                t.reward_error = "sample is missing " + ", ".join(missing)
                t.reward_failed = True
                logger.warning("reward: sample %s (%s): %s", log_safe(t.uid), log_safe(t.domain),
                               log_safe(t.reward_error))
                continue
            for pi, p in enumerate(parts):
                jobs[p.runner].append((ti, pi, view))

        thread_futures = self._submit_threads(trajs, jobs["threads"])
        judge_call = self._submit_judge(trajs, jobs["judge"], results)  # runs while the other parts do
        if jobs["pool"]:
            self._run_pool(trajs, jobs["pool"], results)
        for ti, pi, view in jobs["inline"]:
            results[(ti, pi)] = self._call(self.domains[trajs[ti].domain][pi], view)
        self._collect_judge(judge_call, results)
        self._collect_threads(trajs, thread_futures, results)
        self._assemble(trajs, results)
        return trajs

    def _call(self, part: Part, view: SampleView) -> _Result:
        try:
            return self._check_value(part, part.spec.fn(view, part.params))
        except RewardZero as exc:
            return _Result(0.0, str(exc))
        except Exception as exc:  # noqa: BLE001 - a broken reward must not take the run down
            return _Result(0.0, f"{type(exc).__name__}: {str(exc)[:300]}", failed=True)

    def _fast(self, part: Part, view: SampleView) -> _Result | None:
        try:
            value = part.spec.fast(view, part.params)
        except Exception:  # noqa: BLE001 - the shortcut never decides an error; the reward itself will, in the pool
            return None
        return None if value is None else self._check_value(part, value)

    @staticmethod
    def _check_value(part: Part, value: Any) -> _Result:
        lo, hi = part.spec.score_range
        score = finite_real(value)
        if score is None:
            return _Result(0.0, f"returned {describe_value(value)}, not a finite real number", failed=True)
        if not lo - 1e-9 <= score <= hi + 1e-9:
            return _Result(0.0, f"returned {describe_value(value)}, outside [{lo}, {hi}]", failed=True)
        return _Result(min(max(score, lo), hi))

    def _run_pool(self, trajs, jobs, results) -> None:
        tasks, sent = [], []
        for ti, pi, view in jobs:
            part = self.domains[trajs[ti].domain][pi]
            if part.spec.fast is not None and (fast := self._fast(part, view)) is not None:
                results[(ti, pi)] = fast  # decided without a pool round trip (plain-number math answers)
                continue
            tasks.append((part.spec.fn, (view, part.params), part.timeout_s))
            sent.append((ti, pi, view))
        self.last_pool_run = {"decided_in_process": len(jobs) - len(tasks), "round_trips": 0, "tasks": 0}
        if not tasks:
            return
        outcomes = self._pool.run(tasks)
        self.last_pool_run.update(self._pool.last_run, round_trips=self._pool.last_round_trips)
        for (ti, pi, _), out in zip(sent, outcomes):
            part = self.domains[trajs[ti].domain][pi]
            if out.ok:
                results[(ti, pi)] = self._check_value(part, out.value)
            else:
                results[(ti, pi)] = _Result(0.0, out.error, failed=not out.expected)

    def _submit_threads(self, trajs, jobs) -> list:
        futures = []
        for ti, pi, view in jobs:
            part = self.domains[trajs[ti].domain][pi]
            started: dict[str, float] = {}

            def task(part=part, view=view, started=started) -> _Result:
                started["t"] = time.monotonic()
                params = dict(part.params, _deadline=started["t"] + part.timeout_s)
                return self._call(Part(**{**vars(part), "params": params}), view)

            futures.append((ti, pi, part, started, self._threads.submit(task)))
        return futures

    def _collect_threads(self, trajs, futures, results) -> None:
        pending = list(futures)
        while pending:
            cf.wait([f for *_, f in pending], timeout=1.0, return_when=cf.FIRST_COMPLETED)
            now, still = time.monotonic(), []
            for ti, pi, part, started, fut in pending:
                if fut.done():
                    results[(ti, pi)] = fut.result()
                elif "t" in started and now > started["t"] + part.timeout_s + THREAD_GRACE_S:
                    # Should not happen (the sandbox bounds every run); abandon rather than block the batch.
                    results[(ti, pi)] = _Result(0.0, "timeout", failed=True)
                else:
                    still.append((ti, pi, part, started, fut))
            pending = still

    # ------------------------------------------------------------------------------------------------ judge
    def _judge_is_actor(self) -> bool:
        return hasattr(getattr(self.judge, "score", None), "remote")

    def _submit_judge(self, trajs, jobs, results):
        """Build every judge request of the batch (the part fn) and start ONE judge call; None if nothing to do."""
        keys, requests = [], []
        for ti, pi, view in jobs:
            part = self.domains[trajs[ti].domain][pi]
            try:
                requests.append(part.spec.fn(view, part.params))
                keys.append((ti, pi, part))
            except RewardZero as exc:
                results[(ti, pi)] = _Result(0.0, str(exc))
            except Exception as exc:  # noqa: BLE001
                results[(ti, pi)] = _Result(0.0, f"{type(exc).__name__}: {str(exc)[:300]}", failed=True)
        if not requests:
            return None
        try:
            if self._judge_is_actor():
                pending = self.judge.score.remote(requests)
            else:
                if self._judge_exec is None:
                    self._judge_exec = cf.ThreadPoolExecutor(1, thread_name_prefix="reward-judge")
                pending = self._judge_exec.submit(self.judge.score, requests)
        except Exception as exc:  # noqa: BLE001
            self._judge_failed(keys, results, f"judge call failed: {type(exc).__name__}: {str(exc)[:300]}")
            return None
        return keys, pending, time.monotonic()

    def _collect_judge(self, call, results) -> None:
        if call is None:
            return
        keys, pending, started = call
        left = max(self.judge_timeout_s - (time.monotonic() - started), 0.0)
        try:
            if self._judge_is_actor():
                import ray

                out = ray.get(pending, timeout=left)
            else:
                out = pending.result(timeout=left)
            if not isinstance(out, list) or len(out) != len(keys):
                raise ValueError(f"judge returned {type(out).__name__} of {len(out) if isinstance(out, list) else '?'}"
                                 f" results for {len(keys)} requests")
        except TimeoutError:  # concurrent.futures and Ray's GetTimeoutError both derive from it
            self._abandon_judge_call(pending)
            self._judge_failed(keys, results, f"judge timeout after {self.judge_timeout_s:g}s")
            return
        except Exception as exc:  # noqa: BLE001 - a judge error or a dead judge actor must not end the run
            self._judge_failed(keys, results, f"judge failed: {type(exc).__name__}: {str(exc)[:300]}")
            return
        for (ti, pi, part), res in zip(keys, out):
            value = res.get("score") if isinstance(res, Mapping) else res
            r = self._check_value(part, value)
            if not r.failed and isinstance(res, Mapping) and res.get("reason"):
                r.reason = str(res["reason"])  # e.g. a criterion the judge's text could not be parsed for
            results[(ti, pi)] = r

    def _judge_failed(self, keys, results, reason: str) -> None:
        logger.warning("reward: %s (%d judge request(s) scored 0)", log_safe(reason), len(keys))
        for ti, pi, _ in keys:
            results[(ti, pi)] = _Result(0.0, reason, failed=True)

    def _abandon_judge_call(self, pending) -> None:
        """A timed-out call cannot be interrupted in place; make sure the next batch does not queue behind it."""
        if self._judge_is_actor():
            import ray

            try:  # drops it if still queued; a running sync actor call finishes on its own
                ray.cancel(pending)
            except Exception:  # noqa: BLE001
                pass
        elif self._judge_exec is not None:
            # The stuck thread keeps running until the engine returns; the next batch gets a fresh thread.
            self._judge_exec.shutdown(wait=False, cancel_futures=True)
            self._judge_exec = None

    def _assemble(self, trajs, results) -> None:
        warned = 0
        zero_reasons: dict[str, list[str]] = defaultdict(list)
        for ti, t in enumerate(trajs):
            parts = self.domains.get(t.domain)
            if parts is None or t.reward_error is not None:
                continue
            total, errors = 0.0, []
            for pi, p in enumerate(parts):
                r = results.get((ti, pi), _Result(0.0, "not run", failed=True))
                t.reward_failed |= r.failed
                t.reward_parts[p.label] = r.value
                total += p.weight * r.value
                if r.reason is not None:
                    errors.append(f"{p.label}: {r.reason}")
                    if r.failed and warned < MAX_WARNINGS_PER_BATCH:
                        warned += 1
                        logger.warning("reward %s/%s failed for sample %s: %s", log_safe(t.domain), p.label,
                                       log_safe(t.uid), log_safe(r.reason))
                    elif r.failed:
                        warned += 1
                    else:
                        zero_reasons[f"{t.domain}/{p.label}"].append(r.reason)
            t.reward = total
            t.reward_error = "; ".join(errors) if errors else None
        if warned > MAX_WARNINGS_PER_BATCH:
            logger.warning("reward: %d part failures in this batch (first %d logged)", warned, MAX_WARNINGS_PER_BATCH)
        for key, reasons in zero_reasons.items():
            first = key not in self._zeros_warned
            self._zeros_warned.add(key)
            logger.log(logging.WARNING if first else logging.INFO, "reward %s: %d sample(s) scored 0 with a reason, "
                       "e.g. '%s'%s", log_safe(key), len(reasons), log_safe(reasons[0]),
                       " (from now on logged at INFO)" if first else "")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._threads is not None:
            self._threads.shutdown(wait=True, cancel_futures=True)
            self._threads = None
        if self._judge_exec is not None:
            self._judge_exec.shutdown(wait=False, cancel_futures=True)
            self._judge_exec = None

    def __enter__(self) -> "RewardComposer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

