"""The generative rubric judge: a judge model scores a response against that prompt's own rubric.

Request (one per sample): {"question": raw prompt, "response": the answer with its reasoning already removed,
"rubric": [{"criterion": str, "weight": float > 0}, ...]}. Result: {"score": float in [0, 1], "reason": str | None,
"criteria": [per-criterion score in [0, 1]]}. The sample score is sum(w_i * s_i) / sum(w_i).

Every (sample, criterion) pair is one judge prompt, and all prompts of a batch go to the engine in ONE call, so
the engine batches them (vLLM also shares the question+response prefix between a sample's criteria through its
prefix cache: the criterion is the last thing in the prompt for that reason). Two ways to get a criterion score
(`rewards.judge.mode`):
- "expected": the judge's next-token distribution after the prompt, restricted to the score tokens "0".."score_max"
  and renormalised; the score is its expected value / score_max. Always defined (no parsing), so it also works for
  small or untrained judges such as the embedded tiny model. Each score string must be ONE token of the judge
  tokenizer; that is checked at start.
- "text": the judge writes a short answer (greedy by default) that must hold exactly one line `Score: <int>` with
  0 <= int <= score_max. An unparseable answer gets one retry (all failures of a batch in one more engine call,
  with a reminder of the format, so even a greedy judge answers differently); still unparseable -> 0, with why.
  Also the fallback when the engine cannot give next-token logprobs.

Prompts longer than `max_prompt_tokens` are cut in the MIDDLE of the response (its start and end usually carry the
most signal: the approach and the conclusion), then, only if that is not enough, in the middle of the question;
a "[... N tokens omitted ...]" marker tells the judge. The policy's text is tokenised again here with the judge's
tokenizer: unavoidable for a different model, and nothing of it flows back into training as token ids.

The question, response and criterion are untrusted (the policy writes the response, and is rewarded for what the
judge says): no text in them may add a turn to the judge's conversation. Every special-token string of the judge
tokenizer is removed from them to a fixed point (so "<|im_<|im_start|>start|>" does not reassemble), again after the
cut (decoding the kept pieces gives the text as the tokenizer normalised it), and every prompt is checked to hold
exactly the special tokens of the chat template alone; a request that fails the check scores 0 with the reason and
never reaches the judge model.

`RubricJudge` needs only the judge model's tokenizer and two callables: text generation (text mode) and next-token
logprobs (expected mode). The engine behind them, and the Ray actor that serves one judge to every reward worker,
live in `rollout/judge_worker.py`; the reward-scoring CLI builds one in-process.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Mapping

import numpy as np

from .spec import RewardZero, SampleView
from .text import answer_part, sanitize

logger = logging.getLogger(__name__)

# rewards.judge defaults (conf/rewards/default.yaml documents each key); used when a plain config omits some.
DEFAULTS: dict[str, Any] = {
    "model": None, "mode": "expected", "max_prompt_tokens": 2048, "max_new_tokens": 32, "temperature": 0.0,
    "score_max": 9, "dtype": None, "device": None, "engine": None, "gpu_memory_utilization": None,
    "num_cpus": 0, "num_gpus": 0, "batch_size": None, "timeout_s": 300.0, "tensor_parallel_size": 1,
    "engine_args": None,
}
MIN_KEEP_TOKENS = 32  # never cut a field below this many tokens; past that the request fails with a reason
PROMPT = (
    "You are grading an AI assistant's response against ONE criterion of a rubric.\n\n"
    "[Question]\n{question}\n\n[Response]\n{response}\n\n[Criterion]\n{criterion}\n\n"
    "How well does the response meet this criterion? Use an integer from 0 (not at all) to {score_max} (fully)."
)
EXPECTED_TAIL = " Reply with that single number only."
TEXT_TAIL = " Reply with one line of the form `Score: <integer>`."
RETRY_TAIL = (" Your previous reply could not be read. Reply with exactly one line `Score: <integer>`, "
              "the integer between 0 and {score_max}, and nothing else.")


def judge_config(rewards_cfg: Mapping | None) -> dict:
    return {**DEFAULTS, **dict((rewards_cfg or {}).get("judge") or {})}


def judge_tensor_parallel_size(judge: Mapping) -> int:
    """GPUs one judge instance spans (`rewards.judge.tensor_parallel_size`, of `judge_config`; null = 1)."""
    value = judge.get("tensor_parallel_size")
    return 1 if value is None else int(value)


def uses_rubric_judge(domains_cfg: Mapping) -> bool:
    """True if any domain's rewards list has a `rubric_judge` part (the driver then starts a JudgeWorker)."""
    for block in (domains_cfg or {}).values():
        parts = block.get("rewards") if isinstance(block, Mapping) else block
        if any(isinstance(p, Mapping) and p.get("name") == "rubric_judge" for p in parts or []):
            return True
    return False


