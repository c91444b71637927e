"""Reading a sweep's CSV back, one environment at a time."""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Iterable, Iterator, Sequence

import numpy as np

from .config import BOOLEAN_KEYS, INTEGER_KEYS, OBJECT_KEYS, STRING_KEYS
from .model import (
    COMM_KINDS,
    DEFAULT_POLICY,
    DISPATCH_KEYS,
    IGNORABLE,
    LIST_KEYS,
    PARAMETER,
    PARAMETERS,
    EnvParams,
    ParameterError,
)
from .parameters import OPTIONAL_GROUPS, Weights
from .parquet import ParquetUnavailable, read_frames, require_pyarrow
from .workload import (
    DERIVED_KEYS,
    UNKNOWABLE_KEYS,
    WORKLOAD_KEYS,
    Workload,
    gpu_from_cell,
    model_from_cell,
    seconds_text,
    workload_columns,
)

# pandas is imported where frames are read, not here: the visualizers read only this module's names, and importing
# pandas would take them a second
if TYPE_CHECKING:
    import pandas as pd

#: The simulators a row may name (one core under both: their numbers are equal).
SIMULATORS = ("single_channel", "dual_channel")
#: What a sweep's output can be.
FORMATS = ("csv", "parquet")
#: Columns every generator CSV has; later metric columns are optional for reading.
REQUIRED_COLUMNS = ("n", "num_gpus", "policy", *(f"prio_{kind}" for kind in COMM_KINDS),
                    *(f"tier_{kind}" for kind in COMM_KINDS), "completion_time")
#: The columns a heatmap may colour, with how its title names them.
METRICS = {"completion_time": "completion time", "completion_p95": "p95 completion time",
           "completion_p99": "p99 completion time", "completion_std": "std of completion time",
           "slowdown": "slowdown (completion / ideal)"}
TIER_COLUMNS = tuple(f"tier_{kind}" for kind in COMM_KINDS)
PRIO_COLUMNS = tuple(f"prio_{kind}" for kind in COMM_KINDS)


class ResultsError(ValueError):
    """A CSV that is not a sweep's output."""


#: Rows read at a time: a sweep's output is read in pieces, so memory stays flat however many rows it has.
#: Pieces of 100,000 rows read as fast but left the reading process about 100 MB larger (freed memory that
#: the allocator keeps).
READ_ROWS = 20_000


def read_results(path: str | Path, rows: int = READ_ROWS, source: BinaryIO | None = None) -> Iterator[pd.DataFrame]:
    """A sweep's output (CSV, or Parquet), ``rows`` rows at a time, checked: complete lines, the generator's
    columns, every environment column, cells of the right kind, finite positive times. ``ResultsError`` names
    the file, the line, the column and the cell. Each frame's index is its rows' line numbers (a Parquet file's
    rows are numbered as a CSV's lines would be, from 2). ``source``: the file, already open (read from its
    start), so that two readings read the same file even if ``path`` is replaced in between."""
    import pandas as pd
    path = Path(path)
    if source is None:
        with open_results(path) as handle:
            yield from read_results(path, rows, handle)
        return
    source.seek(0)
    head = source.read(4096)
    parquet = head[:4] == b"PAR1"
    source.seek(0)
    if not parquet and path.suffix.lower() == ".parquet":
        if b"completion_time" in head.split(b"\n", 1)[0]:  # a sweep's CSV header
            raise ResultsError(f"{path}: a CSV, not a Parquet file (its first line is a sweep's CSV header); name "
                               f"it .csv")
        raise ResultsError(f"{path}: not a Parquet file (it does not begin as one); was it copied while written?")
    if parquet:
        frames = _parquet_frames(path, rows, source)
    else:
        source.seek(0, 2)
        if source.tell() and (source.seek(-1, 2), source.read(1))[1] != b"\n":
            raise ResultsError(f"CSV {path}: its last line is cut (no line end); was it copied while written?")
        source.seek(0)
        frames = _csv_frames(path, rows, source)
    line = 2
    for number, frame in enumerate(frames):
        if number == 0:
            _check_columns(path, frame)
        frame.index = pd.RangeIndex(line, line + len(frame))
        _check_times(path, frame)
        _check_cells(path, frame)
        line += len(frame)
        yield frame


def open_results(path: str | Path) -> BinaryIO:
    """A sweep's output opened for ``read_results``, or ``ResultsError`` saying why it cannot be."""
    path = Path(path)
    if path.is_dir():
        raise ResultsError(f"{path}: is a folder; give the CSV or Parquet file a sweep wrote")
    if path.name.endswith(".partial"):
        raise ResultsError(f"CSV {path}: is an unfinished sweep's partial file; finish the sweep with --resume "
                           f"and draw its CSV")
    if path.exists() and not path.is_file():  # before opening it: a named pipe's open would wait for a writer
        raise ResultsError(f"{path}: not a regular file; give the CSV or Parquet file a sweep wrote")
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such file") from None
    except OSError as error:
        raise ResultsError(f"{path}: {error.strerror or error}") from None
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        handle.close()
        raise ResultsError(f"{path}: not a regular file; give the CSV or Parquet file a sweep wrote")
    return handle


