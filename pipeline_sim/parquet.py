"""A sweep's rows as Parquet: typed columns, written in row groups while the sweep streams.

While a sweep runs, its rows go to part files in the folder ``<output>.partial``; each
part is a whole Parquet file, written beside its final name and then renamed to a name
that records its first row, its row count and its checksum, so an interrupted sweep, even
one killed outright, keeps every part it finished, and a resume continues after the parts
that hold the first rows without a gap and match their records. When the sweep completes,
the parts are copied into one file in row groups of ``ROW_GROUP_ROWS`` rows whatever the
parts' sizes, so that the same config gives the same bytes however often it was
interrupted and on however many workers it ran.
Needs pyarrow (the ``cluster`` extra).
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Iterator, Sequence

from .files import file_digest

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

#: Rows per row group of a finished file; readers stream a file one row group at a time.
ROW_GROUP_ROWS = 65_536
#: Rows a sweep gathers before it writes a part (fewer when it ends or stops).
PART_ROWS = 16_384
_PART = re.compile(r"part-(\d{12})-(\d{6,})-([0-9a-f]{32})\.parquet")
EXTRA = 'pip install "pipeline-sim[cluster]" (or pip install pyarrow)'


class ParquetUnavailable(ValueError):
    """pyarrow is not installed; the message says how to get it."""


def require_pyarrow() -> None:
    """Refuse in one line, before any work, when pyarrow is missing."""
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ParquetUnavailable(f"Parquet output needs pyarrow; {EXTRA}") from None


def schema(columns: Sequence[str], types: dict[str, type]) -> pa.Schema:
    """Each column typed from ``types`` (``int``, ``float``, ``bool``, ``str``); numbers where not named."""
    import pyarrow as pa

    arrow = {int: pa.int64(), float: pa.float64(), bool: pa.bool_(), str: pa.string()}
    return pa.schema([(name, arrow[types.get(name, float)]) for name in columns])


def table_from_csv(text: str, schema: pa.Schema) -> pa.Table:
    """CSV rows without their header as a table of ``schema``: an empty cell is null, floats exact."""
    from pyarrow import csv

    return csv.read_csv(io.BytesIO(text.encode("utf-8")),
                        read_options=csv.ReadOptions(column_names=schema.names),
                        convert_options=csv.ConvertOptions(column_types=schema, null_values=[""],
                                                           strings_can_be_null=True, true_values=["True"],
                                                           false_values=["False"]))


def _part_name(first: int, rows: int, checksum: str) -> str:
    return f"part-{first:012d}-{rows:06d}-{checksum}.parquet"


@dataclass(frozen=True)
class Parts:
    """What a resume may keep of a partial folder: ``paths``, the verified parts holding rows 0 to ``rows - 1``
    in order, and ``problem``, why the parts after them (``dropped``) cannot be used (empty when none)."""

    paths: tuple[Path, ...]
    rows: int
    problem: str = ""
    dropped: tuple[Path, ...] = ()


def verified_parts(folder: Path) -> Parts:
    """The longest run of parts of ``folder`` that holds rows 0, 1, 2, ... without a gap, each part matching the
    record in its name (first row, row count, checksum). Anything else in the folder (a half-written part, an
    interrupted merge) is removed."""
    records, dropped = [], []
    for path in folder.iterdir():
        if match := _PART.fullmatch(path.name):
            records.append((int(match.group(1)), int(match.group(2)), match.group(3), path))
        elif path.name.startswith("."):  # ours, written beside its name: cut short by a kill
            path.unlink()
        else:
            dropped.append(path)
    records.sort()
    kept: list[Path] = []
    rows, problem = 0, ""
    for first, count, checksum, path in records:
        if problem:
            dropped.append(path)
        elif first != rows:
            problem = (f"rows {rows:,} to {first - 1:,} have no part" if first > rows else
                       f"{path.name} overlaps the part before it")
            dropped.append(path)
        elif count == 0 or file_digest(path) != checksum:
            problem = f"{path.name} is damaged (its checksum or row count does not match its name)"
            dropped.append(path)
        else:
            kept.append(path)
            rows += count
    if not problem and dropped:
        problem = f"{sorted(dropped)[0].name} is not a part this version writes"
    return Parts(tuple(kept), rows, problem, tuple(dropped))


def _write_part(folder: Path, first: int, table: pa.Table) -> Path:
    """Write ``table`` as the part starting at row ``first``: beside its name, then renamed to a name recording
    its first row, row count and checksum, so that the part and its record appear together or not at all."""
    import pyarrow.parquet as pq

    temporary = folder / ".part-writing.parquet"
    with open(temporary, "wb") as handle:
        pq.write_table(table, handle, row_group_size=ROW_GROUP_ROWS)
        handle.flush()
        os.fsync(handle.fileno())
    path = folder / _part_name(first, table.num_rows, file_digest(temporary))
    os.replace(temporary, path)
    return path


class PartWriter:
    """Rows in CSV form, from row ``first`` on, gathered into parts of ``folder``; ``flush`` writes what is
    gathered."""

    def __init__(self, folder: Path, schema: pa.Schema, first: int) -> None:
        self.folder = folder
        self.schema = schema
        self.first = first
        self.texts: list[str] = []
        self.rows = 0

    def write(self, text: str, rows: int) -> None:
        self.texts.append(text)
        self.rows += rows
        if self.rows >= PART_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        _write_part(self.folder, self.first, table_from_csv("".join(self.texts), self.schema))
        self.first += self.rows
        self.texts, self.rows = [], 0


def merge_parts(parts: Sequence[Path], output: Path, schema: pa.Schema) -> None:
    """Copy ``parts``, in order, into ``output`` in row groups of ``ROW_GROUP_ROWS`` rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pending: list[pa.RecordBatch] = []
    count = 0
    with pq.ParquetWriter(output, schema) as writer:
        for path in parts:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=ROW_GROUP_ROWS):
                pending.append(batch)
                count += batch.num_rows
                while count >= ROW_GROUP_ROWS:
                    table = pa.Table.from_batches(pending, schema)
                    writer.write_table(table.slice(0, ROW_GROUP_ROWS), row_group_size=ROW_GROUP_ROWS)
                    pending = table.slice(ROW_GROUP_ROWS).to_batches()
                    count -= ROW_GROUP_ROWS
        if count:
            writer.write_table(pa.Table.from_batches(pending, schema), row_group_size=ROW_GROUP_ROWS)
    with open(output, "rb+") as handle:
        os.fsync(handle.fileno())


def is_parquet(path: Path) -> bool:
    """Whether ``path`` starts as a Parquet file does."""
    with open(path, "rb") as handle:
        return handle.read(4) == b"PAR1"


def read_frames(path: Path | BinaryIO, rows: int, strings: Sequence[str]) -> Iterator[pd.DataFrame]:
    """A Parquet file, about ``rows`` rows at a time, as the frames a CSV of the same rows reads to
    (``strings``: columns read as pandas strings)."""
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises its own kinds for a damaged file
        raise ValueError(f"not a readable Parquet file ({str(error).splitlines()[0]})") from None
    for batch in handle.iter_batches(batch_size=rows):
        frame = batch.to_pandas()
        for column in strings:
            if column in frame.columns:
                frame[column] = frame[column].astype("string")
        yield frame

