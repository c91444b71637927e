"""A measured iteration through the simulator: replayed on its own lengths, or predicted under another schedule.

Both run the one engine (``engine.simulate``) with every task's length given (``engine.given_lengths``): compute
tasks the time their rank spent on them (``effective_lengths``), transfers the fitted ``CommFit`` time of their
bytes, gradient syncs none (a traced run without data parallelism has none), and compute is never slowed by
transfers (impacts 0: on CPU ranks gloo's threads take their own cycles, which the measured durations already hold).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from statistics import median
from typing import Iterator, Mapping, Sequence

import numpy as np

from .engine import SimulationStuckError, simulate, texts_of
from .measured import CommFit, Iteration, MeasuredRun, Span, TraceError, fit_comm
from .model import EnvParams, Policy, Schedule, Task, TaskKind
from .parameters import ParameterError
from .schedules import SCHEDULES, get_schedule
from .taskgraph import GraphTask, TaskGraph, build_task_graph

_TRANSFER_SENDS = {TaskKind.FWD_PROP: "F", TaskKind.GRAD_PROP: "B"}


def environment(schedule: str, ranks: int, n: int, chunks: int, comm: CommFit, size: float,
                forward: float, backward: float) -> EnvParams:
    """The environment of a traced run: ``forward`` and ``backward``, a GPU's mean work per micro-batch in ms (its
    table of lengths, given per task, replaces them; they set the engine's time unit); no syncs, no impacts."""
    chunks = chunks if "chunks" in get_schedule(schedule).parameters else 2  # the parameter's default when unread
    return EnvParams(n=n, num_gpus=ranks, schedule=schedule, chunks=chunks, fwd_len=forward, bwd_len=backward,
                     prop_len=comm.time(size), sync_base_len=0.0, fwd_impact=0.0, bwd_impact=0.0)


def _sizes(iteration: Iteration) -> dict[tuple[str, int, int], int]:
    return {(send.kind, send.stage, send.mb): send.size for send in iteration.sends}


def _lengths(params: EnvParams, compute: Mapping[tuple[int, str, int], float], comm: CommFit,
             sizes: Mapping[tuple[str, int, int], int], size: float) -> list[float]:
    """Per task of ``params``' graph: a compute task the sum of its parts' ``compute[stage, letter, mb]``, a
    transfer the fitted time of its bytes (``size`` when its send was not traced), anything else 0."""
    def length(task: GraphTask) -> float:
        if task.parts:
            return sum(compute[part.stage, part.kind.code, part.mb] for part in task.parts)
        letter = _TRANSFER_SENDS.get(task.kind)
        return comm.time(sizes.get((letter, task.stage, task.index), size)) if letter else 0.0
    return [length(task) for task in build_task_graph(params).tasks]


def effective_lengths(iteration: Iteration, comm: CommFit) -> dict[tuple[int, str, int], float]:
    """Per compute action ``(stage, letter, mb)``, the time its rank spent on it: from the end of the rank's previous
    action (the Python between actions, and the OS's preemptions under CPU contention, belong to the work that
    follows them) or, if later, from when its input would arrive by ``comm``; but where the action sat waiting for
    a transfer posted after that end, its own duration: that wait is the simulated transfer's to reproduce."""
    posted = {(send.kind, send.stage, send.mb): send for send in iteration.sends}
    lengths: dict[tuple[int, str, int], float] = {}
    previous: dict[int, float] = {}
    for task in iteration.tasks:  # in order of start
        send = posted.get(("F", task.stage - 1, task.mb) if task.kind == "F" else ("B", task.stage + 1, task.mb))
        before = previous.get(task.rank)
        if send is None or task.kind == "W":
            begin = task.start if before is None else before
        elif before is None or send.time > before:
            begin = task.start
        else:
            begin = min(task.start, max(before, send.time + comm.time(send.size)))
        lengths[task.stage, task.kind, task.mb] = task.end - begin
        previous[task.rank] = task.end
    return lengths


