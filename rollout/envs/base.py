"""Agent environments: <environment, tools, task, verifier> (the DeepSeek-V3.2 agent recipe's format).

An environment is a directory (bundled ones are `rollout/envs/<name>/`):
  env.yaml     name, description (one paragraph for the system prompt), limits (tool_timeout_s, max_output_chars,
               max_stuck_calls),
               submit_tool (default submit_result), database (the bundled files its SQLite database is built from;
               leave it out for no database), and any keys of its own (tools read them as `state.config`).
  env.py       TOOLS: the tools, typed functions `fn(state, arg: T, ...)` with Google-style docstrings (their JSON
               schemas are derived by `tool_schema`; the first parameter, the session `State`, is not part of it);
               the submit tool is one of them. `verify(task, state) -> (score in [0, 1], reason or None)`.
               Optional: `build_db(conn, env_dir)` (fills the database), `init_state(state)` /
               `close_state(state)` (per-episode set-up and clean-up), `solve(task, call)` (the reference
               solution: it calls tools through `call(name, **args)`, which returns the tool's value, and the calls
               it made are the reference; or `solve(task)` returning the calls), `perturb_submission(task, value)`
               ({name: wrong value}) and `perturb(task, calls)` ({name: call list}) for `check_env`.
  tasks.jsonl  one task a line: at least {"id", "prompt"}, plus whatever the tools and the verifier read.

The database is built once per content (a hash of the data files and of `build_db`'s source) into the cache
(`$MIXRL_CACHE/envs`, default ~/.cache/mixrl/envs; atomic, safe to race) and every session opens it read-only
(`file:...?mode=ro` plus `PRAGMA query_only`), so no episode can change what another one sees; what an episode
may change lives in its `State`.

Session.call never raises. Bad input is answered as a result the model can read: an unknown tool, arguments that
violate the schema (each violation named), a tool that raised (`ToolError` for expected failures: the message is
shown as is), output over `max_output_chars` (cut in the middle with a marker), a second submit (the first one
counts). A tool past its deadline is stopped (each call runs in a thread of its own, ended at the deadline by
rollout/envs/stoppable.py; a thread blocked inside a C call ends only when that call returns): its call is a
timeout, and since the episode's state may be half-updated the session is spent: every later call of the episode
is an error naming the stopped call (`Session.stopped`; the agent loop ends the episode, reason `tool_timeout`).
While `limits.max_stuck_calls` stopped threads of an environment are still alive (blocked in C), its new calls fail
at once instead of adding to them. Tools marked `@own_timeout` (the code interpreter) enforce `state.timeout_s`
themselves by killing their process; the session then waits a grace period longer before it stops them.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import hashlib
import importlib.util
import inspect
import json
import os
import sqlite3
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from rollout.envs.schema import tool_schema, validate_arguments
from rollout.envs.stoppable import ToolThread, stuck

ENVS_DIR = Path(__file__).resolve().parent
DEFAULT_LIMITS = {"tool_timeout_s": 10.0, "max_output_chars": 4000, "max_stuck_calls": 8}
OWN_TIMEOUT_GRACE_S = 10.0  # process start-up and teardown on top of a self-timed tool's own limit
DB_FORMAT_VERSION = 1  # part of the database cache key: bump when the building in this file changes
STATUSES = ("ok", "error", "bad_args", "unknown_tool", "timeout")


class ToolError(Exception):
    """An expected failure of a tool (no such city, a bad id): its message is what the model sees."""


class ReferenceSolutionError(ValueError):
    """An environment's reference solution does not run: one of its tool calls did not succeed (timed out, failed),
    the solver raised, or its calls do not end with the submit tool. One line naming the environment, the task and
    what went wrong."""


class ToolTimeout(ToolError):
    """A self-timed tool (`own_timeout`) ran out of time and stopped its work: status "timeout", the message shown
    as is (e.g. what was lost)."""


def own_timeout(fn):
    """Marks a tool that enforces `state.timeout_s` itself (by killing its own process)."""
    fn.own_timeout = True
    return fn


@dataclass
class ToolResult:
    content: str  # what the model sees, already cut to max_output_chars with a marker
    status: str  # ok | error (the tool raised) | bad_args (violation named) | unknown_tool | timeout
    seconds: float
    final: bool = False  # this call ended the episode (the first successful submit)
    value: object = None  # the tool's return value, uncut (for reference solvers and tests; None unless ok)


class State:
    """One episode's state, the first argument of every tool. `db` is the read-only database connection (None
    without one); tools keep their own mutable per-episode values as further attributes (set up in init_state)."""

    def __init__(self, task: dict, db: sqlite3.Connection | None, config: dict, env_dir: Path):
        self.task, self.db, self.config, self.env_dir = task, db, config, env_dir
        self.timeout_s = float(config["limits"]["tool_timeout_s"])  # this call's deadline (set per call)
        self.submission: object | None = None
        self.submitted = False


def truncate(text: str, limit: int) -> str:
    """`text` cut in the middle to about `limit` characters, with a marker saying how much went."""
    if len(text) <= limit:
        return text
    keep = max(limit - 40, 2)
    head, tail = keep * 2 // 3, keep - keep * 2 // 3
    return f"{text[:head]}\n[... {len(text) - head - tail} characters omitted ...]\n{text[len(text) - tail:]}"


def render(value) -> str:
    """A tool's return value as the text the model reads: strings as they are, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