# ------------------------------------------------------------------------------------------ request side
def normalize_rubric(rubric: Any) -> list[tuple[str, float]]:
    """Validated [(criterion, weight)]; raises ValueError saying what is wrong (a data error, not a crash)."""
    if isinstance(rubric, str):  # some datasets store the rubric as a JSON string
        import json

        rubric = json.loads(rubric)
    if not isinstance(rubric, list) or not rubric:
        raise ValueError("rubric must be a non-empty list of {criterion, weight}")
    out = []
    for i, item in enumerate(rubric):
        if not isinstance(item, Mapping):
            raise ValueError(f"rubric[{i}] is not a mapping")
        crit, w = item.get("criterion"), item.get("weight", 1.0)
        if not isinstance(crit, str) or not crit.strip():
            raise ValueError(f"rubric[{i}].criterion must be a non-empty string")
        # Negative weights would let the sample score leave [0, 1]; a zero weight is a criterion that never counts.
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"rubric[{i}].weight must be a number > 0, got {w!r}")
        out.append((crit.strip(), float(w)))
    return out


def judge_request(view: SampleView, params: dict) -> dict:
    """The composer's `rubric_judge` part function: one sample -> one judge request (no model call here)."""
    response = view.answer.strip()
    if not response:  # nothing after the reasoning (or unclosed <think>): nothing to judge
        raise RewardZero("empty response after removing the reasoning")
    try:
        rubric = normalize_rubric(view.sample.get("rubric"))
    except ValueError as exc:
        raise RewardZero(f"invalid rubric: {exc}") from None
    return {"question": sanitize(view.sample.get("prompt", "")), "response": response,
            "rubric": [{"criterion": c, "weight": w} for c, w in rubric]}


def parse_score(text: str, score_max: int) -> tuple[int | None, str | None]:
    """Strict text-mode parse: exactly one line `Score: <int>` (case-insensitive), 0 <= int <= score_max.

    Other lines (a justification) are allowed; the judge's own reasoning (<think>...</think>) is ignored.
    Returns (score, None) or (None, reason). Linear in the text (no backtracking regex).
    """
    found = []
    for line in answer_part(sanitize(text)).splitlines():
        s = line.strip()
        if s.lower().startswith("score:"):
            found.append(s[len("score:"):].strip())
    if not found:
        return None, "no 'Score: <int>' line"
    if len(found) > 1:
        return None, f"{len(found)} 'Score:' lines (ambiguous)"
    value = found[0]
    digits = value[1:] if value[:1] in "+-" else value
    if not digits.isascii() or not digits.isdigit():
        return None, f"score {value[:20]!r} is not an integer"
    score = int(value)
    if not 0 <= score <= score_max:
        return None, f"score {score} outside 0..{score_max}"
    return score, None


