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


def _check_text_file(path: Path, key: str, builder: str) -> None:
    """A local text dataset must be UTF-8 and hold at least one row: say so, with the line, before `datasets`
    fails with a traceback (invalid bytes) or a bare StopIteration (an empty file)."""
    if builder not in ("json", "csv"):
        return
    empty = True
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ConfigError(f"{key}.path={path}: line {n} is not valid UTF-8 ({e.reason} at byte {e.start} of "
                                  "the line); re-save the file as UTF-8") from None
            empty = empty and not text.strip()
    if empty:
        raise ConfigError(f"{key}.path={path}: the file is empty (no rows)")


def load_domain_rows(domain: str, ds_cfg: Mapping, required: set[str] = frozenset(),
                     which: str = "dataset", key: str | None = None) -> list[dict[str, Any]]:
    """Load one domain's dataset (`which`: dataset | eval_dataset) as a list of rows in our field names; errors
    name the config key (`key`: another config key's dataset, e.g. algorithm.dataset)."""
    import datasets

    key = key or f"domains.{domain}.{which}"
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
            _check_text_file(local, key, builder)
            ds = datasets.load_dataset(builder, data_files=str(local), split="train")
        elif local.is_dir():
            ds = datasets.load_dataset(str(local), ds_cfg.get("name"), split=split, data_files=ds_cfg.get("data_files"))
        elif _looks_local(path):
            raise ConfigError(f"{key}.path={path}: file not found")
        else:
            ds = datasets.load_dataset(path, ds_cfg.get("name"), split=split, data_files=ds_cfg.get("data_files"))
        rows_raw = list(ds)  # decoding happens here for some formats: inside the try
    except ConfigError:
        raise
    except UnicodeDecodeError as e:
        raise ConfigError(f"{key}.path={path}: not valid UTF-8 ({e.reason} at byte {e.start}); re-save the file as "
                          "UTF-8") from None
    except Exception as e:  # hub/network/format problems: say which domain and what was tried
        reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        raise ConfigError(f"{key}.path={path}: could not load the dataset ({type(e).__name__}: {reason})") from None

    # `where: {column: value or [values]}` keeps the rows whose columns hold one of those values (applied to the
    # dataset's own column names, before renaming): e.g. an agent domain on an environment's easy tasks only.
    for col, want in dict(ds_cfg.get("where") or {}).items():
        if col not in ds.column_names:
            raise ConfigError(f"{key}.where.{col}: column {col!r} not in the dataset (columns: {ds.column_names})")
        allowed = list(want) if isinstance(want, (list, tuple)) else [want]
        rows_raw = [ex for ex in rows_raw if ex[col] in allowed]
        if not rows_raw:
            raise ConfigError(f"{key}.where.{col}: no row of {path} has {col} in {allowed}")

    columns = dict(ds_cfg.get("columns") or {})
    for field in sorted(required - set(columns)):
        columns[field] = field  # default: the dataset already uses our name
    for field, col in columns.items():
        if col not in ds.column_names:
            raise ConfigError(
                f"{key}.columns.{field}: column {col!r} not in the dataset (columns: {ds.column_names})"
            )
    rows = [{field: ex[col] for field, col in columns.items()} for ex in rows_raw]
    if not rows:
        raise ConfigError(f"{key}.path={path}: the dataset is empty")
    return rows


def thinking_modes(domain_spec: Mapping) -> list[bool] | None:
    """The thinking modes a domain's prompts are rendered in (`domains.<d>.thinking`): [True], [False], [True, False]
    (`both`), or None (not set: the chat template's default, the mode unknown). On an agent domain without it,
    `agent.thinking` when given (the older key)."""
    value = domain_spec.get("thinking")
    agent = domain_spec.get("agent")
    if value is None and isinstance(agent, Mapping):
        value = agent.get("thinking")
    if value is None:
        return None
    return [True, False] if value == "both" else [bool(value)]


def draw_mode(modes: list[bool] | None, seed: int, step: int, domain: str, k: int) -> bool | None:
    """The mode of the k-th prompt of `domain` in step `step` (a GRPO group: all its samples share it). With two
    modes they alternate from a start drawn from (seed, step, domain), so a step holds both in equal shares (+-1) and
    a resumed run draws the same ones."""
    if not modes:
        return None
    start = zlib.crc32(f"{seed}:{step}:{domain}".encode()) if len(modes) > 1 else 0
    return modes[(start + k) % len(modes)]


