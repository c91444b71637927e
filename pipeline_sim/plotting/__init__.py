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
    character taken as 0.6 of the font size wide), so that a long title (a custom model's fields) is never cut off."""
    chars = max(20, int(share * fig.get_figwidth() * 72 / (0.6 * fontsize)))
    # a number stays on the line of its unit ("50 GB/s")
    kept = _NUMBER_AND_UNIT.sub(lambda match: match.group(0).replace(" ", "\0"), text)
    return "\n".join(textwrap.fill(line, chars, break_on_hyphens=False, break_long_words=False) or line
                     for line in kept.split("\n")).replace("\0", " ")