def _check_columns(path: Path, frame: pd.DataFrame) -> None:
    """The generator's columns, and every environment column: a figure never claims an environment its file does
    not state."""
    missing = [column for column in REQUIRED_COLUMNS if column not in frame.columns]
    if missing:
        listed = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise ResultsError(f"CSV {path} lacks the generator's columns {listed}; "
                           f"give a CSV written by data_generator.py")
    # a grid that names no parameter of an optional group writes none of its columns
    named = {p.group for p in PARAMETERS if p.group in OPTIONAL_GROUPS and p.name in frame.columns}
    stated = [*(p.name for p in PARAMETERS if p.group not in OPTIONAL_GROUPS or p.group in named),
              *(workload_columns(frame.columns) if "model" in frame.columns else ())]
    missing = [column for column in stated if column not in frame.columns]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ResultsError(f"CSV {path} lacks the environment column {missing[0]}{more}; a figure does not guess "
                           f"what its file does not state")
    if frame.empty:
        raise ResultsError(f"CSV {path} has a header but no rows")


def _bad_cell(path: Path, frame: pd.DataFrame, column: str, bad: pd.Series, allowed: str) -> ResultsError:
    import pandas as pd
    line = int(frame.index[np.flatnonzero(bad.to_numpy())[0]])
    cell = frame.at[line, column]
    text = "an empty cell" if pd.isna(cell) else repr(cell.item() if isinstance(cell, np.generic) else cell)
    return ResultsError(f"{'Parquet' if path.suffix == '.parquet' else 'CSV'} {path}: line {line} has {column} = "
                        f"{text}; {allowed}")


#: Numeric columns a row's environment is read from; a schedule parameter may be empty (its schedule ignores it).
_NUMERIC = tuple(name for name in (*EnvParams.names(), *WORKLOAD_KEYS) if name not in STRING_KEYS + OBJECT_KEYS +
                 BOOLEAN_KEYS + LIST_KEYS + ("recompute_per_stage",))


def _check_cells(path: Path, frame: pd.DataFrame) -> None:
    """Every environment cell a number (an integer where the parameter is one), present unless a schedule may
    ignore it; every priority empty or a number; names present."""
    import pandas as pd
    for column in _NUMERIC + PRIO_COLUMNS:
        if column not in frame.columns:
            continue
        cells = frame[column]
        blank = cells.isna()
        values = pd.to_numeric(cells, errors="coerce")
        integer = column in INTEGER_KEYS
        kind = "an integer" if integer else "a number"
        if (bad := values.isna() & ~blank).any():
            raise _bad_cell(path, frame, column, bad, f"must be {kind}")
        if integer and (bad := ~blank & (values % 1 != 0)).any():
            raise _bad_cell(path, frame, column, bad, "must be an integer")
        if column not in IGNORABLE + PRIO_COLUMNS + UNKNOWABLE_KEYS and (bad := blank).any():
            raise _bad_cell(path, frame, column, bad, f"must be {kind} (only a parameter its environment ignores is "
                                                      f"empty)")
    for prio, tier in zip(PRIO_COLUMNS, TIER_COLUMNS):  # a kind has a share, or else an exclusive tier
        if tier in frame.columns and (bad := frame[prio].isna() & frame[tier].isna()).any():
            raise _bad_cell(path, frame, prio, bad, f"must be a number (only a kind with an exclusive tier, "
                                                    f"{tier}, has none)")
    for column in (*STRING_KEYS, *OBJECT_KEYS, "policy"):
        if column in frame.columns and column not in IGNORABLE and (bad := frame[column].isna()).any():
            raise _bad_cell(path, frame, column, bad, "must be a name")
    # Each distinct value against its parameter's domain here, so that the first bad line is named, not the
    # environment it cuts short.
    for name in (name for name in EnvParams.names() if name in frame.columns):
        for value in frame[name].dropna().unique():
            cell = value.item() if isinstance(value, np.generic) else value
            try:
                PARAMETER[name].domain.check(name, _value(name, cell))
            except ParameterError as error:
                allowed = str(error).split(": ", 1)[1]
                raise _bad_cell(path, frame, name, frame[name] == value, allowed) from None
    for column, parse in (("model", model_from_cell), ("gpu", gpu_from_cell)) if "model" in frame.columns else ():
        for value in frame[column].unique():
            try:
                parse(str(value))
            except (ValueError, TypeError, KeyError):
                raise _bad_cell(path, frame, column, frame[column] == value,
                                f"must be a preset's name or a custom {column}'s fields") from None


def _csv_frames(path: Path, rows: int, source: BinaryIO) -> Iterator[pd.DataFrame]:
    import pandas as pd
    try:
        with pd.read_csv(source, dtype={column: "string" for column in TIER_COLUMNS}, chunksize=rows) as reader:
            empty = True
            for frame in reader:
                empty = False
                yield frame
            if empty:  # a header alone
                source.seek(0)
                yield pd.read_csv(source, nrows=0)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise ResultsError(f"CSV {path}: not a readable CSV ({str(error).splitlines()[0]})") from None


