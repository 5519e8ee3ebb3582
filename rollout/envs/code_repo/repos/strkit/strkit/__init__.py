"""strkit: small text utilities."""

from .case import camel_case, snake_case, split_words, title_case
from .slug import slugify, unique_slug
from .stats import is_palindrome, reading_time, top_words, word_count
from .wrap import indent, truncate, wrap

__all__ = ["camel_case", "snake_case", "split_words", "title_case", "slugify", "unique_slug", "is_palindrome",
           "reading_time", "top_words", "word_count", "indent", "truncate", "wrap"]
