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
