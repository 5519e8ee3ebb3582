"""A process pool with per-task timeouts that kills and recreates itself when a task hangs or crashes a worker.

Built on `concurrent.futures.ProcessPoolExecutor` with a forkserver context (never plain fork: the reward worker
may hold threads and Ray state). Why the extra machinery:
- a future's own timeout only stops *waiting*; the worker keeps burning CPU. Here a task past its deadline gets
  every worker process SIGKILLed and a fresh executor; the other in-flight tasks (innocent) are re-run.
- at most `size` tasks are in flight, so a task's clock starts when it actually starts on a worker rather than
  when it was queued behind a stuck one.
- a task that breaks the pool (segfault, OOM kill) twice is reported as "worker crashed"; others are re-run.
- the pool's processes die with the process that owns the pool, even when it is SIGKILLed (Linux): see
  `_die_with_parent`. Without that, a killed Ray actor or CLI run left the forkserver and every worker behind
  (the workers hold the forkserver's "alive" pipe and their own call queue open, so none of them ever sees EOF).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import logging
import multiprocessing as mp
import multiprocessing.forkserver
import os
import queue
import resource
import signal
import sys
import threading
import time
import types
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from .output_cap import begin_sample, capture_output, end_sample

logger = logging.getLogger(__name__)

# Modules the forkserver imports once, so each forked worker starts with them loaded (math-verify + sympy take
# ~1 s to import; a fork takes milliseconds). This module comes first: importing it in the forkserver ties the
# forkserver's life to the pool owner's (see the end of this file) before the slow imports.
PRELOAD = ["rewards.process_pool", "math_verify", "rewards.math_reward", "rewards.spec"]

# Set by the pool owner before it starts the forkserver: the pid the forkserver must see as its parent.
_OWNER_ENV = "MIXRL_REWARD_POOL_OWNER_PID"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_prctl = None  # libc's prctl once looked up (in the forkserver, so its forked workers inherit it)


def _die_with_parent(expected_ppid: int | None) -> None:
    """Linux: ask the kernel to SIGKILL this process when its parent dies (prctl PR_SET_PDEATHSIG), then exit at
    once if the parent is already gone (it may have died before the prctl: nothing would ever signal us then).
    A no-op elsewhere or if prctl is unavailable.

    The death signal fires when the parent *thread* that forked us exits, not only the parent process. Both of our
    parents are safe with that: a worker's parent is the single-threaded forkserver, and the forkserver is started
    from `_forkserver_keeper`'s thread, which lives as long as the pool owner's process."""
    global _prctl
    if not sys.platform.startswith("linux"):
        return
    if _prctl is None:
        try:
            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _prctl = False
    if not _prctl or _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return
    if expected_ppid is not None and os.getppid() != expected_ppid:
        os._exit(1)


def _in_forkserver_preload() -> bool:
    """True while this module is being imported by the forkserver itself (its preload list), not by a process it
    forked (a worker imports what was not preloaded inside `main` -> `_serve_one`)."""
    fs = sys.modules.get("multiprocessing.forkserver")
    main = getattr(getattr(fs, "main", None), "__code__", None)
    serve_one = getattr(getattr(fs, "_serve_one", None), "__code__", None)
    frame = sys._getframe(1)
    while frame is not None and main is not None:
        if frame.f_code is serve_one:
            return False
        if frame.f_code is main:
            return True
        frame = frame.f_back
    return False


_keeper_lock = threading.Lock()
_keeper: tuple[int, queue.SimpleQueue] | None = None  # (pid that started the thread, its request queue)


def _forkserver_keeper(requests: queue.SimpleQueue) -> None:
    while True:
        done: cf.Future = requests.get()
        try:
            pid = str(os.getpid())
            if os.environ.get(_OWNER_ENV) != pid:
                os.environ[_OWNER_ENV] = pid
            multiprocessing.forkserver.ensure_running()
            done.set_result(multiprocessing.forkserver._forkserver._forkserver_pid)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            done.set_exception(exc)


def _ensure_forkserver() -> int | None:
    """Start the forkserver if it is not running and return its pid. It is started from a dedicated thread that
    never exits: the forkserver's death signal fires when the thread that started it exits, and the caller may be a
    short-lived thread (a Ray actor's method, a helper thread) while the pool lives on."""
    global _keeper
    with _keeper_lock:
        if _keeper is None or _keeper[0] != os.getpid():  # none yet, or inherited through a fork (thread not)
            requests: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_forkserver_keeper, args=(requests,), name="reward-pool-forkserver",
                             daemon=True).start()
            _keeper = (os.getpid(), requests)
        done: cf.Future = cf.Future()
        _keeper[1].put(done)
    return done.result()


