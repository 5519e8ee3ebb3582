"""Hypothesis strategies shared by the property-based suites (tests/test_fuzz_agent.py, tests/test_fuzz_rewards.py):
text of any kind and JSON of any shape, as a model, a tool or a dataset may produce them. The suites run
derandomised with no example database (`FUZZ`), so CI sees the same examples on every run."""

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def decode_pass(b: bytes) -> str:
    try:
        return b.decode("utf-8", "surrogatepass")  # encoded surrogates come back as lone ones
    except UnicodeDecodeError:
        return b.decode("utf-8", "surrogateescape")


# Arbitrary code points (lone surrogates and control characters included), bytes decoded the ways files, pipes and
# JSON decoders decode them, a few hand-picked troublemakers, and long strings.
any_text = st.one_of(
    st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=200),
    st.binary(max_size=300).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.binary(max_size=300).map(decode_pass),
    st.binary(max_size=300).map(lambda b: b.decode("utf-8", "replace")),
    st.sampled_from(["", "\x00", "\ud800", "\udfff\ud800", "\ud83d\ude00", "\x1b[2J", "\u202e\u200b\ufeff", "𝔘𝔫𝔦",
                     "<think>", "</think>x", "Answer: 42", "```python\n", "\\boxed{", "```python\nprint(1)\n```"]),
    st.integers(1, 20_000).map(lambda n: "a\x00\ud800" * n),
    st.integers(1, 200_000).map(lambda n: "a" * n),
)
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
                      st.floats(allow_nan=True, allow_infinity=True), any_text)
json_shape = st.recursive(json_leaf, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                            st.dictionaries(any_text, kids, max_size=4)),
                          max_leaves=12)
