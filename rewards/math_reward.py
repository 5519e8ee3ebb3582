"""Math outcome reward: math-verify `parse` + `verify` of the final answer against the reference.

Runs in a process of the killable pool (math-verify arms SIGALRM, which only works in a process's main thread,
and sympy can take unbounded time or memory on hostile input). The pool adds the outer per-sample timeout; the
inner math-verify timeouts are set below it so a slow sample usually ends cleanly without a pool restart.

math-verify reports its inner timeouts only through `logging` ("Timeout during comparison", "Timeout during
parsing: <the whole text>") and then returns False / []. A pool worker has no logging configured, so Python's
last-resort handler printed those bare lines on the console. Its calls here run under `_quiet_math_verify`, which
collects those records instead; a timeout becomes the sample's reason ("math: math-verify timed out ...").

What math-verify reads is `answer_window.read_answer(answer, max_answer_chars)`: a bounded window of the answer
part that never grades a fragment (issue 67; rewards/answer_window.py says how).
"""

from __future__ import annotations

import contextlib
import logging
import re
from fractions import Fraction

from .answer_window import read_answer
from .spec import RewardZero, SampleView
from .text import last_boxed

# Loggers of math-verify and of its LaTeX parser; their records are collected, never printed, under the block below.
_QUIET_LOGGERS = ("math_verify", "latex2sympy2_extended")


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):  # a record that cannot be formatted is dropped, like any other here
            self.messages.append(str(record.getMessage())[:200])  # a parse timeout quotes the whole input


@contextlib.contextmanager
def _quiet_math_verify():
    """Collect math-verify's log records (warnings and above) instead of letting them reach the console; yields
    the list of messages. Only those two libraries' loggers are touched: our own errors still raise, and other
    loggers keep their handlers."""
    collect = _Collect()
    saved = []
    for name in _QUIET_LOGGERS:
        lg = logging.getLogger(name)
        saved.append((lg, lg.propagate))
        lg.addHandler(collect)
        lg.propagate = False
    try:
        yield collect.messages
    finally:
        for lg, propagate in saved:
            lg.removeHandler(collect)
            lg.propagate = propagate


def _timed_out(messages: list[str], what: str) -> bool:
    return any(m.startswith(f"Timeout during {what}") for m in messages)


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
    with _quiet_math_verify() as messages:
        return _math_verify_reward(view, params, messages)


def _math_verify_reward(view: SampleView, params: dict, messages: list[str]) -> float:
    from math_verify import parse, verify

    gold = view.sample.get("answer")
    if gold is None or not str(gold).strip():
        raise ValueError("sample has no 'answer'")
    answer = view.answer
    if not answer.strip():
        raise RewardZero("empty answer part")
    # A bounded read (a 1 MB response would cost minutes of regex) that never cuts an answer (`read_answer`).
    answer = read_answer(answer, params["max_answer_chars"])
    inner = max(1, int(params["inner_timeout_s"]))
    gold_parsed = _parse_gold(str(gold), inner)
    if not gold_parsed:
        why = f" (math-verify timed out after {inner} s)" if _timed_out(messages, "parsing") else ""
        raise ValueError(f"could not parse the reference answer {str(gold)[:80]!r}{why}")
    del messages[:]
    pred_parsed = parse(answer, parsing_timeout=inner)
    if not pred_parsed:
        if _timed_out(messages, "parsing"):
            raise RewardZero(f"math-verify timed out parsing the answer (inner_timeout_s={inner})")
        raise RewardZero("no parsable final answer")
    del messages[:]
    if verify(gold_parsed, pred_parsed, timeout_seconds=inner):
        return 1.0
    # verify() says False both for "different" and for "sympy ran past the timeout" (it only logs the latter);
    # the score is 0 either way, as before, but a timeout gets a reason.
    if _timed_out(messages, "comparison"):
        raise RewardZero(f"math-verify timed out comparing with the reference (inner_timeout_s={inner})")
    return 0.0


def warm_up_math() -> None:
    """Imported/exercised once per pool process so the first real sample does not pay sympy's import time."""
    from math_verify import parse, verify

    with _quiet_math_verify():
        verify(parse("$\\boxed{1/2}$"), parse("0.5"))


# Exact answers written as a plain number, a/b or \frac{a}{b} (the bundled arithmetic, most competition integers).
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d+)?|\.\d+)")
_SLASH = re.compile(r"([+-]?\d+)/(\d+)")
_FRAC = re.compile(r"([+-]?)\\[dt]?frac\{([+-]?\d+)\}\{(\d+)\}")


def plain_number(text: str) -> Fraction | None:
    """`text` as an exact number when it is written as one (at most 64 characters), else None."""
    s = text.strip().strip("$").replace(" ", "")
    if not s or len(s) > 64:
        return None
    try:
        if _NUMBER.fullmatch(s):
            return Fraction(s)
        if m := _SLASH.fullmatch(s):
            return Fraction(int(m[1]), int(m[2])) if int(m[2]) else None
        if m := _FRAC.fullmatch(s):
            value = Fraction(int(m[2]), int(m[3])) if int(m[3]) else None
            return -value if value is not None and m[1] == "-" else value
    except (ValueError, ZeroDivisionError):
        return None
    return None


