"""What the math reward reads of a response's answer part: a bounded window that never grades a fragment.

Not the whole answer part, which may be megabytes (its regexes are slow there),
but `read_answer(answer, max_answer_chars)`. That is the answer's last `max_answer_chars` characters, cut only at a
clean boundary (never inside a number, an expression, a `$...$`/`\\(...\\)`/`\\[...\\]` environment, a LaTeX command or
between "answer" and its value), together with whatever math-verify would prefer to it that stands before it (the
final `\\boxed{}`, the last "answer"/"final answer" phrases, the last number when the tail has none), each whole
(`answer_window`). A cut never grades a fragment: before, a window starting inside `\\boxed{142}` read "42}" as the
answer 42, and a right answer followed by 4000 characters scored 0. An escaped dollar in prose (`Answer: \\$18`),
which math-verify cannot read, is read as the currency sign it is (`_prose_dollars`).

Used by math-verify's path (`math_reward.math_verify_reward`, in the pool) and the in-process shortcut
(`math_reward.fast_math_check`) alike, so both read the same text. Linear in the answer; the window is about
`max_answer_chars` plus a few hundred characters, with a hard bound (`answer_window`).
"""

from __future__ import annotations

import re

from .spec import RewardZero


# math-verify picks the answer by priority, then rightmost: "final answer is X. I hope" first, then \boxed{} and
# "final answer ... is X", then "answer: X" / "answer ... X", then any LaTeX environment or number. A window that
# starts inside an answer hands it a fragment ("\boxed{142}" cut to "42}" reads 42); one that leaves out an earlier
# box or "answer:" lets a later, lower-priority number win. `read_answer` avoids both while bounding the text.
_SLACK = 1024  # how far before the cut a clean boundary is looked for; the size bound of the other pieces
_ANCHOR_REACH = 130  # math-verify's "answer"/"final answer ... is" patterns reach at most this far to their value
_ANCHORS_KEPT = 3  # how many of the last "answer" (and "answer:", "final answer") phrases before the tail are read
# Between pieces that are not contiguous: a line break ends every inline environment, and the "#" before it ends
# an expression as the text's own next character did ("(7) so" is no expression; "(7) \n" would be one).
_SEPARATOR = "#\n\n"
# Characters that belong to numbers, expressions or LaTeX: a clean boundary has none on either side.
_MATHY = frozenset("$\\{}()[]^_+-*/=<>%|&~'×÷·−⋅")
_ANSWER_WORD = re.compile("answer", re.IGNORECASE)
_FINAL_ANSWER = re.compile("final answer", re.IGNORECASE)
_ANSWER_COLON = re.compile("answer:", re.IGNORECASE)
_BOX = "\\boxed{"  # the only box math-verify reads (not \fbox, not "\boxed {")
# What math-verify's unanchored patterns read: a number, or a $ / \( / \[ / " [x] " environment.
_NUMBER_START = re.compile(r"(?<![^\s=])(?:\*\*)?\$?-?\d")  # as math-verify anchors one: after a space or "="
_ENV_START = re.compile(r"\$|\\[(\[]|\s\[")


def _inert(ch: str) -> bool:
    return not ch.isdigit() and ch not in _MATHY


def _number_goes_on(last_solid: str, text: str, i: int) -> bool:
    """After a number, what follows may still be part of it for math-verify ("5 percent", "5 %")."""
    if not last_solid.isdigit():
        return False
    nxt = text[i: i + 8].lstrip()[:1]
    return not nxt or nxt.isalpha() or nxt == "%"


# Around a space, what an expression or number continues with (math-verify reads "3 + 4", "1 234", "5 %" as one)
_GOES_ON_AFTER = frozenset("+-*/^()×÷=.,−⋅·\\")
_GOES_ON_BEFORE = frozenset("+-*/^)×÷%=.,−⋅·")


def _apart(last_solid: str, text: str, i: int) -> bool:
    """A cut at a space between two tokens that no number, expression or "percent" joins ("5 \\frac{1}{2}",
    "} $x$"): the math characters next to it do not rule it out, as in `_clean_boundaries` they otherwise would."""
    if not (text[i - 1].isspace() or text[i].isspace()) or not last_solid or last_solid in _GOES_ON_AFTER:
        return False
    nxt = text[i: i + 8].lstrip()[:1]
    if not nxt or nxt in _GOES_ON_BEFORE:
        return False
    return not (last_solid.isdigit() and (nxt.isdigit() or nxt.isalpha()))