# ------------------------------------------------------------------------------------------ the judge
# (prompt token ids, max_new_tokens, temperature, seed) -> one decoded text per prompt
GenerateTexts = Callable[[list[list[int]], int, float, int], list[str]]
# (prompt token ids, candidate token ids) -> [prompts, candidates] logprobs of each candidate as the next token
NextTokenLogprobs = Callable[[list[list[int]], list[int]], np.ndarray]


class RubricJudge:
    """Scores requests with a judge model given as its tokenizer, `generate_texts` and, for expected mode,
    `next_token_logprobs` (without it, expected mode falls back to text)."""

    def __init__(self, tokenizer, generate_texts: GenerateTexts, next_token_logprobs: NextTokenLogprobs | None = None,
                 mode: str = "expected", score_max: int = 9, max_prompt_tokens: int = 2048, max_new_tokens: int = 32,
                 temperature: float = 0.0, seed: int = 0):
        if mode not in ("expected", "text"):
            raise ValueError(f"rewards.judge.mode must be 'expected' or 'text', got {mode!r}")
        if not isinstance(score_max, int) or score_max < 1:
            raise ValueError(f"rewards.judge.score_max must be an integer >= 1, got {score_max!r}")
        self.tok, self.generate_texts, self.next_token_logprobs = tokenizer, generate_texts, next_token_logprobs
        self.score_max, self.max_prompt_tokens = score_max, int(max_prompt_tokens)
        self.max_new_tokens, self.temperature, self.seed = int(max_new_tokens), float(temperature), int(seed)
        if mode == "expected" and next_token_logprobs is None:
            logger.warning("the judge model gives no next-token logprobs: rewards.judge.mode falls back to 'text'")
            mode = "text"
        self.mode = mode
        if mode == "expected":
            self.score_token_ids = self._score_tokens()
        # Special-token strings inside untrusted text (question/response/criterion) would be parsed as real
        # special tokens and could fake the chat structure (close the user turn, forge the judge's answer): they
        # are removed from those fields to a fixed point (`_defuse`), and every prompt is checked to hold exactly
        # the special tokens of the template alone (`_prompt_ids`), which also covers what no removal of a token's
        # text finds (a tokenizer that reads a normalised look-alike as the token).
        added = getattr(self.tok, "added_tokens_decoder", {}) or {}
        specials = {str(x) for x in self.tok.all_special_tokens}
        specials |= {str(t.content) for t in added.values() if getattr(t, "special", False)}
        self._special = sorted((x for x in specials if x), key=len, reverse=True)
        self._special_ids = {int(i) for i in self.tok.all_special_ids}
        self._special_ids |= {int(i) for i, t in added.items() if getattr(t, "special", False)}
        self._template_specials = {retry: self._specials_in(self._encode(self.render("", "", "", retry=retry)))
                                   for retry in (False, True)}

    def _score_tokens(self) -> list[int]:
        ids = []
        for s in range(self.score_max + 1):
            enc = self.tok.encode(str(s), add_special_tokens=False)
            if len(enc) != 1:
                raise ValueError(f"rewards.judge.mode=expected needs every score 0..{self.score_max} to be one token "
                                 f"of the judge tokenizer, but {str(s)!r} -> {enc}; lower rewards.judge.score_max "
                                 f"(9 is safe for most tokenizers) or use mode=text")
            ids.append(enc[0])
        if len(set(ids)) != len(ids):
            raise ValueError(f"rewards.judge: score tokens are not distinct: {ids}")
        return ids

    # -- prompts ---------------------------------------------------------------------------------------
    def _defuse(self, text: str) -> str:
        """`text` without any special-token string, to a fixed point: "<|im_<|im_start|>start|>" loses both."""
        return remove_to_fixed_point(text, self._special)

    def _specials_in(self, ids: list[int]) -> list[int]:
        return [i for i in ids if i in self._special_ids]

    def _prompt_ids(self, question: str, response: str, criterion: str, retry: bool = False) -> list[int]:
        """The prompt's token ids, checked to hold exactly the special tokens of the chat template alone (no field
        can add, drop or move a turn); ValueError (the request scores 0 with it) otherwise."""
        ids = self._encode(self.render(question, response, criterion, retry=retry))
        found, want = self._specials_in(ids), self._template_specials[retry]
        if found != want:
            raise ValueError(f"the judge prompt holds {len(found)} special tokens where its chat template alone has "
                             f"{len(want)}: the question, response or criterion reads as chat markup; not judged")
        return ids

    def _encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def render(self, question: str, response: str, criterion: str, retry: bool = False) -> str:
        body = PROMPT.format(question=question, response=response, criterion=criterion, score_max=self.score_max)
        body += EXPECTED_TAIL if self.mode == "expected" else TEXT_TAIL
        if retry:
            body += RETRY_TAIL.format(score_max=self.score_max)
        # enable_thinking=False: a thinking judge (Qwen3 template) answers directly; other templates ignore it.
        return self.tok.apply_chat_template([{"role": "user", "content": body}], tokenize=False,
                                            add_generation_prompt=True, enable_thinking=False)

    def _cut_middle(self, text: str, ids: list[int], keep: int) -> str:
        """`text` (whose encoding is `ids`) with all but `keep` tokens removed from its middle."""
        if len(ids) <= keep:
            return text
        head, tail = keep // 2, keep - keep // 2
        # The kept pieces are decoded, and decoding gives the text as the tokenizer normalised it (NFKC turns a
        # look-alike into the token's own text): removed again here, where `fit` measures the result.
        return self._defuse(self.tok.decode(ids[:head]) + f"\n[... {len(ids) - keep} tokens omitted ...]\n"
                            + self.tok.decode(ids[len(ids) - tail:]))

    def fit(self, question: str, response: str, criteria: list[str]) -> tuple[str, str]:
        """(question, response) cut so that every criterion's prompt fits max_prompt_tokens (the longest decides,
        so all criteria of a sample share one prefix). Raises ValueError when even the minimum does not fit."""
        longest = max(criteria, key=lambda c: len(self._encode(c)))
        q_ids, r_ids = self._encode(question), self._encode(response)
        keep_q, keep_r = len(q_ids), len(r_ids)
        for _ in range(8):  # each round removes the measured excess; the marker's own tokens need a second round
            q, r = self._cut_middle(question, q_ids, keep_q), self._cut_middle(response, r_ids, keep_r)
            # Measured on the retry prompt, the longest variant, so a text-mode retry fits as well.
            over = len(self._encode(self.render(q, r, longest, retry=True))) - self.max_prompt_tokens
            if over <= 0:
                return q, r
            if keep_r > MIN_KEEP_TOKENS:
                keep_r = max(keep_r - over - 4, MIN_KEEP_TOKENS)
            elif keep_q > MIN_KEEP_TOKENS:
                keep_q = max(keep_q - over - 4, MIN_KEEP_TOKENS)
            else:
                break
        raise ValueError(f"judge prompt does not fit rewards.judge.max_prompt_tokens={self.max_prompt_tokens}")

    # -- scoring ---------------------------------------------------------------------------------------
    def score(self, requests: list[dict]) -> list[dict]:
        results: list[dict] = [{"score": 0.0, "reason": None, "criteria": []} for _ in requests]
        # (request index, prompt ids, retry prompt ids (text mode) or None), every one checked by `_prompt_ids`
        jobs: list[tuple[int, list[int], list[int] | None]] = []
        weights: list[list[float]] = []
        for i, req in enumerate(requests):
            try:
                rubric = normalize_rubric(req.get("rubric"))
                q, r = self._defuse(sanitize(req.get("question", ""))), self._defuse(sanitize(req.get("response", "")))
                if not r.strip():
                    raise ValueError("empty response once chat-template tokens are removed")
                crits = [self._defuse(sanitize(c)) for c, _ in rubric]
                q, r = self.fit(q, r, crits)
                todo = [(i, self._prompt_ids(q, r, c), self._prompt_ids(q, r, c, retry=True)
                         if self.mode == "text" else None) for c in crits]
            except ValueError as exc:
                results[i]["reason"] = str(exc)
                weights.append([])
                continue
            weights.append([w for _, w in rubric])
            jobs.extend(todo)
        if jobs:
            scores, reasons = (self._expected(jobs) if self.mode == "expected" else self._text(jobs))
            per_req: dict[int, list[tuple[float, str | None]]] = {}
            for (i, *_), s, why in zip(jobs, scores, reasons):
                per_req.setdefault(i, []).append((s, why))
            for i, items in per_req.items():
                w = weights[i]
                results[i]["criteria"] = [s for s, _ in items]
                results[i]["score"] = float(min(max(sum(wi * s for wi, (s, _) in zip(w, items)) / sum(w), 0.0), 1.0))
                bad = [f"criterion {k}: {why}" for k, (_, why) in enumerate(items) if why]
                results[i]["reason"] = "; ".join(bad)[:500] if bad else None
        return results

    def _expected(self, jobs) -> tuple[list[float], list[None]]:
        prompts = [ids for _, ids, _ in jobs]
        logp = np.asarray(self.next_token_logprobs(prompts, self.score_token_ids), dtype=np.float64)
        return expected_scores(logp, self.score_max).tolist(), [None] * len(jobs)

    def _generate_texts(self, prompts: list[list[int]]) -> list[str]:
        # <think> tags stay in the text so parse_score can drop the judge's own reasoning.
        return self.generate_texts(prompts, self.max_new_tokens, self.temperature, self.seed)

    def _text(self, jobs) -> tuple[list[float], list[str | None]]:
        texts = self._generate_texts([ids for _, ids, _ in jobs])
        parsed = [parse_score(t, self.score_max) for t in texts]
        failed = [k for k, (s, _) in enumerate(parsed) if s is None]
        if failed:  # one retry, batched, with a reminder of the format in the prompt
            retry = self._generate_texts([jobs[k][2] for k in failed])
            for k, t in zip(failed, retry):
                s, why = parse_score(t, self.score_max)
                parsed[k] = (s, None) if s is not None else (None, f"unparseable after retry ({why}): {t[:80]!r}")
        return ([0.0 if s is None else s / self.score_max for s, _ in parsed], [why for _, why in parsed])