def run_environment(run: MeasuredRun, iteration: Iteration, comm: CommFit) -> EnvParams:
    """``environment`` of iteration ``iteration`` of ``run``, as it ran."""
    v = run.stages // run.ranks
    spec = get_schedule(run.schedule)
    if spec.v(v) * run.ranks != run.stages:
        raise TraceError(f"{run.stages} stages on {run.ranks} ranks do not fit schedule {run.schedule} "
                         f"({spec.v(v)} chunks per rank)")
    if "chunks" in spec.parameters and v < 2:
        raise TraceError(f"{run.source}: {run.stages} stages on {run.ranks} ranks, one a rank, where {run.schedule} "
                         "runs two or more a rank (name the schedule it ran)")
    size = median(send.size for send in iteration.sends) if iteration.sends else 0.0
    lengths = effective_lengths(iteration, comm)
    per_rank = lambda kinds: sum(t for (_, kind, _), t in lengths.items() if kind in kinds) / run.ranks  # noqa: E731
    try:
        spec.check(run.microbatches, run.ranks)
    except ParameterError as error:
        raise TraceError(f"{run.source}: {run.microbatches} micro-batches on {run.ranks} ranks: {error}") from None
    try:
        return environment(run.schedule, run.ranks, run.microbatches, v, comm, size,
                           per_rank("F") / run.microbatches, per_rank("BIW") / run.microbatches)
    except ParameterError as error:  # lengths far beyond any real run's: a trace's dur in other units, or corrupt
        if error.name not in ("fwd_len", "bwd_len", "prop_len"):
            raise
        raise TraceError(f"{run.source}: its measured lengths are beyond what the simulator takes: {error}") \
            from None


@dataclass(frozen=True)
class Replay:
    """One measured iteration and its replay: both as ``Schedule`` (the measured one's transfers drawn from their
    post for their fitted time), the iteration's relative error, and per compute task its start error relative to
    its measured start (the first task, at 0, left out)."""

    measured: Schedule
    simulated: Schedule
    iteration_error: float
    start_errors: np.ndarray
    departure: str = ""  # where a rank first ran its actions in another order than the schedule's own, if it did


def replay(run: MeasuredRun, k: int, comm: CommFit) -> Replay:
    """Iteration ``k`` of ``run`` simulated on its measured lengths in the order each rank ran its tasks."""
    iteration = run.iterations[k]
    params = run_environment(run, iteration, comm)
    graph, spans, ranked = _checked(run, k, params)
    size = median(send.size for send in iteration.sends) if iteration.sends else 0.0
    lengths = _lengths(params, effective_lengths(iteration, comm), comm, _sizes(iteration), size)
    try:
        simulated = simulate(params, Policy(), order=[texts_of(graph, own) for own in ranked], lengths=lengths)
    except SimulationStuckError as error:  # a wait across ranks that no run can have
        raise TraceError(f"{run.source}: iteration {k}: the ranks' orders cannot run ({error}): an action misnamed, "
                         "or its timestamps wrong") from None
    measured = _measured_schedule(simulated, spans, iteration, comm)
    starts = [(task.start, measured.tasks[i].start) for i, task in enumerate(simulated.tasks)
              if task.parts and measured.tasks[i].start > 0.0]
    errors = np.array([abs(sim - real) / real for sim, real in starts])
    return Replay(measured, simulated, simulated.completion_time / measured.completion_time - 1.0, errors,
                  _departure(run, graph, ranked))


def _departure(run: MeasuredRun, graph: TaskGraph, ranked: Sequence[Sequence[int]]) -> str:
    """Where the first rank that ran its actions in another order than ``run``'s schedule's own did so."""
    for gpu, (own, ran) in enumerate(zip(graph.orders, ranked)):
        at = next((i for i, (a, b) in enumerate(zip(own, ran)) if a != b), None)
        if at is not None:
            ran_text, own_text = texts_of(graph, [ran[at], own[at]])
            return f"rank {gpu}'s action {at + 1} is {ran_text}, where {run.schedule} runs {own_text}"
    return ""


def check_run(run: MeasuredRun) -> None:
    """``TraceError`` for a run no real one can be, naming its files and what is wrong (``replay`` checks the same,
    an iteration at a time): for a prediction from it, or a comparison with it, checked before any is made."""
    try:
        comm = fit_comm(run.iterations)
    except TraceError as error:
        raise TraceError(f"{run.source}: {error}") from None
    for k in range(len(run.iterations)):  # its order run too: a wait across ranks no run can have ends it
        replay(run, k, comm)