def _parquet_frames(path: Path, rows: int, source: BinaryIO) -> Iterator[pd.DataFrame]:
    try:
        require_pyarrow()
    except ParquetUnavailable as error:
        raise ResultsError(f"{path} is Parquet, which {str(error)[len('Parquet output '):]}") from None
    try:
        yield from read_frames(source, rows, TIER_COLUMNS)
    except ValueError as error:
        raise ResultsError(f"{path}: {error}") from None


def _check_times(path: Path, frame: pd.DataFrame) -> None:
    """Every time a finite number > 0 (a spread >= 0), and a lower bound one that no run is below."""
    import pandas as pd
    for column in [name for name in ("completion_time", *METRICS, "ideal_time") if name in frame.columns]:
        values = pd.to_numeric(frame[column], errors="coerce")
        bad = ~(np.isfinite(values) & (values >= 0 if column == "completion_std" else values > 0))
        _refuse_times(path, frame, column, bad, "every time must be a finite number > 0")
    if "lower_bound" in frame.columns:
        bound = pd.to_numeric(frame["lower_bound"], errors="coerce")
        bad = ~(np.isfinite(bound) & (bound > 0) & (bound <= pd.to_numeric(frame["completion_time"])))
        _refuse_times(path, frame, "lower_bound", bad, "a lower bound must be a finite number > 0, at most its "
                                                       "row's completion_time")


def _refuse_times(path: Path, frame: pd.DataFrame, column: str, bad: pd.Series, allowed: str) -> None:
    """``ResultsError`` naming the first row of ``bad``, if any."""
    import pandas as pd
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        cell = frame[column].iloc[row]
        text = repr(cell) if isinstance(cell, str) else "an empty cell" if pd.isna(cell) else f"{float(cell):g}"
        raise ResultsError(f"CSV {path}: line {frame.index[row]} has {column} = {text}; {allowed}")


def load_results(path: str | Path) -> pd.DataFrame:
    """A whole sweep's output in one frame (``read_results`` reads it in pieces)."""
    import pandas as pd
    return pd.concat(list(read_results(path)), ignore_index=True)


def _value(name: str, cell: Any) -> Any:
    if name in STRING_KEYS:
        return str(cell)
    if name in LIST_KEYS:
        return Weights.parse(str(cell), name)
    return int(cell) if name in INTEGER_KEYS else float(cell)


def environments(frames: pd.DataFrame | Iterable[pd.DataFrame], where: str = "") -> Iterator[
        tuple[EnvParams, pd.DataFrame]]:
    """Each environment with its rows, in order, from a frame or from pieces of one (``read_results``); an empty
    cell is a parameter its schedule ignores.

    A sweep writes an environment's rows together; rows of one environment found apart
    are refused (``ResultsError``). In a workload sweep's output an environment is also
    told apart by its workload columns. An environment whose cells are no valid environment
    (a schedule's parameter missing, a value out of its domain) is refused, naming its first
    line (the frame's index) and ``where`` (the file) the rows come from.
    """
    import pandas as pd
    held: pd.DataFrame | None = None  # the last environment of a piece, which may go on in the next
    seen: set[tuple] = set()
    for frame in [frames] if isinstance(frames, pd.DataFrame) else frames:
        if held is not None:
            frame = pd.concat([held, frame])
        names = [name for name in (*EnvParams.names(), *WORKLOAD_KEYS) if name in frame.columns]
        keys = frame[names]
        changed = (keys.ne(keys.shift()) & ~(keys.isna() & keys.shift().isna())).any(axis=1).to_numpy()
        starts = [*np.flatnonzero(changed), len(frame)]
        for start, stop in zip(starts[:-2], starts[1:-1]):
            yield _environment(frame.iloc[start:stop], names, seen, where)
        held = frame.iloc[starts[-2]:]
    if held is not None and len(held):
        yield _environment(held, names, seen, where)


def _environment(rows: pd.DataFrame, names: list[str], seen: set[tuple], where: str
                 ) -> tuple[EnvParams, pd.DataFrame]:
    import pandas as pd
    key = tuple(None if pd.isna(cell) else cell for cell in rows[names].iloc[0])
    values = {name: _value(name, cell) for name, cell in zip(names, key)
              if cell is not None and name in EnvParams.names()}
    at = f"{where + ': ' if where else ''}line {rows.index[0]}"
    try:
        params = EnvParams(**values)
    except ParameterError as error:
        raise ResultsError(f"{at} has {error}") from None
    for name in IGNORABLE:
        if name not in values and name in params.relevant():
            reader = f"dispatch {params.dispatch}" if name in DISPATCH_KEYS else f"schedule {params.schedule}"
            raise ResultsError(f"{at} has {name} = an empty cell; {reader} reads it")
    workload = workload_of(rows, at)
    if key in seen:
        raise ResultsError(f"the rows of environment {env_slug(params, workload)} are not together; a "
                           f"sweep writes each environment's rows in one run (was the CSV sorted or edited?)")
    seen.add(key)
    return params, rows


