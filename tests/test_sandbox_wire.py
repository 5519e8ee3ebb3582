"""The wire of a graded sandbox run (rewards/sandbox_wire.py, rewards/sandbox_remote.py) without a sandbox: values
travel by content and arrive as plain builtins whatever the sender's types were; anything a hostile program side
could send decodes to a value or a ProtocolError, never to running its code or a crash of the grader; handles
forward what they should and refuse what would hand the program an expected value."""

from __future__ import annotations

import datetime
import decimal
import fractions
import json
import math
import threading
from collections import namedtuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards import sandbox_remote as remote
from rewards import sandbox_wire as wire


def pair_of_connections(serving="program"):
    """A grader connection and a program connection over real pipes; the `serving` side serves in a thread, the
    other is driven by the test."""
    (grader_r, program_w), (program_r, grader_w) = wire.channel()
    grader = remote.connect(grader_r, grader_w, "grader")
    program = remote.connect(program_r, program_w, "program")
    threading.Thread(target=(program if serving == "program" else grader).serve_forever, daemon=True).start()
    return grader, program


def offline(side="grader"):
    """A connection whose codec is used without a peer."""
    r, w = wire.channel()[0]
    return remote.connect(r, w, side)


PLAIN = [None, True, 0, -7, 2**80, -(3**90), 1.5, -0.0, float("inf"), "text \udcff é", b"\x00\xff", bytearray(b"ab"),
         [1, [2, [3]]], (1, "a", (2,)), {"a": 1, 2: [3], (4, 5): None}, {1, 2}, frozenset({"x"}), range(2, 9, 3),
         complex(1, -2), decimal.Decimal("1.10"), fractions.Fraction(2, 6), datetime.date(2024, 2, 29),
         datetime.datetime(2024, 1, 1, 12, 30), datetime.time(9, 5), datetime.timedelta(days=2, seconds=3)]


@pytest.mark.parametrize("value", PLAIN, ids=lambda v: type(v).__name__)
def test_plain_values_round_trip_as_themselves(value):
    conn = offline()
    back = conn.decode(json.loads(json.dumps(conn.encode(value))))
    assert type(back) is type(value) and back == value


def test_nan_numpy_and_named_tuples_keep_what_they_are():
    conn = offline()

    def trip(v):
        return conn.decode(json.loads(json.dumps(conn.encode(v))))
    assert math.isnan(trip(float("nan")))
    arr = trip(np.arange(6, dtype=np.int16).reshape(2, 3))
    assert arr.dtype == np.int16 and arr.shape == (2, 3) and arr.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert type(trip(np.float32(2.5))) is np.float32
    point = trip(namedtuple("Point", "x y")(1, 2))
    assert point == (1, 2) and point.x == 1 and type(point).__name__ == "Point"


def test_subclasses_with_lying_operators_arrive_as_plain_builtins():
    class I(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    class S(str):
        def __eq__(self, other):
            return True

        __hash__ = str.__hash__

    class L(list):
        def __eq__(self, other):
            return True

    conn = offline("program")
    for value, plain in ((I(3), 3), (S("x"), "x"), (L([1]), [1])):
        back = offline().decode(json.loads(json.dumps(conn.encode(value))))
        assert type(back) is type(plain) and back == plain and back != "anything else"


HOSTILE = [
    {"t": "nope"}, {"t": "tuple", "v": 3}, {"t": "dict", "v": [[1]]}, {"t": "dict", "v": [[[1], 2]]},
    {"t": "int", "v": "zz"}, {"t": "float", "v": "1.5"}, {"t": "bytes", "v": "xyz"}, {"t": "decimal", "v": 5},
    {"t": "datetime", "v": "yesterday"}, {"t": "range", "v": [1, 2]}, {"t": "fraction", "v": [1, 0]},
    {"t": "ndarray", "dtype": "|O", "shape": [1], "v": "00" * 8},  # object arrays: pointers from the program
    {"t": "ndarray", "dtype": "<i8", "shape": [4], "v": "00" * 8},  # data shorter than the shape
    {"t": "ndarray", "dtype": "V8", "shape": [1], "v": "00" * 8},
    {"t": "ref"}, {"t": "back", "id": 12345}, {"t": "ref", "id": 1, "k": {"exc": {"builtin": "print"}}},
    {"t": "ref", "id": 2, "k": {"exc": 5}}, {"t": "complex", "v": ["a", 1]},
]


@pytest.mark.parametrize("data", HOSTILE, ids=[json.dumps(h)[:40] for h in HOSTILE])
def test_malformed_values_are_protocol_errors(data):
    with pytest.raises(wire.ProtocolError):
        offline().decode(data)


def _nest(depth):
    v = 0
    for _ in range(depth):
        v = [v]
    return v


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["t", "v", "id", "k", "dtype", "shape"]),
                                                               inner | st.sampled_from(
                                                                   ["tuple", "dict", "set", "int", "ref", "back",
                                                                    "ndarray", "decimal", "date", "exc", "module"]),
                                                               max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_decodes_to_a_value_or_a_protocol_error(data):
    conn = offline()
    try:
        conn.decode(data)
    except wire.ProtocolError:
        pass


def test_depth_and_size_limits():
    conn = offline()
    with pytest.raises(ValueError, match="nested too deeply"):
        conn.encode(_nest(10_000))
    with pytest.raises(wire.ProtocolError):
        conn.decode(_nest(10_000))


def test_handles_forward_calls_but_never_a_comparison_with_a_test_value():
    grader, program = pair_of_connections()
    seen = []

    class Hostile:
        def __eq__(self, other):
            seen.append(other)
            return True

        def __sub__(self, other):
            seen.append(other)
            return 0

        __hash__ = object.__hash__

        def twice(self, x):
            return 2 * x

    obj = grader.decode(program.encode(Hostile()))
    assert isinstance(obj, remote.Remote)
    assert obj.twice(21) == 42  # calls are forwarded, the answer is plain
    assert (obj == 7919) is False and obj != 7919  # the expected value never reaches the program's __eq__
    with pytest.raises(TypeError):
        obj - 7919
    assert 7919 not in seen and seen == []
    other = grader.decode(program.encode(Hostile()))
    assert obj == other and seen  # two objects of the program: its own comparison decides


def test_the_program_reaches_only_data_of_the_tests_objects():
    grader, program = pair_of_connections(serving="grader")
    grader.test_modules.add(__name__)
    secret = 104729

    class Node:  # a class of the tests: its data attributes and methods are the program's to use
        def __init__(self, val):
            self.val = val

        def double(self):
            return 2 * self.val

    def gen():
        yield secret

    node = program.decode(json.loads(json.dumps(grader.encode(Node(5)))))
    assert node.val == 5 and node.double() == 10
    node.val = 6
    with pytest.raises(AttributeError):
        node.__dict__  # noqa: B018 - dunders are not reachable
    g = program.decode(json.loads(json.dumps(grader.encode(gen()))))
    for name in ("gi_frame", "gi_code", "f_globals"):
        with pytest.raises(AttributeError, match="exposes no attribute"):
            getattr(g, name)
    assert next(g) == secret  # iteration is what a generator is for
    fn = program.decode(json.loads(json.dumps(grader.encode(lambda v: v + 1))))
    assert fn(1) == 2
    with pytest.raises(AttributeError, match="exposes no attribute"):
        fn.__globals__  # noqa: B018
