"""Tool calls that can be stopped: a pure-Python tool runs in a daemon thread of its own (`ToolThread`), and at its
deadline `stop()` ends it, so that no hung call keeps a core busy for the rest of the run.

How: `ToolStopped` (a BaseException, so that `except Exception` in a tool does not swallow it) is raised inside the
tool's thread with `PyThreadState_SetAsyncExc`. Python delivers such an exception only where its interpreter checks
for pending events (a loop's back edge, a call), so a tool that catches it could carry on; two things prevent that:
- once it has hit the tool, the exception arms a trace function in that thread (as pdb does) that sends it again
  at every line and call the tool runs, its own `except` and `finally` blocks included: whatever catches it is hit
  again at its next check, until the thread has unwound out of the tool;
- a reaper thread sends it again every REINJECT_S until the thread has left the tool.
Our own frames around the tool (`ToolThread.invoke` and below) are never traced, and nothing is sent once the tool
has returned (`left`), so the session's bookkeeping after the tool runs undisturbed.

What cannot be stopped: a thread blocked inside one C call (`time.sleep(1e9)`, a blocking socket read, a long regex
match, a C extension's loop, a query the database does not interrupt) runs no bytecode, so the exception waits until
that call returns to Python; nothing short of ending the process interrupts it. Such a thread is stuck: it stays
counted (`stuck(group)`, per environment) until it leaves the tool, and the session refuses new calls of an
environment with `limits.max_stuck_calls` stuck ones, so they cannot pile up without limit.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import sys
import threading
import time

log = logging.getLogger(__name__)

REINJECT_S = 0.02  # how often the reaper sends the exception again into a thread that has not left its tool
STUCK_WARN_S = 2.0  # a stopped thread still alive after this long is reported once (it is blocked in a C call)

_PyFn = ctypes.PYFUNCTYPE  # calls that keep the GIL: nothing else runs between our check and the call
_set_async_exc = _PyFn(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(("PyThreadState_SetAsyncExc", ctypes.pythonapi))
# The same C function as a trace function (bound to the thread and the exception by functools.partial, itself C): it
# runs no bytecode, so the exception it schedules is raised in the traced code at its next check; a Python trace
# function would run bytecode of its own, be hit there, and be switched off by Python for raising. The trace call's
# three extra arguments (frame, event, arg) are ignored by the two-argument C function (harmless on the 64-bit C
# ABIs). Bound to thread id 0 (no thread) it does nothing: the thread-wide trace function, which sees only new frames
# ('call' events); those need none, since the exception scheduled by their caller's line is raised at their entry,
# before any `try` of theirs (and tracing them would hit `ToolStopped.__init__` itself, recursively).
_set_async_exc_traced = _PyFn(None, ctypes.c_ulong, ctypes.py_object, ctypes.py_object, ctypes.py_object,
                              ctypes.py_object)(("PyThreadState_SetAsyncExc", ctypes.pythonapi))
_NEW_FRAMES = functools.partial(_set_async_exc_traced, 0, None)
_tls = threading.local()


class ToolStopped(BaseException):
    """Raised inside a tool's thread at its deadline; a tool must not catch it (one that does is hit again)."""

    def __init__(self, *args):
        super().__init__(*args)
        _arm()  # Python builds an asynchronously raised exception in the thread it hits, so this runs there


def _arm() -> None:
    call = getattr(_tls, "call", None)
    if call is None or call.left:
        return
    frames, f = [], sys._getframe(2)  # 0: _arm, 1: __init__, 2: where the exception was raised or caught
    while f is not None and f.f_code is not _INVOKE_CODE:
        frames.append(f)
        f = f.f_back
    if f is None or not frames:
        return  # not inside the tool: our own code around it handles the exception
    tracer = functools.partial(_set_async_exc_traced, threading.get_ident(), ToolStopped)
    call.armed = True
    sys.settrace(_NEW_FRAMES)  # line events reach a frame's f_trace only while the thread has a trace function
    for frame in frames:  # the frames already running, as pdb.set_trace does
        frame.f_trace = tracer


class ToolThread:
    """One tool call in a daemon thread of its own. `body(call)` runs in that thread and calls the tool through
    `call.invoke(fn, ...)`; the caller waits on `done` and calls `stop()` when the deadline has passed. `group`
    (the environment) is what `stuck` counts by."""

    def __init__(self, name: str, body, group: object):
        self.body, self.group = body, group
        self.left = False  # the tool has returned or raised: nothing is sent into the thread any more
        self.armed = False  # _arm has set this thread's trace function (someone else's, e.g. coverage's, is left alone)
        self.ident: int | None = None
        self.stopped_at: float | None = None
        self.warned = False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._main, name=f"tool-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _main(self) -> None:
        self.ident = threading.get_ident()
        _tls.call = self
        try:
            self.body(self)
        except BaseException:  # noqa: BLE001 - a stop that hit our own code after the tool: the caller has moved on
            pass
        finally:
            self.left = True
            if self.armed:
                sys.settrace(None)
            self.done.set()

    def invoke(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            self.left = True  # before anything that could run a check: no stop is sent after this
            if self.armed:
                sys.settrace(None)  # a stop still pending is raised right after this call, here

    def stop(self) -> None:
        """Ends the tool's run (see the module docstring); returns at once."""
        self.stopped_at = time.monotonic()
        if not self.left:
            _set_async_exc(self.ident, ToolStopped)
        _REAPER.add(self)


_INVOKE_CODE = ToolThread.invoke.__code__


class _Reaper:
    """Sends the stop again into every stopped thread until it has left its tool; counts the ones still alive."""

    def __init__(self):
        self._calls: list[ToolThread] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, call: ToolThread) -> None:
        with self._lock:
            self._calls.append(call)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="tool-reaper", daemon=True)
                self._thread.start()

    def stuck(self, group: object) -> int:
        with self._lock:
            return sum(c.group is group and c.thread.is_alive() for c in self._calls)

    def _loop(self) -> None:
        while True:
            with self._lock:
                self._calls = [c for c in self._calls if c.thread.is_alive()]
                calls = list(self._calls)
                if not calls:
                    self._thread = None
                    return
            for c in calls:
                if not c.left:  # read and sent with no check in between: the GIL is not handed over here
                    _set_async_exc(c.ident, ToolStopped)
                if not c.warned and time.monotonic() - c.stopped_at > STUCK_WARN_S:
                    c.warned = True
                    log.warning("tool thread %s is still alive %.0f s after its stop (blocked in a C call, it ends "
                                "when that call returns)", c.thread.name, STUCK_WARN_S)
            time.sleep(REINJECT_S)


_REAPER = _Reaper()


def stuck(group: object) -> int:
    """Stopped tool threads of `group` (an environment) that are still alive."""
    return _REAPER.stuck(group)
