"""Reading an input file within a size limit: a file that is endless (``/dev/zero``) or far larger than any input
of its kind is refused after ``limit`` bytes, never read whole."""

from __future__ import annotations

import os


class TooLarge(ValueError):
    """An input larger than its kind allows; the message says the limit."""


def read_at_most(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of ``path``; ``TooLarge`` when it holds more than ``limit``, read no further than that. ``OSError``
    as ``open`` raises it."""
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"larger than {limit // 2 ** 20} MB")
    return data
