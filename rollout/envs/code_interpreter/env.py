"""Code interpreter: a Python REPL (`run_python`) whose variables persist across calls within an episode, running
the model's code in the project's code sandbox (rewards/sandbox.py: OS isolation, rlimits, audit hook, killed
process group), and `submit_result(answer)` checked by exact / numeric match.

How state persists in a run-once sandbox: every call starts a fresh sandboxed process that first writes the data
files into its private directory, then replays the episode's earlier successful cells with their output discarded,
then runs the new cell (REPL-style: a final expression's value is printed). Costs and consequences, by design:
- each call re-executes all earlier successful cells, so an episode of n cells runs O(n^2) cells in total, and the
  time limit of a call covers the replay too (a slow earlier cell makes every later call slower);
- replay is faithful for deterministic cells; a cell whose result depends on randomness or time gets new values;
  a cell that raised is not replayed, so whatever it changed before raising is lost (a real REPL would keep it);
- when the process dies (the time limit: the sandbox kills the process group; a CPU, memory or forbidden-operation
  kill; or an exit in the cell) the REPL restarts empty, and the tool result says that earlier state is lost;
- files a cell writes exist again in later calls only because the cell that wrote them is replayed.

The sandbox's settings are the run's `rewards.code` (isolation requirement, allowed packages, network namespace,
write quota: `state.config["code_sandbox"]`, set by the rollout worker) with this environment's per-call resources
(env.yaml `sandbox`) and the tool timeout as its time limits: one construction, `sandbox_limits_from_config`, as
for the code reward.
"""

from __future__ import annotations

import math
import re
import secrets
from typing import Annotated

from rewards.rule_rewards import normalize_short_answer
from rewards.sandbox import SandboxIsolationError, SandboxLimits, run_program, sandbox_limits_from_config
from rollout.envs.base import ToolError, ToolTimeout, own_timeout

MAX_CODE_CHARS = 20_000
DIED = ("timeout", "cpu_limit", "memory", "output_limit", "write_limit", "forbidden", "unavailable", "killed",
        "runtime_error")
# What env.yaml's `sandbox` block may set: a call's resources. Isolation policy is the run's (rewards.code) only.
OWN_SANDBOX_KEYS = ("memory_mb", "output_bytes", "max_procs", "max_write_mb")

# The sandboxed program. Markers carry a random token per call, so a cell cannot fake the driver's verdict by
# accident (it could read it from the program file; the worst it gains is having its own cell replayed).
DRIVER = r'''
import ast as _ast, linecache as _linecache, os as _os, sys as _sys, traceback as _tb
_MARK, _FILES, _CELLS, _NEW, _CAP = {mark!r}, {files!r}, {cells!r}, {new!r}, {cap!r}
for _name, _text in _FILES.items():
    with open(_name, "w", encoding="utf-8") as _f:
        _f.write(_text)
_NS = {{"__name__": "__main__", "__builtins__": __builtins__}}


class _Out:
    """A cell's stdout and stderr: the first _CAP characters go through, the rest is counted and dropped."""
    encoding, errors = "utf-8", "replace"

    def __init__(self, target, cap):
        self.target, self.cap, self.seen = target, cap, 0

    def write(self, s):
        s = str(s)
        room = self.cap - self.seen
        if room > 0 and self.target is not None:
            self.target.write(s[:room])
        self.seen += len(s)
        return len(s)

    def flush(self):
        if self.target is not None:
            self.target.flush()

    def isatty(self):
        return False

    def writable(self):
        return True


def _run(src, name):
    _linecache.cache[name] = (len(src), None, src.splitlines(True), name)  # tracebacks show the cell's lines
    tree = _ast.parse(src, name)
    last = _ast.Expression(tree.body.pop().value) if tree.body and isinstance(tree.body[-1], _ast.Expr) else None
    exec(compile(tree, name, "exec"), _NS)
    if last is not None:
        value = eval(compile(last, name, "eval"), _NS)
        if value is not None:
            print(repr(value))


def _report(exc):
    frames = list(_tb.extract_tb(exc.__traceback__))
    while frames and not frames[0].filename.startswith("<cell"):  # the driver's own frames (and ast's) go
        frames.pop(0)
    text = "".join(_tb.format_list(frames)) if frames else ""
    return ("Traceback (most recent call last):\n" + text if text else "") + "".join(
        _tb.format_exception_only(type(exc), exc))


def _main():
    real = _sys.__stdout__
    sink = _Out(None, 0)
    for i, src in enumerate(_CELLS, 1):
        _sys.stdout = _sys.stderr = sink
        try:
            _run(src, "<cell %d>" % i)
        except BaseException as exc:
            _sys.stdout = real
            real.write("%s replay-failed %d\n%s" % (_MARK, i, _report(exc)))
            return
    out = _Out(real, _CAP)
    real.write(_MARK + " begin\n")
    real.flush()
    _sys.stdout = _sys.stderr = out
    status = "ok"
    try:
        _run(_NEW, "<cell %d>" % (len(_CELLS) + 1))
    except BaseException as exc:
        status = "error"
        out.write(_report(exc))
    _sys.stdout, _sys.stderr = real, _sys.__stderr__
    if out.seen > _CAP:
        real.write("\n[... %d characters omitted ...]" % (out.seen - _CAP))
    real.write("\n%s end %s\n" % (_MARK, status))


_main()
_sys.stdout.flush()
_os._exit(0)  # do not wait for threads a cell left running
'''


