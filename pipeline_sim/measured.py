"""Measured pipeline iterations, read from profiler traces (Chrome / Kineto JSON): per task its rank, start and end.

A trace is one file per rank, plain or gzipped, as ``torch.profiler`` exports it. What is read of it:

- the rank: ``distributedInfo.rank`` (written by the profiler when ``torch.distributed`` is initialised), else
  ``pipelineRun.rank``; the world size from ``distributedInfo.world_size`` or ``pipelineRun.ranks``;
- complete events (``"ph": "X"``, or a thread's ``"B"``/``"E"`` pairs) named
  ``pipeline:<stage><F|B|I|W><micro-batch>``, each a compute action (``B`` a
  whole backward, ``I`` and ``W`` its input- and weight-gradient halves); ``pipeline:send <stage><F|B><mb>
  <bytes>``, when a stage's output (``F``) or input gradient (``B``) is posted to its neighbour; and
  ``pipeline:iteration <k>``, one per iteration, enclosing the rest; and, where present, the profiler's own
  ``c10d::send`` ranges, the time a rank spent posting sends;
- ``pipelineRun.schedule``, the schedule's name, unless the caller names it.

Timestamps are microseconds of one clock shared by the ranks of a host (of a cluster: clocks in step, as
Kineto's are with NTP). Everything here is in milliseconds.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from .parameters import ParameterError
from .schedules import SCHEDULES, get_schedule

_ACTION = re.compile(r"^pipeline:(\d+)([FBIW])(\d+)$")
_SEND = re.compile(r"^pipeline:send (\d+)([FB])(\d+) (\d+)$")
_SEND_NAMED = "pipeline:send "
_ITERATION = re.compile(r"^pipeline:iteration (\d+)$")


#: The largest message a send may claim: a petabyte, far beyond any stage's activations.
MAX_SEND_BYTES = 10 ** 15


class TraceError(ValueError):
    """A trace that cannot be read as a pipeline run; the message, one line, names the file and what is missing."""


@dataclass(frozen=True)
class Span:
    """One compute action as it ran: ``kind`` is F, B, I or W; times in ms on the shared clock."""

    rank: int
    stage: int
    kind: str
    mb: int
    start: float
    end: float

    @property
    def text(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"


@dataclass(frozen=True)
class Send:
    """A transfer posted: stage ``stage``'s output (``kind`` F) or input gradient (B) of micro-batch ``mb``."""

    rank: int
    stage: int
    kind: str
    mb: int
    time: float
    size: int  # bytes


@dataclass(frozen=True)
class Iteration:
    tasks: tuple[Span, ...]
    sends: tuple[Send, ...]
    send_posting: float = 0.0  # ms all ranks spent inside c10d::send (held there until the receiver is ready?)

    @property
    def start(self) -> float:
        """The first compute action's start: the simulated iteration's time 0."""
        return min(task.start for task in self.tasks)

    @property
    def time(self) -> float:
        """From the first compute action's start to the last one's end, over all ranks."""
        return max(task.end for task in self.tasks) - self.start


@dataclass(frozen=True)
class MeasuredRun:
    """One traced run: its schedule, ranks, stages and micro-batches, and each traced iteration."""

    schedule: str
    ranks: int
    stages: int
    microbatches: int
    iterations: tuple[Iteration, ...]
    source: str = ""  # the files or folder it was read from, for messages
    settings: tuple[tuple[str, object], ...] = ()  # its pipelineRun record but rank and schedule: the model it ran
    named: bool = False  # whether the traces name the schedule (pipelineRun.schedule), or the caller did

    def differs(self, other: MeasuredRun) -> str:
        """How ``other`` ran another model than this run (its ``settings``, said as "width 64, not 512"; the
        micro-batches, ranks and iterations aside), or nothing when the traces do not say or agree."""
        mine, theirs = dict(self.settings), dict(other.settings)
        keys = [key for key in _MODEL_SETTINGS if key in mine and key in theirs and mine[key] != theirs[key]]
        return ", ".join(f"{key} {theirs[key]}, not {mine[key]}" for key in keys)


#: The settings of a run's record that say what model ran on what: runs differing in one of them are not comparable.
_MODEL_SETTINGS = ("batch", "width", "layers", "backend")