def _clean_boundaries(text: str, start: int, end: int, state: tuple[bool, bool, bool, bool], strict: bool = True):
    """Yield, in order, the positions k in [start, end] where `text` may be cut: text[:k] and text[k:] share no
    number (nor a number and its "percent"), expression, math environment (inline `$`, display `$$`, `\\(`, `\\[`,
    each counted only when it closes, as math-verify pairs them; nor environments joined by ", "/"and"/"or", which
    it reads as one answer), LaTeX command name or "answer" phrase; the start and the end of the text are two.
    `state` = (in $, in $$, in \\(, in \\[) at `start`. `strict=False` drops the "answer" rule (the fallback where
    "answer" is everywhere). Linear in end - start."""
    n = len(text)
    inline, display, paren, bracket = state
    # starts of "answer" (any case) that a boundary k must be more than _ANCHOR_REACH past
    anchors = [a - 6 if text[a - 6: a].lower() == "final " else a  # "final answer" starts at "final"
               for a in (m.start() for m in _ANSWER_WORD.finditer(text, max(0, start - _ANCHOR_REACH), min(n, end + 6)))
               ] if strict else []
    ai, last_anchor = 0, -(10 ** 9)
    line_end = -1  # end of the line holding i (found once per line)
    last_solid = ""  # the last non-space character before i
    joining = False  # after an environment, in what may join it to the next one: ", ", " and ", " or "
    i = start
    while i <= end:
        if i >= n:
            yield n
            return
        while ai < len(anchors) and anchors[ai] < i:
            last_anchor = anchors[ai]
            ai += 1
        if i == 0 or (not (inline or display or paren or bracket or joining) and i - last_anchor > _ANCHOR_REACH
                      and ((_inert(text[i - 1]) and _inert(text[i]) and not _number_goes_on(last_solid, text, i))
                           or _apart(last_solid, text, i))):
            yield i
        ch = text[i]
        if joining:  # math-verify reads "$a$, $b$ and $c$" as one answer (a set): keep them together
            word = "and" if text.startswith("and", i) else "or" if text.startswith("or", i) else ""
            if word and not text[i + len(word): i + len(word) + 1].isalpha():
                i += len(word)
                continue
            joining = ch.isspace() or ch == ","
        if not ch.isspace():
            last_solid = ch
        if i > line_end:
            line_end = text.find("\n", i)
            line_end = n if line_end < 0 else line_end
        if ch == "\\":
            nxt = text[i + 1: i + 2]
            if nxt.isalpha():  # a command name: no boundary inside it (nor right after the backslash)
                j = i + 2
                while j < n and text[j].isalpha():
                    j += 1
                last_solid = text[j - 1]
                i = j
                continue
            if nxt == "(":
                paren = text.find("\\)", i + 2, line_end) >= 0
            elif nxt == ")":
                joining, paren = paren, False
            elif nxt == "[":
                bracket = text.find("\\]", i + 2) >= 0
            elif nxt == "]":
                joining, bracket = bracket, False
            if nxt:
                last_solid = nxt
            i += 2  # an escape (\\$, \\{, \\\\) or a delimiter: one token
            continue
        if ch == "$":
            if text[i + 1: i + 2] == "$":
                joining = display
                display = not display and text.find("$$", i + 2) >= 0
                i += 2
                continue
            if not display:  # a single $ inside $$...$$ is content
                joining = inline
                inline = not inline and text.find("$", i + 1, line_end) >= 0
        elif ch == "\n":
            inline = paren = False  # inline environments end at a line break for math-verify
        i += 1


def _state_at(text: str, k: int) -> tuple[bool, bool, bool, bool]:
    """An estimate of (in $, in $$, in \\(, in \\[) at position k from counts of the delimiters before it and whether
    one closes after it (C speed; `_clean_boundaries` then tracks them exactly)."""
    line = text.rfind("\n", 0, k) + 1
    line_end = text.find("\n", k)
    line_end = len(text) if line_end < 0 else line_end
    doubles = text.count("$$", line, k)
    singles = text.count("$", line, k) - text.count("\\$", line, k) - 2 * doubles
    inline = singles % 2 == 1 and text.find("$", k, line_end) >= 0
    display = (text.count("$$", 0, k) - text.count("\\$$", 0, k)) % 2 == 1 and text.find("$$", k) >= 0
    paren = text.rfind("\\(", line, k) > text.rfind("\\)", line, k) and text.find("\\)", k, line_end) >= 0
    bracket = text.rfind("\\[", 0, k) > text.rfind("\\]", 0, k) and text.find("\\]", k) >= 0
    return inline, display, paren, bracket


def _token_start(text: str, k: int) -> int:
    """k moved back to the start of the token it falls in (a command name with its backslash, an escape), at most
    64 characters, so a scan from there does not take the inside of a command for prose."""
    floor = max(0, k - 64)
    while k > floor and text[k - 1].isalpha():
        k -= 1
    if k > 0 and text[k - 1] == "\\":
        k -= 1
    return k