@dataclass
class Outcome:
    ok: bool
    value: Any = None
    error: str | None = None  # "timeout", "worker crashed", or "<ExceptionType>: message"
    expected: bool = False  # the task raised RewardZero: an expected zero, not a failure


def _init_worker(memory_mb: int, forkserver_pid: int | None = None, output_caps: tuple[int, int] = (0, 0)) -> None:
    # Die with the forkserver, our parent (which itself dies with the pool owner).
    _die_with_parent(forkserver_pid)
    # A reward that prints in a loop must not fill the run's log (rewards/output_cap.py).
    capture_output(*output_caps)
    # Cap each worker's address space so one hostile sympy expression cannot take the machine's memory;
    # it gets a MemoryError inside the task instead.
    if memory_mb:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _run_task(fn: Callable, args: tuple) -> tuple[str, Any]:
    """Runs in the worker. Exceptions become values so the parent can tell them from a broken pool."""
    from .spec import RewardZero

    begin_sample(_fn_key(fn))
    try:
        return "ok", fn(*args)
    except RewardZero as exc:
        return "zero", str(exc)
    except BaseException as exc:  # noqa: BLE001 - any failure of a reward is reported, never propagated
        return "error", f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        end_sample()


def _ping() -> int:
    return os.getpid()


@contextlib.contextmanager
def _main_module_hidden():
    """multiprocessing re-imports the parent's `__main__` in every forkserver/spawn child. The main module here is
    whatever started this process (a Ray worker script, pytest, a Hydra entry point without a main guard...):
    re-running it in a reward worker is at best slow and at worst starts a second pool recursively. Pool tasks
    are module-level functions of importable modules, so the workers never need `__main__`."""
    real = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if real is not None:
            sys.modules["__main__"] = real


