"""Word statistics."""

from collections import Counter

from ._text import strip_accents, words


def word_count(text):
    """How many words `text` has (numbers count as words)."""
    return len(words(text))


def top_words(text, n=3):
    """The `n` most frequent words as (word, count) pairs, most frequent first; ties in alphabetical order."""
    counts = Counter(words(text))
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ranked[:n]


def is_palindrome(text):
    """True when the letters and digits of `text` read the same backwards (case, accents and punctuation are
    ignored); False when it has none."""
    chars = [ch.lower() for ch in strip_accents(text) if ch.isalnum()]
    return bool(chars) and chars == chars[::-1]


def reading_time(text, wpm=200):
    """Whole minutes to read `text` at `wpm` words a minute, rounded up (0 for no words)."""
    n = word_count(text)
    if n == 0:
        return 0
    return -(-n // wpm)