def _tail_start(text: str, cut: int) -> int | None:
    """The clean boundary nearest before `cut` (at most _SLACK before), else the first one after it; None if the
    text after cut - _SLACK has none (then nothing there can be read whole)."""
    for strict in (True, False):
        after = None
        for slack in (48, _SLACK) if strict else (_SLACK,):  # most text has a boundary close before the cut
            lo = _token_start(text, max(0, cut - slack))
            best = None
            for k in _clean_boundaries(text, lo, len(text), _state_at(text, lo), strict):
                if k > cut:
                    after = k if k < len(text) else None
                    break
                best = k
            if best is not None:
                return best
        if after is not None:
            return after
    return None


def _region_around(text: str, q: int, limit: int, stop: int) -> tuple[int, int] | None:
    """(start, end): the clean boundaries nearest around position q (start at most _SLACK before it, end within
    `limit` after it, or `stop` where the tail begins), i.e. the whole answer that q is part of; None if there are
    none."""
    for strict, slack in ((True, 48), (True, _SLACK), (False, _SLACK)):  # most text: a boundary close before q
        lo = _token_start(text, max(0, q - slack))
        start = None
        for k in _clean_boundaries(text, lo, min(len(text), q + limit, stop), _state_at(text, lo), strict):
            if k <= q:
                start = k
            elif start is not None:
                return start, k
            else:
                break
        if start is not None and stop <= q + limit:
            return start, stop
    return None


def _region_end(text: str, start: int, at_least: int, limit: int, stop: int) -> int | None:
    """The first clean boundary at or after `at_least` when `text` is read from `start` (as math-verify reads a
    piece that begins there), within start + limit; `stop` (where the tail begins: the piece runs into it) at the
    latest; None if there is none."""
    at_least = min(at_least, stop)
    for strict in (True, False):
        for k in _clean_boundaries(text, start, min(len(text), start + limit, stop), (False,) * 4, strict):
            if k >= at_least:
                return k
        if stop <= start + limit:
            return stop
    return None


def _last_match_start(pattern: re.Pattern, text: str, end: int) -> int | None:
    """Start of the last match of `pattern` that starts before `end`, searching backwards in growing chunks."""
    hi, size = end, 256
    while hi > 0:
        lo = max(0, hi - size)
        last = None
        for m in pattern.finditer(text, lo, min(len(text), hi + 16)):
            if m.start() < hi:
                last = m.start()
        if last is not None:
            return last
        hi, size = lo, min(2 * size, 1 << 16)
    return None


def _last_phrase(lowered: str | None, text: str, phrase: re.Pattern, end: int) -> int | None:
    """`_last_match_start` of a lower-case phrase, by rfind in the lower-cased text when lowering kept every
    position (it does unless the text holds a character like "İ" that lowers to two)."""
    if lowered is not None:
        at = lowered.rfind(phrase.pattern, 0, end + len(phrase.pattern) - 1)
        return at if 0 <= at < end else None
    return _last_match_start(phrase, text, end)


def _box_end(text: str, start: int, marker: int, stop: int) -> int | None:
    """End (after the closing brace) of the box whose command of `marker` characters starts at `start`, if its
    braces balance before `stop`."""
    i = start + marker
    while i < stop and text[i].isspace():
        i += 1
    if i >= stop or text[i] != "{":
        return None
    depth = 0
    for j in range(i, stop):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return None


_BOX_JOINER = re.compile(r"\b(and|or)\b|,|;")


def _last_box(text: str) -> tuple[int, int] | None:
    """(start, end) of the last `\\boxed{...}` (braces balanced), together with the boxes before it that math-verify
    reads with it as one answer (its normalisation joins boxes less than 10 characters apart, or less than 70 with
    "and", "or", "," or ";" between: "\\boxed{1} and \\boxed{2}" is {1, 2}); None if there is none."""
    start = text.rfind(_BOX)
    end = _box_end(text, start, len(_BOX) - 1, len(text)) if start >= 0 else None
    if end is None:
        return None
    first = start
    for _ in range(16):
        prev = max(text.rfind("\\boxed", 0, first), text.rfind("\\fbox", 0, first))
        if prev < 0:
            break
        prev_end = _box_end(text, prev, 6 if text.startswith("\\boxed", prev) else 5, first)
        if prev_end is None:
            break
        between = text[prev_end:first]
        if not (len(between) < 10 or (len(between) < 70 and _BOX_JOINER.search(between))):
            break
        first = prev
    return first, end


def _line_of_box(text: str, k: int) -> int:
    """k, or the start of its line when that line holds a `\\boxed` at or after k, starts at most _SLACK before k and
    is not inside a display environment: math-verify reads "$...\\boxed{1}...$" with any `$` before the box on
    its line (even one that closes "$x$"), so a piece with a box starts where that line starts."""
    line = text.rfind("\n", 0, k) + 1
    end = text.find("\n", k)
    if line == k or k - line > _SLACK or text.find(_BOX, k, len(text) if end < 0 else end) < 0:
        return k
    _, display, _, bracket = _state_at(text, line)
    return k if display or bracket else line