# ------------------------------------------------------------------------------------------------------ session
class Session:
    """One episode's live state, created by `Environment.reset(task)`."""

    def __init__(self, env: "Environment", task: dict):
        self.env = env
        self.state = State(task, env.open_db(), env.config, env.env_dir)
        self._lock = threading.Lock()  # one tool at a time touches the state, whoever called
        self._closed = False
        self._stopped: str | None = None
        init = getattr(env.module, "init_state", None)
        if init is not None:
            try:
                init(self.state)
            except BaseException:
                self.close()
                raise

    @property
    def submission(self) -> object | None:
        return self.state.submission

    @property
    def stopped(self) -> str | None:
        """Why the session is spent (a call was stopped at its deadline), or None."""
        return self._stopped

    def call(self, name: str, args: dict, timeout_s: float | None = None) -> ToolResult:
        t0 = time.perf_counter()
        try:
            status, content, value, final = self._call(name, args, timeout_s)
        except Exception as exc:  # noqa: BLE001 - the session never raises: a bug here is still a tool error
            status, content, value, final = "error", f"Error: internal error: {type(exc).__name__}: {exc}", None, False
        limit = int(self.env.limits["max_output_chars"])
        return ToolResult(truncate(content, limit), status, time.perf_counter() - t0, final, value)

    def _call(self, name, args, timeout_s):
        if self._closed:
            return "error", "Error: this episode's session is closed.", None, False
        if self._stopped:
            return "error", f"Error: {name!r:.80} was not run: {self._stopped}.", None, False
        tools = self.env.tools
        if not isinstance(name, str) or name not in tools:
            return ("unknown_tool", f"Unknown tool {str(name)[:80]!r}. Available tools: {', '.join(tools)}.",
                    None, False)
        args = {} if args is None else args
        violations = validate_arguments(args, self.env.schema_of(name))
        if violations:
            return "bad_args", f"Invalid arguments for {name}: " + "; ".join(violations) + ".", None, False
        timeout = float(timeout_s) if timeout_s else float(self.env.limits["tool_timeout_s"])
        return self._run(name, tools[name], args, timeout)

    def _run(self, name, fn, args, timeout):
        is_submit = name == self.env.submit_tool
        wait = timeout + (OWN_TIMEOUT_GRACE_S if getattr(fn, "own_timeout", False) else 0.0)
        cap = int(self.env.limits["max_stuck_calls"])
        if stuck(self.env) >= cap:
            return ("error", f"Error: {name} was not run: {cap} earlier calls of this environment were stopped at "
                    "their deadline but are still blocked, and no more may pile up. Try again later.", None, False)
        submission = None
        if is_submit:  # worked out here: nothing that could be stopped runs between the tool and its recording
            params = list(self.env.schema_of(name)["function"]["parameters"]["properties"])
            submission = args.get(params[0]) if len(params) == 1 else dict(args)
        mutex = threading.Lock()  # the caller and the tool's thread agree under it on which of them decided
        flags = {"cancelled": False, "started": False, "finished": False}
        out = {}

        def body(call):
            if not self._lock.acquire(timeout=wait):
                out["busy"] = True  # the caller's wait may end just after this one: it must see why
                return
            try:
                with mutex:  # no call inside: a stop cannot land in here
                    if flags["cancelled"]:
                        return
                    if is_submit and self.state.submitted:
                        out["already"] = flags["finished"] = True
                        return
                    flags["started"] = True
                self.state.timeout_s = timeout
                try:
                    out["value"] = call.invoke(fn, self.state, **args)
                except ToolTimeout as exc:
                    out["tool_timeout"] = str(exc)
                except ToolError as exc:
                    out["tool_error"] = str(exc)
                except BaseException as exc:  # noqa: BLE001 - SystemExit from a tool included: it is the tool's error
                    out["exception"] = exc
                with mutex:
                    if flags["cancelled"]:
                        return  # stopped: whatever it did is not recorded
                    if is_submit and "value" in out:  # under the session's lock: of two submits, exactly one counts
                        self.state.submission = submission
                        self.state.submitted = out["final"] = True
                    flags["finished"] = True
            finally:
                self._lock.release()

        call = ToolThread(name, body, self.env)
        call.start()
        if not call.done.wait(wait):
            with mutex:
                late = flags["finished"]  # it finished while we gave up: its result stands
                flags["cancelled"] = not late
                started = flags["started"]
            if not late and not started:
                return ("timeout", f"Timed out after {timeout:g} s: the tool {name} did not start, because an "
                        "earlier call of this episode is still running.", None, False)
            if not late:
                self._stopped = (f"{name} was stopped at its {timeout:g} s deadline and may have left the episode's "
                                 "state half-updated, so no tool of this episode runs any more")
                call.stop()
                if self.state.db is not None:
                    self.state.db.interrupt()  # a query that runs away stops at its next step
                return ("timeout", f"Timed out after {timeout:g} s: the tool {name} did not finish and was stopped; "
                        "its result is lost, and no tool of this episode runs any more.", None, False)
        if "busy" in out:
            return ("timeout", f"Timed out after {timeout:g} s: the tool {name} did not start, because an "
                    "earlier call of this episode is still running.", None, False)
        if "already" in out:
            return ("error", f"Error: {name} was already called; the first submission counts and this one is "
                    "ignored.", None, False)
        if "tool_timeout" in out:
            return "timeout", out["tool_timeout"], None, False
        if "tool_error" in out:
            return "error", f"Error: {out['tool_error']}", None, False
        if "exception" in out:
            exc = out["exception"]
            return "error", f"Error: the tool {name} raised {type(exc).__name__}: {exc}", None, False
        return "ok", render(out["value"]), out["value"], bool(out.get("final"))

    def close(self) -> None:
        """Frees the episode's processes and database handle; idempotent."""
        if self._closed:
            return
        self._closed = True
        done = getattr(self.env.module, "close_state", None)
        try:
            if done is not None:
                done(self.state)
        finally:
            db, self.state.db = self.state.db, None
            if db is not None:
                db.close()