class KillablePool:
    def __init__(self, size: int, memory_mb: int = 0, warmup: Callable[[], None] | None = None,
                 start_timeout_s: float = 120.0, output_caps: tuple[int, int] = (0, 0)):
        self.size = max(1, int(size))
        self.memory_mb = int(memory_mb or 0)
        self.output_caps = tuple(int(x) for x in output_caps)  # bytes kept per task, per worker (0 = no cap)
        self.warmup = warmup
        self.start_timeout_s = start_timeout_s
        self.restarts = 0
        self._mean_s: dict[str, float] = {}  # seconds per task of each function so far (batching, `_units`)
        self.last_round_trips = 0  # futures the last `run` submitted (tasks or batches)
        # the last `run`: seconds it took, and the workers' own seconds per task summed and at most (what a slow
        # reward phase is made of: one slow task, or the round trips around many quick ones)
        self.last_run = {"tasks": 0, "wall_s": 0.0, "worker_s": 0.0, "slowest_s": 0.0}
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)  # only takes effect if the forkserver is not running yet
        self._ctx = ctx
        self._executor: cf.ProcessPoolExecutor | None = None
        self._start()

    # ---------------------------------------------------------------------------------------------- lifecycle
    def _start(self) -> None:
        forkserver_pid = _ensure_forkserver()
        self._executor = cf.ProcessPoolExecutor(
            max_workers=self.size, mp_context=self._ctx, initializer=_init_worker,
            initargs=(self.memory_mb, forkserver_pid, self.output_caps),
        )
        # Start every worker now (the executor spawns lazily) so start-up time never counts against a task.
        # Workers are only ever created here (they are not replaced one by one), so hiding the caller's main
        # module for these submits is enough to keep it from being re-imported in every worker.
        with _main_module_hidden():
            futures = [self._executor.submit(_ping) for _ in range(self.size)]
        if self.warmup is not None:
            futures += [self._executor.submit(_run_task, self.warmup, ()) for _ in range(self.size)]
        done, not_done = cf.wait(futures, timeout=self.start_timeout_s)
        if not_done:
            logger.warning("reward pool: workers did not start within %.0f s", self.start_timeout_s)

    def worker_pids(self) -> list[int]:
        procs = getattr(self._executor, "_processes", None) or {}
        return [p.pid for p in list(procs.values()) if p.pid is not None]

    def _kill(self) -> None:
        """SIGKILL every worker process and drop the executor (it cannot be reused after that)."""
        ex, self._executor = self._executor, None
        if ex is None:
            return
        procs = list((getattr(ex, "_processes", None) or {}).values())
        for p in procs:
            try:
                p.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass
        ex.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            p.join(timeout=5)

    def restart(self) -> None:
        self.restarts += 1
        self._kill()
        self._start()

    def close(self) -> None:
        self._kill()

    # ------------------------------------------------------------------------------------------------- running
    def run(self, tasks: list[tuple[Callable, tuple, float]]) -> list[Outcome]:
        """Run `(fn, args, timeout_s)` tasks; one Outcome per task, in order. Never raises for a task's failure.

        Tasks of a function that has been cheap so far (`CHEAP_TASK_S` on average) go to the workers in batches
        (`_units`): one round trip per batch instead of per task, which is what a batch of short math answers
        otherwise spends its time on. A batch past its deadline, or one that raised as a whole (an unpicklable
        result), is split and its tasks run again one by one, so the culprit meets the per-task rules alone.
        A crashed worker breaks every task in flight and does not say whose task crashed it: all of them become
        suspects, run again one at a time with nothing beside them, and a task that crashes the pool twice on its
        own is reported as "worker crashed"."""
        results: list[Outcome | None] = [None] * len(tasks)
        queue = deque(self._units(tasks))
        attempts = [0] * len(tasks)
        suspects: set[int] = set()  # tasks in flight when a worker crashed
        inflight: dict[cf.Future, tuple[list[int], float, bool]] = {}  # future -> (tasks, deadline, alone)
        self.last_round_trips = 0
        started, worker_s, slowest_s = time.perf_counter(), 0.0, 0.0

        def crashed(unit: list[int], alone: bool, error: str) -> None:
            if alone and len(unit) == 1:  # it crashed the pool by itself: one attempt used
                attempts[unit[0]] += 1
                if attempts[unit[0]] >= 2:
                    results[unit[0]] = Outcome(False, error=error)
                    suspects.discard(unit[0])
                    return
            suspects.update(unit)
            queue.extendleft([i] for i in reversed(unit))

        while queue or inflight:
            if self._executor is None:
                self._start()
            while queue and len(inflight) < self.size and not any(a for *_, a in inflight.values()):
                alone = any(i in suspects for i in queue[0])
                if alone and inflight:
                    break  # a suspect runs with nothing beside it: wait for the others
                unit = queue.popleft()
                try:
                    fut = self._executor.submit(_run_batch, [tasks[i][:2] for i in unit])
                except cf.process.BrokenProcessPool:
                    if inflight:  # a task in flight broke the pool: the wait below finds it and restarts
                        queue.appendleft(unit)
                        break
                    # The pool died before this task ran (e.g. workers cannot start); bounded retries.
                    crashed(unit, True, "worker crashed (pool could not start)")
                    self.restart()
                    continue
                self.last_round_trips += 1
                # Each task keeps its own timeout: a batch of cheap tasks past the shortest of them is split
                inflight[fut] = (unit, time.monotonic() + min(tasks[i][2] for i in unit), alone)
            if not inflight:
                continue
            next_deadline = min(d for _, d, _ in inflight.values())
            done, _ = cf.wait(list(inflight), timeout=max(0.0, next_deadline - time.monotonic()),
                              return_when=cf.FIRST_COMPLETED)
            broken, solo = False, len(inflight) == 1  # solo: nothing else was in flight
            for fut in done:
                unit, _, alone = inflight.pop(fut)
                try:
                    outs, seconds = fut.result()
                except cf.process.BrokenProcessPool:
                    broken = True
                    crashed(unit, alone or solo, "worker crashed")
                    continue
                except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable argument or result
                    if len(unit) > 1:
                        queue.extendleft([i] for i in reversed(unit))
                    else:
                        results[unit[0]] = Outcome(False, error=f"{type(exc).__name__}: {str(exc)[:300]}")
                    continue
                for i, sec in zip(unit, seconds):
                    self._note_duration(tasks[i][0], sec)
                    worker_s, slowest_s = worker_s + sec, max(slowest_s, sec)
                for i, out in zip(unit, outs):
                    results[i] = _outcome(*out)
                    suspects.discard(i)
            now = time.monotonic()
            expired = [f for f, (_, d, _) in inflight.items() if d <= now and not f.done()]
            if expired or broken:
                timed_out = 0
                for fut in expired:
                    unit, _, _ = inflight.pop(fut)
                    if len(unit) > 1:  # a hung batch: its tasks again, one by one
                        queue.extendleft([i] for i in reversed(unit))
                    else:
                        results[unit[0]] = Outcome(False, error="timeout")
                        timed_out += 1
                # Other tasks in flight lose their worker with the pool: re-run them from scratch.
                for fut, (unit, _, alone) in list(inflight.items()):
                    if fut.done() and not fut.exception():
                        for i, out in zip(unit, fut.result()[0]):
                            results[i] = _outcome(*out)
                    elif broken:  # whose task crashed the worker is not known: it may have been this one
                        crashed(unit, False, "worker crashed")
                    else:
                        queue.appendleft(unit)
                inflight.clear()
                logger.warning("reward pool: restarting (%d timed out, %d batches split, crashed=%s)", timed_out,
                               len(expired) - timed_out, broken)
                self.restart()
        self.last_run = {"tasks": len(tasks), "wall_s": time.perf_counter() - started, "worker_s": worker_s,
                         "slowest_s": slowest_s}
        return results  # type: ignore[return-value]

    def _units(self, tasks: list[tuple[Callable, tuple, float]]) -> list[list[int]]:
        """Task indices grouped into what each round trip carries: batches of tasks whose function has been cheap,
        about `BATCHES_PER_WORKER` per worker (at most `MAX_BATCH` tasks), and single tasks otherwise."""
        cheap = [i for i, (fn, _, _) in enumerate(tasks)
                 if self._mean_s.get(_fn_key(fn), float("inf")) < CHEAP_TASK_S]
        k = min(MAX_BATCH, -(-len(cheap) // (BATCHES_PER_WORKER * self.size))) if cheap else 1
        if k <= 1:
            return [[i] for i in range(len(tasks))]
        is_cheap = set(cheap)
        units = [cheap[j : j + k] for j in range(0, len(cheap), k)]
        return units + [[i] for i in range(len(tasks)) if i not in is_cheap]

    def _note_duration(self, fn: Callable, seconds: float) -> None:
        """Running mean (EMA) of a function's seconds per task, as its worker timed it."""
        key = _fn_key(fn)
        old = self._mean_s.get(key)
        self._mean_s[key] = seconds if old is None else 0.8 * old + 0.2 * seconds


# What makes tasks go to the workers in batches (KillablePool.run)
CHEAP_TASK_S = 0.02  # a function whose tasks ran for less than this on average in the worker
BATCHES_PER_WORKER = 4  # batches per worker per run: few round trips, and little left for the last batch
MAX_BATCH = 32  # tasks per batch at most


def _fn_key(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"


def _outcome(status: str, value: Any) -> Outcome:
    if status == "ok":
        return Outcome(True, value=value)
    return Outcome(False, error=value, expected=status == "zero")


def _run_batch(items: list[tuple[Callable, tuple]]) -> tuple[list[tuple[str, Any]], list[float]]:
    """Runs in the worker: one or more tasks, each with its own outcome and the seconds it took."""
    outs, seconds = [], []
    for fn, args in items:
        start = time.perf_counter()
        outs.append(_run_task(fn, args))
        seconds.append(time.perf_counter() - start)
    return outs, seconds


# In the forkserver (this module is first in its preload list): die with the pool owner, who set _OWNER_ENV.
if _in_forkserver_preload():
    _owner = os.environ.get(_OWNER_ENV, "")
    _die_with_parent(int(_owner) if _owner.isdigit() else None)
