"""Cheap rule-based rewards that run inline: exact_match, format, char_fraction and the length penalty.

All of them are linear-time string scans, so they cannot hang on hostile output.
"""

from __future__ import annotations

from .spec import RewardZero, SampleView
from .text import THINK_CLOSE, THINK_OPEN, last_boxed, nfkc

# ---------------------------------------------------------------------------------------------------- exact_match

# Characters stripped from both ends of a candidate answer: punctuation, quotes, brackets and markdown emphasis
# that models wrap around short answers ("**Alice**.", "(B)", '"yes"').
_EDGE_CHARS = " \t\n.,;:!?。，；：！？'\"`*_()[]{}<>«»“”‘’「」『』（）【】$"
_ANSWER_MARKERS = ("final answer:", "final answer is", "answer:", "answer is", "答案：", "答案:", "答案是")


def _unwrap_latex(s: str) -> str:
    # \boxed{X} / \text{X} / \textbf{X} / \mathrm{X} -> X (repeatedly, outermost only).
    for _ in range(4):
        t = s.strip()
        for cmd in ("\\boxed{", "\\text{", "\\textbf{", "\\mathrm{", "\\mathbf{"):
            if t.startswith(cmd) and t.endswith("}"):
                t = t[len(cmd):-1]
                break
        else:
            return t
        s = t
    return s


def normalize_short_answer(s: str) -> str:
    """NFKC, unwrap \\boxed/\\text, casefold, strip edge punctuation/quotes/markdown, collapse whitespace."""
    s = _unwrap_latex(nfkc(s))
    s = s.casefold().strip(_EDGE_CHARS)
    s = _unwrap_latex(s).strip(_EDGE_CHARS)
    return " ".join(s.split())


def pick_short_answer(answer: str) -> str:
    """The one candidate a short-answer response is judged on (first rule that applies wins):

    1. the content of the last `\\boxed{...}`;
    2. the text after the last "Answer:" / "Final answer:" / "答案：" marker (case-insensitive), to the end of
       that line;
    3. the last non-empty line of the answer part.
    Only one candidate is compared: accepting any line would reward listing every option.
    """
    boxed = last_boxed(answer)
    if boxed is not None:
        return boxed
    lowered = answer.casefold()
    best = -1
    best_len = 0
    for marker in _ANSWER_MARKERS:
        at = lowered.rfind(marker)
        if at > best:
            best, best_len = at, len(marker)
    if best >= 0:
        rest = answer[best + best_len:]
        line = rest.strip().split("\n", 1)[0] if rest.strip() else ""
        if line.strip():
            return line
    for line in reversed(answer.split("\n")):
        if line.strip():
            return line
    return ""


def exact_match(view: SampleView, params: dict) -> float:
    gold = view.sample.get("answer")
    if gold is None or not str(gold).strip():
        raise ValueError("sample has no 'answer'")
    if not view.answer.strip():
        raise RewardZero("empty answer part")
    # Long answer parts are only read at their end (where the final answer is); keeps hostile sizes cheap.
    tail = view.answer[-params["max_answer_chars"]:]
    return float(normalize_short_answer(pick_short_answer(tail)) == normalize_short_answer(str(gold)))


# --------------------------------------------------------------------------------------------------------- format


def format_reward(view: SampleView, params: dict) -> float:
    """Thinking mode: one well-formed `<think>...</think>` at the very start (leading whitespace allowed), then a
    non-empty answer. `think_in_prompt: true` is for chat templates that open `<think>` in the prompt: the response
    must then hold exactly one `</think>` and no `<think>`. Non-thinking mode: no think tags at all, non-empty text.
    `thinking: auto` takes the sample's own mode (a `both` domain has samples of each), thinking where it has none.
    """
    r = view.response
    n_open, n_close = r.count(THINK_OPEN), r.count(THINK_CLOSE)
    thinking = params["thinking"]
    if thinking == "auto":
        thinking = view.thinking is not False
    if not thinking:
        return float(n_open == 0 and n_close == 0 and bool(r.strip()))
    if params["think_in_prompt"]:
        if n_open != 0 or n_close != 1:
            return 0.0
    else:
        if n_open != 1 or n_close != 1 or not r.lstrip().startswith(THINK_OPEN):
            return 0.0
    return float(bool(r[r.index(THINK_CLOSE) + len(THINK_CLOSE):].strip()))


# -------------------------------------------------------------------------------------------------- char_fraction


def char_fraction(view: SampleView, params: dict) -> float:
    """Share of the answer's non-space characters that are in `chars` (a smoke-test reward: "can GRPO learn")."""
    allowed = set(params["chars"])
    total = hits = 0
    for ch in view.answer:
        if ch.isspace():
            continue
        total += 1
        hits += ch in allowed
    return hits / total if total else 0.0


# --------------------------------------------------------------------------------------------------------- length


def length_penalty(view: SampleView, params: dict) -> float:
    """A penalty in [-1, 0] (the composer multiplies it by its weight like any part).

    overlong (DAPO soft overlong punishment): 0 up to `max_new_tokens - buffer`, then linearly down to -1 at
             `max_new_tokens`; -1 whenever the response was cut (finish_reason == "length").
    linear:  `-(len - target) / scale` beyond `target` tokens, clipped to [-1, 0].
    """
    n = view.num_response_tokens
    if params["mode"] == "overlong":
        max_len = params["max_new_tokens"] or view.max_new_tokens
        if view.finish_reason == "length":
            return -1.0
        start = max_len - params["buffer"]
        if n <= start:
            return 0.0
        return max(-1.0, -(n - start) / params["buffer"])
    target = params["target"]
    if n <= target:
        return 0.0
    return max(-1.0, -(n - target) / params["scale"])


# -------------------------------------------------------------------------------------------------- env_verifier


def env_verifier(view: SampleView, params: dict) -> float:
    """An agent episode's outcome: the score its environment's verifier gave the final state and submission
    (computed by the rollout, which holds the episode's state; see rollout/agent.py). A verifier that raised is a
    failed part (the sample trains with advantage 0); a zero with the verifier's reason is an expected zero."""
    outcome = (view.episode or {}).get("outcome")
    if outcome is None:
        raise ValueError("sample has no agent episode: env_verifier needs a domain with an `agent` block")
    if outcome.get("error"):
        raise RuntimeError(f"the environment's verifier raised: {outcome['error']}")
    score = float(outcome["score"])
    if score <= 0.0 and outcome.get("reason"):
        raise RewardZero(str(outcome["reason"])[:300])
    return score