# -------------------------------------------------------------------------------------------------- environment
def cache_root() -> Path:
    """Where databases are built: the same MIXRL_CACHE as the models (rl.models, not imported: it needs torch)."""
    return Path(os.environ.get("MIXRL_CACHE", Path.home() / ".cache" / "mixrl")) / "envs"


def _load_module(path: Path, env_name: str):
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    mod_name = f"_mixrl_env_{env_name}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # registered before running it: dataclasses and typing look modules up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    return module


class Environment:
    """An environment loaded from its directory (see the module docstring for the format)."""

    def __init__(self, env_dir: Path):
        self.env_dir = Path(env_dir).resolve()
        config_path = self.env_dir / "env.yaml"
        if not config_path.is_file():
            raise FileNotFoundError(f"{self.env_dir}: no env.yaml (not an environment directory)")
        config = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
        for key in ("name", "description"):
            if not isinstance(config.get(key), str) or not config[key].strip():
                raise ValueError(f"{config_path}: needs a {key!r} string")
        self.name: str = config["name"]
        self.description: str = " ".join(config["description"].split())
        self.limits: dict = {**DEFAULT_LIMITS, **(config.get("limits") or {})}
        self.config = {**config, "limits": self.limits}
        self.module = _load_module(self.env_dir / "env.py", self.name)
        tools = getattr(self.module, "TOOLS", None)
        if not tools:
            raise ValueError(f"{self.env_dir}/env.py: needs TOOLS, the list of tool functions")
        self.tools = {fn.__name__: fn for fn in tools}
        self._schemas = {name: tool_schema(fn) for name, fn in self.tools.items()}
        self.submit_tool = config.get("submit_tool", "submit_result")
        if self.submit_tool not in self.tools:
            raise ValueError(f"{self.env_dir}: the submit tool {self.submit_tool!r} is not in TOOLS")
        if not callable(getattr(self.module, "verify", None)):
            raise ValueError(f"{self.env_dir}/env.py: needs verify(task, state)")
        self.tasks_path = self.env_dir / "tasks.jsonl"
        self._tasks: list[dict] | None = None
        self.db_path = self._build_db() if config.get("database") else None

    # -- the interface -----------------------------------------------------------------------------------------
    def tool_schemas(self) -> list[dict]:
        return copy.deepcopy(list(self._schemas.values()))

    def schema_of(self, name: str) -> dict:
        return self._schemas[name]

    def tasks(self) -> list[dict]:
        if self._tasks is None:
            rows = []
            for n, line in enumerate(self.tasks_path.read_text(encoding="utf-8").splitlines(), 1):
                if line.strip():
                    try:
                        row = json.loads(line)
                    except ValueError as exc:
                        raise ValueError(f"{self.tasks_path}:{n}: not valid JSON ({exc})") from None
                    if not isinstance(row, dict):
                        raise ValueError(f"{self.tasks_path}:{n}: a task is a JSON object, not a "
                                         f"{type(row).__name__}")
                    if not isinstance(row.get("id"), str) or not isinstance(row.get("prompt"), str):
                        raise ValueError(f"{self.tasks_path}:{n}: a task needs an 'id' and a 'prompt' string")
                    rows.append(row)
            ids = [r["id"] for r in rows]
            if len(set(ids)) != len(ids):
                raise ValueError(f"{self.tasks_path}: task ids are not unique")
            self._tasks = rows
        return copy.deepcopy(self._tasks)

    def reset(self, task: dict) -> Session:
        return Session(self, task)

    def verify(self, task: dict, session: Session) -> tuple[float, str | None]:
        state = session.state
        temporary = state.db is None and self.db_path is not None  # verifying after close: a connection of its own
        if temporary:
            state.db = self.open_db()
        try:
            out = self.module.verify(task, state)
        finally:
            if temporary:
                state.db.close()
                state.db = None
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(f"{self.name}: verify must return (score, reason), got {out!r:.100}")
        score, reason = float(out[0]), out[1]
        if not 0.0 <= score <= 1.0:
            raise ValueError(f"{self.name}: verify returned score {score}, outside [0, 1]")
        return score, (None if reason is None else str(reason))

    def reference_solution(self, task: dict) -> list[tuple[str, dict]] | None:
        """The reference tool calls (ending with the submit call), or None without a solver. A solver of the form
        `solve(task, call)` runs its calls in a scratch session; any call that does not succeed is an error. Every
        failure is a `ReferenceSolutionError` (a ValueError) naming the environment, the task and the call."""
        solve = getattr(self.module, "solve", None)
        if solve is None:
            return None

        def fail(why: str) -> ReferenceSolutionError:
            return ReferenceSolutionError(f"environment {self.name}: the reference solution of task {task.get('id')} "
                                          f"does not run: {' '.join(why.split())[:400]}")

        try:
            if len(inspect.signature(solve).parameters) == 1:
                calls = solve(task)
            else:
                try:
                    session, recorded = self.reset(task), []
                except Exception as exc:  # noqa: BLE001 - init_state's bug, not the solver's
                    raise fail(f"its session's set-up (init_state) raised {type(exc).__name__}: {exc}") from exc

                def call(name, **args):
                    recorded.append((name, copy.deepcopy(args)))
                    res = session.call(name, args)
                    if res.status != "ok":
                        shown = ", ".join(f"{k}={v!r:.60}" for k, v in args.items())
                        what = "timed out" if res.status == "timeout" else f"failed ({res.status})"
                        raise fail(f"{name}({shown}) {what}: {res.content[:300]}")
                    return res.value

                try:
                    returned = solve(task, call)
                finally:
                    session.close()
                calls = returned if returned is not None else recorded
        except ReferenceSolutionError:
            raise
        except Exception as exc:  # noqa: BLE001 - the solver's own bug (or init_state's): named, in one line
            raise fail(f"solve raised {type(exc).__name__}: {exc}") from exc
        try:
            calls = [(str(n), dict(a)) for n, a in calls]
        except (TypeError, ValueError):
            raise fail(f"solve returned {calls!r:.100}, not a list of (tool name, arguments) pairs") from None
        if not calls or calls[-1][0] != self.submit_tool:
            raise fail(f"its calls do not end with {self.submit_tool}")
        return calls

    def perturbations(self, task: dict, calls: list[tuple[str, dict]]) -> dict[str, list[tuple[str, dict]]]:
        """Variants of a reference solution that must fail: the submit dropped, the submission changed
        (`perturb_submission`, or a generic change of a scalar), and the environment's own (`perturb`)."""
        out = {"no_submit": calls[:-1]}
        name, args = calls[-1]
        params = list(self.schema_of(name)["function"]["parameters"]["properties"])
        value = args.get(params[0]) if len(params) == 1 else args
        hook = getattr(self.module, "perturb_submission", None)
        variants = hook(task, copy.deepcopy(value)) if hook else _changed_scalar(value)
        for label, wrong in variants.items():
            new_args = {params[0]: wrong} if len(params) == 1 else wrong
            out[f"submission:{label}"] = calls[:-1] + [(name, new_args)]
        extra = getattr(self.module, "perturb", None)
        if extra is not None:
            out.update(extra(task, copy.deepcopy(calls)))
        return out

    # -- the database ------------------------------------------------------------------------------------------
    def _build_db(self) -> Path:
        build = getattr(self.module, "build_db", None)
        if build is None:
            raise ValueError(f"{self.env_dir}: env.yaml names database files but env.py has no build_db")
        h = hashlib.sha256(f"{DB_FORMAT_VERSION}\0{inspect.getsource(build)}".encode())
        for rel in self.config["database"]:
            h.update(b"\0" + rel.encode() + b"\0" + (self.env_dir / rel).read_bytes())
        path = cache_root() / f"{self.name}-{h.hexdigest()[:16]}.sqlite"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            try:
                conn = sqlite3.connect(tmp)
                try:
                    build(conn, self.env_dir)
                    conn.commit()
                finally:
                    conn.close()
                os.chmod(tmp, 0o444)
                os.replace(tmp, path)  # atomic: a racing builder writes the same content
            finally:
                tmp.unlink(missing_ok=True)
        return path

    def open_db(self) -> sqlite3.Connection | None:
        """A read-only connection to the environment's database (None without one); usable from any thread."""
        if self.db_path is None:
            return None
        conn = sqlite3.connect(f"{self.db_path.as_uri()}?mode=ro", uri=True, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA query_only = ON")
        return conn


def _changed_scalar(value) -> dict:
    """A generic wrong version of a scalar submission (numbers and integer strings + 1; other strings extended)."""
    if isinstance(value, bool):
        return {"negated": not value}
    if isinstance(value, (int, float)):
        return {"plus_one": value + 1}
    if isinstance(value, str):
        try:
            return {"plus_one": str(int(value.strip()) + 1)}
        except ValueError:
            return {"extended": f"{value} and more"}
    return {}


def create_table(conn: sqlite3.Connection, table: str, rows: list[dict], primary_key: str | None = None) -> None:
    """A table holding `rows` (dicts with the same keys; column types from the first row's values)."""
    kinds = {bool: "INTEGER", int: "INTEGER", float: "REAL", str: "TEXT"}
    cols = list(rows[0])
    decl = ", ".join(f"{c} {kinds.get(type(rows[0][c]), 'TEXT')}{' PRIMARY KEY' if c == primary_key else ''}"
                     for c in cols)
    conn.execute(f"CREATE TABLE {table} ({decl})")
    conn.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                     [[r[c] for c in cols] for r in rows])