def workload_of(rows: pd.DataFrame, at: str = "the first row") -> Workload | None:
    """The workload of an environment's rows, rebuilt from its columns; None outside a workload sweep.
    ``ResultsError`` names ``at`` (where the rows are), the column and the cell that make no workload."""
    import pandas as pd
    if "model" not in rows.columns:
        return None
    row = rows.iloc[0]
    cells = {key: row[key] for key in workload_columns(rows.columns)}
    try:
        model = model_from_cell(str(cells["model"]))
    except (ValueError, TypeError, KeyError):
        raise ResultsError(f"{at} has model = {str(cells['model'])!r}; must be a model preset's name or a custom "
                           f"model's fields (layers=... hidden=...)") from None
    try:
        gpu = gpu_from_cell(str(cells["gpu"]))
    except (ValueError, TypeError, KeyError):
        raise ResultsError(f"{at} has gpu = {str(cells['gpu'])!r}; must be a GPU preset's name or a custom GPU's "
                           f"fields (tflops=... memory_gb=...)") from None
    numbers = {key: (int(value) if key in INTEGER_KEYS else float(value)) for key, value in cells.items()
               if key not in ("model", "gpu", "recompute", "layers_per_stage", "recompute_per_stage", *BOOLEAN_KEYS)
               and not pd.isna(value)}
    cell = cells.get("recompute_per_stage")
    try:
        shares = None if cell is None or pd.isna(cell) else Weights.parse(str(cell), "recompute_per_stage")
    except ValueError as error:
        raise ResultsError(f"{at} has {error}") from None
    layers = str(cells.get("layers_per_stage", "balanced"))
    try:
        return Workload(model=model, gpu=gpu, recompute=str(cells["recompute"]), recompute_per_stage=shares,
                        layers_per_stage=layers if layers in ("balanced", "auto") else
                        tuple(int(x) for x in layers.split()),
                        **{key: str(cells[key]) == "True" for key in BOOLEAN_KEYS if key in cells},
                        **numbers)  # type: ignore[arg-type]
    except ValueError as error:  # a ParameterError, or a layer count that is no number
        raise ResultsError(f"{at} has {error}") from None


def identity(params: EnvParams, workload: Workload | None, leave_out: tuple[str, ...] = ()) -> tuple:
    """What tells an environment apart, without ``leave_out``; a workload stands for the parameters it derives."""
    derived = DERIVED_KEYS if workload is not None else ()
    values = tuple(value for name, value in params.as_dict().items() if name not in leave_out + derived)
    cells = tuple(value for key, value in workload.cells().items() if key not in leave_out) if workload else ()
    return values + cells


def parameter_value(params: EnvParams, workload: Workload | None, name: str) -> object:
    """A parameter of the environment or of its workload (a model or GPU by its name)."""
    if name in EnvParams.names():
        return getattr(params, name)
    return workload.cells()[name] if workload is not None else None


def policy_family(rows: pd.DataFrame) -> pd.Series:
    """How many kinds of each row's policy have an exclusive tier (0 to 3)."""
    return rows[list(TIER_COLUMNS)].notna().sum(axis=1)


def best_rows(rows: pd.DataFrame, rel_tol: float = 1e-9, metric: str = "completion_time") -> pd.DataFrame:
    """The rows with the lowest ``metric`` (ties within ``rel_tol`` included), in CSV order."""
    best = rows[metric].min()
    return rows[rows[metric] <= best * (1 + rel_tol) + (1e-12 if best == 0 else 0.0)]


def best_label(rows: pd.DataFrame, metric: str = "completion_time") -> str:
    """The best policy of one environment's rows by ``metric``, as a reader should take it: its label and how many
    others tie with it (``best_rows``), or that every policy does, when the priorities change nothing."""
    winners = best_rows(rows, metric=metric)
    if len(winners) == len(rows) > 1:
        return f"any policy (all {len(rows)} tie)"
    return str(winners["policy"].iloc[0]) + (f" (and {len(winners) - 1} tied)" if len(winners) > 1 else "")


def simplex_steps(rows: pd.DataFrame) -> int:
    """Steps per unit of the sweep that wrote these rows, from its shared-priority simplex."""
    count = int((policy_family(rows) == 0).sum())
    k = round((math.sqrt(8 * count + 1) - 3) / 2)
    if count == 0 or (k + 1) * (k + 2) // 2 != count:
        raise ResultsError(f"an environment has {count} shared-priority policies, which is no simplex grid; "
                           f"was the CSV cut or edited?")
    return k


#: The parameters that say which schedule runs and who dispatches it; environments differing only in them are
#: compared side by side.
SCHEDULE_KEYS = tuple(p.name for p in PARAMETERS if p.group in ("schedule", "dispatch"))
#: The parameters of the environment proper, that neither a schedule nor the noise sets (the stages' weights
#: among them: titles and names show them only when given).
ENVIRONMENT_KEYS = tuple(p.name for p in PARAMETERS if p.group in ("environment", "stages", "optimizer"))
#: Those a workload leaves as they are: it names its batch (n) and layout (num_gpus) itself and derives the
#: lengths, but its sync_freq may be given.
_BESIDE_WORKLOAD = tuple(name for name in ENVIRONMENT_KEYS if name not in DERIVED_KEYS + ("num_gpus",)
                         or name == "sync_freq")