def render_prompt(tokenizer, system_prompt: str | None, row: Mapping, template_kwargs: Mapping,
                  thinking: bool | None = None) -> tuple[str, list[int]]:
    """A dataset row as the policy sees it: the chat template over [system], user, then the assistant's turn.
    `thinking` (not None) adds `enable_thinking` to the template's kwargs (the embedded template and Qwen3's read it:
    false pre-fills an empty think block); None renders with `template_kwargs` as given."""
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": str(row["prompt"])})
    kwargs = dict(template_kwargs) if thinking is None else {**template_kwargs, "enable_thinking": bool(thinking)}
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    return text, tokenizer(text, add_special_tokens=False)["input_ids"]


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
        self.modes = {d: thinking_modes(domains[d]) for d in self.names}
        required_fields = required_fields or {}
        self.rows = {d: load_domain_rows(d, domains[d]["dataset"], set(required_fields.get(d, ()))) for d in self.names}
        self.cursor = {d: [0, 0] for d in self.names}  # [epoch, position]
        self._orders: dict[str, tuple[int, np.ndarray]] = {}
        self.step = 0
        self.skipped_too_long = 0

    def render(self, domain: str, row: Mapping, thinking: bool | None = None) -> tuple[str, list[int]]:
        return render_prompt(self.tokenizer, self.system[domain], row, self.template_kwargs, thinking)

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
        """n prompts: {domain, index, prompt_text, prompt_ids, sample, thinking}. Over-long prompts are skipped.
        `thinking`: the mode the prompt is rendered in (`draw_mode`; None where the domain sets none)."""
        rng = np.random.default_rng([self.seed, self.step])
        picks = rng.choice(len(self.names), size=n, p=self.probs)
        batch = []
        drawn: dict[str, int] = {}  # prompts of each domain so far this step
        for k in picks:
            domain = self.names[int(k)]
            thinking = draw_mode(self.modes[domain], self.seed, self.step, domain, drawn.get(domain, 0))
            drawn[domain] = drawn.get(domain, 0) + 1
            batch.append(self._draw(domain, thinking))
        self.step += 1
        return batch

    def next_of_domains(self, counts: Mapping[str, int]) -> list[dict[str, Any]]:
        """`counts[d]` prompts of each domain d, in the mixture's domain order (a backfill round of dynamic sampling,
        which refills each domain's own share of the step: rl/dynamic_sampling.py). It is one draw of the mixture
        like `next_batch`: it advances `step` (the modes of `thinking: both` alternate from a start drawn from it),
        and the checkpointed state after it resumes exactly."""
        batch = []
        for domain in self.names:
            for k in range(int(counts.get(domain, 0))):
                batch.append(self._draw(domain, draw_mode(self.modes[domain], self.seed, self.step, domain, k)))
        self.step += 1
        return batch

    def _draw(self, domain: str, thinking: bool | None) -> dict[str, Any]:
        """The domain's next prompt that fits data.max_prompt_tokens (longer ones are skipped and counted)."""
        for _ in range(len(self.rows[domain]) + 1):
            index, row = self._next_row(domain)
            text, ids = self.render(domain, row, thinking)
            if len(ids) <= self.max_prompt_tokens:
                break
            self.skipped_too_long += 1
            log.warning("domain %s row %d: prompt has %d tokens > data.max_prompt_tokens, skipped", domain, index, len(ids))
        else:
            raise ConfigError(f"domains.{domain}: no prompt fits in data.max_prompt_tokens={self.max_prompt_tokens}")
        return {"domain": domain, "index": index, "prompt_text": text, "prompt_ids": ids, "sample": dict(row),
                "thinking": thinking}

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


class EvalPrompts:
    """Held-out prompts per domain (`domains.<d>.eval_dataset`): the first `max_prompts` rows of each, rendered like
    training prompts (the eval set's system_prompt, else the training dataset's). A domain with `thinking: both`
    alternates the modes over its prompts (the first thinking), so the eval costs what it did with one mode."""

    def __init__(self, domains: Mapping[str, Mapping], tokenizer, *, max_prompts: int, max_prompt_tokens: int,
                 chat_template_kwargs: Mapping | None = None, required_fields: Mapping[str, set[str]] | None = None):
        self.tokenizer, self.max_prompt_tokens = tokenizer, int(max_prompt_tokens)
        self.template_kwargs = dict(chat_template_kwargs or {})
        self.requests: list[dict[str, Any]] = []
        for d, spec in domains.items():
            ds = spec.get("eval_dataset")
            if not ds:
                continue
            system = ds.get("system_prompt", spec["dataset"].get("system_prompt"))
            rows = load_domain_rows(d, ds, set((required_fields or {}).get(d, ())), which="eval_dataset")
            modes = thinking_modes(spec)
            kept = 0
            for index, row in enumerate(rows):
                if kept == int(max_prompts):
                    break
                thinking = modes[kept % len(modes)] if modes else None
                text, ids = render_prompt(tokenizer, system, row, self.template_kwargs, thinking)
                if len(ids) > self.max_prompt_tokens:
                    log.warning("eval domain %s row %d: prompt longer than data.max_prompt_tokens, skipped", d, index)
                    continue
                self.requests.append({"domain": d, "index": index, "prompt_text": text, "prompt_ids": ids,
                                      "sample": dict(row), "group_id": f"eval-{d}-{index}", "thinking": thinking})
                kept += 1

    @property
    def domains(self) -> list[str]:
        return sorted({r["domain"] for r in self.requests})