def _trace_files(folder: Path) -> list[Path]:
    """A folder's traces: its ``.json`` and ``.json.gz`` files in any letter case, hidden ones (a copier's ``._``
    companions) aside."""
    return sorted(path for path in folder.iterdir() if path.is_file() and not path.name.startswith(".")
                  and path.name.lower().endswith((".json", ".json.gz")))


def _load(path: Path) -> dict:
    try:
        with open(path, "rb") as raw:
            zipped = raw.read(2) == b"\x1f\x8b"  # gzip's magic number, whatever the file's name says
        opener = gzip.open if zipped else open
        with opener(path, "rt") as handle:
            trace = json.load(handle)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TraceError(f"{path}: truncated or not JSON ({str(error).splitlines()[0][:80]})") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise TraceError(f"{path}: not a Chrome/Kineto trace: it has no traceEvents list")
    for key in ("distributedInfo", "pipelineRun"):
        if trace.get(key) is not None and not isinstance(trace[key], dict):
            raise TraceError(f"{path}: its {key} is {type(trace[key]).__name__}, not an object of named fields")
    return trace


def _rank_of(trace: dict, path: Path) -> tuple[int, int]:
    info, run = trace.get("distributedInfo") or {}, trace.get("pipelineRun") or {}
    rank, world = info.get("rank", run.get("rank")), info.get("world_size", run.get("ranks"))
    if not isinstance(rank, int) or not isinstance(world, int):
        raise TraceError(f"{path}: no rank: it has neither distributedInfo.rank and world_size (a trace of an "
                         "initialised torch.distributed) nor pipelineRun.rank and ranks")
    return rank, world


def _complete(events: list, path: Path) -> Iterator[dict]:
    """The trace's complete ranges: its ``"X"`` events, and each ``"B"``/``"E"`` pair of a thread as one."""
    open_ranges: dict[tuple[object, object], list[dict]] = defaultdict(list)
    for event in events:
        if not isinstance(event, dict):
            continue
        if event.get("ph") == "X":
            yield event
        elif event.get("ph") == "B":
            open_ranges[event.get("pid"), event.get("tid")].append(event)
        elif event.get("ph") == "E" and open_ranges[event.get("pid"), event.get("tid")]:
            begin = open_ranges[event.get("pid"), event.get("tid")].pop()
            try:
                yield {**begin, "ph": "X", "dur": float(event["ts"]) - float(begin["ts"])}
            except (KeyError, TypeError, ValueError):
                raise TraceError(f"{path}: range {begin.get('name')!r} lacks a numeric ts at its begin or end") \
                    from None


def _events(trace: dict, rank: int, path: Path) -> tuple[dict[int, list[Span]], dict[int, list[Send]],
                                                          dict[int, float], dict[int, tuple[float, float]]]:
    """Per iteration number, this rank's compute actions, its sends, its time posting them and when it ran."""
    windows, actions, sends, posting = [], [], [], []
    for event in _complete(trace["traceEvents"], path):
        if event.get("cat") == "gpu_user_annotation":  # Kineto's copy of a range on a GPU stream: its CPU range counts
            continue
        name = str(event.get("name", ""))
        try:
            start, end = float(event["ts"]) / 1000.0, (float(event["ts"]) + float(event["dur"])) / 1000.0
        except (KeyError, TypeError, ValueError):
            raise TraceError(f"{path}: event {name!r} lacks a numeric ts or dur") from None
        if not name.startswith("pipeline:"):
            if name == "c10d::send" and math.isfinite(end - start):
                posting.append((start, end))
            continue
        if not math.isfinite(start) or not math.isfinite(end):
            raise TraceError(f"{path}: event {name!r} has ts {event['ts']} and dur {event['dur']}: both must be "
                             "finite numbers (microseconds)")
        if end < start:
            raise TraceError(f"{path}: event {name!r} has a negative duration ({end - start:.3f} ms)")
        if match := _ITERATION.match(name):
            windows.append((start, end, int(match[1])))
        elif match := _ACTION.match(name):
            actions.append(Span(rank, int(match[1]), match[2], int(match[3]), start, end))
        elif match := _SEND.match(name):
            if not 0 < int(match[4]) <= MAX_SEND_BYTES:
                raise TraceError(f"{path}: event {name!r} sends {int(match[4]):,} bytes: a send's last field is its "
                                 f"size in bytes, an integer from 1 to {MAX_SEND_BYTES:,}")
            sends.append(Send(rank, int(match[1]), match[2], int(match[3]), start, int(match[4])))
        elif name.startswith(_SEND_NAMED):
            raise TraceError(f"{path}: event {name!r} is not a send as the simulator reads one: it must read "
                             "'pipeline:send <stage><F|B><micro-batch> <bytes>', its size an integer > 0 "
                             "(e.g. 'pipeline:send 0F3 262144')")
    if not windows:
        raise TraceError(f"{path}: no pipeline:iteration ranges: not a trace recorded by pipeline-sim-trace record "
                         "(name each iteration pipeline:iteration <k> with torch.profiler.record_function)")
    if not actions:
        raise TraceError(f"{path}: no pipeline:<stage><F|B|I|W><micro-batch> ranges: no compute action is named")
    by_iteration: dict[int, list[Span]] = defaultdict(list)
    sent: dict[int, list[Send]] = defaultdict(list)
    for items, target in ((actions, by_iteration), (sends, sent)):
        for item in items:
            time = item.start if isinstance(item, Span) else item.time
            k = next((k for lo, hi, k in windows if lo <= time <= hi), None)
            if k is not None:
                target[k].append(item)  # type: ignore[arg-type]
    for _, _, k in windows:
        by_iteration.setdefault(k, [])
    posted = {k: sum(end - start for start, end in posting if lo <= start <= hi) for lo, hi, k in windows}
    return by_iteration, sent, posted, {k: (lo, hi) for lo, hi, k in windows}


