import strkit
from strkit import indent, truncate, wrap


def test_wrap_greedy():
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]
    assert wrap("a verylongword b", 5) == ["a", "verylongword", "b"]
    try:
        wrap("text", 0)
    except ValueError:
        pass
    else:
        raise AssertionError("wrap(text, 0) should raise ValueError")


def test_wrap_exact_fit():
    assert wrap("aaaa bbbbb", 10) == ["aaaa bbbbb"]


def test_wrap_newlines():
    assert wrap("one\ntwo three", 20) == ["one two three"]
    assert wrap("one\n\ttwo", 3) == ["one", "two"]


def test_truncate():
    assert truncate("short", 10) == "short"
    assert truncate("The quick brown fox", 12) == "The quick..."
    assert truncate("Hello wonderful world", 14) == "Hello..."
    assert truncate("abc", 2, ellipsis="...") == ".."


def test_truncate_without_spaces():
    result = truncate("abcdefghijklmnop", 10)
    assert len(result) <= 10, result
    assert result == "abcdefg..."


def test_indent():
    assert indent("a\n\nb") == "    a\n\n    b"
    assert indent("a\n\nb", "> ", skip_blank=False) == "> a\n> \n> b"
    assert strkit.indent("x", "") == "x"
