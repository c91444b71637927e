"""Drawing of computed results. Only this package imports matplotlib."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def fitted(text: str, fig: Figure, fontsize: float, share: float = 1.0) -> str:
    """``text`` with each line broken between words where it would run past ``share`` of the figure's width (a
    character taken as 0.6 of the font size wide), so that a long title (a custom model's fields) is never cut off."""
    chars = max(20, int(share * fig.get_figwidth() * 72 / (0.6 * fontsize)))
    return "\n".join(textwrap.fill(line, chars, break_on_hyphens=False, break_long_words=False) or line
                     for line in text.split("\n"))
