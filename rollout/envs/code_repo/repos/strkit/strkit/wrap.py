"""Line wrapping, truncation and indentation."""

from ._text import collapse_spaces


def wrap(text, width):
    """The words of `text` on lines of at most `width` characters, as many on a line as fit (a word longer than
    `width` gets a line of its own). Whitespace in the input, newlines included, only separates words."""
    if width < 1:
        raise ValueError("width must be at least 1")
    lines, current = [], ""
    for word in collapse_spaces(text).split(" "):
        if not word:
            continue
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current += " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def truncate(text, limit, ellipsis="..."):
    """`text` cut to at most `limit` characters, the ellipsis included, at a word boundary when there is one."""
    if len(text) <= limit:
        return text
    room = limit - len(ellipsis)
    if room <= 0:
        return ellipsis[:limit]
    cut = text[:room]
    if " " in cut and text[room] != " ":
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip() + ellipsis


def indent(text, prefix="    ", skip_blank=True):
    """Every line of `text` with `prefix` in front (blank lines left alone unless skip_blank is False)."""
    lines = text.split("\n")
    return "\n".join(prefix + line if line.strip() or not skip_blank else line for line in lines)
