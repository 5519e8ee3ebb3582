"""SFT data: OpenAI-style chat rows rendered with the tokenizer's chat template, tokenised once, with a loss mask on
the assistant's tokens only, drawn a batch per step in a seeded order (`algorithm=sft`, conf/algorithm/sft.yaml).

A row is `{"messages": [...], "tools": [...]}` (tools optional): roles system / user / assistant / tool; an assistant
message may hold `tool_calls` (OpenAI's `{"type": "function", "function": {"name", "arguments"}}`, arguments a JSON
string or an object) and `reasoning_content`; a tool message holds a tool's result as `content`. A row that also
carries `token_ids` and `loss_mask` (mapped in `columns`; launch.generate writes them: the exact tokens its generator
sampled, 1 on the generated ones) is trained on those tokens instead of the template's rendering of its messages.

Where the assistant's tokens are (`assistant_spans`): the conversation is rendered once whole, and for each assistant
message i also up to message i-1 (with and without the generation prompt) and up to message i. Each must be a prefix
of the whole (a template that renders earlier turns differently once later ones follow, e.g. one that drops old
reasoning, is refused, since no single sequence then holds every turn as trained). Turn i's span starts after the
assistant header (the common part of the generation prompt and the rendered turn) and ends with the turn's last
special token (its end-of-turn token, e.g. `<|im_end|>`); what follows it (a newline) is template scaffolding. The
whole text is tokenised once, and a token is a loss token when it starts inside a span (offsets of the fast
tokenizer): content, reasoning, tool calls and the end-of-turn token get 1; system, user and tool messages, headers
and scaffolding 0. A template that drops part of an assistant message (its tool calls or reasoning) or the row's
tools is refused rather than trained on without them.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rl.batching import fill_rows
from rl.config import ConfigError
from rl.data import BUNDLED_DIR, load_domain_rows
from rl.trajectory import Trajectory

log = logging.getLogger(__name__)
DOMAIN = "sft"  # the `domain` of every SFT sample
# A row's thinking mode (launch.generate's `mode` column) -> the chat template's enable_thinking when it is rendered:
# a non-thinking row's prompt then holds the empty think block its sample was generated after, so the block is not
# trained as the assistant's own tokens, and a thinking row's prompt is the one its reasoning followed
MODES = {"thinking": True, "non_thinking": False}


# -- loading ------------------------------------------------------------------------------------------------------
def is_mode(value: Any) -> bool:
    """A row's `mode` that names a thinking mode (anything else, a list included, is no mode)."""
    return isinstance(value, str) and value in MODES


def json_kind(value: Any) -> str:
    """What a JSON value is, in words (for messages about a line that should have been an object)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def drop_nulls(value: Any) -> Any:
    """Dict entries whose value is None removed, recursively. Arrow-backed datasets give every message every key any
    message of the column has (None where it had none), and every tool schema every other tool's parameters."""
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