def read_run(paths: Sequence[Path], schedule: str | None = None) -> MeasuredRun:
    """The run traced in ``paths`` (one file per rank, any order; a folder: its ``*.json`` and ``*.json.gz``).

    ``TraceError`` names the file and what is missing: a rank, an iteration on some rank, or a compute action
    that the other actions of the run imply (every stage runs F and B, or I and W, for every micro-batch).
    """
    files = [file for path in map(Path, paths) for file in (_trace_files(path) if path.is_dir() else [path])]
    if not files:
        raise TraceError(f"{', '.join(map(str, paths))}: no trace files (*.json or *.json.gz)")
    ranks: dict[int, tuple[Path, dict[int, list[Span]], dict[int, list[Send]], dict[int, float],
                           dict[int, tuple[float, float]]]] = {}
    worlds, names = set(), set()
    settings: tuple[Path, dict] | None = None  # the first file's run settings, which every rank's must repeat
    for path in files:
        trace = _load(path)
        rank, world = _rank_of(trace, path)
        if rank in ranks:
            raise TraceError(f"{path}: rank {rank} again (also in {ranks[rank][0]})")
        run = {key: value for key, value in (trace.get("pipelineRun") or {}).items()
               if key not in ("rank", "load_average")}
        if settings is None:
            settings = path, run
        elif run != settings[1]:
            differ = sorted(key for key in {*run, *settings[1]} if run.get(key) != settings[1].get(key))
            keys = ", ".join(f"pipelineRun.{key}" for key in differ)
            raise TraceError(f"{path}: not the run of {settings[0]}: their {keys} "
                             f"{'differ' if len(differ) > 1 else 'differs'} (pass the rank files of one run)")
        worlds.add(world)
        names.add(run.get("schedule"))
        ranks[rank] = (path, *_events(trace, rank, path))
    if len(worlds) != 1:
        raise TraceError(f"{files[0]}: the files disagree on the number of ranks ({sorted(worlds)})")
    world = worlds.pop()
    missing = [r for r in range(world) if r not in ranks]
    if missing:
        raise TraceError(f"{', '.join(map(str, paths))}: missing rank{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(map(str, missing))} of {world}: pass one trace file per rank")
    named = next(iter(names)) if len(names) == 1 else None
    # a trace that names its schedule is replayed as that one
    if schedule and named and schedule.strip().lower() != str(named).strip().lower():
        raise TraceError(f"{files[0]}: the trace names its schedule, {named}, not {schedule}: leave the schedule out "
                         "(it is for traces that do not name one)")
    if not (schedule or named):
        raise TraceError(f"{files[0]}: no pipelineRun.schedule in the trace: name the schedule it ran")
    try:
        schedule = get_schedule(str(schedule or named).strip()).name
    except ParameterError:
        raise TraceError(f"{files[0]}: {'pipelineRun.' if not schedule else ''}schedule {schedule or named!r} is not "
                         f"a schedule the simulator has: one of {', '.join(SCHEDULES)}") from None
    numbers = sorted(set().union(*(set(actions) for _, actions, _, _, _ in ranks.values())))
    for rank, (path, actions, _, _, _) in sorted(ranks.items()):
        lacking = [k for k in numbers if k not in actions]
        if lacking:
            raise TraceError(f"{path}: rank {rank} lacks iteration {lacking[0]} that other ranks traced")
    for k in numbers:  # the ranks of one run ran each iteration together: their windows overlap
        latest = max(ranks.values(), key=lambda entry: entry[4][k][0])
        earliest = min(ranks.values(), key=lambda entry: entry[4][k][1])
        if latest[4][k][0] > earliest[4][k][1]:
            raise TraceError(f"{latest[0]}: its iteration {k} began after {earliest[0]}'s had ended: the files are "
                             "not of one run (pass the rank files of one run)")
    iterations = [_iteration([task for _, actions, _, _, _ in ranks.values() for task in actions[k]],
                             [send for _, _, sent, _, _ in ranks.values() for send in sent[k]], k, files,
                             sum(posted[k] for _, _, _, posted, _ in ranks.values()))
                  for k in numbers]
    stages = 1 + max(task.stage for task in iterations[0].tasks)
    microbatches = 1 + max(task.mb for task in iterations[0].tasks)
    recorded = settings[1] if settings else {}
    for key, traced in (("microbatches", microbatches), ("stages", stages), ("ranks", world),
                        ("iterations", len(iterations))):
        if key in recorded and recorded[key] != traced:  # what the run says it was against what its actions are
            raise TraceError(f"{files[0]}: pipelineRun.{key} is {json.dumps(recorded[key])}, but its actions "
                             f"are of {traced} {key.replace('microbatches', 'micro-batches')}")
    for key in ("batch", "width", "layers", "chunks"):
        value = recorded.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TraceError(f"{files[0]}: pipelineRun.{key} is {json.dumps(value)}: must be an integer >= 1")
    spec, v = get_schedule(schedule), max(1, stages // world)
    for rank, (path, actions, _, _, _) in sorted(ranks.items()):  # each rank runs the stages its schedule gives it
        for task in actions[numbers[0]]:
            if stages == world * spec.v(v) and spec.placement(task.stage, world, spec.v(v)) != rank:
                raise TraceError(f"{path}: rank {rank} ran {task.text}, where {schedule} places stage {task.stage} "
                                 f"on rank {spec.placement(task.stage, world, spec.v(v))}: its files' ranks are not "
                                 "the ranks that ran them")
    source = ", ".join(map(str, paths))
    kept = tuple(sorted((key, value) for key, value in recorded.items() if key != "schedule"))
    return MeasuredRun(schedule, world, stages, microbatches, tuple(iterations), source, kept, named is not None)


def _iteration(tasks: list[Span], sends: list[Send], k: int, files: Sequence[Path], posting: float) -> Iteration:
    if not tasks:
        raise TraceError(f"{files[0]}: iteration {k} holds no compute action")
    stages = 1 + max(task.stage for task in tasks)
    n = 1 + max(task.mb for task in tasks)
    seen = {(task.stage, task.kind, task.mb) for task in tasks}
    if len(seen) < len(tasks):
        twice = sorted(text for text, count in Counter(task.text for task in tasks).items() if count > 1)
        raise TraceError(f"{', '.join(map(str, files))}: iteration {k} holds action {twice[0]} twice")
    lacking = []
    for stage in range(stages):
        for mb in range(n):
            wanted = ["F", *(["B"] if (stage, "I", mb) not in seen and (stage, "W", mb) not in seen else ["I", "W"])]
            lacking += [f"{stage}{kind}{mb}" for kind in wanted if (stage, kind, mb) not in seen]
    if lacking:
        more = f" and {len(lacking) - 4} more" if len(lacking) > 4 else ""
        implied = f"the {stages} stages x {n} micro-batches its highest numbers imply"
        raise TraceError(f"{', '.join(map(str, files))}: iteration {k} lacks compute actions "
                         f"{', '.join(lacking[:4])}{more} of {implied} (a trace cut short, a rank's file missing, "
                         f"or an action misnumbered)")
    return Iteration(tuple(sorted(tasks, key=lambda t: (t.start, t.rank))), tuple(sorted(sends, key=lambda s: s.time)),
                     posting)


@dataclass(frozen=True)
class CommFit:
    """Transfer time as ``latency + bytes / bandwidth``, fitted to the transfers a receiver sat waiting for.

    A transfer's measured time runs from its send's post to the start of the compute action that consumes it, for
    those where the receiving rank was idle from before the post until that start (otherwise the receiver, not the
    transfer, set the start). With one message size, ``latency`` is 0 and the bandwidth is bytes over the median
    time; with several, a least-squares line through the per-size medians.
    """

    latency: float  # ms
    bandwidth: float  # bytes per ms
    samples: int

    def time(self, size: float) -> float:
        return self.latency + size / self.bandwidth


def waited_transfers(iteration: Iteration) -> list[tuple[int, float]]:
    """Per transfer that a receiver sat waiting for: its bytes and its time (ms), as ``CommFit`` explains."""
    consumer = {(task.stage, task.kind, task.mb): task for task in iteration.tasks}
    by_rank: dict[int, list[Span]] = defaultdict(list)
    for span in iteration.tasks:
        by_rank[span.rank].append(span)
    result = []
    for send in iteration.sends:
        stage = send.stage + 1 if send.kind == "F" else send.stage - 1
        kinds = ("F",) if send.kind == "F" else ("B", "I")
        task = next((consumer[stage, kind, send.mb] for kind in kinds if (stage, kind, send.mb) in consumer), None)
        if task is None or task.rank == send.rank or task.start < send.time:
            continue
        before = [t.end for t in by_rank[task.rank] if t.end <= task.start]
        if not before or max(before) <= send.time:
            result.append((send.size, task.start - send.time))
    return result


def input_lead(run: MeasuredRun) -> str:
    """Where an action of ``run`` starts furthest before the send of its input from another rank was posted (beyond
    a clock's rounding), said as a note: the ranks' clocks disagree by at least that much, or the action's range holds
    its wait for the input; empty when none does."""
    lead, said = LEAD_TOLERANCE, ""
    for k, iteration in enumerate(run.iterations):
        consumer = {(task.stage, task.kind, task.mb): task for task in iteration.tasks}
        for send in iteration.sends:
            stage = send.stage + 1 if send.kind == "F" else send.stage - 1
            kinds = ("F",) if send.kind == "F" else ("B", "I")
            task = next((consumer[stage, kind, send.mb] for kind in kinds if (stage, kind, send.mb) in consumer), None)
            if task is not None and task.rank != send.rank and send.time - task.start > lead:
                lead = send.time - task.start
                said = (f"{run.source}: rank {task.rank}'s {task.text} starts {lead:.3f} ms before rank {send.rank} "
                        f"posts its input (iteration {k}): the ranks' clocks disagree by at least that much, or the "
                        f"action's range holds its wait for the input; a replay is off by as much")
    return said


#: A clock's rounding between ranks: an action may start this much before its input's send (ms).
LEAD_TOLERANCE = 0.05


def fit_comm(iterations: Iterable[Iteration]) -> CommFit:
    """``CommFit`` over every waited-for transfer of ``iterations``; ``TraceError`` when there is none."""
    iterations = list(iterations)
    samples = [sample for iteration in iterations for sample in waited_transfers(iteration)]
    if not samples and not any(iteration.sends for iteration in iterations):
        return CommFit(0.0, math.inf, 0)  # one rank: no transfer to time
    if not samples:
        raise TraceError("no transfer was waited for: nothing to fit communication to (no receiver sat idle from a "
                         "send's post to its action: the ranks' clocks disagree, or the sends are misnamed)")
    sizes = sorted({size for size, _ in samples})
    medians = [float(np.median([t for size, t in samples if size == s])) for s in sizes]
    if len(sizes) == 1:  # transfers that took no time: as fast as the clock can tell
        return CommFit(0.0, sizes[0] / medians[0] if medians[0] > 0 else math.inf, len(samples))
    slope, latency = np.polyfit(np.array(sizes, dtype=float), np.array(medians), 1)
    return CommFit(max(0.0, float(latency)), 1.0 / max(float(slope), 1e-12), len(samples))
