"""URL slugs."""

import re

from ._text import strip_accents


def slugify(text, sep="-", max_len=None):
    """'Hello, World!' -> 'hello-world'.

    Accents are dropped, letters are lower-cased, every run of other characters becomes one `sep`, and there is
    no `sep` at either end. With `max_len` the slug is cut to at most that many characters, at a separator when
    the cut would fall inside a word.
    """
    plain = strip_accents(text).lower()
    parts = re.split(r"[^a-z0-9]+", plain)
    slug = sep.join(p for p in parts if p)
    if max_len is not None and len(slug) > max_len:
        cut = slug[:max_len]
        if sep in cut and slug[max_len] != sep:
            cut = cut[: cut.rindex(sep)]
        slug = cut.strip(sep)
    return slug


def unique_slug(text, taken, sep="-"):
    """The slug of `text`, made unique against the set `taken` by appending -2, -3, ... ('item' when empty)."""
    base = slugify(text, sep) or "item"
    slug, n = base, 2
    while slug in taken:
        slug = f"{base}{sep}{n}"
        n += 1
    return slug