def remove_to_fixed_point(text: str, tokens: list[str]) -> str:
    """`text` with every occurrence of `tokens` removed, including those the removal itself forms ("<|im_" +
    "<|im_start|>" + "start|>"): the result holds none of them. Linear in the text however deep the nesting (a stack:
    each character is appended once, and a token is popped the moment the output ends with it)."""
    if not any(t in text for t in tokens):
        return text
    for _ in range(3):  # the usual cases (no nesting, or a little) at C speed
        for t in tokens:
            text = text.replace(t, "")
        if not any(t in text for t in tokens):
            return text
    by_last: dict[str, list[str]] = {}
    for t in sorted(tokens, key=len, reverse=True):
        by_last.setdefault(t[-1], []).append(t)
    out: list[str] = []
    for ch in text:
        out.append(ch)
        for t in by_last.get(ch, ()):  # the output held none before this character: one can only end here
            if len(out) >= len(t) and "".join(out[-len(t):]) == t:
                del out[-len(t):]
                break
    return "".join(out)


def expected_scores(logp: np.ndarray, score_max: int) -> np.ndarray:
    """[N, C] log-probs of the score tokens 0..score_max -> expected score / score_max, in [0, 1]."""
    logp = np.asarray(logp, dtype=np.float64)
    z = logp - logp.max(axis=1, keepdims=True)  # renormalise over the allowed tokens only (stable softmax)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    return np.clip(p @ np.arange(logp.shape[1], dtype=np.float64) / score_max, 0.0, 1.0)