def bundled_envs() -> list[str]:
    return sorted(p.name for p in ENVS_DIR.iterdir() if (p / "env.yaml").is_file())


def load_env(name_or_path: str) -> Environment:
    """A bundled environment by name (rollout/envs/<name>/), else an environment directory by path."""
    text = str(name_or_path)
    if text.isidentifier() and (ENVS_DIR / text / "env.yaml").is_file():
        return Environment(ENVS_DIR / text)
    path = Path(text).expanduser()
    if path.is_dir():
        return Environment(path)
    raise ValueError(f"unknown environment {text!r}: neither a bundled one ({', '.join(bundled_envs())}) nor a "
                     "directory")


# ---------------------------------------------------------------------------------------------------- check_env
def _replay(env: Environment, task: dict, calls) -> tuple[float | None, str | None, list[str]]:
    """(score, reason, calls that did not succeed) of `calls` run through a fresh session; score None and the
    error as reason when the verifier raised."""
    session = env.reset(task)
    try:
        bad = []
        for name, args in calls:
            res = session.call(name, copy.deepcopy(args))
            if res.status != "ok":
                bad.append(f"{name}: {res.status}: {res.content[:200]}")
        try:
            score, reason = env.verify(task, session)
        except Exception as exc:  # noqa: BLE001 - reported, not raised: check_env names every failure
            return None, f"the verifier raised {type(exc).__name__}: {exc}", bad
        return score, reason, bad
    finally:
        session.close()