# An interval with plain-number ends, "[4, 8]" or "(1, 9]" (the bundled arithmetic's inequalities).
_INTERVAL = re.compile(r"([\[(])([^,\[\]()]+),([^,\[\]()]+)([\])])")


def plain_interval(text: str) -> tuple[str, Fraction, Fraction, str] | None:
    """`text` as (left bracket, a, b, right bracket) when it is an interval a < b written with plain-number ends
    (at most 64 characters), else None. a = b is left out: math-verify may read "[5, 5]" as the point 5."""
    s = text.strip().strip("$").replace(" ", "")
    m = _INTERVAL.fullmatch(s) if len(s) <= 64 else None
    if m is None:
        return None
    a, b = plain_number(m[2]), plain_number(m[3])
    return (m[1], a, b, m[4]) if a is not None and b is not None and a < b else None


# math-verify reads the answer with regexes in priority groups (parser.extract_target_from_pred): "final answer is
# ... I hope" first, then \boxed{} and "final answer ... is" together (rightmost wins), then "answer ..." and
# plain numbers. Without the words "final answer", a response's only \boxed{} is therefore its answer; without a
# box, LaTeX, operators, percent or any other digits, a lone integer in prose ("The answer is 57.") is.
_LONE_INTEGER = re.compile(r"(?:^|\s)(-?[0-9]+)(?=$|[\s.,!?:;])")
# A lone \frac{a}{b} in prose ("The answer is \frac{13}{8}."), a minus attached: math-verify reads it as a/b. Not
# \dfrac/\tfrac (there it reads nothing), nor "- \frac" (it drops the sign).
_LONE_FRAC = re.compile(r"(?:^|\s)(-?)\\frac\{(-?\d+)\}\{(\d+)\}(?=$|[\s.,!?:;])")
_NOT_PROSE = re.compile(r"[$\\%()\[\]{}+*/^=<>×÷]|percent|pct", re.IGNORECASE)
_DIGITS = re.compile(r"\d+")


def _only_box(tail: str) -> str | None:
    """The content of the response's only \\boxed{} when math-verify would take it as the answer, else None."""
    if "\\fbox" in tail or "final answer" in tail.lower() or tail.count("\\boxed") != 1:
        return None
    return last_boxed(tail)


def _said_answer(tail: str) -> Fraction | None:
    """The number math-verify would read as the answer, when that is certain without running it; else None."""
    if "\\fbox" in tail or "final answer" in tail.lower():
        return None
    if "\\boxed" in tail:
        boxed = _only_box(tail)
        return plain_number(boxed) if boxed is not None else None
    if (m := _LONE_FRAC.search(tail)) is not None:
        rest = tail[: m.start()] + " " + tail[m.end():]  # the prose around the fraction: no other number or math
        if _DIGITS.search(rest) or _NOT_PROSE.search(rest) or "-" in rest:
            return None
        return plain_number(m[0])  # None for a zero denominator
    if len(_DIGITS.findall(tail)) != 1 or _NOT_PROSE.search(tail):
        return None
    m = _LONE_INTEGER.search(tail)
    if m is None or tail.count("-") != m[1].count("-"):  # a dash elsewhere may join an expression with it
        return None
    return Fraction(int(m[1]))


def fast_math_check(view: SampleView, params: dict) -> float | None:
    """The math reward without sympy, when the reference is a plain number and so is the answer (the response's
    only \\boxed{}, or a lone integer or \\frac{a}{b} in plain prose): 1.0 when they are equal, 0.0 when they differ by more than
    any rounding tolerance; or when the reference is an interval with plain-number ends and the answer a boxed
    interval or number (`_interval_check`); None (math-verify decides, in the pool) otherwise, e.g. 0.333 against
    1/3, which math-verify may accept. It reads what math-verify reads (`read_answer`) and is linear in the answer,
    so it runs in the composer's process: most reasoning samples never wait for a pool process."""
    gold_text = str(view.sample.get("answer") or "")
    gold = plain_number(gold_text)
    if gold is None:
        interval = plain_interval(gold_text)
        return _interval_check(read_answer(view.answer, params["max_answer_chars"]), interval) if interval else None
    pred = _said_answer(read_answer(view.answer, params["max_answer_chars"]))
    if pred is None:
        return None
    if pred == gold:
        return 1.0
    if pred.denominator == 1 and gold.denominator == 1:
        return 0.0
    return 0.0 if abs(pred - gold) > 1e-3 * max(1, abs(gold)) else None


def _interval_check(tail: str, gold: tuple) -> float | None:
    """An interval reference against the response's only \\boxed{}: the same interval 1.0; the same brackets with
    other integer ends, or a plain number (boxed or alone in prose), 0.0; anything else (other brackets, decimal
    ends, an interval in prose) None."""
    boxed = _only_box(tail)
    if boxed is None:  # a lone number in prose is never the interval
        return 0.0 if "\\boxed" not in tail and _said_answer(tail) is not None else None
    pred = plain_interval(boxed)
    if pred is None:
        return 0.0 if plain_number(boxed) is not None else None
    if pred == gold:
        return 1.0
    ends = (pred[1], pred[2], gold[1], gold[2])
    same_kind = pred[0] == gold[0] and pred[3] == gold[3]
    return 0.0 if same_kind and all(e.denominator == 1 for e in ends) else None