_BESIDE_SYNC = tuple(name for name in _BESIDE_WORKLOAD if name != "sync_freq")  # a workload's title says sync
#: Sharded data parallelism, context parallelism and the all-to-all (docs/model.md sections 15 and 16): named in file
#: names where given (an environment's strategies tell its heatmaps apart), those a workload does not derive.
_STRATEGY_KEYS = tuple(p.name for p in PARAMETERS if p.group == "strategies")
_STRATEGIES_BESIDE_WORKLOAD = tuple(name for name in _STRATEGY_KEYS if name not in DERIVED_KEYS)
_NOISE_GROUPS = ("jitter", "straggler")
#: A table of lengths (``EnvParams.lengths``): named first, where given.
TABLE_KEYS = tuple(p.name for p in PARAMETERS if p.group == "lengths")


def titles(params: EnvParams, names: Sequence[str]) -> list[str]:
    """``fwd impact=0.2`` for each of ``names`` that matters to ``params`` (``EnvParams.relevant``)."""
    relevant = params.relevant()
    return [PARAMETER[name].title(getattr(params, name)) for name in names if name in relevant]


def _slugs(params: EnvParams, names: Sequence[str]) -> str:
    relevant = params.relevant()
    return "".join(f"_{PARAMETER[name].slug(getattr(params, name))}" for name in names if name in relevant)


def _group(*groups: str) -> tuple[str, ...]:
    return tuple(p.name for p in PARAMETERS if p.group in groups)


def schedule_name(params: EnvParams) -> str:
    """The schedule with the parameters it reads: ``zb-h1 wf=0.5``, ``interleaved-1f1b v=2``, ``1f1b``."""
    return " ".join(titles(params, SCHEDULE_KEYS))


def memory_name(params: EnvParams, memory_limit: float) -> str:
    """The memory limit a dispatcher kept to where ``schedule_name`` does not say it: the default's, ``memory
    limit=4 (the static peak)``, or one given between two whole steps of 1/v, ``1 in force (whole steps of 1)``;
    empty for the schedule's own order."""
    if params.dispatch == "static":
        return ""
    if params.memory_limit == 0.0:
        return f"{PARAMETER['memory_limit'].title(memory_limit)} (the static peak)"
    if memory_limit != params.memory_limit:
        return f"{memory_limit:g} in force (whole steps of 1/{params.v})" if params.v > 1 else \
            f"{memory_limit:g} in force (whole micro-batches)"
    return ""


def noise_name(params: EnvParams, *, sep: str = " ") -> str:
    """The noise of an environment, empty when there is none:
    ``compute jitter=0.1, comm jitter=0, lognormal, seed=0``; ``straggler GPU=2, straggler factor=1.5``."""
    return sep.join(filter(None, (", ".join(titles(params, _group(group))) for group in _NOISE_GROUPS)))


def _slug_parts(params: EnvParams, workload: Workload | None = None) -> tuple[str, str, str]:
    """The environment, its schedule and its noise, as file-name pieces."""
    if workload is not None:
        w = workload
        base = (f"{safe_name(w.shape.name)}_{safe_name(w.device.name)}_p{params.num_gpus}_t{w.tensor_parallel}"
                f"_d{w.data_parallel}_mbs{w.micro_batch_size}_gbs{params.n * w.micro_batch_size * w.data_parallel}"
                f"_s{w.seq_len}{'_sp' if w.sequence_parallel else ''}_{w.recompute}_eff{w.compute_efficiency:g}"
                f"_p2p{w.p2p_bandwidth:g}_dp{w.dp_bandwidth:g}{_slugs(params, _BESIDE_WORKLOAD)}"
                f"{_slugs(params, _STRATEGIES_BESIDE_WORKLOAD)}")
        if (w.dtype_bytes, w.bytes_per_param) != (2, 16.0):
            base += f"_bytes{w.dtype_bytes}_{w.bytes_per_param:g}"
        if w.grad_bytes is not None:
            base += f"_grad{w.grad_bytes}"
        base += "".join(f"_{text}" for text in layout_words(w, short=True))
    else:
        base = _slugs(params, TABLE_KEYS + ENVIRONMENT_KEYS + _STRATEGY_KEYS)[1:]
    return base, _slugs(params, SCHEDULE_KEYS), "".join(_slugs(params, _group(group)) for group in _NOISE_GROUPS)


def safe_name(name: str) -> str:
    """A model or GPU name in a file name (a custom one's fields without spaces and signs)."""
    return name.replace(" ", "-").replace("=", "")


def env_slug(params: EnvParams, workload: Workload | None = None) -> str:
    """File-name form of an environment: ``n8_gpus4_sf1_fwd1_bwd2_prop1_sync2_fi0.2_bi0.2_in1_1f1b``.

    Noise, when there is any, adds ``_cj0.1_mj0_lognormal_seed0`` and ``_slow2_x1.5``; a
    workload names its model, GPU, layout and network instead of the derived lengths.
    """
    return "".join(_slug_parts(params, workload))


def _sync_text(params: EnvParams) -> str:
    if params.sync_base_len == 0.0:
        return "no gradient sync"
    return f"sync {seconds_text(params.sync_base_len)} every {params.sync_freq} backwards"