def answer_window(text: str, max_chars: int) -> str:
    """The part of an answer that math-verify reads, bounded, never a fragment of an answer:
    - the tail: the last `max_chars` characters, started at the clean boundary (`_clean_boundaries`) nearest before
      the cut, so an answer the cut would split is read whole;
    - and, where they stand before the tail, what math-verify would prefer to anything in it: the final `\\boxed{}`
      (with the boxes it joins to it, `_last_box`), the last "final answer is X. I hope", the last three "final
      answer", "answer:" and "answer" phrases (each with what follows it: the last one may have no value
      math-verify reads), and the last number and math environment (what it reads when the tail holds nothing it
      can), each cut at clean boundaries; a piece with a box starts at its line's start (`_line_of_box`).
    Pieces that are not contiguous are joined by `_SEPARATOR`. A final box longer than max(max_chars, _SLACK)
    raises RewardZero (it cannot be read whole). At most 2 * max_chars + max(max_chars, _SLACK) + 17 * _SLACK
    characters (about max_chars + a few hundred in practice); linear in len(text). What it cannot promise: that
    math-verify, had it read the whole text, would not have gone further back still (past three anchored phrases
    whose values it cannot read, or past a number and an environment it cannot read either).
    """
    n = len(text)
    if n <= max_chars:
        return text
    limit = max(max_chars, _SLACK)
    tail = _tail_start(text, n - max_chars)
    tail = None if tail is None else _line_of_box(text, tail)
    front = n if tail is None else tail
    spans = [] if tail is None else [(tail, n)]
    box = _last_box(text)
    if box is not None and box[0] < front:
        b, e = box
        if e - b > limit:
            raise RewardZero(f"the final \\boxed{{}} is {e - b} characters long, more than max_answer_chars="
                             f"{max_chars}")
        spans.append((_line_of_box(text, b), _region_end(text, b, e, limit, front) or e))
    lowered = text[: front + 16].lower()
    lowered = lowered if len(lowered) == min(n, front + 16) else None
    for phrase in (_FINAL_ANSWER, _ANSWER_COLON, _ANSWER_WORD):  # the last anchors of each priority class (the
        before = front                                             # last one may have no value math-verify reads)
        for _ in range(_ANCHORS_KEPT):
            a = _last_phrase(lowered, text, phrase, before)
            if a is None:
                break
            if (end := _region_end(text, a, a + _ANCHOR_REACH, _SLACK, front)) is not None:
                spans.append((a, end))
            before = a
    # math-verify's first choice, "final answer is X. I hope": the last one, with its "final answer"
    hope = text.rfind("I hope", 0, front)
    a = _last_phrase(lowered, text, _FINAL_ANSWER, hope) if hope >= 0 else None
    if a is not None and hope - a <= limit and (end := _region_end(text, a, hope + 6, hope - a + _SLACK, front)):
        spans.append((a, end))
    # the last number and environment before the tail: what math-verify reads when the tail holds nothing it can
    # (a number in the tail it always reads, and it reads the rightmost: then they never count)
    for pattern in (_NUMBER_START, _ENV_START) if _NUMBER_START.search(text, front) is None else ():
        q = _last_match_start(pattern, text, front)
        if q is not None and (around := _region_around(text, q, _SLACK, front)) is not None:
            spans.append(around)
    spans.sort()
    pieces: list[list[int]] = []
    for s, e in spans:
        # contiguous text is read as it stands whenever that stays within the bound (or the gap is small)
        if pieces and (s <= pieces[-1][1] + 64 or e - pieces[-1][0] <= 2 * max_chars):
            pieces[-1][1] = max(pieces[-1][1], e)
        else:
            pieces.append([s, e])
    return _SEPARATOR.join(text[s:e] for s, e in pieces)


# An escaped dollar in prose ("Answer: \$18", "costs \$4.50"): math-verify reads no number behind a backslash, so the
# answer was lost. It is read as a space: a currency sign math-verify ignores. Only where it starts an amount after a
# space, "(", "=", ":" or the start, so no digits are joined ("\$1\$8" stays 1 and \$8, "5 \$234" stays 5 and 234)
# and a sign is not dropped ("-\$5" is left as it is); `\$` inside \boxed{} or $...$ math-verify already reads.
_PROSE_DOLLAR = re.compile(r"(?<![^\s(=:])\\\$(?=-?\.?\d)")


def _prose_dollars(text: str) -> str:
    return _PROSE_DOLLAR.sub(" ", text) if "\\$" in text else text


def read_answer(answer: str, max_chars: int) -> str:
    """What the math reward (math-verify and the in-process shortcut alike) reads of an answer part."""
    return _prose_dollars(answer_window(answer, max_chars))
