"""Running every policy in every environment of a grid, streamed in order to one CSV.

One row per (environment, policy): with ``samples`` > 1 noisy draws, its completion
time is the mean over samples beside their standard deviation, minimum, p50, p95,
p99 and maximum, and every other metric is a mean. A parameter that the row's
schedule ignores is an empty cell. Rows go to ``<output>.partial`` as they finish,
in grid order then policy order; the file becomes ``<output>`` only when complete. A
partial file and its fingerprint (``<output>.partial.json``) let an interrupted sweep
resume and still end byte-identical to an uninterrupted run, whatever the number of
workers. An optional samples file gets one row per (environment, policy, sample),
written and resumed in step with the main one.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import shutil
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterator

import numpy as np

from .cluster import DaskCluster
from .config import BOOLEAN_KEYS, INTEGER_KEYS, OBJECT_KEYS, STRING_KEYS, ConfigError, EnvironmentGrid
from .cost import MAX_HOURS, simulation_seconds
from .engine import bound_of_run, lower_bound, memory_bound
from .files import OutputError, check_locks, exclusive_writer, file_digest, hold, lock_path, output_target
from .hindsight import proven_share
from .learned import LearnedPolicy, figures_of
from .metrics import ScheduleMetrics, ideal_time, metric_columns
from .model import COMM_KINDS, HINDSIGHT, LIST_KEYS, LOOKAHEAD, PARAMETER, EnvParams, ParameterError, Policy
from .parallel import ordered_map, shared_count, tick
from .parameters import OPTIONAL_GROUPS, Weights
from .parquet import Parts, PartWriter, merge_parts, require_pyarrow, schema, verified_parts
from .results import FORMATS, SIMULATORS
from .scenarios import DEFAULT_STEP, check_step, policy_grid, steps_per_unit
from .tables import LengthTable, given
from .taskgraph import MAX_TASKS, estimated_tasks
from .workload import AUTO_COLUMNS, REPORT_COLUMNS, Workload, auto_candidates, workload_columns, workload_report

if TYPE_CHECKING:
    import pyarrow as pa

POLICY_COLUMNS = ("policy", *(f"prio_{kind}" for kind in COMM_KINDS), *(f"tier_{kind}" for kind in COMM_KINDS))
#: Completion-time statistics over samples; percentiles by linear interpolation (numpy's default, Hyndman-Fan 7).
STATISTICS = ("completion_std", "completion_min", "completion_p50", "completion_p95", "completion_p99",
              "completion_max")
#: What a run reports of section 12: columns of a grid that names a dispatch parameter (``model.DISPATCH_KEYS``).
BOUND_COLUMNS = ("lower_bound", "bound_gap", "memory_bound", "memory_gap", "hindsight_optimal")
_METRIC_COLUMNS = ("completion_time", *STATISTICS, *ScheduleMetrics.SCALARS[1:])


def _stated(name: str, optional: frozenset[str]) -> bool:
    """Whether a row states parameter ``name``: always, unless its group is optional and not in ``optional``."""
    group = PARAMETER[name].group
    return group not in OPTIONAL_GROUPS or group in optional


def sweep_columns(workload: bool, optional: frozenset[str] = frozenset(),
                  auto: bool = False) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The columns of the CSV and of the samples file. A grid that names a parameter of an optional group
    (``optional``: the groups it names) has that group's parameters among the environment's, and with dispatch
    the bound after the metrics (``BOUND_COLUMNS``); a workload sweep adds its keys after the environment's and its
    report (``workload.REPORT_COLUMNS``) at the end, then, when a ``layers_per_stage`` is ``auto``, the split it chose
    and its gain (``workload.AUTO_COLUMNS``)."""
    dispatch = "dispatch" in optional
    env = tuple(name for name in EnvParams.names() if _stated(name, optional))
    keys = workload_columns(optional) if workload else ()
    return ((*env, *keys, "simulator", "samples", *POLICY_COLUMNS, *_METRIC_COLUMNS,
             *(BOUND_COLUMNS if dispatch else ()), *(REPORT_COLUMNS if workload else ()),
             *(AUTO_COLUMNS if auto else ())),
            (*env, *keys, "simulator", "policy", "sample", "completion_time"))
#: Simulations a chunk of work aims at when samples multiply its rows.
CHUNK_SIMULATIONS = 2048
#: The most estimated work (``cost``, on one core) a unit of work of an environment aims at, so that a slow
#: dispatcher's sweep reports progress and keeps its work when stopped: a look-ahead environment of 16 GPUs and 64
#: micro-batches at 20 samples took hours a unit. (Compiled rules' units hold a few minutes at most of a slow day.)
CHUNK_SECONDS = 600.0