def layout_words(w: Workload, *, short: bool) -> list[str]:
    """What departs from a workload's default stages: given layer counts, no embedding or head on their stage, shares
    recomputed per stage, the optimizer step, element-wise work, flash attention, no dropout, a tensor-parallel
    bandwidth that is not the GPU's; file-name words when ``short``, else title words."""
    words = []
    if isinstance(w.layers_per_stage, tuple):
        counts = PARAMETER["stage_weights"].text(w.layers_per_stage)
        words.append(f"lps{counts.replace(',', '-')}" if short else f"layers {counts}")
    elif w.layers_per_stage == "auto":  # beside a balanced split of the same sweep, a figure of its own
        words.append("lpsauto" if short else "layers auto")
    if not w.embedding_on_first:
        words.append("noemb" if short else "embedding spread")
    if not w.head_on_last:
        words.append("nohead" if short else "head spread")
    if w.recompute_per_stage is not None:
        shares = PARAMETER["stage_weights"].text(w.recompute_per_stage)
        words.append(f"rps{shares.replace(',', '-')}" if short else f"recomputed per stage {shares}")
    if w.optimizer_step:
        words.append("opt" if short else "optimizer step")
    if w.elementwise:
        words.append("ew" if short else "element-wise work")
    if w.flash_attention:
        words.append("flash" if short else "flash attention")
    if not w.dropout:
        words.append("nodrop" if short else "no dropout")
    if short:  # a title's label names them
        words += [f"c{w.context_parallel}"] if w.context_parallel > 1 else []
        words += [f"e{w.expert_parallel}"] if w.expert_parallel > 1 else []
    elif w.grad_bytes is not None:  # a file name has it beside the bytes a parameter
        words.append(f"gradients of {w.grad_bytes} bytes, {w.bytes_per_param:g} a parameter")
    if w.imbalance != 1.0:
        words.append(f"imb{w.imbalance:g}" if short else f"expert imbalance {w.imbalance:g}")
    if w.route_nodes is not None and w.expert_parallel > 1:  # without expert parallelism no token is routed away
        nodes = f"{w.route_nodes} node{'s' if w.route_nodes > 1 else ''}"
        words.append(f"rn{w.route_nodes}" if short else f"routed to {nodes}")
    if w.ep_bandwidth != w.dp_bandwidth and w.expert_parallel > 1:
        words.append(f"ep{w.ep_bandwidth:g}" if short else f"ep {w.ep_bandwidth:g} GB/s")
    nvlink = w.device.nvlink_bandwidth
    if w.tensor_parallel > 1 and (nvlink is None or w.tp_bandwidth != nvlink / 2):
        words.append(f"tp{w.tp_bandwidth:g}" if short else f"tp {w.tp_bandwidth:g} GB/s")
    return words


def workload_title(params: EnvParams, workload: Workload) -> str:
    """``gpt3-175b on 64 x a100-80gb (tensor 8, pipeline 8, data 1), batch 64 x 2048 tokens; ...``."""
    w = workload
    return (f"{w.label(params.num_gpus, params.n, params.zero)}"
            f", micro-batch {w.micro_batch_size}, {'no' if w.recompute == 'none' else w.recompute} recompute; "
            f"p2p {w.p2p_bandwidth:g} GB/s, "
            f"dp {w.dp_bandwidth:g} GB/s, efficiency {w.compute_efficiency:g}"
            f"{''.join(', ' + text for text in layout_words(w, short=False))}\n"
            f"fwd {seconds_text(params.fwd_len)}, bwd {seconds_text(params.bwd_len)}, "
            f"prop {seconds_text(params.prop_len)}, "
            f"{', '.join([_sync_text(params)] + _a2a_text(params) + titles(params, _BESIDE_SYNC))}")


def _a2a_text(params: EnvParams) -> list[str]:
    """The all-to-all of a forward, its class and overlap, where there is one (docs/model.md section 16)."""
    if params.a2a_len == 0.0:
        return []
    return [f"all-to-all {seconds_text(params.a2a_len)}", *titles(params, ("a2a_class", "ep_overlap"))]


def env_title(params: EnvParams, workload: Workload | None = None, *, schedule: bool = True,
              noise: bool = True) -> str:
    if workload is not None:
        text = workload_title(params, workload)
    else:
        text = ", ".join(titles(params, TABLE_KEYS + ENVIRONMENT_KEYS + _STRATEGY_KEYS))
    if noise and noise_name(params):
        text += f"; {noise_name(params, sep='; ')}"
    return f"{schedule_name(params)}: {text}" if schedule else text


#: The policy that the visualizers use unless told otherwise; the comparison marks it.
DEFAULT_POLICY_LABEL = DEFAULT_POLICY.label