def load_conversations(ds_cfg: Mapping, key: str = "algorithm.dataset") -> list[dict[str, Any]]:
    """The rows as {"messages": [...], "tools": [...] (optional)} in our field names (`columns`: our field -> the
    dataset's column). A local .jsonl file is read line by line as written (exact JSON: no schema merging); anything
    else goes through HF `datasets` (rl/data.py), and None-valued keys are dropped (`drop_nulls`)."""
    columns = dict(ds_cfg.get("columns") or {"messages": "messages"})
    path = str(ds_cfg["path"])
    local = Path(str(BUNDLED_DIR / path.split(":", 1)[1]) if path.startswith("bundled:") else path).expanduser()
    if local.is_file() and local.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(local.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except ValueError as e:
                raise ConfigError(f"{key}.path={path}: line {n} is not JSON ({e})") from None
            if not isinstance(raw, dict):  # valid JSON, but a list, string, number or null
                raise ConfigError(f"{key}.path={path}: line {n} is not a JSON object (it is {json_kind(raw)}); each "
                                  'line must be one conversation, {"messages": [...]}') from None
            if columns["messages"] not in raw:
                raise ConfigError(f"{key}.columns.messages: line {n} has no column {columns['messages']!r} "
                                  f"(it has {sorted(raw)})")
            row = {field: raw[col] for field, col in columns.items() if col in raw}
            if is_mode(raw.get("mode")) and "mode" not in columns:  # launch.generate's rows say their mode
                row["mode"] = raw["mode"]
            rows.append(row)
        if not rows:
            raise ConfigError(f"{key}.path={path}: the file is empty (no rows)")
    else:
        rows = [drop_nulls(r) for r in load_domain_rows(DOMAIN, ds_cfg, {"messages"}, key=key)]
    for i, row in enumerate(rows):
        if not isinstance(row["messages"], list) or not all(isinstance(m, dict) and "role" in m for m in row["messages"]):
            raise ConfigError(f"{key}: row {i}: `messages` must be a list of {{role, content, ...}} objects")
    return rows


# -- rendering and the loss mask ----------------------------------------------------------------------------------
def _render(tokenizer, messages: list[dict], tools, kwargs: Mapping, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                         add_generation_prompt=generation_prompt, **kwargs)


def _turn_end(turn: str, specials: list[str]) -> int:
    """Where an assistant turn's trained text ends: after its last special token (the end-of-turn token; scaffolding
    such as a newline follows it), or the turn's end when it has none."""
    ends = [turn.rfind(s) + len(s) for s in specials if s and s in turn]
    return max(ends) if ends else len(turn)


def _check_turn(message: Mapping, text: str, i: int) -> None:
    """The rendered turn holds what the message says: its content, reasoning and every tool call's name."""
    parts = {"content": message.get("content"), "reasoning_content": message.get("reasoning_content")}
    for name, value in parts.items():
        if isinstance(value, str) and value.strip() and value.strip() not in text:
            raise ValueError(f"message {i}: the chat template does not render the assistant's {name}")
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call) if isinstance(call, Mapping) else {}
        if fn.get("name") and str(fn["name"]) not in text:
            raise ValueError(f"message {i}: the chat template does not render the assistant's tool_calls "
                             f"({fn['name']!r}); use a template with tool support (e.g. the embedded one, Qwen3's)")


def assistant_spans(tokenizer, messages: list[dict], tools: list | None = None,
                    template_kwargs: Mapping | None = None) -> tuple[str, list[tuple[int, int]]]:
    """(the whole rendered conversation, the character span [start, end) of every assistant turn's trained text:
    content, reasoning, tool calls and the end-of-turn token). Raises ValueError where the template cannot give them
    (see the module's docstring)."""
    kwargs = dict(template_kwargs or {})
    full = _render(tokenizer, messages, tools, kwargs, False)
    if tools:
        names = [str((t.get("function") or t).get("name")) for t in tools if isinstance(t, Mapping)]
        if any(n not in full for n in names):
            raise ValueError("the chat template does not render the row's tools (use a template with tool support)")
    specials = list(getattr(tokenizer, "all_special_tokens", None) or [])
    spans = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        if i == 0:
            raise ValueError("message 0 is an assistant message: a conversation starts with a system or user message")
        before = _render(tokenizer, messages[:i], tools, kwargs, False)
        opened = _render(tokenizer, messages[:i], tools, kwargs, True)
        through = _render(tokenizer, messages[: i + 1], tools, kwargs, False)
        if not (full.startswith(through) and through.startswith(before) and opened.startswith(before)):
            raise ValueError(f"message {i}: the chat template renders the conversation up to this turn differently "
                             "from the same turns inside the whole conversation (it rewrites earlier turns, e.g. drops "
                             "their reasoning), so one sequence cannot hold every turn as trained")
        header = os.path.commonprefix([opened[len(before):], through[len(before):]])
        start = len(before) + len(header)
        end = start + _turn_end(through[start:], specials)
        _check_turn(m, full[start:end], i)
        if end > start:
            spans.append((start, end))
    if not spans:
        raise ValueError("the conversation has no assistant message to train on")
    return full, spans


@dataclass
class Rendered:
    text: str  # the whole conversation as the template renders it
    ids: np.ndarray  # int32 [T]: `text` tokenised once
    loss_mask: np.ndarray  # float32 [T]: 1 on the assistant's tokens
    offsets: np.ndarray  # int64 [T]: where each token starts in `text`


