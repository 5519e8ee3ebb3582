"""Identifier and title case conversion."""

import re

from ._text import collapse_spaces

# Separators, a lower-case letter or digit followed by a capital, and the end of an acronym ("HTTPServer").
_BOUNDARY = re.compile(r"[\s_\-]+|(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")

MINOR_WORDS = {"a", "an", "and", "as", "at", "but", "by", "for", "in", "of", "on", "or", "the", "to"}


def split_words(name):
    """'parseHTTPResponse' -> ['parse', 'HTTP', 'Response']; 'user_id' -> ['user', 'id']."""
    return [part for part in _BOUNDARY.split(name) if part]


def snake_case(name):
    """'HTTPServerError' -> 'http_server_error'."""
    return "_".join(part.lower() for part in split_words(name))


def camel_case(name, upper_first=False):
    """'user id' -> 'userId'; with upper_first, 'UserId'."""
    parts = [part.lower() for part in split_words(name)]
    if not parts:
        return ""
    head = parts[0].capitalize() if upper_first else parts[0]
    return head + "".join(part.capitalize() for part in parts[1:])


def title_case(text):
    """Each word capitalised, except minor words ('of', 'the', ...) that are neither the first nor the last."""
    words = collapse_spaces(text).split(" ")
    out = []
    for i, word in enumerate(words):
        lower = word.lower()
        if 0 < i < len(words) - 1 and lower in MINOR_WORDS:
            out.append(lower)
        else:
            out.append(lower[:1].upper() + lower[1:])
    return " ".join(out)
