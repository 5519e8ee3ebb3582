"""The W&B side of the Tracker (launch/tracking.py), in a process of its own, so that what a run logged reaches W&B's
files even when the run is killed (`kill -9`, OOM killer).

Why a process: W&B's service (wandb-core) keeps the transaction log (`run-<id>.wandb`, what `wandb sync` uploads)
in a 32 KiB block in memory and writes it when the block fills or, since wandb 0.31, every 15 s; and when the
process that started it dies it quits at once ("forced shutdown"), dropping that block. A run killed a few steps
in left a 7-byte `.wandb` file (its header). Here the run's Tracker starts this process in a session of its own
(a `kill -9` of the run, or of its process group, does not reach it) and sends it each step as it writes it to
metrics.jsonl. The process owns the W&B run: it logs each row at once and has wandb-core flush its log every 0.2 s;
when the run closes it, or dies (end of its pipe, or a new parent pid), it logs the rows of metrics.jsonl it has
not seen yet, writes the summary, and finishes the W&B run as W&B's own exit would (exit code 1 for a run that
died), so the `.wandb` file is complete and `files/` holds `config.yaml` and `wandb-summary.json`.

On resume it replays into the resumed W&B run the rows of metrics.jsonl that no W&B file of this run holds (for
when this process was killed too, e.g. with the whole job); steps the resumed run redoes are logged again.
`run_dir/wandb_run.json` keeps the run's id, name and the W&B directory and first step of each part (segment).

Protocol: the first line on stdin is the spec (JSON); then one JSON message a line: {"n": line number in
metrics.jsonl, "row": ..., "t": time} | {"sync": 1} | {"close": {"n": last line, "summary": {...}}}. Replies
(ready, synced, closed, error) go out on the original stdout, one JSON line each.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import signal
import struct
import sys
import threading
import time
import zlib
from pathlib import Path

FLUSH_SECONDS = 0.2  # how often wandb-core writes its buffered records to the .wandb file
STATE_FILE = "wandb_run.json"
LOCK_FILE = "wandb_logger.lock"
LOG_FILE = "wandb_logger.log"


# --- reading W&B's transaction log (the LevelDB log format: 32 KiB blocks of CRC-checked chunks after a 7-byte
# ":W&B" header); wandb 0.31 has no Python reader of its own.
def read_records(path: str | Path) -> list:
    """Every whole record of a `.wandb` file as `wandb_internal_pb2.Record`; a torn tail (a run still writing, or
    killed mid-write) ends the list."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        return []
    out, pos, parts = [], 7, []
    while pos + 7 <= len(data):
        block_end = (pos // 32768 + 1) * 32768
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if crc == length == kind == 0:  # the zero padding at a block's end
            pos = block_end
            continue
        chunk = data[pos + 7:pos + 7 + length]
        if len(chunk) < length or zlib.crc32(bytes([kind]) + chunk) != crc:
            break
        pos += 7 + length
        if pos + 7 > block_end:  # no room for another chunk header in this block
            pos = block_end
        parts = [chunk] if kind in (1, 2) else parts + [chunk]
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(b"".join(parts))
            out.append(record)
    return out


def history_steps(records: list) -> list:
    """The `step` metric of each history row, in order."""
    steps = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            for item in r.history.item:
                if (item.key or "/".join(item.nested_key)) == "step":
                    steps.append(json.loads(item.value_json))
    return steps


def run_files(run_dir: Path, run_id: str) -> list[Path]:
    """This run's `.wandb` files under run_dir/wandb, oldest first (offline-run-<time>-<id>, run-<time>-<id>)."""
    found = [p for p in (run_dir / "wandb").glob(f"*run-*-{run_id}/run-{run_id}.wandb") if not p.parent.is_symlink()]
    return sorted(found, key=lambda p: p.parent.name.split("run-", 1)[1])


# --- which rows of metrics.jsonl a resumed run replays
def steps_to_replay(row_steps: list, segments: list[tuple[int, set]]) -> list:
    """`row_steps`: the steps of metrics.jsonl (up to the checkpoint resumed from); `segments`: (first step - 1,
    steps in its W&B files) of each earlier part of the run, oldest first. A row was last (re)done by the newest
    segment that started before it; W&B has it when that segment or a later one logged its step."""
    out = []
    for s in row_steps:
        owner = max((i for i, (start, _) in enumerate(segments) if start < s), default=0)
        if not any(s in steps for _, steps in segments[owner:]):
            out.append(s)
    return out


def _state(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def _metric_lines(path: Path) -> list[str]:
    """metrics.jsonl's whole lines (a last line without its newline was torn by a crash)."""
    try:
        text = path.read_text()
    except OSError:
        return []
    lines = text.split("\n")
    return lines[:-1]  # the part after the last newline is empty or torn


def _row(line: str) -> dict | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def _lock(run_dir: Path, timeout: float = 120.0):
    """Wait for the logger of an earlier part of this run (finishing its W&B run after the run died) to end, so
    that its files are whole before they are read; one that takes longer is left to finish beside this one."""
    f = (run_dir / LOCK_FILE).open("a")
    deadline = time.time() + timeout
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if time.time() > deadline:
                print(f"another W&B logger still holds {run_dir / LOCK_FILE} after {timeout:.0f} s; going on",
                      file=sys.stderr, flush=True)
                return f
            time.sleep(0.1)


class Logger:
    def __init__(self, spec: dict, reply):
        import wandb

        self.spec, self.reply = spec, reply
        self.run_dir = Path(spec["run_dir"])
        self.metrics = self.run_dir / "metrics.jsonl"
        self.parent = spec["parent_pid"]
        self.last_n = spec["lines"]  # the lines of metrics.jsonl before this part of the run
        state = _state(self.run_dir) if spec["resume"] else {}
        run_id, name = spec["init"]["id"], spec["init"].get("name")
        earlier = run_files(self.run_dir, run_id) if spec["resume"] else []
        records = {p: read_records(p) for p in earlier}
        if spec["resume"]:  # the same W&B run keeps its name (a resumed run's run_name is a new time stamp)
            names = [r.run.display_name for rs in records.values() for r in rs if r.WhichOneof("record_type") == "run"]
            name = (state.get("name") if state.get("id") == run_id else None) or (names[0] if names else name)
        # W&B's metadata (command, system metrics) are the run's, not this process's
        sys.argv = list(spec.get("argv") or sys.argv)
        settings = wandb.Settings(x_transaction_log_flush_interval=FLUSH_SECONDS, x_stats_pid=self.parent,
                                  console="off", program=sys.argv[0])
        self.run = wandb.init(**{**spec["init"], "name": name}, settings=settings)
        # Our step is a metric and the x-axis of every chart, not W&B's own step: a resumed run redoes the steps
        # after its checkpoint, which W&B would drop as lower than the steps it already has.
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        self.files = Path(self.run.dir)
        self._write_config()
        wandb_dir = str(Path(self.run.dir).parent.relative_to(self.run_dir))
        old = state.get("segments", []) if state.get("id") == run_id else []
        self.replayed = 0
        if spec["resume"]:
            by_dir = {str(p.parent.relative_to(self.run_dir)): set(history_steps(rs)) for p, rs in records.items()}
            segments = ([(s["start_step"], by_dir.get(s["dir"], set())) for s in old] if old
                        else [(0, set().union(*by_dir.values()))] if by_dir else [])
            rows = [r for r in map(_row, _metric_lines(self.metrics)[:self.last_n]) if r and "step" in r]
            missing = set(steps_to_replay([r["step"] for r in rows], segments))
            for r in rows:
                if r["step"] in missing:
                    self._log(r)
                    self.replayed += 1
        _write_json(self.run_dir / STATE_FILE, {"id": run_id, "name": self.run.name, "segments": [
            *old, {"dir": wandb_dir, "start_step": spec["start_step"], "replayed": self.replayed}]})

    def _write_config(self) -> None:
        from wandb.sdk.lib.config_util import save_config_file_from_dict

        save_config_file_from_dict(str(self.files / "config.yaml"),
                                   {k: {"value": v} for k, v in self.run.config.as_dict().items()})

    def _log(self, row: dict, t: float | None = None) -> None:
        values = {k: v for k, v in row.items() if v is not None}
        if t is not None:
            values["_timestamp"] = t  # when the run logged it, not when it got here
        try:
            self.run.log(values)
        except Exception as e:  # noqa: BLE001 - one bad row must not end the W&B run
            print(f"W&B log of step {row.get('step')} failed: {e!r}", file=sys.stderr, flush=True)

    def catch_up(self, upto: int | None = None) -> None:
        """Log the rows of metrics.jsonl after the last one logged (up to line `upto`): those the run wrote but
        did not send, because it died between the two."""
        lines = _metric_lines(self.metrics)
        end = len(lines) if upto is None else min(upto, len(lines))
        for line in lines[self.last_n:end]:
            row = _row(line)
            if row is not None:
                self._log(row)
        self.last_n = max(self.last_n, end)

    def finish(self, summary: dict | None, exit_code: int) -> None:
        if summary is None:  # the run died: its summary from metrics.jsonl, as it would have written it
            rows = [r for r in map(_row, _metric_lines(self.metrics)) if r is not None]
            summary = wandb_summary(reward_summary(rows), len(rows))
        self.run.summary.update(summary)
        try:
            current = self.run.summary._as_dict()
        except Exception:  # noqa: BLE001
            current = dict(summary)
        _write_json(self.files / "wandb-summary.json", current)
        self.run.finish(exit_code=exit_code)

    def serve(self, messages: queue.SimpleQueue) -> None:
        while True:
            try:
                msg = messages.get(timeout=0.5)
            except queue.Empty:
                if os.getppid() == self.parent:
                    continue
                msg = None  # the run died, but a child it forked still holds the pipe
            if msg is None:
                self.catch_up()
                self.finish(None, exit_code=1)
                return
            if "row" in msg:
                n = msg["n"]
                if n > self.last_n + 1:
                    self.catch_up(n - 1)
                if n > self.last_n:
                    self._log(msg["row"], msg.get("t"))
                    self.last_n = n
            elif "sync" in msg:
                self.reply({"synced": {"step": self.run.step, "lines": self.last_n}})
            elif "close" in msg:
                self.catch_up(msg["close"]["n"])
                self.finish(msg["close"]["summary"], exit_code=0)
                self.reply({"closed": {"lines": self.last_n}})
                return


def _read_stdin(messages: queue.SimpleQueue) -> None:
    for line in sys.stdin:
        if line.endswith("\n"):  # a message torn by the run's death is also in metrics.jsonl
            try:
                messages.put(json.loads(line))
            except ValueError:
                pass
    messages.put(None)


def main() -> int:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed here goes to the log, not into the replies

    def reply(obj) -> None:
        try:
            out.write(json.dumps(obj, default=str) + "\n")
        except OSError:  # the run is gone
            pass

    spec = json.loads(sys.stdin.readline())
    run_dir = Path(spec["run_dir"])
    lock = _lock(run_dir)
    messages: queue.SimpleQueue = queue.SimpleQueue()  # put() is safe in a signal handler
    threading.Thread(target=_read_stdin, args=(messages,), daemon=True).start()
    # SIGTERM (a batch system stopping the whole job): finish the W&B run now, as when the run dies
    signal.signal(signal.SIGTERM, lambda *_: messages.put(None))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run's Ctrl-C is the run's: it closes this process
    try:
        logger = Logger(spec, reply)
    except Exception as e:  # noqa: BLE001 - reported to the run, which raises it
        reply({"error": f"{type(e).__name__}: {e}"})
        raise
    try:
        url = None if spec["init"].get("mode") == "offline" else logger.run.url
    except Exception:  # noqa: BLE001
        url = None
    reply({"ready": {"dir": logger.run.dir, "id": logger.run.id, "name": logger.run.name, "url": url,
                     "replayed": logger.replayed}})
    logger.serve(messages)
    lock.close()
    return 0


class WandbProcess:
    """The run's end of the logger: starts it (in its own session), sends it rows, asks it to close. Stands in for
    the W&B run object where the Tracker used one (`dir`, `id`, `name`, `step`)."""

    def __init__(self, spec: dict, timeout: float = 300.0):
        import subprocess

        root = str(Path(__file__).resolve().parents[1])
        env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}  # its own wandb-core, not the run's
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        run_dir = Path(spec["run_dir"])
        self.log_path = run_dir / LOG_FILE
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "launch.wandb_logger"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, env=env, bufsize=0,
                                         start_new_session=True)
        self._out = self.proc.stdout
        self.alive = True
        self._send({**spec, "parent_pid": os.getpid(), "argv": sys.argv})
        ready = self._reply("ready", timeout)
        self.dir, self.id, self.name = ready["dir"], ready["id"], ready["name"]
        self.url, self.replayed = ready.get("url"), ready.get("replayed", 0)

    def _send(self, obj) -> bool:
        return self.send_line(json.dumps(obj, default=str))

    def send_line(self, line: str) -> bool:
        """Write one message (without its newline); False when the logger is gone."""
        if not self.alive:
            return False
        data, fd = (line + "\n").encode(), self.proc.stdin.fileno()
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError:  # BrokenPipeError: the logger ended
            self.alive = False
        return self.alive

    def _reply(self, key: str, timeout: float) -> dict:
        import select

        deadline = time.time() + timeout
        while True:
            ready, _, _ = select.select([self._out], [], [], max(0.0, deadline - time.time()))
            line = self._out.readline() if ready else b""
            if not line:
                self.alive = False
                tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
                why = "timed out" if not ready else f"ended with code {self.proc.poll()}"
                raise RuntimeError(f"the W&B logger process {why} waiting for '{key}' "
                                   f"(log: {self.log_path}):\n{tail}")
            msg = json.loads(line)
            if "error" in msg:
                self.alive = False
                raise RuntimeError(f"W&B failed in its logger process: {msg['error']} (log: {self.log_path})")
            if key in msg:
                return msg[key]

    @property
    def step(self) -> int:
        """W&B's own step (rows logged) once every row sent so far is logged."""
        self._send({"sync": 1})
        return self._reply("synced", 120)["step"]

    def close(self, n: int, summary: dict, timeout: float = 300.0) -> None:
        if self._send({"close": {"n": n, "summary": summary}}):
            self._reply("closed", timeout)
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def reward_summary(rows: list[dict]) -> dict:
    """Per domain (and "all"), the mean reward of the first and the last (up to 3) steps with samples."""
    out = {}
    domains = sorted({k.split("/")[1] for r in rows for k in r if k.startswith("reward/") and k.count("/") == 2
                      and k.endswith("/mean")})
    for name, key in [("all", "reward/mean"), *((d, f"reward/{d}/mean") for d in domains)]:
        seen = [r[key] for r in rows if r.get(key) is not None]
        n = max(1, min(3, len(seen) // 2))
        if seen:
            out[name] = {"first": sum(seen[:n]) / n, "last": sum(seen[-n:]) / n, "steps_averaged": n}
    return out


def wandb_summary(reward: dict, steps: int, start_up: dict | None = None) -> dict:
    """What the W&B summary gets beyond each metric's last value: per-domain reward at the start and the end, the
    steps, and the start-up timeline (seconds from the command to each milestone, launch/startup.py)."""
    flat = {f"summary/reward/{d}/{k}": v for d, s in reward.items() for k, v in s.items() if k != "steps_averaged"}
    timeline = {f"summary/start_up/{name}": seconds for name, seconds in (start_up or {}).items()}
    return {**flat, **timeline, "summary/steps": steps}


if __name__ == "__main__":
    sys.exit(main())
