"""Metrics out: W&B (offline automatically without an API key), `metrics.jsonl` in the run dir, a progress bar, the
samples of every step, and the run's summary at the end.

The same dict goes everywhere; `None` values (e.g. `kl/<domain>` for a domain whose reference was not run, or
`reward/<domain>/mean` on a step that drew no prompt of that domain) are written as null to the jsonl and left out
of W&B. W&B is written by a process of its own (launch/wandb_logger.py), so a run killed with `kill -9` still has
every step it logged in W&B's files. A resumed run continues the same W&B run: its id is kept in
`run_dir/wandb_run_id` (and with its name in `run_dir/wandb_run.json`); the charts' x-axis is the metric `step`, so
the steps a resumed run redoes are logged again, not dropped.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import string
import time
from collections.abc import Callable
from pathlib import Path

from launch.wandb_logger import WandbProcess, reward_summary, wandb_summary

log = logging.getLogger(__name__)


def wandb_mode(mode: str) -> str:
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def json_line(obj) -> str:
    """One JSON line that always encodes as UTF-8: model output may hold lone surrogates ("\\ud800"), which
    ensure_ascii=False would pass through to a UTF-8 file write that then raises."""
    line = json.dumps(obj, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(obj, ensure_ascii=True)  # \\udXXX escapes: valid JSON, nothing lost
    return line + "\n"


class Tracker:
    def __init__(self, cfg: dict, run_dir: Path, total_steps: int, start_step: int, resume: bool,
                 launched: float | None = None, start_up: Callable[[], dict] | None = None, truncate: bool = True):
        """`launched`: when the run began (time.time()), to report the start-up time apart from training;
        `start_up`: the start-up timeline's marks in time order (`StartupTimeline.ordered`, which reads them under
        its lock: Ray threads may still add some), called when the summary is written. `truncate` False (eval.only):
        a resumed run keeps the rows after its checkpoint, which it will not redo."""
        self.start_up = start_up or dict
        lcfg = cfg["logger"]
        self.run_dir, self.total_steps = run_dir, total_steps
        self.path = run_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not resume and self.path.exists():
            self.path.unlink()
        elif resume and truncate and self.path.exists():
            self._truncate_after(start_step)
        self.started = time.time()
        self.launched = launched or self.started
        self.run: WandbProcess | None = None
        self.lines = 0  # metrics.jsonl's rows so far
        if self.path.exists():
            with self.path.open() as f:
                self.lines = sum(1 for _ in f)
        mode = wandb_mode(lcfg["mode"])
        if mode != "disabled":
            id_file = run_dir / "wandb_run_id"
            run_id = lcfg.get("run_id") or (id_file.read_text().strip() if resume and id_file.exists() else None)
            run_id = run_id or "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
            id_file.write_text(run_id)
            init = dict(project=lcfg["project"], entity=lcfg.get("entity"), name=cfg.get("run_name"),
                        group=lcfg.get("group"), dir=str(run_dir), mode=mode, config=cfg, resume="allow", id=run_id)
            self.run = WandbProcess({"init": init, "run_dir": str(run_dir), "resume": resume,
                                     "start_step": start_step, "lines": self.lines})
            if self.run.replayed:
                log.info("W&B: %d steps of metrics.jsonl that no W&B file of run %s held were logged again",
                         self.run.replayed, run_id)
            log.info("W&B run %s (%s): %s, written by its own process (log: %s)", run_id, self.run.name,
                     self.run.url or Path(self.run.dir).parent, self.run.log_path)
        self.rollouts_dir = run_dir / "rollouts" if lcfg.get("save_rollouts", True) else None
        self.bar = None
        if lcfg.get("progress_bar", True):
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, desc="rl steps", dynamic_ncols=True)

    def _truncate_after(self, start_step: int) -> None:
        """On resume, drop lines of steps after the checkpoint (they are about to be redone)."""
        keep = []
        for ln in self.path.read_text().splitlines():
            try:
                if json.loads(ln)["step"] <= start_step:
                    keep.append(ln)
            except (ValueError, KeyError, TypeError):  # a line torn by a crash mid-write
                continue
        self.path.write_text("".join(k + "\n" for k in keep))

    def log(self, metrics: dict, counts_as_step: bool = True) -> None:
        """One row of metrics.jsonl and W&B; `counts_as_step` False for the evaluation before step 1 (step 0)."""
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        line = json.dumps(clean, sort_keys=True)
        with self.path.open("a") as f:
            f.write(line + "\n")
        self.lines += 1
        if self.run is not None and self.run.alive:  # to W&B's logger process, after the line (which it reads
            # itself if the run dies in between)
            if not self.run.send_line(f'{{"n": {self.lines}, "t": {time.time()!r}, "row": {line}}}'):
                log.warning("the W&B logger process ended (see %s): W&B gets no more steps in this run; "
                            "metrics.jsonl has them all and a resumed run logs them to W&B", self.run.log_path)
        if self.bar is not None and counts_as_step:
            self.bar.update(1)
            if "loss/sft" in metrics:  # SFT: no rewards, its loss is the number to watch
                self.bar.set_postfix(loss=f"{metrics['loss/sft']:.3f}", tokens=f"{metrics.get('sft/tokens', 0):.0f}")
            else:
                self.bar.set_postfix(reward=f"{metrics.get('reward/mean', 0):.3f}",
                                     len=f"{metrics.get('response_length/mean', 0):.0f}")

    def save_rollouts(self, name: str, trajs) -> None:
        """One jsonl per step (`name`: step_N, eval_step_N) under run_dir/rollouts/: what was asked, answered and
        scored (for reading samples)."""
        if not self.rollouts_dir:
            return
        self.rollouts_dir.mkdir(parents=True, exist_ok=True)
        with (self.rollouts_dir / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            for t in trajs:
                f.write(json_line({
                    "uid": t.uid, "domain": t.domain, "prompt": t.prompt_text, "response": t.response_text,
                    "finish_reason": t.finish_reason, "response_tokens": t.num_generated_tokens,
                    "reward": t.reward, "parts": t.reward_parts, "error": t.reward_error, "advantage": t.advantage,
                    **({"thinking": t.thinking} if t.thinking is not None else {}),
                    **({"episode": t.episode} if t.episode is not None else {}),
                }))

    def summary(self) -> dict:
        """The whole run_dir's metrics.jsonl (resumed parts included) in short: steps, time, per-domain reward at
        the start and the end, where the outputs are. Also written to run_dir/summary.json."""
        rows = []
        for ln in self.path.read_text().splitlines() if self.path.exists() else []:
            try:
                rows.append(json.loads(ln))
            except ValueError:
                continue
        out: dict = {"steps": len(rows), "last_step": rows[-1]["step"] if rows else 0,
                     "seconds_training": round(time.time() - self.started, 1),
                     "seconds_start_up": round(self.started - self.launched, 1), "reward": reward_summary(rows),
                     "start_up": self.start_up()}
        ckpts = sorted((self.run_dir / "checkpoints").glob("step_*/COMPLETE"))
        out["outputs"] = {"run_dir": str(self.run_dir), "metrics": str(self.path),
                          # SFT writes no rollouts: name the folder only when it holds something
                          "rollouts": str(self.rollouts_dir) if self.rollouts_dir and self.rollouts_dir.exists()
                          else None,
                          "last_checkpoint": str(ckpts[-1].parent / "hf") if ckpts else None,
                          "log": str(self.run_dir / "train.log"),
                          # the charts as one HTML page, made on demand (not at close: ~0.4 s per 1000 steps)
                          "report": f"python -m launch.report {self.run_dir} (writes "
                                    f"{self.run_dir / 'report.html'})"}
        if self.run is not None:
            out["outputs"]["wandb"] = str(Path(self.run.dir).parent)
        return out

    def close(self) -> dict:
        """Finish the bar and the W&B run (its summary gets this run's summary); returns the summary."""
        if self.bar is not None:
            self.bar.close()
        summary = self.summary()
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        if self.run is not None:  # W&B's logger logs what it has not got yet, writes the summary and finishes
            try:
                self.run.close(self.lines, wandb_summary(summary["reward"], summary["steps"], summary["start_up"]))
            except Exception as e:  # noqa: BLE001 - the run's own outputs are written; W&B's are reported
                log.warning("W&B did not close cleanly: %s", e)
        return summary


def format_summary(summary: dict) -> str:
    """The summary as the few lines printed when a run ends."""
    lines = [f"done: {summary['steps']} steps (last {summary['last_step']}) in {summary['seconds_training']:.0f} s "
             f"(+{summary['seconds_start_up']:.0f} s start-up)." + (" Mean reward, first -> last steps with samples:"
                                                                   if summary["reward"] else "")]
    for d, s in summary["reward"].items():
        lines.append(f"  {d}: {s['first']:.3f} -> {s['last']:.3f} (over {s['steps_averaged']} steps)")
    for k, v in summary["outputs"].items():
        if v:
            lines.append(f"  {k}: {v}")
    return "\n".join(lines)
