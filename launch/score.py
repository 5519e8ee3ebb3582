"""`python -m launch.score IN.jsonl --out OUT.jsonl [hydra overrides]`: score responses offline, for debugging.

Input line: {"domain", "prompt", "response", + that domain's fields ("answer", "tests", "rubric", "language"),
optional "finish_reason" ("stop" default) and "response_tokens"}. Output line: the input plus "reward", "parts"
(unweighted part scores) and "error" (null or the reason). A bad line (invalid JSON, no domain/response, unknown
domain, missing fields) gets reward 0 and an error; the other lines go on.

Token count for the length penalty: "response_tokens" when given; else, with `--tokenizer PATH`, the length of
that tokenizer's encoding; else the number of whitespace-separated words (a rough stand-in, documented as such).

Rubric judge: when a domain uses `rubric_judge`, the judge model (`rewards.judge`, default `model.path`, i.e. the
embedded tiny model) is loaded in this process on the transformers engine (or vLLM if `rollout.engine` says so).

Config: the project's Hydra config `conf/train.yaml` composed with the overrides (needs `domains.*`,
`rewards`, `rollout.max_new_tokens`), or `--config FILE` (YAML/JSON holding those keys) to bypass Hydra.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from launch.config import CONF_DIR, compose
from launch.tracking import json_line
from rewards.compose import RewardComposer, check_reward_specs
from rewards.judge import uses_rubric_judge
from rl.config import ConfigError, to_plain
from rl.trajectory import Trajectory

logger = logging.getLogger(__name__)
BATCH = 256
MAX_RESPONSE_TOKENS = 100_000_000  # far past any context window
_RUNTIME_KEYS = ("response", "finish_reason", "response_tokens")


def load_hydra_config(overrides: list[str]) -> dict:
    if not (CONF_DIR / "train.yaml").exists():
        raise SystemExit(f"{CONF_DIR / 'train.yaml'} not found: pass --config FILE with domains/rewards/rollout")
    return compose(overrides)


def load_plain_config(path: str) -> dict:
    text = Path(path).read_text()
    if path.endswith(".json"):
        return json.loads(text)
    from omegaconf import OmegaConf

    return to_plain(OmegaConf.create(text))


def _line_to_traj(k: int, row: dict, count_tokens: Callable[[str], int]) -> Trajectory:
    response = row.get("response")
    if not isinstance(row.get("domain"), str) or not isinstance(response, str):
        raise ValueError("line needs a string 'domain' and a string 'response'")
    n = row.get("response_tokens")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        n = count_tokens(response)
    if n > MAX_RESPONSE_TOKENS:  # the placeholder ids below would be allocated
        raise ValueError(f"response_tokens={n} is more than {MAX_RESPONSE_TOKENS}")
    sample = {key: v for key, v in row.items() if key not in _RUNTIME_KEYS}
    finish = row.get("finish_reason") if row.get("finish_reason") in ("stop", "length") else "stop"
    # CLI lines have no token ids: empty prompt ids, placeholder response ids whose length is the token count.
    return Trajectory(
        uid=f"line-{k}", group_id=f"line-{k}", domain=row["domain"], prompt_ids=np.zeros(0, np.int32),
        response_ids=np.zeros(n, np.int32), inference_logprobs=np.zeros(n, np.float32), finish_reason=finish,
        prompt_text=str(row.get("prompt", "")), response_text=response, sample=sample,
    )


def word_count(text: str) -> int:
    return len(text.split())


def reward_composer(cfg: dict, model_path: str | None = None) -> RewardComposer:
    """The domains' reward stacks in this process, as the reward workers build them, with the rubric judge loaded
    here when a domain uses it (its model: `rewards.judge.model`, else `model_path`, else `model.path`). Also used
    by `python -m launch.generate`; close it when done."""
    judge = None
    if uses_rubric_judge(cfg["domains"]):
        from rollout.judge_worker import build_judge

        judge = build_judge(cfg, model_path)
    return RewardComposer(cfg["domains"], cfg.get("rewards") or {},
                          (cfg.get("rollout") or {}).get("max_new_tokens", 0), judge=judge)


def score_lines(lines: Iterable[str], cfg: dict, count_tokens: Callable[[str], int] = word_count) -> Iterable[dict]:
    """Plain-dict config in, one output dict per input line out (streamed in batches)."""
    composer = reward_composer(cfg)
    try:
        batch: list[tuple[dict, Trajectory | None, str | None]] = []

        def flush():
            trajs = [t for _, t, _ in batch if t is not None]
            composer.score(trajs)
            for row, t, err in batch:
                if t is None:
                    yield {**row, "reward": 0.0, "parts": {}, "error": err}
                else:
                    yield {**row, "reward": t.reward, "parts": t.reward_parts, "error": t.reward_error}
            batch.clear()

        for k, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError("line is not a JSON object")
            except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser goes
                batch.append(({"line": k + 1}, None, f"invalid JSON: {str(exc)[:200]}"))
            else:
                try:
                    batch.append((row, _line_to_traj(k, row, count_tokens), None))
                except (ValueError, TypeError) as exc:
                    batch.append((row, None, str(exc)))
            if len(batch) >= BATCH:
                yield from flush()
        if batch:
            yield from flush()
    finally:
        composer.close()


def _load_config(args) -> dict[str, Any]:
    if args.config:
        cfg = load_plain_config(args.config)
        if args.overrides:
            from omegaconf import OmegaConf

            cfg = to_plain(OmegaConf.merge(OmegaConf.create(cfg), OmegaConf.from_dotlist(args.overrides)))
    else:
        cfg = load_hydra_config(args.overrides)
    try:
        check_reward_specs(cfg["domains"], cfg.get("rewards") or {}, (cfg.get("rollout") or {}).get("max_new_tokens", 0))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m launch.score", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input", help="JSONL file of responses to score")
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", help="plain YAML/JSON config instead of the Hydra conf/ tree")
    ap.add_argument("--tokenizer", help="tokenizer path/name to count response tokens (default: word count)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. rewards.code.wall_s=5")
    # Overrides may come before or after the options; argparse leaves the late ones unrecognised.
    args, extra = ap.parse_known_args(argv)
    bad = [x for x in extra if x.startswith("-") or "=" not in x]
    if bad:
        ap.error(f"unrecognized arguments: {' '.join(bad)}")
    args.overrides = list(args.overrides) + extra
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    try:
        cfg = _load_config(args)
    except ConfigError as e:  # a misspelled override, a reward that does not import: one line, as launch.train
        print(f"config error: {e}", file=sys.stderr)
        return 2
    count = word_count
    if args.tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.tokenizer)
        count = lambda text: len(tok(text, add_special_tokens=False)["input_ids"])  # noqa: E731

    n = errors = 0
    total = 0.0
    out_path = Path(args.out)
    # Written beside the output and renamed at the end: an interrupted run leaves no half file, and --out may be
    # the input itself (it is read to the end before the rename).
    tmp = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
    try:
        with open(args.input, encoding="utf-8", errors="replace") as fin, open(tmp, "w", encoding="utf-8") as fout:
            for out in score_lines(fin, cfg, count):
                fout.write(json_line(out))
                n += 1
                total += out["reward"]
                errors += out["error"] is not None
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"scored {n} lines -> {args.out}: mean reward {total / max(n, 1):.4f}, {errors} with an error",
          file=sys.stderr)
    return 0


# The guard matters: the reward process pool uses forkserver, whose workers import the main module.
if __name__ == "__main__":
    sys.exit(main())
