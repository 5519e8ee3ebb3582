"""Metrics out: W&B (offline automatically without an API key), `metrics.jsonl` in the run dir, a progress bar.

The same dict goes everywhere; `None` values (e.g. `kl/<domain>` for a domain whose reference was not run)
are written as null to the jsonl and left out of W&B.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

log = logging.getLogger(__name__)


def wandb_mode(mode: str) -> str:
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


class Tracker:
    def __init__(self, cfg: dict, run_dir: Path, total_steps: int, start_step: int, resume: bool):
        lcfg = cfg["logger"]
        self.path = run_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not resume and self.path.exists():
            self.path.unlink()
        elif resume and self.path.exists():
            self._truncate_after(start_step)
        self.run = None
        mode = wandb_mode(lcfg["mode"])
        if mode != "disabled":
            import wandb

            self.run = wandb.init(
                project=lcfg["project"],
                entity=lcfg.get("entity"),
                name=cfg.get("run_name"),
                group=lcfg.get("group"),
                dir=str(run_dir),
                mode=mode,
                config=cfg,
                resume="allow" if resume else None,
                id=lcfg.get("run_id"),
            )
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

    def log(self, metrics: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(clean, sort_keys=True) + "\n")
        if self.run is not None:
            self.run.log({k: v for k, v in clean.items() if v is not None}, step=int(metrics["step"]))
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(
                reward=f"{metrics.get('reward/mean', 0):.3f}", len=f"{metrics.get('response_length/mean', 0):.0f}"
            )

    def save_rollouts(self, step: int, trajs) -> None:
        """One jsonl per step under run_dir/rollouts/: what was asked, answered and scored (for reading samples)."""
        if not self.rollouts_dir:
            return
        self.rollouts_dir.mkdir(parents=True, exist_ok=True)
        with (self.rollouts_dir / f"step_{step:06d}.jsonl").open("w") as f:
            for t in trajs:
                row = {
                    "uid": t.uid, "domain": t.domain, "prompt": t.prompt_text, "response": t.response_text,
                    "finish_reason": t.finish_reason, "response_tokens": t.num_response_tokens,
                    "reward": t.reward, "parts": t.reward_parts, "error": t.reward_error, "advantage": t.advantage,
                }
                f.write(json.dumps(row, ensure_ascii=False) + "\n")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.run is not None:
            self.run.finish()