def init_state(state):
    state.cells = []  # the episode's successful cells, replayed before each new one
    state.restarts = 0
    state.files = {name.rsplit("/", 1)[-1]: (state.env_dir / name).read_text(encoding="utf-8")
                   for name in state.config.get("files", [])}


def _limits(state) -> SandboxLimits:
    own = dict(state.config.get("sandbox") or {})
    unknown = sorted(set(own) - set(OWN_SANDBOX_KEYS))
    if unknown:
        raise ToolError(f"env.yaml sandbox: unknown key(s) {unknown}; allowed: {list(OWN_SANDBOX_KEYS)} (the "
                        "isolation settings come from rewards.code)")
    return sandbox_limits_from_config(state.config.get("code_sandbox"), **own, wall_s=state.timeout_s,
                                      cpu_s=int(math.ceil(state.timeout_s)) + 1)


def _restart(state, why: str, partial: str) -> str:
    lost = len(state.cells)
    state.cells, state.restarts = [], state.restarts + 1
    shown = f"{partial.rstrip()}\n" if partial.strip() else ""
    return (f"{shown}{why}: the Python process was killed and the interpreter restarted, so everything defined "
            f"in earlier cells ({lost} cell{'s' if lost != 1 else ''}: variables, functions, imports) is lost; "
            "run again what you need.")


@own_timeout
def run_python(state, code: Annotated[str, {"maxLength": MAX_CODE_CHARS}]) -> str:
    """Run Python code in a persistent interpreter (like a notebook cell): variables, functions and imports stay
    defined for later calls. The value of a final expression is printed, as is everything the code prints. The
    data files of the task are in the working directory. numpy is available; there is no network.

    Args:
        code: the Python code to run.
    """
    mark = f"@@cell-{secrets.token_hex(8)}"
    cap = int(state.config.get("cell_output_chars", 20_000))
    program = DRIVER.format(mark=mark, files=state.files, cells=state.cells, new=code, cap=cap)
    try:
        res = run_program(program, _limits(state))
    except SandboxIsolationError as exc:
        raise ToolError(f"the sandbox refused to run: {exc}") from None
    out = res.stdout
    begin, end = f"{mark} begin\n", re.compile(rf"\n{re.escape(mark)} end (ok|error)\n")
    if f"{mark} replay-failed" in out and begin not in out:
        why = out.split(f"{mark} replay-failed", 1)[1].strip()
        state.cells, state.restarts = [], state.restarts + 1
        raise ToolError(f"the interpreter state could not be rebuilt (cell {why}); the interpreter restarted "
                        "empty and your new code did not run: run again what you need.")
    cell_out = out.split(begin, 1)[1] if begin in out else ""
    m = end.search(cell_out)
    if res.status == "timeout":
        raise ToolTimeout(_restart(state, f"Timed out after {state.timeout_s:g} s", cell_out))
    if res.status == "setup_error":
        raise ToolError(f"the sandbox failed ({res.status}: {res.detail}); your code did not run, earlier state "
                        "is kept")
    if m is None or res.status in DIED:
        detail = res.detail or (res.stderr_tail.strip().splitlines() or ["the process ended"])[-1]
        raise ToolError(_restart(state, f"The process died ({res.status}: {detail[:200]})", cell_out))
    text = cell_out[:m.start()]
    if m.group(1) == "error":
        raise ToolError(text.rstrip() + "\n(the cell raised, so it is not kept; earlier state is kept)")
    state.cells.append(code)
    return text.rstrip("\n") if text.strip() else "(no output)"


def submit_result(state, answer: str | int | float) -> str:
    """Submit the final answer; this ends the episode. Only the first submission counts.

    Args:
        answer: the answer, as a number or a short text, in the form the task asks for.
    """
    return "Answer submitted."


TOOLS = [run_python, submit_result]


# ------------------------------------------------------------------------------------------------- verifier
_GROUPED = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")


def as_number(value) -> float | None:
    """A submitted answer as a number: numbers as they are; strings like "1,234.5", " 40 " or "$12" parsed."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip().strip("'\"`*_ ").lstrip("$")  # not normalize_short_answer: it would eat ".5"'s dot
    if _GROUPED.fullmatch(text):
        text = text.replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


def verify(task, state):
    if not state.submitted:
        return 0.0, "nothing was submitted"
    got, want = state.submission, task["answer"]
    if task["answer_type"] == "str":
        ok = normalize_short_answer(str(got)) == normalize_short_answer(str(want))
        return (1.0, None) if ok else (0.0, f"submitted {str(got)[:80]!r}, expected {want!r}")
    number = as_number(got)
    if number is None:
        return 0.0, f"submitted {str(got)[:80]!r}, which is not a number"
    tolerance = float(task.get("tolerance", 0.0))
    if abs(number - float(want)) <= tolerance + 1e-9 * max(1.0, abs(float(want))):
        return 1.0, None
    return 0.0, f"submitted {number:g}, expected {want} (tolerance {tolerance:g})"


def solve(task, call):
    """Runs the task's reference cells through the REPL and submits the last line the last cell printed."""
    output = ""
    for cell in task["reference_cells"]:
        output = call("run_python", code=cell)
    call("submit_result", answer=output.strip().splitlines()[-1].strip())


def perturb_submission(task, value) -> dict:
    number = as_number(value)
    if task["answer_type"] == "str" or number is None:
        return {"other_text": f"{value} and more"}
    step = max(10 * float(task.get("tolerance", 0.0)), 1.0)
    return {"off_by_more_than_tolerance": number + step}
