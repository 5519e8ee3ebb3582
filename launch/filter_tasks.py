"""`python -m launch.filter_tasks DOMAIN --k 8 --out KEPT.jsonl [hydra overrides]`: keep the agent tasks the current
policy can solve at least once (DeepSeek-V3.2 keeps only synthesised tasks with non-zero pass@k).

Every task of the agent domain DOMAIN (its `dataset`, by default its environment's tasks.jsonl) is run k times
with the policy of `model.path` on the configured rollout engine (transformers on CPU, vLLM on a GPU), each
episode scored by the environment's verifier. A task passes when one of its k episodes scores at least
`--threshold`. The kept tasks go to `--out` as the episodes saw them: the environment's own task row (all its
columns) when the row's id names one, else the dataset row with the domain's `columns` applied; training on them
is `++domains.DOMAIN.dataset.path=KEPT.jsonl` (`++` adds the key where the domain has no `dataset` block, as an
agent domain reading its environment's tasks has not; columns `prompt` and `id` are read by default). One line per task
with its pass count goes to `--report` when given; the summary prints pass@k overall. k may be 1 (pass@1).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from launch.config import compose, prepare
from launch.tracking import json_line
from rl.config import ConfigError
from rl.data import load_domain_rows

log = logging.getLogger(__name__)


def filter_tasks(cfg: dict, domain: str, k: int, threshold: float, batch: int = 16) -> list[tuple[dict, int]]:
    """(task row, passing episodes out of k) for every task of the agent domain."""
    from rollout.worker import RolloutWorker

    if int(k) < 1:
        raise ConfigError(f"--k {k}: run at least one episode per task")
    cfg["domains"] = {domain: cfg["domains"][domain]}
    model_path = prepare(cfg)
    cfg["rollout"]["n_samples"] = int(k)  # after the training checks: k = 1 (pass@1) is fine here, GRPO needs 2
    rows = load_domain_rows(domain, cfg["domains"][domain]["dataset"])
    worker = RolloutWorker(cfg, model_path, 0)
    runner = worker._agents[domain]
    out = []
    for start in range(0, len(rows), batch):
        requests = [{"group_id": f"task-{i}", "domain": domain, "prompt_ids": [], "prompt_text": "", "sample": row}
                    for i, row in enumerate(rows[start : start + batch], start)]
        trajs = worker.generate(requests, step=0)
        for j, req in enumerate(requests):
            scores = [t.episode["outcome"].get("score") or 0.0 for t in trajs[j * k : (j + 1) * k]]
            out.append((runner.task_of(req["sample"]), sum(s >= threshold for s in scores)))
        log.info("filter_tasks: %d/%d tasks run", min(start + batch, len(rows)), len(rows))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m launch.filter_tasks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("domain", help="an agent domain of the config (domains.<name>.agent)")
    ap.add_argument("--k", type=int, default=8, help="episodes per task")
    ap.add_argument("--threshold", type=float, default=1.0, help="verifier score an episode needs to pass")
    ap.add_argument("--out", required=True, help="JSONL of the kept tasks")
    ap.add_argument("--report", help="JSONL: every task's id and passing episodes")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. +experiment=mixed_rl model.path=...")
    args, extra = ap.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = compose(list(args.overrides) + extra)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    block = (cfg.get("domains") or {}).get(args.domain)
    if not block or not block.get("agent"):
        agents = sorted(d for d, b in (cfg.get("domains") or {}).items() if isinstance(b, dict) and b.get("agent"))
        print(f"domains.{args.domain}: not an agent domain of this config (it needs an `agent` block; agent domains "
              f"here: {', '.join(agents) or 'none, add the experiment that defines yours, e.g. +experiment=mixed_rl'})",
              file=sys.stderr)
        return 2
    try:
        results = filter_tasks(cfg, args.domain, args.k, args.threshold)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    Path(args.out).write_text("".join(json_line(row) for row, passed in results if passed))
    if args.report:
        Path(args.report).write_text("".join(json_line({"id": row.get("id"), "passed": passed, "k": args.k})
                                             for row, passed in results))
    kept = sum(1 for _, passed in results if passed)
    print(f"pass@{args.k}: {kept}/{len(results)} tasks solved at least once -> {args.out} (train on them with "
          f"++domains.{args.domain}.dataset.path={args.out})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
