"""Helpers shared by the strkit modules."""

import re
import unicodedata

_WORD = re.compile(r"[A-Za-z0-9']+")


def strip_accents(text):
    """'Café' -> 'Cafe': every letter without its combining marks."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def words(text):
    """The words of `text`, lower-cased; an apostrophe inside a word is kept ("don't")."""
    found = (w.strip("'") for w in _WORD.findall(strip_accents(text)))
    return [w.lower() for w in found if w]


def collapse_spaces(text):
    """Every run of whitespace (spaces, tabs, newlines) becomes one space; none is left at either end."""
    return " ".join(text.split())
