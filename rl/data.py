"""Per-domain prompt datasets and the weighted mixture that feeds each RL step.

Each `domains.<d>.dataset` is loaded with HF `datasets` (a local jsonl/json/csv/parquet file or directory,
`bundled:<file>` for the data shipped in `rl/bundled/`, or a hub name) and its columns are renamed to our
field names through `columns` (`{prompt: question, answer: final_answer, ...}`). The mixture is deterministic
in (seed, step) and its cursor is checkpointed, so a resumed run sees exactly the prompts it would have seen.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rl.config import ConfigError

log = logging.getLogger(__name__)
BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def _looks_local(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~")) or Path(path).suffix in FILE_BUILDERS


def load_domain_rows(domain: str, ds_cfg: Mapping, required: set[str] = frozenset()) -> list[dict[str, Any]]:
    """Load one domain's dataset as a list of rows in our field names; errors name the config key."""
    import datasets

    key = f"domains.{domain}.dataset"
    path = str(ds_cfg["path"])
    split = ds_cfg.get("split") or "train"
    if path.startswith("bundled:"):
        path = str(BUNDLED_DIR / path.split(":", 1)[1])
    local = Path(path).expanduser()
    try:
        if local.is_file():
            builder = FILE_BUILDERS.get(local.suffix)
            if builder is None:
                raise ConfigError(f"{key}.path={path}: unsupported file type {local.suffix!r} (use {sorted(FILE_BUILDERS)})")
            ds = datasets.load_dataset(builder, data_files=str(local), split="train")
        elif local.is_dir():
            ds = datasets.load_dataset(str(local), ds_cfg.get("name"), split=split, data_files=ds_cfg.get("data_files"))
        elif _looks_local(path):
            raise ConfigError(f"{key}.path={path}: file not found")
        else:
            ds = datasets.load_dataset(path, ds_cfg.get("name"), split=split, data_files=ds_cfg.get("data_files"))
    except ConfigError:
        raise
    except Exception as e:  # hub/network/format problems: say which domain and what was tried
        raise ConfigError(f"{key}.path={path}: could not load the dataset ({type(e).__name__}: {e})") from e

    columns = dict(ds_cfg.get("columns") or {})
    for field in sorted(required - set(columns)):
        columns[field] = field  # default: the dataset already uses our name
    for field, col in columns.items():
        if col not in ds.column_names:
            raise ConfigError(
                f"{key}.columns.{field}: column {col!r} not in the dataset (columns: {ds.column_names})"
            )
    rows = [{field: ex[col] for field, col in columns.items()} for ex in ds]
    if not rows:
        raise ConfigError(f"{key}.path={path}: the dataset is empty")
    return rows


class PromptMixture:
    """Draws `n` prompts per step: domains by weight, rows in a per-domain shuffled order (epoch by epoch)."""

    def __init__(
        self,
        domains: Mapping[str, Mapping],
        tokenizer,
        *,
        seed: int,
        max_prompt_tokens: int,
        chat_template_kwargs: Mapping | None = None,
        required_fields: Mapping[str, set[str]] | None = None,
    ):
        self.tokenizer = tokenizer
        self.seed = int(seed)
        self.max_prompt_tokens = int(max_prompt_tokens)
        self.template_kwargs = dict(chat_template_kwargs or {})
        self.names = list(domains)
        weights = np.array([float(domains[d]["weight"]) for d in self.names])
        self.probs = weights / weights.sum()
        self.system = {d: domains[d]["dataset"].get("system_prompt") for d in self.names}
        required_fields = required_fields or {}
        self.rows = {d: load_domain_rows(d, domains[d]["dataset"], set(required_fields.get(d, ()))) for d in self.names}
        self.cursor = {d: [0, 0] for d in self.names}  # [epoch, position]
        self._orders: dict[str, tuple[int, np.ndarray]] = {}
        self.step = 0
        self.skipped_too_long = 0

    def render(self, domain: str, row: Mapping) -> tuple[str, list[int]]:
        messages = []
        if self.system[domain]:
            messages.append({"role": "system", "content": self.system[domain]})
        messages.append({"role": "user", "content": str(row["prompt"])})
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self.template_kwargs
        )
        return text, self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _order(self, domain: str, epoch: int) -> np.ndarray:
        cached = self._orders.get(domain)
        if cached is None or cached[0] != epoch:
            rng = np.random.default_rng([self.seed, zlib.crc32(domain.encode()), epoch])
            cached = self._orders[domain] = (epoch, rng.permutation(len(self.rows[domain])))
        return cached[1]

    def _next_row(self, domain: str) -> tuple[int, dict]:
        epoch, pos = self.cursor[domain]
        order = self._order(domain, epoch)
        index = int(order[pos])
        pos += 1
        if pos == len(order):
            epoch, pos = epoch + 1, 0
        self.cursor[domain] = [epoch, pos]
        return index, self.rows[domain][index]

    def next_batch(self, n: int) -> list[dict[str, Any]]:
        """n prompts: {domain, index, prompt_text, prompt_ids, sample}. Over-long prompts are skipped."""
        rng = np.random.default_rng([self.seed, self.step])
        picks = rng.choice(len(self.names), size=n, p=self.probs)
        batch = []
        for k in picks:
            domain = self.names[int(k)]
            for _ in range(len(self.rows[domain]) + 1):
                index, row = self._next_row(domain)
                text, ids = self.render(domain, row)
                if len(ids) <= self.max_prompt_tokens:
                    break
                self.skipped_too_long += 1
                log.warning("domain %s row %d: prompt has %d tokens > data.max_prompt_tokens, skipped", domain, index, len(ids))
            else:
                raise ConfigError(f"domains.{domain}: no prompt fits in data.max_prompt_tokens={self.max_prompt_tokens}")
            batch.append({"domain": domain, "index": index, "prompt_text": text, "prompt_ids": ids, "sample": dict(row)})
        self.step += 1
        return batch

    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "cursor": {d: list(c) for d, c in self.cursor.items()},
            "skipped_too_long": self.skipped_too_long,
        }

    def load_state_dict(self, state: Mapping) -> None:
        self.step = int(state["step"])
        self.skipped_too_long = int(state.get("skipped_too_long", 0))
        for d, c in state["cursor"].items():
            if d in self.cursor:
                self.cursor[d] = [int(c[0]), int(c[1])]