def _checked(run: MeasuredRun, k: int, params: EnvParams) -> tuple[TaskGraph, dict[tuple[int, str, int], Span],
                                                                    list[list[int]]]:
    """Iteration ``k``'s graph under ``params``, its actions by (stage, kind, micro-batch) and each rank's tasks in
    the order it ran them, once every check of a run that can be holds."""
    spans = {(t.stage, t.kind, t.mb): t for t in run.iterations[k].tasks}
    graph = build_task_graph(params)
    _check_actions(run, graph, spans)
    _check_at_once(run, k, graph, spans)
    first = lambda task: spans[task.parts[0].stage, task.parts[0].kind.code, task.parts[0].mb]  # noqa: E731
    ranked = [sorted(own, key=lambda i: first(graph.tasks[i]).start) for own in graph.orders]
    _check_order(run, k, graph, ranked)
    return graph, spans, ranked


def _check_actions(run: MeasuredRun, graph: TaskGraph, spans: Mapping[tuple[int, str, int], Span]) -> None:
    """``TraceError`` unless the actions ``run``'s schedule has are exactly those traced (each on the rank the
    schedule places its stage on: ``measured.read_run`` checks it)."""
    wanted = {(part.stage, part.kind.code, part.mb) for task in graph.tasks for part in task.parts}
    named = "its pipelineRun.schedule is not the schedule it ran" if run.named else "name the schedule it ran"
    for missing, verb in ((sorted(wanted - spans.keys()), "lacks"), (sorted(spans.keys() - wanted), "ran")):
        if missing:
            texts = ", ".join(f"{stage}{kind}{mb}" for stage, kind, mb in missing[:3])
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            whose = f"actions that {run.schedule} has not" if verb == "ran" else f"{run.schedule}'s actions"
            raise TraceError(f"{run.source}: the trace does not match schedule {run.schedule}: it {verb} {whose} "
                             f"{texts}{more} ({named})")



def _check_at_once(run: MeasuredRun, k: int, graph: TaskGraph, spans: Mapping[tuple[int, str, int], Span]) -> None:
    """``TraceError`` when two actions of one rank ran at once that are not the parts of one task (an overlapped
    forward and backward, section 5), tolerating a microsecond's rounding: a rank runs one task at a time."""
    task_of = {(part.stage, part.kind.code, part.mb): i for i, task in enumerate(graph.tasks) for part in task.parts}
    origin = run.iterations[k].start
    by_rank: dict[int, list[Span]] = {}
    for span in spans.values():
        by_rank.setdefault(span.rank, []).append(span)
    for rank, own in sorted(by_rank.items()):
        latest: Span | None = None  # of the actions so far, the one that ends last
        for span in sorted(own, key=lambda span: (span.start, span.end)):
            if latest is not None and span.start < latest.end - 1e-3 and \
                    task_of[span.stage, span.kind, span.mb] != task_of[latest.stage, latest.kind, latest.mb]:
                raise TraceError(f"{run.source}: iteration {k}: rank {rank}'s action {span.text} starts "
                                 f"{span.start - origin:.3f} ms into the iteration, while {latest.text} runs "
                                 f"({latest.start - origin:.3f} to {latest.end - origin:.3f} ms): a rank runs one task "
                                 f"at a time, and {run.schedule} has no task of the two")
            if latest is None or span.end > latest.end:
                latest = span


def _check_order(run: MeasuredRun, k: int, graph: TaskGraph, ranked: Sequence[Sequence[int]]) -> None:
    """``TraceError`` when a rank ran an action before one of its own that it depends on (directly, or through a
    transfer; a longer chain across ranks leaves the simulation stuck, which ``replay`` reports): an order no run
    can have, whose names or timestamps are wrong."""
    place = {task: (gpu, position) for gpu, own in enumerate(ranked) for position, task in enumerate(own)}

    def compute_needs(task: int) -> Iterator[int]:  # the compute tasks whose end ``task`` waits for
        for need in graph.needs[task]:
            if need in place:
                yield need
            else:
                yield from compute_needs(need)
    for task, (gpu, position) in place.items():
        for need in compute_needs(task):
            if place[need][0] == gpu and place[need][1] > position:
                raise TraceError(f"{run.source}: iteration {k}: rank {gpu} ran {texts_of(graph, [task])[0]} before "
                                 f"{texts_of(graph, [need])[0]}, which it depends on: no run can (an action misnamed, "
                                 "or its timestamps wrong)")


