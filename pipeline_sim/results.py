"""Reading a sweep's CSV back, one environment at a time."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterator

import pandas as pd

from .config import INTEGER_KEYS
from .model import COMM_KINDS, EnvParams
from .sweep import COLUMNS

#: Columns every generator CSV has; later metric columns are optional for reading.
REQUIRED_COLUMNS = COLUMNS[:COLUMNS.index("completion_time") + 1]
TIER_COLUMNS = tuple(f"tier_{kind}" for kind in COMM_KINDS)
PRIO_COLUMNS = tuple(f"prio_{kind}" for kind in COMM_KINDS)


class ResultsError(ValueError):
    """A CSV that is not a sweep's output."""


def load_results(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise ResultsError(f"CSV {path}: no such file")
    try:
        frame = pd.read_csv(path, dtype={column: "string" for column in TIER_COLUMNS})
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise ResultsError(f"CSV {path}: not a readable CSV ({str(error).splitlines()[0]})") from None
    missing = [column for column in REQUIRED_COLUMNS if column not in frame.columns]
    if missing:
        listed = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise ResultsError(f"CSV {path} lacks the generator's columns {listed}; "
                           f"give a CSV written by data_generator.py")
    if frame.empty:
        raise ResultsError(f"CSV {path} has a header but no rows")
    if frame["completion_time"].isna().any() or not pd.api.types.is_numeric_dtype(frame["completion_time"]):
        raise ResultsError(f"CSV {path}: completion_time has missing or non-numeric values")
    return frame


def environments(frame: pd.DataFrame) -> Iterator[tuple[EnvParams, pd.DataFrame]]:
    """Each environment of the CSV with its rows, in the CSV's order."""
    names = list(EnvParams.names())
    for key, rows in frame.groupby(names, sort=False):
        values = {name: (int(v) if name in INTEGER_KEYS else float(v)) for name, v in zip(names, key)}
        yield EnvParams(**values), rows


def policy_family(rows: pd.DataFrame) -> pd.Series:
    """How many kinds of each row's policy have an exclusive tier (0 to 3)."""
    return rows[list(TIER_COLUMNS)].notna().sum(axis=1)


def best_rows(rows: pd.DataFrame, rel_tol: float = 1e-9) -> pd.DataFrame:
    """The rows with the lowest completion time (ties within ``rel_tol`` included), in CSV order."""
    best = rows["completion_time"].min()
    return rows[rows["completion_time"] <= best * (1 + rel_tol)]


def simplex_steps(rows: pd.DataFrame) -> int:
    """Steps per unit of the sweep that wrote these rows, from its shared-priority simplex."""
    count = int((policy_family(rows) == 0).sum())
    k = round((math.sqrt(8 * count + 1) - 3) / 2)
    if count == 0 or (k + 1) * (k + 2) // 2 != count:
        raise ResultsError(f"an environment has {count} shared-priority policies, which is no simplex grid; "
                           f"was the CSV cut or edited?")
    return k


def env_slug(params: EnvParams) -> str:
    """File-name form of an environment: ``n8_gpus4_sf1_fwd1_bwd2_prop1_sync2_fi0.2_bi0.2_in1``."""
    return (f"n{params.n}_gpus{params.num_gpus}_sf{params.sync_freq}_fwd{params.fwd_len:g}_bwd{params.bwd_len:g}"
            f"_prop{params.prop_len:g}_sync{params.sync_base_len:g}_fi{params.fwd_impact:g}_bi{params.bwd_impact:g}"
            f"_in{params.ingress_capacity:g}")


def env_title(params: EnvParams) -> str:
    return (f"n={params.n}, {params.num_gpus} GPUs, sync_freq={params.sync_freq}, fwd={params.fwd_len:g}, "
            f"bwd={params.bwd_len:g}, prop={params.prop_len:g}, sync={params.sync_base_len:g}, "
            f"impact fwd/bwd={params.fwd_impact:g}/{params.bwd_impact:g}, ingress={params.ingress_capacity:g}")