def schedule_summary(params: EnvParams, rows: pd.DataFrame) -> dict[str, Any]:
    """One environment's line of a schedule comparison: ``schedule`` (name with its parameters),
    ``best_policy`` (``best_label``), ``best_time``, ``default_time`` (NaN when the sweep's step has no such policy),
    ``worst_policy``, ``worst_time``, ``ideal_time``, ``peak_activations``, ``max_span``, the best
    policy's spread over samples ``best_min``, ``best_p50``, ``best_p95``, ``best_max`` (NaN in a
    CSV without them), ``samples`` and ``lower_bound`` (NaN in a CSV without it); in a workload sweep
    also the best policy's ``peak_memory_gb``, ``gpu_memory_gb``, ``memory_fits``, ``tokens_per_second`` and ``mfu``;
    in a dispatch sweep its ``memory_bound``."""
    best, worst = best_rows(rows).iloc[0], rows.loc[rows["completion_time"].idxmax()]
    default = rows.loc[rows["policy"] == DEFAULT_POLICY_LABEL, "completion_time"]
    return {
        "schedule": schedule_name(params), "best_policy": best_label(rows),
        "best_time": float(best["completion_time"]),
        "default_time": float(default.iloc[0]) if len(default) else math.nan,
        "worst_policy": worst["policy"], "worst_time": float(worst["completion_time"]),
        "ideal_time": float(best.get("ideal_time", math.nan)),
        "peak_activations": float(best.get("peak_activations", math.nan)),
        "max_span": float(best.get("max_span", math.nan)),
        **{f"best_{stat}": float(best.get(f"completion_{stat}", math.nan)) for stat in ("min", "p50", "p95", "max")},
        "samples": int(best.get("samples", 1)),
        "lower_bound": float(best.get("lower_bound", math.nan)),
        **{name: best[name] for name in (*REPORT_SUMMARY, "memory_bound") if name in best}}


def schedule_groups(summaries: Iterable[tuple[EnvParams, Workload | None, dict[str, Any]]]
                    ) -> Iterator[tuple[EnvParams, Workload | None, pd.DataFrame]]:
    """Groups of environments that differ only by their schedule (and the parameters a schedule reads), from
    each environment's ``schedule_summary``.

    Yields one environment of the group (for its title), its workload (None outside a
    workload sweep) and the summaries of its schedules, in order. Only groups of two or
    more schedules are yielded.
    """
    import pandas as pd
    groups: dict[tuple, list[tuple[EnvParams, Workload | None, dict[str, Any]]]] = {}
    for params, workload, summary in summaries:
        groups.setdefault(identity(params, workload, SCHEDULE_KEYS), []).append((params, workload, summary))
    for members in groups.values():
        if len(members) >= 2:
            yield members[0][0], members[0][1], pd.DataFrame([summary for _, _, summary in members])


#: The workload report's columns that a schedule comparison carries for its best policy.
REPORT_SUMMARY = ("peak_memory_gb", "gpu_memory_gb", "memory_fits", "tokens_per_second", "mfu")


def group_slug(params: EnvParams, workload: Workload | None = None) -> str:
    """File-name form of a group of environments that differ only by schedule."""
    base, _, noise = _slug_parts(params, workload)
    return base + noise


#: Noise parameters whose levels a robustness figure puts on its x axis.
JITTER_KEYS = tuple(p.name for p in PARAMETERS if p.group == "jitter" and p.type is float)


def jitter_keys(params: EnvParams, workload: Workload | None) -> list[tuple[str, tuple]]:
    """The robustness families an environment belongs to: one per jitter key (all else equal), and ``jitter`` when
    its jitters are equal (a grid that ties them varies them together)."""
    families = [(key, identity(params, workload, (key,))) for key in JITTER_KEYS]
    if len({getattr(params, key) for key in JITTER_KEYS}) == 1:
        families.append(("jitter", identity(params, workload, JITTER_KEYS)))
    return families


def jitter_level(params: EnvParams, key: str) -> float:
    """An environment's level in a robustness family of ``key`` (``jitter``: every jitter, all equal)."""
    return getattr(params, JITTER_KEYS[0] if key == "jitter" else key)


def curve_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """What a robustness figure reads of an environment's rows: policy, mean and p95 (the mean without samples)."""
    if "completion_p95" not in rows.columns:
        rows = rows.assign(completion_p95=rows["completion_time"])
    return rows[["policy", "completion_time", "completion_p95"]]


