"""Math outcome reward: math-verify `parse` + `verify` of the final answer against the reference.

Runs in a process of the killable pool (math-verify arms SIGALRM, which only works in a process's main thread,
and sympy can take unbounded time or memory on hostile input). The pool adds the outer per-sample timeout; the
inner math-verify timeouts are set below it so a slow sample usually ends cleanly without a pool restart.
"""

from __future__ import annotations

from .registry import RewardZero, SampleView


def _parse_gold(gold: str, timeout: int) -> list:
    from math_verify import parse

    # A bare reference like "\frac{1}{2}" or "[1,3)" is not found by math-verify's extractors unless it sits in a
    # LaTeX environment; wrapping it in \boxed{} makes the boxed extractor take it whole (intervals, sets).
    text = gold.strip()
    if "$" in text or "\\boxed" in text:
        candidates = (text, f"${text}$")
    else:
        candidates = (f"$\\boxed{{{text}}}$", f"${text}$", text)
    for cand in candidates:
        parsed = parse(cand, parsing_timeout=timeout)
        if parsed:
            return parsed
    return []


def math_verify_reward(view: SampleView, params: dict) -> float:
    from math_verify import parse, verify

    gold = view.sample.get("answer")
    if gold is None or not str(gold).strip():
        raise ValueError("sample has no 'answer'")
    answer = view.answer
    if not answer.strip():
        raise RewardZero("empty answer part")
    # The final answer is at the end; reading only the tail keeps a 1 MB response from costing minutes of regex.
    answer = answer[-params["max_answer_chars"]:]
    inner = max(1, int(params["inner_timeout_s"]))
    gold_parsed = _parse_gold(str(gold), inner)
    if not gold_parsed:
        raise ValueError(f"could not parse the reference answer {str(gold)[:80]!r}")
    pred_parsed = parse(answer, parsing_timeout=inner)
    if not pred_parsed:
        raise RewardZero("no parsable final answer")
    return float(verify(gold_parsed, pred_parsed, timeout_seconds=inner))


def warm_up_math() -> None:
    """Imported/exercised once per pool process so the first real sample does not pay sympy's import time."""
    from math_verify import parse, verify

    verify(parse("$\\boxed{1/2}$"), parse("0.5"))
