"""A sweep's rows as Parquet: typed columns, written in row groups while the sweep streams.

While a sweep runs, its rows go to numbered part files in the folder ``<output>.partial``;
each part is a whole Parquet file, written beside its final name and then renamed, so an
interrupted sweep, even one killed outright, keeps every part it finished and resumes
after its last row. When the sweep completes, the parts are copied into one file in row
groups of ``ROW_GROUP_ROWS`` rows whatever the parts' sizes, so that the same config gives
the same bytes however often it was interrupted and on however many workers it ran.
Needs pyarrow (the ``cluster`` extra).
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

#: Rows per row group of a finished file; readers stream a file one row group at a time.
ROW_GROUP_ROWS = 65_536
#: Rows a sweep gathers before it writes a part (fewer when it ends or stops).
PART_ROWS = 16_384
_PART = re.compile(r"part-(\d{6})\.parquet")
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


def _parts(folder: Path) -> list[Path]:
    return sorted(path for path in folder.iterdir() if _PART.fullmatch(path.name))


def part_rows(folder: Path) -> int:
    """Rows in the finished parts of ``folder``, read from their footers; a half-written part is removed."""
    import pyarrow.parquet as pq

    for leftover in folder.glob(".part-*"):
        leftover.unlink()
    return sum(pq.ParquetFile(path).metadata.num_rows for path in _parts(folder))


def cut_parts(folder: Path, keep: int) -> None:
    """Keep the first ``keep`` rows of ``folder``'s parts (rows past them were written beyond a samples file)."""
    import pyarrow.parquet as pq

    seen = 0
    for path in _parts(folder):
        rows = pq.ParquetFile(path).metadata.num_rows
        if seen >= keep:
            path.unlink()
        elif seen + rows > keep:
            _write_part(path, pq.read_table(path).slice(0, keep - seen))
        seen += rows


def _write_part(path: Path, table: pa.Table) -> None:
    import pyarrow.parquet as pq

    temporary = path.with_name("." + path.name)
    with open(temporary, "wb") as handle:
        pq.write_table(table, handle, row_group_size=ROW_GROUP_ROWS)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


class PartWriter:
    """Rows in CSV form gathered into parts of ``folder``; ``flush`` writes what is gathered."""

    def __init__(self, folder: Path, schema: pa.Schema) -> None:
        self.folder = folder
        self.schema = schema
        parts = _parts(folder)
        self.next = int(_PART.fullmatch(parts[-1].name).group(1)) + 1 if parts else 0  # type: ignore[union-attr]
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
        _write_part(self.folder / f"part-{self.next:06d}.parquet", table_from_csv("".join(self.texts), self.schema))
        self.next += 1
        self.texts, self.rows = [], 0


def merge_parts(folder: Path, output: Path, schema: pa.Schema) -> None:
    """Copy ``folder``'s parts, in order, into ``output`` in row groups of ``ROW_GROUP_ROWS`` rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pending: list[pa.RecordBatch] = []
    count = 0
    with pq.ParquetWriter(output, schema) as writer:
        for path in _parts(folder):
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


def read_frames(path: Path, rows: int, strings: Sequence[str]) -> Iterator[pd.DataFrame]:
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

