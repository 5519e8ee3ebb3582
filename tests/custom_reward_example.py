"""A user's own reward, referenced from a config by its dotted path (tests/test_reliability.py)."""

import time


def contains_keyword(view, params) -> float:
    """2.5 when the answer contains params["keyword"], else -0.5 (any finite score is allowed)."""
    return 2.5 if params["keyword"] in view.answer else -0.5


def hangs(view, params) -> float:
    time.sleep(60)
    return 1.0