def _measured_schedule(simulated: Schedule, spans: Mapping[tuple[int, str, int], Span], iteration: Iteration,
                       comm: CommFit) -> Schedule:
    """``simulated`` with every task where it ran: compute from its first part's start to its last part's end, a
    transfer from its send's post for its fitted time (zero-length tasks at 0)."""
    origin = iteration.start
    sends = {(send.kind, send.stage, send.mb): send for send in iteration.sends}
    tasks = []
    for task in simulated.tasks:
        if task.parts:
            parts = [spans[part.stage, part.kind.code, part.mb] for part in task.parts]
            start, end = parts[0].start - origin, parts[-1].end - origin
            tasks.append(replace(task, ready=start, start=start, end=end, throttled=False, throttled_time=0.0,
                                 segments=[(start, end, 1.0)]))
            continue
        send = sends.get((_TRANSFER_SENDS.get(task.kind, ""), task.stage, task.index))
        start = send.time - origin if send else 0.0
        end = start + (comm.time(send.size) if send else 0.0)
        tasks.append(replace(task, ready=start, start=start, end=end, throttled=False, throttled_time=0.0))
    return replace(simulated, tasks=_shared(tasks), completion_time=iteration.time)


def _shared(tasks: list[Task]) -> list[Task]:
    """``tasks`` with each transfer's segments at an equal share of its port with the transfers beside it."""
    spans = [(task.gpu, task.start, task.end) for task in tasks if not task.parts and task.end > task.start]
    result = []
    for task in tasks:
        if task.parts or task.end <= task.start:
            result.append(task)
            continue
        cuts = sorted({task.start, task.end, *(t for gpu, a, b in spans if gpu == task.gpu
                                               for t in (a, b) if task.start < t < task.end)})
        segments = [(a, b, 1.0 / sum(1 for gpu, s, e in spans if gpu == task.gpu and s < b and e > a))
                    for a, b in zip(cuts, cuts[1:])]
        result.append(replace(task, segments=segments))
    return result


@dataclass(frozen=True)
class RuntimeCosts:
    """What a pipeline runtime adds to its model's compute, as a trace measures it: ``gap``, the mean time in ms a
    rank spends between two actions (``effective_lengths`` counts it into the action that follows); ``split``, a
    split backward's I + W over the whole backward of the same stage, on stages whose input needs a gradient (each
    taken relative to the forward of the same stage and micro-batch, so that runs on a faster or slower host
    compare); ``input_share``, the I's share of it; ``split_measured``, whether those two were measured (else they
    are a whole backward's cost, in halves)."""

    gap: float
    split: float = 1.0
    input_share: float = 0.5
    split_measured: bool = False


def _overhead(run: MeasuredRun) -> list[float]:
    """Per compute action of ``run``, the time ``effective_lengths`` adds to its duration."""
    comm = fit_comm(run.iterations)
    gaps = []
    for iteration in run.iterations:
        effective = effective_lengths(iteration, comm)
        gaps += [effective[t.stage, t.kind, t.mb] - (t.end - t.start) for t in iteration.tasks]
    return gaps


def _per_forward(run: MeasuredRun, kinds: str) -> list[tuple[float, float]]:
    """Per (stage, micro-batch, iteration) of ``run`` past the first stage that ran all of ``kinds`` (``"B"`` or
    ``"IW"``): their summed durations over the forward's, and the first kind's share of the sum."""
    result = []
    for iteration in run.iterations:
        took = {(t.stage, t.kind, t.mb): t.end - t.start for t in iteration.tasks}
        for stage, kind, mb in took:
            if kind == kinds[0] and stage > 0 and all((stage, k, mb) in took for k in kinds):
                parts = [took[stage, k, mb] for k in kinds]
                result.append((sum(parts) / took[stage, "F", mb], parts[0] / sum(parts)))
    return result


def runtime_costs(runs: Sequence[MeasuredRun], source: MeasuredRun) -> RuntimeCosts:
    """``RuntimeCosts`` measured on ``runs`` (``source``'s own gap when there are none): the mean gap over all their
    actions, and, where they split a backward, its cost against ``source``'s whole backwards."""
    gaps = [gap for run in runs for gap in _overhead(run)] or _overhead(source)
    split = [pair for run in runs for pair in _per_forward(run, "IW")]
    whole = _per_forward(source, "B")
    if not split or not whole:
        return RuntimeCosts(sum(gaps) / len(gaps))
    return RuntimeCosts(sum(gaps) / len(gaps), median(r for r, _ in split) / median(r for r, _ in whole),
                        median(share for _, share in split), True)


def task_spread(run: MeasuredRun) -> float:
    """The median over ``run``'s compute actions of the coefficient of variation of an action's effective length
    across the iterations (0 with one iteration)."""
    comm = fit_comm(run.iterations)
    lengths: dict[tuple[int, str, int], list[float]] = {}
    for iteration in run.iterations:
        for key, length in effective_lengths(iteration, comm).items():
            lengths.setdefault(key, []).append(length)
    return float(np.median([variation(values) for values in lengths.values()]))


