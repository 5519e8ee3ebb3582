"""Text helpers shared by the rewards: sanitising hostile model output and cutting a response into parts.

Everything here is linear in the input size (no regex that can backtrack catastrophically), because responses
are model output of any size and content.
"""

from __future__ import annotations

import unicodedata

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

# C0 controls other than tab/newline/carriage return, plus DEL: they carry no meaning for any reward and confuse
# tokenisers / fastText / sympy. Mapped to a space so word boundaries survive.
_CONTROL_TABLE = {c: " " for c in (*range(0, 9), 11, 12, *range(14, 32), 127)}


def sanitize(text: object) -> str:
    """Any object -> a valid str: lone surrogates replaced ("\\ud800" cannot be encoded as UTF-8), controls -> space."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    elif not isinstance(text, str):
        text = "" if text is None else str(text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", errors="replace").decode("utf-8")
    return text.translate(_CONTROL_TABLE)


def answer_part(response: str) -> str:
    """The part of a response after the reasoning.

    Rule: text after the LAST `</think>`; a response with `<think>` but no `</think>` is all reasoning (truncated or
    malformed) so its answer part is empty; a response with no think tags is all answer. This also covers chat
    templates that open `<think>` in the prompt: the response then holds only `</think>`.
    """
    close = response.rfind(THINK_CLOSE)
    if close >= 0:
        return response[close + len(THINK_CLOSE):]
    if THINK_OPEN in response:
        return ""
    return response


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) with balanced braces, None if there is none."""
    best = None
    for marker in ("\\boxed", "\\fbox"):
        start = text.rfind(marker)
        if start >= 0 and (best is None or start > best[0]):
            best = (start, marker)
    if best is None:
        return None
    i = best[0] + len(best[1])
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth, j = 0, i
    while j < len(text):
        ch = text[j]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1: j]
        j += 1
    return None  # unbalanced: no usable box


def fenced_blocks(text: str) -> list[tuple[int, int, str, str]]:
    """Closed ``` fenced blocks of a markdown text, in order, as (start, end, info string, body): text[start:end]
    is the whole block, fences included. The one rule for every reader of fences: a block opens at ``` and its
    info string runs to the end of that line; it closes at the next ```. A fence closed on its own opening line
    (```x```) is an inline block with no info string. An unclosed trailing fence is not a block."""
    blocks = []
    pos = 0
    while True:
        open_at = text.find("```", pos)
        if open_at < 0:
            break
        line_end = text.find("\n", open_at + 3)
        inline = text.find("```", open_at + 3, line_end if line_end >= 0 else len(text))
        if inline >= 0:
            blocks.append((open_at, inline + 3, "", text[open_at + 3: inline]))
            pos = inline + 3
            continue
        if line_end < 0:
            break
        close_at = text.find("```", line_end + 1)
        if close_at < 0:
            break
        blocks.append((open_at, close_at + 3, text[open_at + 3: line_end].strip(), text[line_end + 1: close_at]))
        pos = close_at + 3
    return blocks


_PYTHON_INFOS = {"", "python", "py", "python3", "py3"}


def last_python_block(text: str) -> str | None:
    """Body of the last fenced block tagged python (or untagged); other languages (```bash...) are skipped."""
    for _, _, info, body in reversed(fenced_blocks(text)):
        if info.split(" ", 1)[0].lower() in _PYTHON_INFOS:
            return body
    return None


def remove_fenced_blocks(text: str) -> str:
    """Text with every closed ``` fenced block replaced by a line break (the language reward: code is not prose)."""
    out, pos = [], 0
    for start, end, _, _ in fenced_blocks(text):
        out.append(text[pos:start])
        out.append("\n")
        pos = end
    out.append(text[pos:])
    return "".join(out)


def nfkc(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


# ---------------------------------------------------------------------------------------------- logging
LOG_LIMIT = 300  # characters of one sample-derived text in a log line, escapes included
_LOG_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _log_escape(ch: str) -> str:
    if ch in _LOG_ESCAPES:
        return _LOG_ESCAPES[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def log_safe(text: object, limit: int = LOG_LIMIT) -> str:
    """Text that came from a sample (a reward's reason quoting a program's stderr or the submission, a verifier's
    reason, a tool or episode error, a task id, an exception raised over model text) as ONE line of a log: every
    character that is not printable is escaped where it stands, so it shows and forms nothing: line breaks of any kind
    ("\\n", "\\r", "\\x0b", "\\x0c", "\\x1c".."\\x1e", "\\x85", "\\u2028", "\\u2029") could forge log lines (a fake
    "step 99 reward 1.000"), ESC starts terminal escapes ("\\x1b[2K" erases a line on a console), bidi and
    zero-width controls reorder or hide what a reader sees. The result is at most `limit` characters (escapes
    included; a cut one says how long the text was). An exception gives "Type: message" and where it was raised
    (the frames of its traceback, innermost last), on the same line. Linear in min(len(text), limit)."""
    if isinstance(text, BaseException):
        text = _describe_exception(text)
    elif isinstance(text, bytes):
        text = text.decode("utf-8", errors="backslashreplace")
    elif not isinstance(text, str):
        try:
            text = str(text)
        except Exception:  # noqa: BLE001 - an object whose str() raises still has a type
            text = f"<{type(text).__name__}>"
    limit = max(int(limit), 16)
    if len(text) <= limit and text.isprintable():
        return text
    out, size = [], 0
    for ch in text[:limit]:
        piece = ch if ch.isprintable() else _log_escape(ch)
        if size + len(piece) > limit:
            break
        out.append(piece)
        size += len(piece)
    else:
        if len(text) <= limit:
            return "".join(out)
    tail = f"... ({len(text)} characters)"
    while out and size + len(tail) > limit:
        size -= len(out.pop())
    return "".join(out) + tail


def _describe_exception(exc: BaseException) -> str:
    import traceback

    try:
        message = f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - an exception whose str() raises
        message = type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ is not None else []
    if frames:
        where = " < ".join(f"{'/'.join(f.filename.split('/')[-2:])}:{f.lineno} {f.name}" for f in reversed(frames))
        message += f" (at {where})"
    return message