class ResumeError(ValueError):
    """A partial file that cannot be continued by this sweep."""


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep runs: every environment of ``grid`` under every policy at ``step``.

    A grid with combinations that break a schedule's requirement is refused, unless
    ``skip_invalid`` leaves them out.
    """

    grid: EnvironmentGrid
    step: float = DEFAULT_STEP
    simulator: str = "single_channel"
    skip_invalid: bool = False
    samples: int = 0  # noise draws per (environment, policy); 0: the grid's own setting
    with_samples: bool = False  # also write one row per sample
    allow_large: bool = False  # run beyond the size limits (tasks per simulation, step, estimated hours)
    format: str = "csv"  # of the output: csv, or parquet (typed columns in row groups; needs pyarrow)
    workers: int = 0  # the processes asked for, which its refusal of a sweep too long counts; 0: every core
    remote: bool = False  # run by a remote cluster, whose workers are counted once it is reached (``check_hours``)

    def __post_init__(self) -> None:
        if self.samples == 0:
            object.__setattr__(self, "samples", self.grid.samples)
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise ParameterError("samples", self.samples, "must be an integer >= 1")
        steps_per_unit(self.step)
        if not self.allow_large:
            check_step(self.step)
        if self.simulator not in SIMULATORS:
            raise ParameterError("simulator", self.simulator, f"must be one of {', '.join(SIMULATORS)}")
        if self.format not in FORMATS:
            raise ParameterError("format", self.format, f"must be one of {', '.join(FORMATS)}")
        invalid = self.grid.invalid()
        if invalid and not self.skip_invalid:
            where, reason = invalid[0]
            more = f" (and {len(invalid) - 1} more)" if len(invalid) > 1 else ""
            raise ConfigError(f"{len(invalid)} combination{'s' if len(invalid) > 1 else ''} of the grid cannot run: "
                              f"{where}: {reason}{more}; fix the config or pass --skip-invalid to leave them out")
        if not len(self.grid):
            where, reason = invalid[0] if invalid else ("", "")
            raise ConfigError("no combination of the grid can run" + (f", e.g. {where}: {reason}" if invalid else "")
                              + "; fix the config")
        if not self.allow_large:
            _, largest, where = self.grid.task_estimate()
            if largest > MAX_TASKS:
                raise ConfigError(f"{where} has about {largest:,} tasks per simulation; at most {MAX_TASKS:,} fit in "
                                  f"memory (pass --allow-large to try anyway)")
            if not self.remote:
                cores = os.cpu_count() or 1
                self.check_hours(min(self.workers or cores, cores))

    def check_hours(self, workers: int, whose: str = "") -> None:
        """Refuse, before any work, a sweep that cannot finish in a day on ``workers`` processes (this machine's, or
        a remote cluster's once reached), of which no more count than the sweep has units of work (a hindsight
        environment is one); ``whose`` follows their count in the refusal."""
        if self.allow_large:
            return
        total, _, _ = self.grid.task_estimate()
        tasks = total * len(self.policies) * self.samples
        seconds, solves = self.grid.seconds_estimate(len(self.policies), self.samples)
        running = useful_workers(self, workers)
        hours = seconds / running / 3600
        if hours > MAX_HOURS:
            why = "; ".join(text for priced, text in ((LOOKAHEAD in self.dispatchers, "each look-ahead decision "
                                                                                      "runs the rest of the iteration "
                                                                                      "once per candidate"),
                                                      (solves > 0, "the hindsight solver takes seconds a draw"))
                            if priced)
            raise ConfigError(f"{self.num_simulations:,} simulations of about {tasks:,} tasks would take about "
                              f"{hours:,.0f} hours on {running} worker{'s' if running > 1 else ''}{whose}"
                              f"{f' ({why})' if why else ''}; at most "
                              f"{MAX_HOURS} hours are allowed (shrink the grid, or pass --allow-large)")

    @property
    def policies(self) -> tuple[Policy, ...]:
        return policy_grid(self.step)

    @property
    def dispatchers(self) -> frozenset[str]:
        """The ``dispatch`` values of the grid."""
        return frozenset(dict(self.grid.values)["dispatch"])

    @property
    def header(self) -> str:
        return ",".join(sweep_columns(self.grid.has_workload, self.grid.optional_groups, self.grid.has_auto)[0]) + "\n"

    @property
    def sample_header(self) -> str:
        return ",".join(sweep_columns(self.grid.has_workload, self.grid.optional_groups, self.grid.has_auto)[1]) + "\n"

    def column_types(self) -> dict[str, type]:
        """The type of each column that is not a float: what a Parquet output stores them as."""
        types: dict[str, type] = {**{key: int for key in INTEGER_KEYS}, **{key: str for key in STRING_KEYS},
                                  **{key: bool for key in BOOLEAN_KEYS}, **{key: str for key in OBJECT_KEYS},
                                  **{key: str for key in LIST_KEYS}, "recompute_per_stage": str}
        types.update(simulator=str, samples=int, policy=str, memory_fits=bool, auto_layers=str,
                     **{column: str for column in POLICY_COLUMNS if column.startswith("tier_")},
                     throttled_transfers=int if self.samples == 1 else float)  # a mean over samples
        return types

    @property
    def num_environments(self) -> int:
        return len(self.grid)

    @property
    def num_rows(self) -> int:
        return self.num_environments * len(self.policies)

    @property
    def num_simulations(self) -> int:
        return self.num_rows * self.samples

    @cached_property
    def _seconds_before(self) -> np.ndarray:
        """Per environment, the estimated seconds (``cost``) of all rows before it, and last those of all."""
        return np.concatenate(([0.0], np.cumsum(self.grid.environment_seconds(len(self.policies), self.samples))))

    @property
    def estimated_seconds(self) -> float:
        """The sweep's work in estimated seconds on one core: what its progress is measured in, where environments
        cost thousands of times one another (a hindsight draw's solve against a plain simulation)."""
        return float(self._seconds_before[-1])

    def seconds_done(self, rows: int) -> float:
        """The estimated seconds of the first ``rows`` rows: an environment's rows share its estimate evenly."""
        environment, within = divmod(rows, len(self.policies))
        before = self._seconds_before
        if environment >= len(before) - 1:
            return float(before[-1])
        return float(before[environment] + (before[environment + 1] - before[environment]) * within /
                     len(self.policies))

    def fingerprint(self) -> str:
        """Identifies the rows this plan writes; a partial file resumes only under the same one."""
        record = {"grid": self.grid.as_dict(), "step": self.step, "simulator": self.simulator,
                  "skip_invalid": self.skip_invalid, "samples": self.samples, "with_samples": self.with_samples,
                  "columns": self.header}
        if self.networks():  # the rows of a learned dispatcher are its network's: a changed file is another sweep
            record["networks"] = self.networks()
        if self.grid.tables():  # and those of a table of lengths its table's
            record["tables"] = self.grid.tables()
        if self.grid.collapses_anew:  # its environments are not those a partial file of before was written from
            record["collapse"] = 2
        if self.grid.has_workload:  # a workload's rows are those of the model's revision (WORKLOAD_REVISION)
            record["workload_model"] = WORKLOAD_REVISION
        if self.format != "csv":  # a CSV's record is as it always was, so that older partial files resume
            record["format"] = self.format
        text = json.dumps(record, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def settings(self) -> dict[str, object]:
        """What the command line set for this plan, by option, and a checksum of its grid (``grid``): kept in a
        partial's record, so that a sweep that cannot continue it names what differs."""
        grid = hashlib.sha256(json.dumps(self.grid.as_dict(), sort_keys=True).encode()).hexdigest()
        return {"--step": self.step, "--simulator": self.simulator, "--skip-invalid": self.skip_invalid,
                "--samples": self.samples, "--samples-output": self.with_samples, "--format": self.format,
                "grid": grid}

    def networks(self) -> dict[str, str]:
        """By ``dispatch`` value, the checksum of the network each policy file of the grid holds (as first read)."""
        return {name: network.digest for name, network in self.grid.networks().items()}

    def chunks(self, start_row: int, rows_per_chunk: int) -> Iterator[Chunk]:
        """Units of work from row ``start_row`` on, in row order, none spanning two environments; a learned
        dispatcher's carry its network, and a table's environment its table, so that no worker reads a file. A
        hindsight environment's rows are one unit: the order it solves for each draw serves every policy, and is
        solved once where one process runs them all (two workers given its pieces solved every draw twice). Other
        units hold ``rows_per_chunk`` rows, fewer where that many would take more than ``CHUNK_SECONDS``
        (``cost``: a look-ahead's simulations take seconds)."""
        per_env = len(self.policies)
        first_env, offset = divmod(start_row, per_env)
        networks, tables = self.grid.networks(), self.grid.length_tables
        before = self._seconds_before
        for environment, (params, workload) in enumerate(self.grid.cases(first_env), start=first_env):
            row_seconds = simulation_seconds(params, estimated_tasks(params)) * (self.samples if params.jittered
                                                                                 else 1)
            size = per_env if params.dispatch == HINDSIGHT else \
                max(1, min(rows_per_chunk, int(CHUNK_SECONDS // row_seconds)))
            for first in range(offset, per_env, size):
                yield Chunk(params, self.simulator, self.step, first, min(first + size, per_env),
                            self.samples, self.with_samples, workload, self.grid.optional_groups,
                            self.grid.has_auto, networks.get(params.dispatch),
                            (tables[params.lengths],) if params.lengths else (),
                            (before[environment + 1] - before[environment]) / per_env)
            offset = 0


@dataclass(frozen=True)
class Chunk:
    """Policies ``first`` to ``stop - 1`` of the policy grid, in one environment, each over ``samples`` draws."""

    params: EnvParams
    simulator: str
    step: float
    first: int
    stop: int
    samples: int = 1
    with_samples: bool = False
    workload: Workload | None = None
    optional: frozenset[str] = frozenset()  # the optional groups whose columns the rows carry (dispatch: the bound)
    auto: bool = False  # whether the rows carry AUTO_COLUMNS (the grid has a layers_per_stage of auto)
    network: LearnedPolicy | None = field(default=None, compare=False)  # a learned dispatcher's, read by the plan
    tables: tuple[LengthTable, ...] = field(default=(), compare=False)  # its table of lengths, read by the plan
    seconds: float = field(default=0.0, compare=False)  # a row's estimated seconds: the weight of its progress

    @property
    def dispatch(self) -> bool:
        return "dispatch" in self.optional


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, tuple):
        return Weights.cell(value)
    return repr(value) if isinstance(value, float) else str(value)


def _environment_cells(params: EnvParams, workload: Workload | None = None,
                       optional: frozenset[str] = frozenset()) -> list[object]:
    ignored = params.ignored()
    cells: list[object] = [None if name in ignored else value for name, value in params.as_dict().items()
                           if _stated(name, optional)]
    if workload is None:
        return cells
    columns = workload_columns(optional)
    return cells + [value for key, value in workload.cells().items() if key in columns]


def _csv_text(cells: list[object]) -> str:
    """Cells as one CSV fragment (quoted where needed), without a line end."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="").writerow([_cell(value) for value in cells])
    return buffer.getvalue()


@lru_cache(maxsize=16)
def _policy_texts(step: float) -> tuple[str, ...]:
    """Per policy of the grid at ``step``, its CSV cells: label, shared priorities, tiers."""
    return tuple(_csv_text([policy.label,
                            *(None if kind in policy.exclusive_tiers else policy.shared_priority(kind)
                              for kind in COMM_KINDS),
                            *(policy.tier(kind) for kind in COMM_KINDS)])
                 for policy in policy_grid(step))


def summarise(samples: list[dict[str, float | int]]) -> dict[str, float | int]:
    """One row's metric columns from the scalar metrics of its samples (``ScheduleMetrics.SCALARS``): mean
    completion time and its spread, other means.

    With one sample every column is that sample's value (the spread's standard deviation
    is 0); with more, the standard deviation is the sample one (n - 1).
    """
    if len(samples) == 1:
        row: dict[str, float | int] = dict(samples[0])
        time = row["completion_time"]
        row.update({name: time for name in STATISTICS}, completion_std=0.0)
        return row
    times = np.array([v["completion_time"] for v in samples])
    row = {name: math.fsum(v[name] for v in samples) / len(samples) for name in samples[0]}
    p50, p95, p99 = np.percentile(times, [50, 95, 99])
    row.update(completion_std=float(times.std(ddof=1)), completion_min=float(times.min()),
               completion_p50=float(p50), completion_p95=float(p95), completion_p99=float(p99),
               completion_max=float(times.max()))
    return row


def simulate_chunk(chunk: Chunk) -> tuple[str, str, int]:
    """CSV text of a chunk's rows, of its samples (empty unless asked for), and how many rows. Pure: a table of
    lengths is the one the chunk carries."""
    with given(chunk.tables):
        return _simulate_chunk(chunk)


def _simulate_chunk(chunk: Chunk) -> tuple[str, str, int]:
    """``simulate_chunk`` of ``chunk``.

    Samples run outermost: each is one kernel call for every policy of the chunk. The
    cells that every row of the chunk shares are formatted once.
    """
    policies = policy_grid(chunk.step)[chunk.first:chunk.stop]
    draws = chunk.samples if chunk.params.jittered else 1  # without jitter every sample is the same simulation
    choosing = chunk.workload is not None and chunk.workload.layers_per_stage == "auto"
    # auto: every candidate split is simulated and each policy keeps the one of least mean completion time
    candidates = auto_candidates(chunk.workload, chunk.params) if choosing and chunk.workload is not None \
        else [(chunk.workload, chunk.params)]
    runs_of: list[list[dict[str, list]]] = []
    scalars_of = []
    # the parent told of the chunk's simulations as each draw's are done: all of them once the last draw is
    simulations, steps, told = (chunk.stop - chunk.first) * chunk.samples, len(candidates) * draws, 0
    for _, params in candidates:
        ideal = ideal_time(params, chunk.network)
        runs: list[dict[str, list]] = []
        scalars = []
        for sample in range(draws):
            run = metric_columns(figures_of(params, policies, sample, chunk.network), ideal)
            runs.append(run)
            scalars.append([dict(zip(ScheduleMetrics.SCALARS, values))
                            for values in zip(*(run[name] for name in ScheduleMetrics.SCALARS))])
            if chunk.dispatch:  # the bound depends on the draw, not on the policy
                bound, held = lower_bound(params, sample), memory_bound(params, sample)
                for values in scalars[sample]:
                    values["lower_bound"] = bound_of_run(bound, float(values["completion_time"]), params)
                    values["memory_bound"] = bound_of_run(held, float(values["completion_time"]), params)
            done = simulations * (len(runs_of) * draws + sample + 1) // steps
            tick(done - told, chunk.seconds * (chunk.stop - chunk.first) * (done - told) / simulations)
            told = done
        runs_of.append(runs)
        scalars_of.append(scalars)
    mean_times = np.array([[math.fsum(run["completion_time"][i] for run in runs) / draws
                            for i in range(len(policies))] for runs in runs_of])
    chosen = np.argmin(mean_times, axis=0)  # ties keep the first: balanced, whose gain is then 0
    environment = _environment_cells(chunk.params, chunk.workload, chunk.optional)
    prefix = _csv_text([*environment, chunk.simulator, chunk.samples]) + ","
    sample_prefix = _csv_text([*environment, chunk.simulator]) + ","
    policy_texts = _policy_texts(chunk.step)[chunk.first:chunk.stop]
    rows, sample_rows = [], []
    for i, policy in enumerate(policies):
        c = int(chosen[i])
        workload, params = candidates[c]
        runs, scalars = runs_of[c], scalars_of[c]
        # identical draws summarise as one: the mean of repeated floats may not be that float
        summary = summarise([scalars[sample][i] for sample in range(draws)])
        cells: list[object] = [summary[name] for name in _METRIC_COLUMNS]
        if chunk.dispatch:  # the gap of the mean completion time over the mean bound
            cells += [summary["lower_bound"], float(summary["completion_time"]) / float(summary["lower_bound"]) - 1.0,
                      summary["memory_bound"], float(summary["completion_time"]) / float(summary["memory_bound"]) - 1.0,
                      proven_share(params, draws) if params.dispatch == HINDSIGHT else None]
        if workload is not None:  # activation peaks follow the orders alone: any sample's will do
            cells += workload_report(workload, params, float(summary["completion_time"]),
                                     runs[0]["gpu_peak_activations"][i]).columns().values()
        if chunk.auto:
            assert workload is not None
            cells += [" ".join(map(str, workload.layers_per_stage)), float(1.0 - mean_times[c, i] / mean_times[0, i])] \
                if choosing else [None, None]
        rows.append(f"{prefix}{policy_texts[i]},{','.join(_cell(value) for value in cells)}\n")
        if chunk.with_samples:
            label = _csv_text([policy.label])
            for sample in range(chunk.samples):
                time = runs[min(sample, draws - 1)]["completion_time"][i]
                sample_rows.append(f"{sample_prefix}{label},{sample},{time!r}\n")
    return "".join(rows), "".join(sample_rows), chunk.stop - chunk.first


def rows_per_chunk(plan: SweepPlan, workers: int) -> int:
    """A whole environment per chunk, split when there are too few environments to keep workers busy or when
    samples make an environment long (about ``CHUNK_SIMULATIONS`` simulations a chunk then)."""
    per_env = len(plan.policies)
    pieces = math.ceil(4 * workers / plan.num_environments) if workers > 1 else 1
    by_samples = math.ceil(CHUNK_SIMULATIONS / plan.samples) if plan.samples > 1 else per_env
    return max(1, min(math.ceil(per_env / pieces), by_samples))


def useful_workers(plan: SweepPlan, workers: int) -> int:
    """``workers``, or fewer when the sweep has fewer chunks of work than that (chunks sized for the cores)."""
    sized_for = min(workers, os.cpu_count() or 1)
    chunks = sum(1 for _ in islice(plan.chunks(0, rows_per_chunk(plan, sized_for)), workers))
    return max(1, min(workers, chunks))


def partial_paths(output: Path) -> tuple[Path, Path]:
    """The partial CSV and its fingerprint file for ``output``."""
    return output.with_name(output.name + ".partial"), output.with_name(output.name + ".partial.json")


def _complete_lines(path: Path, header: str, keep: int | None = None) -> int:
    """Cut ``path`` after its last complete line (or after ``keep`` lines past the header); count its lines.

    Read in blocks, so memory stays flat however large the file.
    """
    with open(path, "rb+") as handle:
        start = handle.read(len(header))
        if start != header.encode() and not (header.encode().startswith(start) and handle.read(1) == b""):
            raise ResumeError(f"{path} does not start with the sweep's header; remove it or drop --resume")
        if start != header.encode():  # a kill cut the header short: the file is the start of a new one
            handle.seek(0)
            handle.write(header.encode())
        rows, end, position = 0, len(header), len(header)
        while (keep is None or rows < keep) and (block := handle.read(1 << 20)):
            newlines = block.count(b"\n")
            if keep is not None and rows + newlines > keep:
                cut = -1
                for _ in range(keep - rows):
                    cut = block.index(b"\n", cut + 1)
                rows, end = keep, position + cut + 1
                break
            if newlines:
                rows += newlines
                end = position + block.rfind(b"\n") + 1
            position += len(block)
        handle.truncate(end)
    return rows


def _first_malformed(path: Path, header: str) -> int | None:
    """The place (0 for the first row) of the first row of ``path`` that is not a CSV row of ``header``'s columns:
    a line written by anything but this sweep, which a resume computes again with every row after it. Lines are
    split at line feeds alone, as the sweep writes them; a row without quotes is judged by its commas."""
    width = len(next(csv.reader([header])))
    with open(path, "rb") as handle:
        handle.readline()
        for place, line in enumerate(handle):
            if b"\x00" in line:
                return place
            if b'"' not in line:
                if line.count(b",") + 1 != width:
                    return place
                continue
            try:
                fields = next(csv.reader([line.decode("utf-8").rstrip("\n")]))
            except (csv.Error, UnicodeDecodeError, StopIteration):
                return place
            if len(fields) != width:
                return place
    return None


def samples_path(output: Path) -> Path:
    """Where the one-row-per-sample file of ``output`` is kept while the sweep runs."""
    return output.with_name(output.name + ".samples.partial")


def sweep_record(meta: Path) -> dict:
    """The partial's record: the plan's fingerprint, and once every row is on disk, the checksum of the output
    it becomes (``complete``). Empty when missing or damaged."""
    try:
        record = json.loads(meta.read_text())
        return record if isinstance(record, dict) and isinstance(record.get("fingerprint"), str) else {}
    except (OSError, ValueError):
        return {}


def _write_record(meta: Path, record: dict) -> None:
    """Replace the record at once: a kill leaves the old one or the new one, never half of one."""
    temporary = meta.with_name(meta.name + ".writing")
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(record, handle)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:  # a full disk: nothing half written left behind, and the file named is the record
        temporary.unlink(missing_ok=True)
        raise OSError(error.errno, error.strerror, str(meta)) from None
    os.replace(temporary, meta)


def resumable(output: Path, plan: SweepPlan) -> bool:
    """Whether ``output`` has a partial file written by this very plan."""
    partial, meta = partial_paths(output)
    return partial.exists() and sweep_record(meta).get("fingerprint") == plan.fingerprint()


def not_resumable(partial: Path, meta: Path, plan: SweepPlan) -> str:
    """Why a partial file cannot be continued by this sweep, said precisely."""
    if not meta.exists():
        return (f"{partial} has lost its record {meta.name}, so which sweep wrote it is unknown; remove it or "
                f"pass --overwrite to start over")
    if not sweep_record(meta):
        return f"{meta} is damaged, so which sweep wrote {partial} is unknown; remove both or pass --overwrite"
    then, now = sweep_record(meta).get("networks", {}), plan.networks()
    changed = sorted(name for name in now if name in then and then[name] != now[name])
    if changed:
        return (f"{partial} holds rows of another network: {changed[0][len('learned:'):]} changed since they were "
                f"written; pass --overwrite to start over with the new one, or put the old one back to resume")
    then, now = sweep_record(meta).get("tables", {}), plan.grid.tables()
    changed = sorted(path for path in now if path in then and then[path] != now[path])
    if changed:
        return (f"{partial} holds rows of another table of lengths: {changed[0]} changed since they were written; "
                f"pass --overwrite to start over with the new one, or put the old one back to resume")
    differences = settings_changed(sweep_record(meta).get("settings"), plan)
    if differences == [ANOTHER_GRID]:
        return f"{partial} was written {ANOTHER_GRID}; pass --overwrite to discard it and start over, or choose " \
               f"another output"
    if differences:
        return (f"{partial} was written {', '.join(differences)}; rerun with its settings and --resume to continue "
                f"it, or pass --overwrite to discard it and start over")
    if plan.grid.has_workload and sweep_record(meta).get("workload_model") != WORKLOAD_REVISION:
        return (f"{partial} was written by an earlier revision of the workload model (docs/model.md: full "
                f"recomputation's memory, a MoE layer's element-wise work), so its rows are not those of this "
                f"sweep; pass --overwrite to start over")
    if plan.grid.collapses_anew:
        return (f"{partial} was written before a parameter an environment does not read stopped multiplying its "
                f"grid, so its rows are not those of this sweep; pass --overwrite to start over")
    return (f"{partial} was written by a different config, step, simulator or samples setting; pass --overwrite "
            f"to discard it and start over, or choose another output")


#: The workload model's revision: a partial of a workload sweep resumes only under the revision that wrote it (2:
#: full recomputation keeps each layer's input split over the tensor ranks, a MoE layer's element-wise work runs on
#: its active experts, context parallelism exchanges the model's own head widths).
WORKLOAD_REVISION = 2

#: What ``settings_changed`` says of a partial written from another grid than the plan's.
ANOTHER_GRID = "from another grid (its config has changed since, or is another file of that name)"


def settings_changed(then: object, plan: SweepPlan) -> list[str]:
    """How the settings of a partial's record (``SweepPlan.settings``) differ from ``plan``'s, said as options
    (``"with --step 0.05 (this run: 0.1)"``), or ``[ANOTHER_GRID]``; none when they do not, or when the record
    predates them."""
    if not isinstance(then, dict):
        return []
    said = []
    for option, value in plan.settings().items():
        if option not in then or then[option] == value:
            continue
        if option == "grid":
            return [ANOTHER_GRID]  # its options then say nothing of how to continue it
        if isinstance(value, bool):
            said.append(f"{'with' if then[option] else 'without'} {option} (this run: "
                        f"{'with' if value else 'without'})")
        else:
            said.append(f"with {option} {then[option]} (this run: {value})")
    return said


def finished(output: Path, plan: SweepPlan) -> bool:
    """Whether ``output`` is the complete output of ``plan`` and only the cleanup of its sweep was cut short."""
    record = sweep_record(partial_paths(output)[1])
    return record.get("fingerprint") == plan.fingerprint() and "complete" in record and output.is_file() and \
        file_digest(output) == record["complete"]


def _remove_leftovers(output: Path) -> None:
    partial, meta = partial_paths(output)
    if partial.is_dir():
        shutil.rmtree(partial)
    partial.unlink(missing_ok=True)
    meta.with_name(meta.name + ".writing").unlink(missing_ok=True)
    meta.unlink(missing_ok=True)  # last: until the partial is gone, its record says what it is


def run_sweep(plan: SweepPlan, output: str | os.PathLike, *, workers: int = 1, resume: bool = False,
              samples_output: str | os.PathLike | None = None, overwrite: bool = False,
              cluster: DaskCluster | None = None, report: Callable[[str], None] | None = None,
              running: Callable[[int, float], None] | None = None) -> Generator[int, None, None]:
    """Run ``plan`` into ``output`` (a CSV, or Parquet by ``plan.format``); yield the rows on disk, first before
    any new work.

    With ``resume``, continue ``output``'s partial file if there is one (it must come
    from the same plan); otherwise start afresh, which an existing output or partial file
    refuses unless ``overwrite``. One run at a time writes an output, and its samples file
    (``files.exclusive_writer``). Closing the generator early leaves the partial file
    holding every finished row. When ``plan.with_samples``, one row per sample also goes to
    ``samples_output``. With ``cluster`` (a Dask scheduler, or a local Dask cluster) the
    chunks run there instead of on ``workers`` local processes, and the file is the same
    bytes. ``report`` is told, in one line, what a resume found and did besides continuing
    (parts recomputed, a complete output left as it was). ``running`` is told, every half second while the next
    rows are awaited from local workers, the simulations done so far and their estimated seconds
    (``seconds_done``), those of rows still being computed included (a unit can take minutes: a hindsight
    environment's draws).
    """
    output = output_target(output)
    if plan.with_samples and samples_output is None:
        raise ValueError("a plan with samples needs a samples_output path")
    if samples_output is not None:
        samples_output = output_target(samples_output)
        if samples_output.resolve() == output.resolve():  # however spelled, or through a link
            raise OutputError(f"the samples file and the CSV are both {output}; give them different paths")
        beside = (*partial_paths(output), samples_path(output), lock_path(output))
        if samples_output.resolve() in {path.resolve() for path in beside}:
            raise OutputError(f"--samples-output {samples_output}: the sweep of {output} keeps a file of its own "
                              f"there while it runs and removes it when done; give another path")
        if samples_output.suffix.lower() == ".parquet":
            raise OutputError(f"--samples-output {samples_output}: the samples file is CSV; give a path ending in "
                              f".csv")
    partial, meta = partial_paths(output)
    sample_partial = samples_path(output)
    parquet = plan.format == "parquet"
    if parquet:
        require_pyarrow()
    for path in (meta, sample_partial) if parquet else (partial, meta, sample_partial):
        output_target(path)  # refuses a folder, a device or a FIFO in their place
    for path in (partial, meta, sample_partial):
        if path.is_symlink():
            raise OutputError(f"{path} is a link; remove it")
    with exclusive_writer(output), exclusive_writer(samples_output), ExitStack() as partials:
        for path in (partial, sample_partial):  # before anything reads, continues or removes them
            hold(path, partials)
        if resume and meta.exists() and finished(output, plan):
            if plan.with_samples and sample_partial.exists():  # the samples were not moved yet
                assert samples_output is not None
                os.replace(sample_partial, samples_output)
            _remove_leftovers(output)
            if report:
                report(f"{output} is already complete; removed what its sweep left behind ({partial.name})")
            yield plan.num_rows
            return
        if resume and not partial.exists() and not meta.exists() and output.exists() and not overwrite:
            # a sweep that finished removed its record last: nothing tells whose rows the file holds
            raise ResumeError(f"{output} exists and nothing of a sweep of it is left to continue: if this command "
                              f"wrote it, it is complete; pass --overwrite to compute it again, or choose another "
                              f"output")
        done = 0
        parts: Parts | None = None
        if resume and partial.exists():
            if not resumable(output, plan):
                raise ResumeError(not_resumable(partial, meta, plan))
            if parquet:
                parts = verified_parts(partial)
                done = parts.rows
            else:
                done = _complete_lines(partial, plan.header)
                if (bad := _first_malformed(partial, plan.header)) is not None:
                    done = _complete_lines(partial, plan.header, bad)
                    if report:
                        report(f"{partial}: row {bad + 1:,} is not a row of this sweep; computing the rows from "
                               f"{done:,} on again")
            if done > plan.num_rows:
                raise ResumeError(f"{partial} has {done} rows, more than the {plan.num_rows} this sweep writes")
            if parts is not None and parts.problem:
                for path in parts.dropped:
                    path.unlink()
                if report:
                    report(f"{partial}: {parts.problem}; computing the rows from {done:,} on again")
            if plan.with_samples:
                expected = done * plan.samples
                if not sample_partial.exists() or \
                        _complete_lines(sample_partial, plan.sample_header, expected) < expected:
                    raise ResumeError(f"{sample_partial} lacks rows of the samples already summarised in "
                                      f"{partial}; remove both or drop --resume")
        else:
            _start(plan, output, samples_output, overwrite)
            for path in (partial, sample_partial):  # the new ones
                hold(path, partials)
        yield done
        types = schema(plan.header.rstrip("\n").split(","), plan.column_types()) if parquet else None
        with open(os.devnull if parquet else partial, "a", encoding="utf-8", newline="") as handle, \
                open(sample_partial if plan.with_samples else os.devnull, "a", encoding="utf-8",
                     newline="") as samples:
            writer = PartWriter(partial, types, done) if types is not None else None
            size = rows_per_chunk(plan, workers)
            chunks = plan.chunks(done, size)
            # a Dask task carries up to CHUNK_SIMULATIONS simulations (its scheduling costs a millisecond), and
            # there are still four per worker
            batch = max(1, min(CHUNK_SIMULATIONS // (size * plan.samples), plan.num_rows // size // (4 * workers)))
            if plan.dispatchers & {LOOKAHEAD, HINDSIGHT}:  # units of seconds to minutes each, sized by their cost
                batch = 1
            # in worker processes even for one: a stop request is answered while a long simulation runs there
            ticks, waiting = (None, None) if running is None or cluster else \
                _told(running, done * plan.samples, plan.seconds_done(done))
            results = cluster.map(simulate_chunk, chunks, batch) if cluster else \
                ordered_map(simulate_chunk, chunks, workers, isolate=True, ticks=ticks, waiting=waiting)
            try:
                for text, sample_text, count in results:
                    check_locks()
                    samples.write(sample_text)  # samples first: a summarised row always has its samples on disk
                    samples.flush()
                    if writer is not None:
                        writer.write(text, count)
                    else:
                        handle.write(text)
                        handle.flush()
                    done += count
                    yield done
            finally:
                if writer is not None:
                    writer.flush()  # a stopped sweep keeps the rows it gathered
            if writer is None:
                os.fsync(handle.fileno())
            if plan.with_samples:
                os.fsync(samples.fileno())
        check_locks()
        _finish(plan, output, samples_output, types)


def _told(running: Callable[[int, float], None], simulated: int, seconds: float) -> tuple[Any, Callable[[], None]]:
    """What the workers add their simulations and the simulations' estimated seconds to as they do them
    (``parallel.tick``), and what tells ``running`` the sweep's: ``simulated`` and ``seconds`` before, and those."""
    ticks = shared_count()

    def waiting() -> None:
        running(simulated + int(ticks[0]), seconds + ticks[1])
    return ticks, waiting


def _start(plan: SweepPlan, output: Path, samples_output: Path | None, overwrite: bool) -> None:
    """Make a new sweep's partial file (or folder), samples file and record; refuse to discard anything without
    ``overwrite``."""
    partial, meta = partial_paths(output)
    if not overwrite:
        if partial.exists():
            if resumable(output, plan):
                raise ResumeError(f"{partial} is an unfinished run of this very sweep; pass --resume to continue it "
                                  f"or --overwrite to start over")
            differences = settings_changed(sweep_record(meta).get("settings"), plan)
            which = f", written {', '.join(differences)}" if differences else \
                " (a different config, step, simulator or samples setting)"
            raise ResumeError(f"{partial} holds rows of another sweep{which}; pass --overwrite to discard them and "
                              f"start over, or choose another output")
        for existing in (output, samples_output):
            if existing is not None and existing.exists():
                raise ResumeError(f"{existing} exists; pass --overwrite to replace it or choose another "
                                  f"output")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(output)
        # the record first: a kill before the partial exists leaves a record of nothing, which a resume replaces
        _write_record(meta, {"fingerprint": plan.fingerprint(), "output": str(output), "settings": plan.settings(),
                             **({"networks": plan.networks()} if plan.networks() else {}),
                             **({"tables": plan.grid.tables()} if plan.grid.tables() else {}),
                             **({"workload_model": WORKLOAD_REVISION} if plan.grid.has_workload else {})})
        if plan.format == "parquet":
            partial.mkdir()
        else:
            partial.write_text(plan.header, encoding="utf-8")
        if plan.with_samples:
            samples_path(output).write_text(plan.sample_header, encoding="utf-8")
    except OSError as error:
        raise OSError(error.errno, f"cannot write {error.filename or output}: {error.strerror or error}") from None


def _finish(plan: SweepPlan, output: Path, samples_output: Path | None, types: pa.Schema | None) -> None:
    """Turn a partial holding every row into ``output`` (and the samples file), so that a kill at any instant
    leaves something a resume completes without replacing a finished output: the final file is made whole
    beside its name, its checksum recorded, then it is moved into place, and the leftovers go last."""
    partial, meta = partial_paths(output)
    if types is not None:
        parts = verified_parts(partial)
        if parts.problem or parts.rows != plan.num_rows:
            raise ResumeError(f"{partial}: {parts.problem or f'{parts.rows:,} of {plan.num_rows:,} rows'}; "
                              f"rerun with --resume")
        final = partial / ".merged.parquet"  # inside the partial folder: a kill leaves nothing beside the output
        merge_parts(parts.paths, final, types)
    else:
        final = partial
    _write_record(meta, {**sweep_record(meta), "complete": file_digest(final)})
    os.replace(final, output)
    if plan.with_samples:
        assert samples_output is not None
        os.replace(samples_path(output), samples_output)
    _remove_leftovers(output)