def variation(values: Sequence[float]) -> float:
    """The coefficient of variation of ``values`` (0 for fewer than two)."""
    return float(np.std(values) / np.mean(values)) if len(values) > 1 and np.mean(values) > 0 else 0.0


def _prediction(source: MeasuredRun, k: int, comm: CommFit, schedule: str, chunks: int, runtime: RuntimeCosts,
                microbatches: int | None) -> tuple[EnvParams, list[float]]:
    iteration = source.iterations[k]
    stages = source.ranks * get_schedule(schedule).v(chunks)
    n = source.microbatches if microbatches is None else microbatches

    def mean(stage: int, kind: str) -> float:
        """The mean duration of the stage's actions of ``kind`` (0 when it ran none)."""
        took = [t.end - t.start for t in iteration.tasks if t.stage == stage and t.kind == kind]
        return sum(took) / len(took) if took else 0.0

    params = replace(run_environment(source, iteration, comm), schedule=schedule, chunks=max(2, chunks), n=n)
    compute: dict[tuple[int, str, int], float] = {}
    scale = source.stages / stages  # a target stage's layers over a source stage's
    for stage in range(stages):
        ran = stage * source.stages // stages  # the source stage that ran this stage's layers
        forward = mean(ran, "F") * scale
        if mean(ran, "B"):  # whole backwards measured (all of them, or beside a few split ones as DualPipeV's)
            backward = mean(ran, "B") * scale
            split = backward * runtime.split
            # the first stage's input needs no gradient: its I computes nothing, its W the whole backward
            inputs, weights = (0.0, backward) if stage == 0 else (split * runtime.input_share,
                                                                   split * (1.0 - runtime.input_share))
        else:  # every backward split: its halves as measured
            inputs, weights = mean(ran, "I") * scale, mean(ran, "W") * scale
            backward = inputs + weights
        for mb in range(n):
            compute[stage, "F", mb] = forward + runtime.gap
            compute[stage, "B", mb] = backward + runtime.gap
            compute[stage, "I", mb] = inputs + runtime.gap
            compute[stage, "W", mb] = weights + runtime.gap
    size = median(send.size for send in iteration.sends) if iteration.sends else 0.0
    return params, _lengths(params, compute, comm, {}, size)


def predict(source: MeasuredRun, k: int, comm: CommFit, schedule: str, *, chunks: int = 2,
            runtime: RuntimeCosts | None = None, microbatches: int | None = None) -> Schedule:
    """The iteration of ``schedule`` (its own static order; ``chunks`` per rank if it reads them) over
    ``microbatches`` (default: the source's) on the lengths measured in iteration ``k`` of ``source``: each stage's
    mean forward and backward per micro-batch, as the source stage that ran its layers measured them, scaled by
    the share of those layers it has; a backward the target splits costs ``runtime.split`` times a whole one,
    ``runtime.input_share`` of it in I (except on the first stage, whose input needs no gradient: all of it in W);
    every action ``runtime.gap`` more (``runtime`` default: the source's own gap, a split costing what a whole
    backward does, in halves)."""
    runtime = runtime_costs([], source) if runtime is None else runtime
    params, lengths = _prediction(source, k, comm, schedule, chunks, runtime, microbatches)
    return simulate(params, Policy(), lengths=lengths)


def predicted_time(source: MeasuredRun, k: int, comm: CommFit, schedule: str, *, chunks: int = 2,
                   runtime: RuntimeCosts | None = None, microbatches: int | None = None, draws: int = 20) -> float:
    """``predict``'s iteration time with the source's measured task spread (``task_spread``) put back as compute
    jitter: the median over ``draws`` draws (the noise-free time when the source has one iteration)."""
    runtime = runtime_costs([], source) if runtime is None else runtime
    params, lengths = _prediction(source, k, comm, schedule, chunks, runtime, microbatches)
    cv = min(task_spread(source), 1.0)
    if cv == 0.0:
        return simulate(params, Policy(), lengths=lengths).completion_time
    params = replace(params, compute_jitter=cv)
    return median(simulate(params, Policy(), draw, lengths=lengths).completion_time for draw in range(draws))


#: The schedules a measured run can be predicted under: every schedule PyTorch also runs.
PREDICTABLE = tuple(SCHEDULES)
