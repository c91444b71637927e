"""Drawing of computed results. Only this package imports matplotlib."""

from __future__ import annotations

import re
import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure


_NUMBER_AND_UNIT = re.compile(r"\d (?:GB/s|GB|TFLOP/s|s|ms|us|tokens)\b")


def fitted(text: str, fig: Figure, fontsize: float, share: float = 1.0) -> str:
    """``text`` with each line broken between words where it would run past ``share`` of the figure's width (a
    character taken as 0.6 of the font size wide), so that a long title (a custom model's fields) is never cut off;
    a line broken in k is broken into k of about equal length, so that none ends on an orphaned word."""
    chars = max(20, int(share * fig.get_figwidth() * 72 / (0.6 * fontsize)))
    # a number stays on the line of its unit ("50 GB/s")
    kept = _NUMBER_AND_UNIT.sub(lambda match: match.group(0).replace(" ", "\0"), text)
    return "\n".join(_balanced(line, chars) for line in kept.split("\n")).replace("\0", " ")


def _balanced(line: str, chars: int) -> str:
    """``line`` in as few lines of at most ``chars`` characters as a greedy fill takes, each about as long."""
    def wrapped(width: int) -> list[str]:
        return textwrap.wrap(line, width, break_on_hyphens=False, break_long_words=False)

    count = len(wrapped(chars))
    if count <= 1:
        return line
    for width in range(-(-len(line) // count), chars):
        pieces = wrapped(width)
        if len(pieces) == count:
            return "\n".join(pieces)
    return "\n".join(wrapped(chars))
