"""Running every policy in every environment of a grid, streamed in order to one CSV.

A parameter that the row's schedule ignores is an empty cell. Rows go to
``<output>.partial`` as they finish, in grid order then policy order; the
file becomes ``<output>`` only when complete. A partial file and its fingerprint
(``<output>.partial.json``) let an interrupted sweep resume and still end
byte-identical to an uninterrupted run, whatever the number of workers.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .config import ConfigError, EnvironmentGrid
from .engine import simulate
from .metrics import ScheduleMetrics, schedule_metrics
from .model import COMM_KINDS, EnvParams, ParameterError, Policy
from .parallel import ordered_map
from .scenarios import DEFAULT_STEP, policy_grid, steps_per_unit

SIMULATORS = ("single_channel", "dual_channel")
POLICY_COLUMNS = ("policy", *(f"prio_{kind}" for kind in COMM_KINDS), *(f"tier_{kind}" for kind in COMM_KINDS))
COLUMNS = (*EnvParams.names(), "simulator", *POLICY_COLUMNS, *ScheduleMetrics.SCALARS)
HEADER = ",".join(COLUMNS) + "\n"


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

    def __post_init__(self) -> None:
        steps_per_unit(self.step)
        if self.simulator not in SIMULATORS:
            raise ParameterError("simulator", self.simulator, f"must be one of {', '.join(SIMULATORS)}")
        invalid = self.grid.invalid()
        if invalid and not self.skip_invalid:
            where, reason = invalid[0]
            more = f" (and {len(invalid) - 1} more)" if len(invalid) > 1 else ""
            raise ConfigError(f"{len(invalid)} combination{'s' if len(invalid) > 1 else ''} of the grid cannot run: "
                              f"{where}: {reason}{more}; fix the config or pass --skip-invalid to leave them out")
        if not len(self.grid):
            raise ConfigError("no combination of the grid can run; fix the config")

    @property
    def policies(self) -> tuple[Policy, ...]:
        return policy_grid(self.step)

    @property
    def num_environments(self) -> int:
        return len(self.grid)

    @property
    def num_simulations(self) -> int:
        return self.num_environments * len(self.policies)

    def fingerprint(self) -> str:
        """Identifies the rows this plan writes; a partial file resumes only under the same one."""
        text = json.dumps({"grid": self.grid.as_dict(), "step": self.step, "simulator": self.simulator,
                           "skip_invalid": self.skip_invalid, "columns": COLUMNS}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def chunks(self, start_row: int, rows_per_chunk: int) -> Iterator[Chunk]:
        """Units of work from row ``start_row`` on, in row order, none spanning two environments."""
        per_env = len(self.policies)
        first_env, offset = divmod(start_row, per_env)
        for params in self.grid.environments(first_env):
            for first in range(offset, per_env, rows_per_chunk):
                yield Chunk(params, self.simulator, self.step, first, min(first + rows_per_chunk, per_env))
            offset = 0


@dataclass(frozen=True)
class Chunk:
    """Policies ``first`` to ``stop - 1`` of the policy grid, in one environment."""

    params: EnvParams
    simulator: str
    step: float
    first: int
    stop: int


def _cell(value: object) -> str:
    if value is None:
        return ""
    return repr(value) if isinstance(value, float) else str(value)


def result_row(params: EnvParams, simulator: str, policy: Policy, metrics: ScheduleMetrics) -> list[str]:
    prios = [None if kind in policy.exclusive_tiers else policy.shared_priority(kind) for kind in COMM_KINDS]
    tiers = [policy.tier(kind) for kind in COMM_KINDS]
    ignored = params.ignored()
    environment = [None if name in ignored else value for name, value in params.as_dict().items()]
    values = [*environment, simulator, policy.label, *prios, *tiers, *metrics.scalars().values()]
    return [_cell(value) for value in values]


def simulate_chunk(chunk: Chunk) -> tuple[str, int]:
    """CSV text of a chunk's rows, and how many there are. Pure: runs in worker processes."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for policy in policy_grid(chunk.step)[chunk.first:chunk.stop]:
        schedule = simulate(chunk.params, policy)
        writer.writerow(result_row(chunk.params, chunk.simulator, policy, schedule_metrics(schedule)))
    return buffer.getvalue(), chunk.stop - chunk.first


def rows_per_chunk(plan: SweepPlan, workers: int) -> int:
    """A whole environment per chunk, split only when there are too few environments to keep workers busy."""
    per_env = len(plan.policies)
    pieces = math.ceil(4 * workers / plan.num_environments) if workers > 1 else 1
    return max(1, math.ceil(per_env / pieces))


def partial_paths(output: Path) -> tuple[Path, Path]:
    """The partial CSV and its fingerprint file for ``output``."""
    return output.with_name(output.name + ".partial"), output.with_name(output.name + ".partial.json")


def _rows_on_disk(partial: Path, plan: SweepPlan) -> int:
    """Complete rows in a partial file, read in blocks (flat memory); a torn last line is cut off."""
    with open(partial, "rb+") as handle:
        if handle.read(len(HEADER)) != HEADER.encode():
            raise ResumeError(f"{partial} does not start with the sweep's header; remove it or drop --resume")
        rows, end, position = 0, len(HEADER), len(HEADER)
        while block := handle.read(1 << 20):
            newlines = block.count(b"\n")
            if newlines:
                rows += newlines
                end = position + block.rfind(b"\n") + 1
            position += len(block)
        handle.truncate(end)
    if rows > plan.num_simulations:
        raise ResumeError(f"{partial} has {rows} rows, more than the {plan.num_simulations} this sweep writes")
    return rows


def resumable(output: Path, plan: SweepPlan) -> bool:
    """Whether ``output`` has a partial file written by this very plan."""
    partial, meta = partial_paths(output)
    try:
        return partial.exists() and json.loads(meta.read_text())["fingerprint"] == plan.fingerprint()
    except (OSError, ValueError, KeyError, TypeError):
        return False


def run_sweep(plan: SweepPlan, output: str | os.PathLike, *, workers: int = 1,
              resume: bool = False) -> Iterator[int]:
    """Run ``plan`` into the CSV ``output``; yield the rows on disk, first before any new work.

    With ``resume``, continue ``output``'s partial file if there is one (it must come
    from the same plan); otherwise start afresh. Closing the generator early leaves
    the partial file holding every finished row.
    """
    output = Path(output)
    partial, meta = partial_paths(output)
    done = 0
    if resume and partial.exists():
        if not resumable(output, plan):
            raise ResumeError(f"{partial} was written by a different config, step or simulator; "
                              f"remove it or drop --resume")
        done = _rows_on_disk(partial, plan)
    else:
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(HEADER, encoding="utf-8")
            meta.write_text(json.dumps({"fingerprint": plan.fingerprint(), "output": str(output)}),
                            encoding="utf-8")
        except OSError as error:
            raise OSError(error.errno, f"cannot write {output}: {error.strerror or error}") from None
    yield done
    with open(partial, "a", encoding="utf-8", newline="") as handle:
        chunks = plan.chunks(done, rows_per_chunk(plan, workers))
        for text, count in ordered_map(simulate_chunk, chunks, workers):
            handle.write(text)
            handle.flush()
            done += count
            yield done
        os.fsync(handle.fileno())
    os.replace(partial, output)
    meta.unlink(missing_ok=True)