def _check_task(env: Environment, task: dict) -> dict:
    tid = task.get("id")
    out = {"reference": None, "perturbed": 0, "perturbed_failed": 0, "failures": []}
    try:
        calls = env.reference_solution(task)
    except Exception as exc:  # noqa: BLE001
        out["reference"] = False
        out["failures"].append(f"{tid}: the reference solver raised {type(exc).__name__}: {str(exc)[:300]}")
        return out
    if calls is None:
        return out
    score, reason, bad = _replay(env, task, calls)
    out["reference"] = score == 1.0 and not bad
    if not out["reference"]:
        why = reason if score is None or score < 1.0 else f"calls that did not succeed: {bad}"
        out["failures"].append(f"{tid}: the reference solution scores {score}: {why}")
    for label, pcalls in env.perturbations(task, calls).items():
        out["perturbed"] += 1
        score, reason, _ = _replay(env, task, pcalls)
        if score is None:
            out["failures"].append(f"{tid}: perturbed ({label}): {reason}")
        elif score >= 1.0:
            out["failures"].append(f"{tid}: the perturbed solution ({label}) passes")
        else:
            out["perturbed_failed"] += 1
    return out


def check_env(env: Environment, tasks: list[dict] | None = None, workers: int = 2) -> dict:
    """Every task's reference solution must pass its verifier through the tools alone (a fresh session, every
    call succeeding, score 1), and every perturbation of it (see `Environment.perturbations`) must fail (score < 1,
    the verifier not raising). Returns counts, `failures` (one line each) and `ok`."""
    t0 = time.perf_counter()
    rows = env.tasks() if tasks is None else tasks
    with cf.ThreadPoolExecutor(max(1, workers)) as pool:  # tools that run processes overlap; the rest is cheap
        results = list(pool.map(lambda t: _check_task(env, t), rows))
    report = {
        "env": env.name, "tasks": len(rows),
        "with_reference": sum(r["reference"] is not None for r in results),
        "reference_passed": sum(r["reference"] is True for r in results),
        "perturbed": sum(r["perturbed"] for r in results),
        "perturbed_failed": sum(r["perturbed_failed"] for r in results),
        "failures": [f for r in results for f in r["failures"]] or ([] if rows else ["the environment has no tasks"]),
    }
    report["ok"] = not report["failures"]
    report["seconds"] = round(time.perf_counter() - t0, 3)
    return report