def jitter_families(environments: Iterable[tuple[EnvParams, Workload | None, pd.DataFrame]], top: int = 3
                    ) -> Iterator[tuple[EnvParams, Workload | None, str, pd.DataFrame]]:
    """Groups of environments that differ only by one jitter level, for the robustness view.

    Yields one environment of the family (for its title), its workload, the jitter key that varies (``jitter``
    for jitters that vary together, equal in every environment),
    and one row per (policy followed, level): ``policy``, ``level``, ``mean``, ``p95``,
    ``why`` (``"best at 0%, 10%"`` for the best at each level it wins, ``"#2 at 0%"`` for
    the runners-up among the ``top`` best at the lowest level). Policies whose curves are
    identical share one row, named ``A = B``. Only families of two or more levels are yielded.
    Of each environment's rows only the policy, mean and p95 columns are kept.
    """
    import pandas as pd
    families: dict[tuple, list[tuple[EnvParams, pd.DataFrame]]] = {}
    workloads: dict[tuple, Workload | None] = {}
    for params, workload, rows in environments:
        rows = curve_rows(rows)
        for family in jitter_keys(params, workload):
            families.setdefault(family, []).append((params, rows))
            workloads[family] = workload
    for (key, family), members in families.items():
        levels = sorted({jitter_level(params, key) for params, _ in members})
        if len(levels) < 2 or len(levels) != len(members):
            continue
        members.sort(key=lambda member: jitter_level(member[0], key))
        best_at: dict[str, list[str]] = {}
        for params, rows in members:
            best_at.setdefault(best_rows(rows).iloc[0]["policy"], []).append(f"{jitter_level(params, key):.0%}")
        top_at_lowest = list(members[0][1].nsmallest(top, "completion_time")["policy"])
        followed: dict[str, str] = {}
        for policy in dict.fromkeys(top_at_lowest + list(best_at)):
            reasons = [f"best at {', '.join(best_at[policy])}"] if policy in best_at else []
            if policy in top_at_lowest[1:]:
                reasons.append(f"#{top_at_lowest.index(policy) + 1} at {levels[0]:.0%}")
            followed[policy] = "; ".join(reasons)
        curves: dict[tuple, tuple[list[str], list[str], list[dict]]] = {}
        for policy, why in followed.items():
            points = []
            for params, rows in members:
                row = rows[rows["policy"] == policy].iloc[0]
                points.append({"level": jitter_level(params, key), "mean": float(row["completion_time"]),
                               "p95": float(row["completion_p95"])})
            # Policies that behave alike draw one curve, else the later one hides the earlier.
            same = tuple((f"{point['mean']:.9g}", f"{point['p95']:.9g}") for point in points)
            names, reasons, _ = curves.setdefault(same, ([], [], points))
            names.append(policy)
            reasons.extend([why] if why else [])
        records = [{"policy": " = ".join(names), "why": "; ".join(reasons), **point}
                   for names, reasons, points in curves.values() for point in points]
        yield members[0][0], workloads[(key, family)], key, pd.DataFrame(records)


def dispatch_families(summaries: Iterable[tuple[EnvParams, Workload | None, dict[str, Any]]]
                      ) -> Iterator[tuple[EnvParams, Workload | None, str, pd.DataFrame]]:
    """Groups of environments that differ by schedule or dispatcher and by their jitter, from each environment's
    ``schedule_summary``: every way of running against the noise, for one figure.

    Yields one environment of the group (its title), its workload, the jitter that varies (a
    ``JITTER_KEYS`` name, or ``jitter`` when all of them vary together, equal in every
    environment) and one row per (way, level): ``way`` (``schedule_name``), its ``schedule``
    and ``dispatch``, ``static``, ``level``, ``mean``, ``p95``, ``bound`` and ``memory_bound`` (NaN in a CSV
    without it) of the best policy, and each relative to the reference at that level (``mean_vs``, ``p95_vs``,
    ``bound_vs``, ``memory_bound_vs``: the reference's own statistic, its mean for the bounds). The reference,
    ``reference``, is the static order of least mean at the lowest level. Only groups of two or more ways, two or
    more levels each, a static order and a dispatcher among them are yielded.
    """
    import pandas as pd
    groups: dict[tuple, list[tuple[EnvParams, Workload | None, dict[str, Any]]]] = {}
    for params, workload, summary in summaries:
        groups.setdefault(identity(params, workload, SCHEDULE_KEYS + JITTER_KEYS), []).append(
            (params, workload, summary))
    for members in groups.values():
        varying = [key for key in JITTER_KEYS if len({getattr(params, key) for params, _, _ in members}) > 1]
        together = len(varying) > 1 and all(len({getattr(params, key) for key in varying}) == 1
                                            for params, _, _ in members)
        if not varying or len(varying) > 1 and not together:
            continue
        key = "jitter" if together else varying[0]
        records = [{"way": summary["schedule"], "schedule": params.schedule, "dispatch": params.dispatch,
                    "static": params.dispatch == "static",
                    "level": getattr(params, varying[0]), "mean": summary["best_time"],
                    "p95": summary["best_p95"] if not math.isnan(summary["best_p95"]) else summary["best_time"],
                    "bound": summary["lower_bound"], "memory_bound": float(summary.get("memory_bound", math.nan))}
                   for params, _, summary in members]
        frame = pd.DataFrame(records)
        if frame["way"].nunique() < 2 or frame["level"].nunique() < 2 or frame["static"].all() or \
                not frame["static"].any() or \
                frame.groupby("way")["level"].nunique().min() < 2 or frame.duplicated(["way", "level"]).any():
            continue
        lowest = frame["level"].min()
        static_lowest = frame[frame["static"] & (frame["level"] == lowest)]
        reference = static_lowest.loc[static_lowest["mean"].idxmin(), "way"]
        base = frame[frame["way"] == reference].set_index("level")
        frame = frame[frame["level"].isin(base.index)]
        frame = frame.assign(mean_vs=frame["mean"] / frame["level"].map(base["mean"]) - 1.0,
                             p95_vs=frame["p95"] / frame["level"].map(base["p95"]) - 1.0,
                             bound_vs=frame["bound"] / frame["level"].map(base["mean"]) - 1.0,
                             memory_bound_vs=frame["memory_bound"] / frame["level"].map(base["mean"]) - 1.0,
                             reference=reference)
        yield members[0][0], members[0][1], key, frame.sort_values(["way", "level"], kind="stable")
