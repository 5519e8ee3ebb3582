"""KillablePool process lifetime: the forkserver and the pool's workers die with the process that owns the pool,
even when that process is SIGKILLed (a Ray actor killed by Ray, a CLI run killed from the shell)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")

# The owner prints one JSON line with the pids of everything it started, then waits to be killed.
OWNER = textwrap.dedent("""
    import json, sys, threading, time
    import multiprocessing.forkserver as fs, multiprocessing.resource_tracker as rt
    from rewards.process_pool import KillablePool

    def make():
        global pool
        pool = KillablePool({size})

    if {in_thread}:  # the pool is created by a thread that then exits: the forkserver must not die with it
        t = threading.Thread(target=make); t.start(); t.join(); time.sleep(1.0)
    else:
        make()
    from rewards.process_pool import _ping
    pids = pool.run([(_ping, (), 30.0) for _ in range({size})])
    print(json.dumps({{"workers": pool.worker_pids(), "forkserver": fs._forkserver._forkserver_pid,
                      "tracker": rt._resource_tracker._pid, "ran": [o.value for o in pids]}}), flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _start_owner(size: int, in_thread: bool, stderr):
    # stderr to a file: the resource tracker outlives the owner a moment and reports the semaphores it cleans up.
    proc = subprocess.Popen([sys.executable, "-c", OWNER.format(size=size, in_thread=in_thread)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=stderr, text=True)
    line = proc.stdout.readline()
    assert line, f"owner exited early (rc={proc.poll()})"
    return proc, json.loads(line)


@pytest.mark.parametrize("in_thread", [False, True], ids=["main-thread", "short-lived-thread"])
def test_children_die_with_sigkilled_owner(in_thread, tmp_path):
    with open(tmp_path / "stderr", "w") as err:
        proc, info = _start_owner(2, in_thread, err)
    started = info["workers"] + [info["forkserver"], info["tracker"]]
    try:
        assert len(info["workers"]) == 2 and set(info["ran"]) <= set(info["workers"])
        assert all(_alive(p) for p in started), info  # the forkserver survived the creating thread's exit
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(_alive(p) for p in started):
            time.sleep(0.1)
        left = {p: psutil.Process(p).name() for p in started if _alive(p)}
        assert not left, f"still alive after the owner was SIGKILLed: {left} (started: {info})"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in started:  # clean up after a failure: only the processes this test started
            if _alive(p):
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass


# -- batching: cheap tasks travel to the workers several at a time, each keeping its own outcome ----------------
def _sleepy(seconds):
    time.sleep(seconds)
    return seconds


def _cheap(x):  # module-level: pickled by reference into the pool's workers
    from rewards.spec import RewardZero

    if x < 0:
        os._exit(1)  # a crash of the worker process
    if x == 13_000:
        while True:
            pass
    if x == 12_000:
        time.sleep(2.0)  # slow, not hung: past a short timeout of its own
    if x % 5 == 0:
        raise RewardZero(f"zero {x}")
    if x % 7 == 0:
        raise ValueError(f"bad {x}")
    return x * x


def _check(outs, xs):
    for x, o in zip(xs, outs):
        if x % 5 == 0:
            assert not o.ok and o.expected and o.error == f"zero {x}"
        elif x % 7 == 0:
            assert not o.ok and not o.expected and o.error == f"ValueError: bad {x}"
        else:
            assert o.ok and o.value == x * x


def test_cheap_tasks_go_in_batches_with_their_own_outcomes():
    from rewards.process_pool import BATCHES_PER_WORKER, KillablePool

    pool = KillablePool(2)
    try:
        xs = list(range(1, 41))
        first = pool.run([(_cheap, (x,), 30.0) for x in xs])
        assert pool.last_round_trips == 40  # nothing known about the function yet: one task per round trip
        _check(first, xs)
        again = pool.run([(_cheap, (x,), 30.0) for x in xs])
        assert pool.last_round_trips == BATCHES_PER_WORKER * 2  # 40 cheap tasks -> 8 batches of 5
        _check(again, xs)
        assert pool.restarts == 0
    finally:
        pool.close()


def test_a_run_reports_what_it_cost():
    """`last_run`: the run's seconds and the workers' own seconds per task (summed, and the slowest), which the
    reward worker logs for the scoring left after generation."""
    from rewards.process_pool import KillablePool
    from rewards.worker import pool_summary

    pool = KillablePool(2)
    try:
        pool.run([(_sleepy, (0.01,), 30.0), (_sleepy, (0.2,), 30.0), (_sleepy, (0.01,), 30.0)])
        run = pool.last_run
        assert run["tasks"] == 3
        assert 0.2 <= run["slowest_s"] < 1.0
        assert run["worker_s"] == pytest.approx(0.22, abs=0.1) and run["worker_s"] > run["slowest_s"]
        assert run["wall_s"] >= run["slowest_s"]
        text = pool_summary({**run, "decided_in_process": 5, "round_trips": pool.last_round_trips})
        assert "5 decided in-process" in text and "3 tasks in 3 round trips" in text and "slowest task 0.2" in text
        assert pool_summary({}) == ""
    finally:
        pool.close()


@pytest.mark.parametrize("culprit, error", [(13_000, "timeout"), (-3, "worker crashed")], ids=["hang", "crash"])
def test_a_task_that_breaks_its_batch_is_found_alone(culprit, error):
    from rewards.process_pool import KillablePool

    pool = KillablePool(2)
    try:
        xs = list(range(1, 41))
        pool.run([(_cheap, (x,), 30.0) for x in xs])  # the function is known to be cheap from now on
        xs[12] = culprit
        t0 = time.monotonic()
        outs = pool.run([(_cheap, (x,), 1.5) for x in xs])
        assert time.monotonic() - t0 < 20
        assert pool.last_round_trips > 8  # the broken batch was split and its tasks ran one by one
        assert not outs[12].ok and outs[12].error == error
        _check(outs[:12] + outs[13:], xs[:12] + xs[13:])  # every other task has its own outcome
    finally:
        pool.close()


def test_a_crash_blames_only_the_task_that_crashed():
    """Tasks sent one by one (a function not yet known to be cheap): a crash breaks every task in flight, and only
    the one that then crashes the pool on its own is reported; its neighbours in flight get their own results."""
    from rewards.process_pool import KillablePool

    pool = KillablePool(2)
    try:
        xs = [x for x in range(1, 21) if x % 5 and x % 7]
        xs[3] = -1
        outs = pool.run([(_cheap, (x,), 30.0) for x in xs])
        assert pool.last_round_trips >= len(xs) and not outs[3].ok and outs[3].error == "worker crashed"
        assert all(o.ok and o.value == x * x for x, o in zip(xs, outs) if x != -1)
    finally:
        pool.close()


def test_a_batched_task_keeps_its_own_timeout():
    """A task with a short timeout inside a batch of tasks with long ones still times out at its own."""
    from rewards.process_pool import KillablePool

    pool = KillablePool(1)
    try:
        xs = [x for x in range(1, 30) if x % 5 and x % 7]
        pool.run([(_cheap, (x,), 30.0) for x in xs])  # cheap from now on: batched
        xs[2] = 12_000
        outs = pool.run([(_cheap, (x,), 0.5 if x == 12_000 else 30.0) for x in xs])
        assert not outs[2].ok and outs[2].error == "timeout"
        assert all(o.ok and o.value == x * x for x, o in zip(xs, outs) if x != 12_000)
    finally:
        pool.close()


def test_a_task_crashing_a_one_worker_pool_is_blamed_after_two_crashes():
    from rewards.process_pool import KillablePool

    pool = KillablePool(1)
    try:
        outs = pool.run([(_cheap, (1,), 30.0), (_cheap, (-1,), 30.0), (_cheap, (2,), 30.0)])
        assert [o.ok for o in outs] == [True, False, True] and outs[1].error == "worker crashed"
        assert pool.restarts == 2
    finally:
        pool.close()