def render_conversation(tokenizer, messages: list[dict], tools: list | None = None,
                        template_kwargs: Mapping | None = None) -> Rendered:
    """Render, tokenise once and mask (`assistant_spans`): a token is trained on when it starts inside a span."""
    text, spans = assistant_spans(tokenizer, messages, tools, template_kwargs)
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("the SFT loss mask needs a fast tokenizer (character offsets of its tokens)")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    starts = np.array([a for a, _ in enc["offset_mapping"]], dtype=np.int64)
    mask = np.zeros(len(starts), dtype=np.float32)
    for a, b in spans:
        mask[(starts >= a) & (starts < b)] = 1.0
    return Rendered(text, np.asarray(enc["input_ids"], dtype=np.int32), mask, starts)


# -- the dataset source's rows, step by step ------------------------------------------------------------------------
class ConversationDataset:
    """Conversations in a per-epoch shuffled order (seeded), epoch after epoch: `n` a step (`next_batch`), or as
    many as fill a step's packed rows (`next_packed`). Each drawn row is rendered and tokenised when drawn, cut to
    `max_tokens` (counted in `truncated`); a row left with no assistant token is skipped (`skipped`). The cursor
    (and the rows held over for a later step) are checkpointed, so a resumed run draws exactly the rows it would
    have."""

    def __init__(self, rows: list[dict], tokenizer, *, seed: int, max_tokens: int,
                 chat_template_kwargs: Mapping | None = None, key: str = "algorithm.dataset"):
        self.rows, self.tokenizer, self.seed, self.max_tokens = rows, tokenizer, int(seed), int(max_tokens)
        self.template_kwargs, self.key = dict(chat_template_kwargs or {}), key
        self.cursor = [0, 0]  # [epoch, position in the epoch's order]
        self.carry: list[Trajectory] = []  # next_packed: drawn rows that fit no packed row of their step
        self.truncated = self.skipped = 0
        self._orders: tuple[int, np.ndarray] | None = None
        self.sample(0, 0)  # the first row renders, or the run stops before anything starts
        self.truncated = 0

    def sample(self, index: int, epoch: int) -> Trajectory | None:
        """Row `index` as a Trajectory: prompt = the tokens before its first assistant token, response = the rest up
        to its last assistant token, `loss_mask` over the response, no inference logprobs. None when no assistant
        token is within `max_tokens`."""
        row = self.rows[index]
        if "token_ids" in row:
            r = self._sampled_tokens(index, row)
        else:
            kwargs = self.template_kwargs
            if is_mode(row.get("mode")):
                kwargs = {**kwargs, "enable_thinking": MODES[row["mode"]]}
            try:
                r = render_conversation(self.tokenizer, row["messages"], row.get("tools"), kwargs)
            except Exception as e:  # noqa: BLE001 - a template error, or one of ours: name the row
                raise ConfigError(f"{self.key}: row {index}: {e}") from None
        ids, mask = r.ids, r.loss_mask
        if len(ids) > self.max_tokens:
            ids, mask = ids[: self.max_tokens], mask[: self.max_tokens]
            self.truncated += 1
        trained = np.flatnonzero(mask)
        if not len(trained):
            return None
        first, last = int(trained[0]), int(trained[-1]) + 1  # tokens after the last trained one teach nothing
        cut = int(r.offsets[first])
        return Trajectory(uid=f"sft-{index}-e{epoch}", group_id=f"sft-{index}", domain=DOMAIN, prompt_ids=ids[:first],
                          response_ids=ids[first:last], inference_logprobs=None, loss_mask=mask[first:last],
                          prompt_text=r.text[:cut], response_text=r.text[cut:], sample={"index": index, "epoch": epoch})

    def _sampled_tokens(self, index: int, row: Mapping) -> "Rendered":
        """A row with the exact tokens a generator sampled (`token_ids`, and `loss_mask` 1 on the tokens it generated;
        launch.generate writes both): trained as they are, token in, token out, with no chat template. This is how
        an agent episode of a model whose template cannot render tools (SmolLM2: the tools were described in the
        system text) trains on exactly what was sampled. The ids must be the policy's vocabulary."""
        ids, mask = np.asarray(row["token_ids"], dtype=np.int64), np.asarray(row.get("loss_mask", []), dtype=np.float32)
        if ids.ndim != 1 or mask.shape != ids.shape:
            raise ConfigError(f"{self.key}: row {index}: token_ids and loss_mask must be two lists of one length "
                              f"(got {ids.shape} and {mask.shape})")
        if len(ids) and (ids.min() < 0 or ids.max() >= len(self.tokenizer)):
            raise ConfigError(f"{self.key}: row {index}: token id {int(ids.max())} is outside the policy's vocabulary "
                              f"({len(self.tokenizer)} tokens): these token_ids come from another tokenizer")
        # the text (for the samples' prompt_text / response_text) piece by piece, so that offsets index it
        pieces = self.tokenizer.batch_decode([[int(i)] for i in ids], skip_special_tokens=False)
        starts = np.concatenate([[0], np.cumsum([len(p) for p in pieces])[:-1]]).astype(np.int64)
        return Rendered("".join(pieces), ids.astype(np.int32), mask, starts)

    def _order(self, epoch: int) -> np.ndarray:
        if self._orders is None or self._orders[0] != epoch:
            self._orders = (epoch, np.random.default_rng([self.seed, epoch, 0x5F7]).permutation(len(self.rows)))
        return self._orders[1]

    def next_batch(self, n: int) -> list[Trajectory]:
        """The next `n` conversations (rows held over by `next_packed` first: a run resumed without step_tokens)."""
        held, self.carry = self.carry[:n], self.carry[n:]
        return held + [self._next_row() for _ in range(n - len(held))]

    def next_packed(self, rows: int, row_tokens: int) -> list[Trajectory]:
        """The conversations of one step of `rows` packed rows of `row_tokens` tokens (algorithm.step_tokens): the
        rows held over from the last step, then the next ones, until they hold a step's tokens; of those, the ones
        that fill the rows (best-fit decreasing, `rl.batching.fill_rows`, the trainer's own packing). The others
        wait for a later step (longest first: a row waits while longer ones and shorter gap-fillers take the room;
        on SFT-like lengths up to a few dozen steps) and are checkpointed with the cursor: none is lost or drawn
        twice. Rows still waiting when the run ends are not trained, as the rows not yet drawn are not."""
        buffer, self.carry = self.carry, []
        total = sum(t.num_tokens for t in buffer)
        while total < rows * row_tokens:
            buffer.append(self._next_row())
            total += buffer[-1].num_tokens
            if buffer[-1].num_tokens > row_tokens:  # rl.config.validate_step_tokens refuses such a config
                raise ConfigError(f"{self.key}: a conversation of {buffer[-1].num_tokens} tokens fits no packed row "
                                  f"of {row_tokens}: algorithm.max_tokens must be <= trainer.micro_batch_tokens")
        kept = set(fill_rows([t.num_tokens for t in buffer], rows, row_tokens))
        self.carry = [t for i, t in enumerate(buffer) if i not in kept]
        return [t for i, t in enumerate(buffer) if i in kept]

    def _next_row(self) -> Trajectory:
        for _ in range(len(self.rows) + 1):
            epoch, pos = self.cursor
            index = int(self._order(epoch)[pos])
            self.cursor = [epoch, pos + 1] if pos + 1 < len(self.rows) else [epoch + 1, 0]
            t = self.sample(index, epoch)
            if t is not None:
                return t
            self.skipped += 1
            log.warning("%s: row %d has no assistant token within algorithm.max_tokens=%d, skipped", self.key, index,
                        self.max_tokens)
        raise ConfigError(f"{self.key}: no row has an assistant token within algorithm.max_tokens={self.max_tokens}")

    @property
    def epoch(self) -> float:
        """Epochs drawn so far (fractional)."""
        return self.cursor[0] + self.cursor[1] / len(self.rows)

    def state_dict(self) -> dict:
        carry = [[t.sample["index"], t.sample["epoch"]] for t in self.carry]
        return {"cursor": list(self.cursor), "truncated": self.truncated, "skipped": self.skipped, "carry": carry}

    def load_state_dict(self, state: Mapping) -> None:
        self.cursor = [int(state["cursor"][0]), int(state["cursor"][1])]
        # the held-over rows rendered again; they were counted in truncated when first drawn
        carry = [self.sample(int(index), int(epoch)) for index, epoch in state.get("carry", [])]
        self.carry = [t for t in carry if t is not None]  # None: algorithm.max_tokens changed since the checkpoint
        self.truncated, self.skipped = int(state.get("truncated", 0)), int(state.get("skipped", 0))
