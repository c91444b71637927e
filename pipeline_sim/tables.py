"""A table of lengths as an environment: every task's work by its text (``0F3``, ``0FP3``, ``(0F7;7B3)``), as
``pipeline_trace.py replay --lengths-out`` writes a measured iteration's, with the flags of the environment it was
measured in (``--schedule 1f1b -n 8 --num-gpus 2 ...``).

An environment names its table by file (``EnvParams.lengths``); the engine reads it when it needs the lengths
(``taskgraph.task_lengths``), once per file and version, and refuses, in one line naming ``lengths`` and the file,
one that cannot be read or holds anything but finite lengths >= 0. What is computed from a table is kept per table
read (``table_of``), so a table changed on disk is read and used again. A sweep reads each of its tables once and
sends them with its work (``given``), so that no worker reads a file and a table replaced while a sweep runs does
not mix two versions in its rows.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable, Iterator, Mapping

from .inputs import TooLarge, read_at_most, where_relative
from .model import PARAMETERS
from .parameters import MAX_LENGTH, ParameterError

#: The largest table read: a million tasks' texts and lengths, several times over.
MAX_TABLE_BYTES = 64 * 2 ** 20
#: The longest unit a table may name (its lengths' unit, shown on a chart's time axis).
MAX_UNIT = 16
#: The parameter of each flag a table's environment may give.
_FLAG_PARAMETER = {flag: p for p in PARAMETERS for flag in p.flag_names}


@dataclass(frozen=True, eq=False)
class LengthTable:
    """A table's file, every task's length by its text, the parameters its flags set (``environment``, by name), the
    checksum of its bytes and the unit its lengths are in, when it names one (``ms`` from a trace; "" otherwise)."""

    path: str
    lengths: Mapping[str, float]
    environment: Mapping[str, Any]
    digest: str
    unit: str = ""


#: The tables a sweep sent with its work, by file as the environments name them (``given``).
_GIVEN: dict[str, LengthTable] = {}


def read_table(path: str) -> LengthTable:
    """The table in file ``path`` (the one ``given`` while a sweep's work runs), read again only when the file
    changed; ``ParameterError`` naming ``lengths`` and the file for one that cannot be read or is no table."""
    if path in _GIVEN:
        return _GIVEN[path]
    try:
        stat = os.stat(path)
    except OSError as error:
        raise ParameterError("lengths", path, f"cannot be read ({error.strerror or error}{where_relative(path)})") \
            from None
    return _read(path, os.path.realpath(path), stat.st_mtime_ns, stat.st_size)


@contextmanager
def given(tables: Iterable[LengthTable]) -> Iterator[None]:
    """While in effect, ``read_table`` of each table's file gives that table, as its sweep read it."""
    before = dict(_GIVEN)
    _GIVEN.update((table.path, table) for table in tables)
    try:
        yield
    finally:
        _GIVEN.clear()
        _GIVEN.update(before)


@lru_cache(maxsize=64)
def _read(path: str, real: str, modified: int, size: int) -> LengthTable:
    """``read_table`` of file ``real``'s version ``(modified, size)``, named ``path``."""
    def refuse(allowed: str) -> ParameterError:
        return ParameterError("lengths", path, allowed)

    try:
        data = read_at_most(path, MAX_TABLE_BYTES)
        raw = json.loads(data.decode(), object_pairs_hook=_unique_keys)
    except _GivenTwice as twice:
        raise refuse(f"{twice} is given twice; give each once (JSON would keep the last)") from None
    except TooLarge as error:
        raise refuse(f"{error}; a table is one length per task") from None
    except (OSError, UnicodeDecodeError) as error:
        raise refuse(f"cannot be read ({getattr(error, 'strerror', None) or error})") from None
    except (ValueError, RecursionError):
        raise refuse("truncated or not JSON") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("lengths"), dict) or not raw["lengths"]:
        raise refuse("not a JSON object whose 'lengths' maps task texts to numbers")
    lengths = {}
    for text, value in raw["lengths"].items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
                not 0.0 <= value <= MAX_LENGTH:
            raise refuse(f"task {text}: {json.dumps(value)} is no length; each must be a finite number from 0 to "
                         f"{MAX_LENGTH:g}")
        lengths[text] = float(value)
    flags, unit = raw.get("flags", ""), raw.get("unit", "")
    if not isinstance(flags, str):
        raise refuse("'flags' must be the environment's flags in one string (--schedule 1f1b -n 8 ...)")
    if not isinstance(unit, str) or len(unit) > MAX_UNIT or not unit.isprintable():
        raise refuse(f"'unit' must be the lengths' unit as a short string (\"ms\"), at most {MAX_UNIT} characters")
    return LengthTable(path, lengths, _environment(path, flags.split()), hashlib.sha256(data).hexdigest(), unit)


class _GivenTwice(ValueError):
    """A key a table's JSON object gives twice (its message the key)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _GivenTwice(f"task {key}" if isinstance(value, (int, float)) else f"key {key!r}")
        seen[key] = value
    return seen


def _environment(path: str, words: list[str]) -> dict[str, Any]:
    """The parameters a table's flags set: pairs of a visualizer's flag and its value."""
    environment: dict[str, Any] = {}
    for flag, value in zip(words[::2], words[1::2] + [""]):
        p = _FLAG_PARAMETER.get(flag)
        if p is None or not value or p.type is tuple or p.name == "lengths":
            raise ParameterError("lengths", path, f"flag {flag} {value}: the flags name the environment's parameters "
                                                  "by their visualizer flags, each with one value (--schedule 1f1b -n "
                                                  "8 --num-gpus 2 ...)")
        try:
            environment[p.name] = p.type(value)
            p.domain.check(p.name, environment[p.name])
        except (ValueError, ParameterError) as error:
            raise ParameterError("lengths", path, f"flag {flag} {value}: {error}") from None
    return environment
