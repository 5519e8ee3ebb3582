"""A user's own reward, referenced from a config by its dotted path (tests/test_reliability.py)."""

import time


def contains_keyword(view, params) -> float:
    """2.5 when the answer contains params["keyword"], else -0.5 (any finite score is allowed)."""
    return 2.5 if params["keyword"] in view.answer else -0.5


def hangs(view, params) -> float:
    time.sleep(60)
    return 1.0


def returns(view, params):
    """Whatever `params["kind"]` names: the odd return values a user's reward may give (tests/test_reward_outputs.py)."""
    import decimal
    import fractions

    import numpy as np

    kind = params["kind"]
    return {
        "huge_int": lambda: 10 ** 400,  # too large for a float: float() raises OverflowError
        "unprintable_int": lambda: 10 ** 5000,  # past Python's 4300-digit repr limit as well
        "neg_huge_int": lambda: -(10 ** 400),
        "decimal_inf": lambda: decimal.Decimal("1e400"),
        "complex": lambda: 0.5 + 1j,
        "string": lambda: "0.5",
        "array2": lambda: np.array([0.5, 0.5]),
        "numpy_f32": lambda: np.float32(0.25),
        "numpy_bool": lambda: np.bool_(True),
        "fraction": lambda: fractions.Fraction(1, 4),
        "decimal": lambda: decimal.Decimal("0.25"),
        "none": lambda: None,
    }[kind]()


def prints(view, params):
    """Prints `params["kb"]` KB (through print, sys.stderr and the raw file descriptor) and scores 1."""
    import os
    import sys

    chunk = "x" * 1023 + "\n"
    for i in range(int(params["kb"])):
        [print, lambda s: sys.stderr.write(s + "\n"), lambda s: os.write(1, (s + "\n").encode())][i % 3](chunk[:-1])
    return 1.0
