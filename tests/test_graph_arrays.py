"""The task graph's arrays, built per structure by a compiled function, against a task-by-task reference from the
records (docs/model.md sections 6.6, 7, 8 and 15): every array equal to the bit, for environments new and of a
structure already seen."""

import gc
import random
import sys
import threading
import weakref
from dataclasses import replace

import numpy as np
import pytest
import reference_taskgraph as reference

from pipeline_sim import taskgraph
from pipeline_sim.engine import (
    _dispatch_arguments,
    _memory_jobs,
    gpu_order_peaks,
    graph_arrays,
    simulate_figures,
    static_order_peaks,
    static_peak,
)
from pipeline_sim.model import (
    COMM_KINDS,
    DISPATCHERS,
    EP_OVERLAP_SCHEDULES,
    KIND_INDEX,
    ROOM_UNIT,
    EnvParams,
    Policy,
    TaskKind,
)
from pipeline_sim.noise import KIND_NUMBERS, standard_normals, work_factors
from pipeline_sim.orders import order_parts
from pipeline_sim.schedules import SCHEDULES, get_schedule
from pipeline_sim.taskgraph import (
    _KIND_CLASS,
    GraphStructure,
    ScheduleError,
    _draws,
    _structure_of,
    _work_of,
    build_task_graph,
    estimated_tasks,
    graph_structure,
    graph_work,
    task_impacts,
    task_lengths,
)

F, B, I, W = TaskKind.FORWARD, TaskKind.BACKWARD, TaskKind.BACKWARD_INPUT, TaskKind.BACKWARD_WEIGHT
_K = KIND_INDEX


def random_environment(rng: random.Random, schedule: str) -> EnvParams:
    """An environment of ``schedule`` with every length, weight, strategy, dispatcher and noise drawn at random."""
    p = rng.randint(1, 4) if schedule not in ("zb-v", "dualpipe-v") else rng.randint(2, 4)
    chunks = rng.choice([2, 3])
    stages = p * get_schedule(schedule).v(chunks)

    def weights() -> tuple[float, ...]:
        return tuple(rng.choice([0.1, 0.5, 1.0, 1.3, 2.7]) * rng.uniform(0.5, 2) for _ in range(stages)) \
            if rng.random() < 0.5 else ()
    overlap = rng.choice([0.0, 0.3]) if schedule == "dualpipe-v" else 0.0
    zero = rng.randint(0, 3)
    return EnvParams(
        n=p * rng.randint(2, 3), num_gpus=p, schedule=schedule, chunks=chunks, sync_freq=rng.randint(1, 3),
        fwd_len=rng.uniform(0.1, 3), bwd_len=rng.uniform(0.1, 5), prop_len=rng.choice([0.0, 0.7, 1.1]),
        sync_base_len=rng.choice([0.0, 2.3]), fwd_impact=rng.random(), bwd_impact=rng.random(),
        w_fraction=rng.random(), fb_overlap=overlap, stage_weights=weights(), sync_weights=weights(),
        bwd_weights=weights(), optimizer_len=rng.choice([0.0, 0.9]), zero=zero,
        gather_len=rng.choice([0.0, 0.6]) if zero else 0.0, cp_len=rng.choice([0.0, 0.4]),
        dispatch=rng.choice(DISPATCHERS) if overlap == 0.0 else "static", compute_jitter=rng.choice([0.0, 0.2]),
        comm_jitter=rng.choice([0.0, 0.1]), jitter_dist=rng.choice(["lognormal", "normal"]),
        slow_gpu=rng.choice([-1, p - 1]), slow_factor=rng.choice([1.0, 1.5]), seed=rng.randint(0, 99))


def new_lengths(rng: random.Random, params: EnvParams) -> EnvParams:
    """``params`` with other work and weights: the same structure."""
    stages = len(params.stage_weights or params.sync_weights or ())
    return replace(params, fwd_len=rng.uniform(0.1, 3), bwd_len=rng.uniform(0.1, 5), prop_len=rng.uniform(0.1, 2),
                   cp_len=params.cp_len and rng.uniform(0.1, 1), w_fraction=rng.random(), fwd_impact=rng.random(),
                   stage_weights=tuple(rng.uniform(0.1, 3) for _ in range(stages)),
                   optimizer_len=params.optimizer_len and rng.uniform(0.1, 2))


def environments(count: int):
    rng = random.Random(37)
    for i in range(count):
        params = random_environment(rng, sorted(SCHEDULES)[i % len(SCHEDULES)])
        yield params
        yield new_lengths(rng, params)


def reference_work(params: EnvParams, tasks) -> tuple[list[float], list[float]]:
    """Each task's work and impact, task by task from its record (sections 6.6, 6.7 and 15)."""
    v, lengths, impacts = params.v, [], []
    forward = lambda s: params.fwd_len * params.stage_weight(s) / v  # noqa: E731
    backward = lambda s: params.bwd_len * params.stage_weight(s) * params.bwd_weight(s) / v  # noqa: E731
    exchange = lambda s: params.cp_len / v * params.stage_weight(s)  # noqa: E731
    for task in tasks:
        kind, s, impact = task.kind, task.stage, 0.0
        if kind is TaskKind.OVERLAP_F_B:
            f, b = forward(task.parts[0].stage), backward(task.parts[1].stage)
            length = (f + b) * (1.0 - params.fb_overlap)
            impact = (f * params.fwd_impact + b * params.bwd_impact) / (f + b)
        elif kind is F:
            length, impact = forward(s), params.fwd_impact
        elif kind in (B, I, W):
            length, impact = backward(s), params.bwd_impact
            if kind is not B:
                length = length * (1.0 - params.w_fraction) if kind is I else length * params.w_fraction
        elif kind is TaskKind.OPTIMIZER_STEP:
            length = params.step_lengths()[task.gpu]
        elif kind is TaskKind.GRAD_SYNC:
            length = params.sync_base_len / v * params.sync_weight(s)
        elif kind is TaskKind.PARAM_GATHER:
            length = params.gather_lengths()[task.gpu]
        elif kind in (TaskKind.FWD_GATHER, TaskKind.BWD_GATHER):
            length = params.gather_len / v * params.sync_weight(s)
        elif kind is TaskKind.KV_EXCHANGE:
            length = exchange(s)
        elif kind is TaskKind.KV_GRAD_EXCHANGE:
            length = 2.0 * exchange(s)
        else:
            assert kind in (TaskKind.FWD_PROP, TaskKind.GRAD_PROP)
            length = params.prop_len
        lengths.append(length)
        impacts.append(impact)
    return lengths, impacts


def reference_lengths(params: EnvParams, tasks, sample: int) -> list[float]:
    """Section 8: a task's work times the mean of its parts' factors, the straggler's on top."""
    base = reference_work(params, tasks)[0]
    if not params.jittered and params.slow_gpu < 0:
        return base
    draws = [(KIND_NUMBERS[kind], stage, index) for task in tasks
             for kind, stage, index in (task.parts or ((task.kind, task.stage, task.index),))]
    z = standard_normals(params.seed, sample if params.jittered else 0, np.array(draws, dtype=np.int64)).tolist()
    lengths, row = [], 0
    for task, length in zip(tasks, base):
        parts = len(task.parts) or 1
        jitter = params.compute_jitter if task.parts else params.comm_jitter
        factors = work_factors(np.array(z[row:row + parts]), jitter, params.jitter_dist).tolist()
        row += parts
        slow = params.slow_factor if task.parts and task.gpu == params.slow_gpu else 1.0
        lengths.append(length * (sum(factors) / parts * slow))
    return lengths


def rows(lists) -> tuple[list[int], list[int]]:
    starts = [0]
    for row in lists:
        starts.append(starts[-1] + len(row))
    return starts, [x for row in lists for x in row]


def reference_arrays(params: EnvParams) -> dict[str, list]:
    """Every array of ``graph_arrays``, task by task from the records (the kernel's layout: ``engine.GraphArrays``)."""
    graph = build_task_graph(params)
    tasks = graph.tasks
    spec = get_schedule(params.schedule)
    room = [round(params.stage_weight(s) * ROOM_UNIT) for s in range(params.num_gpus * params.v)]
    gpu_room = [sum(r for s, r in enumerate(room) if spec.placement(s, params.num_gpus, params.v) == g)
                for g in range(params.num_gpus)]
    issued: list[list[int]] = [[] for _ in range(len(tasks) + 1)]  # per task what its start issues, then time 0's
    for transfer, issuer in sorted(graph.issued_by.items()):
        issued[issuer if issuer >= 0 else len(tasks)].append(transfer)
    release_start, release_task = rows([*graph.releases, *issued])
    order_start, order_task = rows(graph.orders)
    peer_start, peer_task = rows(graph.peers)
    return {
        "gpu": [t.gpu for t in tasks], "receiver": [-1 if t.receiver is None else t.receiver for t in tasks],
        "comm": [-1 if t.kind.is_compute else COMM_KINDS.index(t.kind.priority_class) for t in tasks],
        "stage": [t.stage for t in tasks], "index": [t.index for t in tasks],
        "impact": reference_work(params, tasks)[1], "needs_count": [len(needs) for needs in graph.needs],
        "release_start": release_start, "release_task": release_task, "order_start": order_start,
        "order_task": order_task, "peer_start": peer_start, "peer_task": peer_task,
        "kind_class": [_KIND_CLASS.get(t.kind, -1) for t in tasks],
        "reserve": [gpu_room[t.gpu] if t.kind is F and graph.stage_chunk[t.stage] == 0 else 0 for t in tasks],
        "rises": [sum(room[part.stage] for part in t.parts if part.kind is F) for t in tasks],
        "falls": [sum(room[part.stage] for part in t.parts if part.kind in (B, W)) for t in tasks]}


def same_bits(array: np.ndarray, values: list) -> bool:
    return array.tobytes() == np.array(values, dtype=array.dtype).tobytes() and len(array) == len(values)


def test_every_array_is_the_reference_to_the_bit():
    seen = set()
    for params in environments(150):
        arrays = graph_arrays(params)
        expected = reference_arrays(params)
        for name, array in zip(arrays._fields, arrays):
            assert array.dtype == (float if name == "impact" else np.int64) and not array.flags.writeable
            assert same_bits(array, expected[name]), (name, params)
        assert same_bits(task_impacts(params), expected["impact"])
        structure, work = graph_structure(params), graph_work(params)  # what the arrays are views of, read-only too
        for name in (*structure._fields, "kind", "part_mb", "release_start", "release_task", "stage_chunk",
                     "issued_task", "issued_by", "holds", "compute_task"):
            assert not getattr(structure, name).flags.writeable, name
        for name in ("floats", "integers", "lengths", "impact", "reserve", "rises", "falls"):
            assert not getattr(work, name).flags.writeable, name
        tasks = build_task_graph(params).tasks
        for sample in (0, 3):
            lengths = reference_lengths(params, tasks, sample)
            assert same_bits(task_lengths(params, sample), lengths), (sample, params)
            assert [t.length for t in build_task_graph(params, sample).tasks] == lengths
        assert [t.impact for t in tasks] == expected["impact"]
        seen.add((params.schedule, params.dispatch, params.zero, params.cp_len > 0, bool(params.stage_weights)))
    assert {s[0] for s in seen} == set(SCHEDULES) and {s[1] for s in seen} == set(DISPATCHERS)
    assert {s[2] for s in seen} == {0, 1, 2, 3} and {s[3] for s in seen} == {s[4] for s in seen} == {False, True}


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_peaks_of_an_order_are_counted_task_by_task(schedule):
    rng = random.Random(schedule)
    for _ in range(5):
        params = random_environment(rng, schedule)
        static = replace(params, dispatch="static", memory_limit=0.0)
        graph, arrays = build_task_graph(static), graph_arrays(static)
        peaks = []
        for order in graph.orders:
            level = peak = 0
            for task in order:
                level += int(arrays.rises[task])
                peak = max(peak, level)
                level -= int(arrays.falls[task])
            peaks.append(peak / (params.v * ROOM_UNIT))
        assert gpu_order_peaks(static) == gpu_order_peaks(static, graph.orders) == peaks
        assert static_order_peaks(params) == peaks  # from the orders alone, no graph
        assert static_peak(params) == max(peaks)


def structure_environment(rng: random.Random, schedule: str) -> EnvParams:
    """An environment of ``schedule`` with every option that shapes a graph drawn at random: p, n, chunks, the
    sync frequency, the dispatcher (pairs split or not), optimizer step, zero stage and gathers, context and expert
    parallelism, the all-to-all's class and its overlap in pairs."""
    p = rng.randint(1, 5) if schedule not in ("zb-v", "dualpipe-v") else rng.randint(2, 5)
    n = {"dualpipe-v": rng.randint(2 * p, 3 * p), "interleaved-1f1b": p * rng.randint(1, 3)}.get(
        schedule, rng.randint(1, 3 * p))
    zero, overlap = rng.randint(0, 3), rng.choice([0.0, 0.3]) if schedule == "dualpipe-v" else 0.0
    params = dict(n=n, num_gpus=p, schedule=schedule, chunks=rng.choice([2, 3]), sync_freq=rng.randint(1, 3),
                     optimizer_len=rng.choice([0.0, 0.9]), zero=zero,
                     gather_len=rng.choice([0.0, 0.6]) if zero else 0.0, cp_len=rng.choice([0.0, 0.4]),
                     a2a_len=rng.choice([0.0, 0.5]), a2a_class=rng.choice(["pipeline", "grad_sync"]),
                     fb_overlap=overlap, ep_overlap=rng.randint(0, 1),
                     dispatch=rng.choice(DISPATCHERS) if overlap == 0.0 else "static", fwd_len=rng.uniform(0.5, 2))
    if params["ep_overlap"] and params["a2a_len"] and schedule in EP_OVERLAP_SCHEDULES:
        params["dispatch"] = "static"  # pairs of the static order
    return EnvParams(**params)


def test_structure_is_the_task_by_task_construction():
    """The structure's arrays and the records made from them against the construction task by task
    (tests/reference_taskgraph.py): records, needs, releases, orders, peers, issuers and
    holds equal (the issuers in the same order); the kernel's arrays, work rows, noise draws and memory jobs equal
    to the bit."""
    rng, seen = random.Random(3737), set()
    for i in range(240):
        params = structure_environment(rng, sorted(SCHEDULES)[i % len(SCHEDULES)])
        expected = reference.structure_of(params)
        work = graph_work(params)
        lengths, impacts = work.lengths.tolist(), work.impact.tolist()
        expected = expected._replace(params=params, tasks=tuple(
            task._replace(length=length, impact=impact) for task, length, impact in zip(expected.tasks, lengths,
                                                                                        impacts)))
        graph = build_task_graph(params)
        assert graph == expected and list(graph.issued_by.items()) == list(expected.issued_by.items()), params
        arrays, structure, old = graph_arrays(params), graph_structure(params), reference.skeleton(params, expected)
        rows = [name for name, value in vars(GraphStructure).items() if isinstance(value, property)]  # views
        names = [name for name in (*structure._fields, *rows) if name not in arrays._fields]
        for name, array in [*zip(arrays._fields, arrays), *((name, getattr(structure, name)) for name in names)]:
            if name in old:
                assert array.dtype == old[name].dtype and same_bits(array, old[name].tolist()), (name, params)
        compared = old.keys() & {*names, *arrays._fields}
        assert {"first_forward", "rise_stage", "fall_stage", "kind_class", "comm"} <= compared
        for new, reference_arrays_of in (((structure.work_row, structure.work_impact, structure.pairs),
                                          reference.work_index(params, expected)),
                                         (_draws(params), reference.draws(expected)),
                                         (_memory_jobs(params), reference.memory_jobs(expected))):
            for array, value in zip(new, reference_arrays_of):
                assert array.shape == value.shape and array.tobytes() == value.astype(array.dtype).tobytes(), params
        seen.add((params.schedule, params.dispatch, params.zero if params.gather_len else 0, params.cp_len > 0,
                  params.a2a_len > 0, params.optimizer_len > 0, params.fb_overlap > 0,
                  params.a2a_len > 0 and params.ep_overlap == 1 and params.schedule in EP_OVERLAP_SCHEDULES))
    for field, values in enumerate((set(SCHEDULES), set(DISPATCHERS), {0, 1, 2, 3}, *[{False, True}] * 5)):
        assert {key[field] for key in seen} == values


def _orders_of(schedule: str, p: int, n: int) -> list[list]:
    """The steps of ``schedule``'s orders on p GPUs for n micro-batches, each GPU's a list to break: a step the
    kind number, stage and micro-batch of an action, or two such, a pair."""
    steps: list[list] = [[] for _ in range(p)]
    for gpu, *step in zip(*(part.tolist() for part in order_parts(EnvParams(schedule=schedule, num_gpus=p, n=n))[:4])):
        steps[gpu].append(tuple(step))
    return steps


def _parts_of(steps: list[list]) -> np.ndarray:
    """``order_parts``'s array of the orders ``steps`` (``_orders_of``'s)."""
    rows, second = [], []
    for gpu, order in enumerate(steps):
        for step in order:
            pair = isinstance(step[0], tuple)
            for k, part in enumerate(step if pair else (step,)):
                rows.append((gpu, *part))
                second.append(k == 1)
    return np.vstack([np.array(rows, dtype=np.int64).T, np.array(second, dtype=np.int64)])


@pytest.mark.parametrize("broken, message", [
    (lambda o: o[0].__setitem__(0, (_K[TaskKind.GRAD_SYNC], 0, 0)), "the orders of 1f1b run a part of kind number "
     f"{_K[TaskKind.GRAD_SYNC]} (grad_sync): an order runs forwards, backwards and their input and weight gradients "
     "only"),
    (lambda o: o[0].__setitem__(0, (100_000, 0, 0)), "the orders of 1f1b run a part of kind number 100000: an order "
     "runs forwards, backwards and their input and weight gradients only"),
    (lambda o: o[0].__setitem__(0, (o[0][0][0], 0, 4)), "the orders of 1f1b run 0F4, beyond its 2 stages and 4 "
                                                         "micro-batches"),
    (lambda o: o[0].__setitem__(0, (o[0][0][0], 1, 0)), "GPU 0 runs 1F0, but stage 1 lives on GPU 1"),
    (lambda o: o[1].__setitem__(o[1].index((_K[B], 1, 3)), (_K[F], 1, 0)), "1F0 appears twice in the orders of 1f1b"),
    (lambda o: o[0].__setitem__(o[0].index((_K[F], 0, 2)), (_K[W], 0, 2)), "the orders of 1f1b never run 0F2"),
    (lambda o: o[1].__setitem__(o[1].index((_K[B], 1, 1)), (_K[W], 1, 1)), "the orders of 1f1b never run 1B1"),
    (lambda o: o[1].__setitem__(o[1].index((_K[B], 1, 1)), (_K[I], 1, 1)),
     "the orders of 1f1b split 1I1 but never run its W"),
    (lambda o: o[1].__setitem__(slice(0, 2), [((_K[F], 1, 0), (_K[B], 1, 0))]), "1F0 of 1f1b would wait for its own "
                                                                              "task"),
])
def test_broken_orders_are_named(monkeypatch, broken, message):
    """Orders that run a part of no part's kind, beyond the graph, on another stage's GPU, twice, or never, or a
    pair waiting for itself: a ``ScheduleError`` naming the part."""
    steps = _orders_of("1f1b", 2, 4)
    broken(steps)
    monkeypatch.setattr(taskgraph, "order_parts", lambda params: _parts_of(steps))
    with pytest.raises(ScheduleError) as raised:
        _structure_of(EnvParams(schedule="1f1b", num_gpus=2, n=4))  # uncached: built from these orders
    assert str(raised.value) == message


@pytest.mark.parametrize("kept_tasks", [taskgraph.KEPT_TASKS, 600])
def test_structures_asked_by_threads_at_once(monkeypatch, kept_tasks):
    """Threads asking at once for more structures than are kept (``STRUCTURES_KEPT``; and, with 600, for more tasks
    than are kept, ``KEPT_TASKS``), the interpreter switching between them every microsecond: each gets its own
    structure, and none an error."""
    monkeypatch.setattr(taskgraph, "KEPT_TASKS", kept_tasks)
    environments = [EnvParams(n=n, num_gpus=p) for n in range(1, 25) for p in range(1, 5)]
    assert len(environments) > taskgraph.STRUCTURES_KEPT
    expected = [graph_structure(params).columns.tobytes() for params in environments]
    errors: list[Exception] = []
    wrong: list[int] = []

    def ask(first: int) -> None:
        for k in range(first, first + 400):
            i = k % len(environments)
            try:
                if graph_structure(environments[i]).columns.tobytes() != expected[i]:
                    wrong.append(i)
            except Exception as error:  # noqa: BLE001  # what a race raises, counted
                errors.append(error)

    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=ask, args=(17 * k,)) for k in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switching)
    assert not errors and not wrong, (errors[:3], wrong[:3])


def test_emptied_caches_let_everything_go_and_compute_it_again():
    """``empty_caches``: every cache of structures and environments holds nothing after it, what it held is freed, and
    the next call computes the same arrays from nothing."""
    params = EnvParams(num_gpus=4, n=12, fwd_len=1.7)
    before = [array.tobytes() for array in graph_arrays(params)]
    simulate_figures(params, [Policy()])
    _memory_jobs(params)
    gone = weakref.ref(graph_structure(params).columns)
    taskgraph.empty_caches()
    gc.collect()
    assert gone() is None
    for cache in (graph_structure, _draws, _memory_jobs, _work_of, graph_arrays, _dispatch_arguments):
        assert cache.kept().values == 0, cache.__name__
    assert [array.tobytes() for array in graph_arrays(params)] == before
    assert graph_structure.kept().values == 1


def test_caches_keep_at_most_their_tasks(monkeypatch):
    """Environments of more tasks in all than a cache keeps (``KEPT_TASKS``, here 5,000): every cache of an
    environment's values holds no more tasks (the last computed, whatever its size), gives what a new computation
    gives, and frees what it let go."""
    monkeypatch.setattr(taskgraph, "KEPT_TASKS", 5_000)
    environments = [EnvParams(num_gpus=4, n=n, fwd_len=1.0 + n / 100) for n in range(40, 400, 24)]
    gone = weakref.ref(graph_structure(environments[0]).columns)
    caches = (graph_structure, _draws, _memory_jobs, _work_of, graph_arrays, _dispatch_arguments)
    for params in environments:
        simulate_figures(params, [Policy()])
        task_lengths(replace(params, compute_jitter=0.1))
        _memory_jobs(params)
        for cache in caches:
            assert cache.kept().tasks <= max(5_000, estimated_tasks(params)), cache.__name__
        assert graph_structure(params) is graph_structure(params)  # the last, kept
        assert graph_structure(params).columns.tobytes() == _structure_of(params).columns.tobytes()
        assert graph_work(params).floats.tobytes() == _work_of.__wrapped__(params, None).floats.tobytes()
    assert estimated_tasks(environments[-1]) > 5_000  # one environment beyond what is kept: kept all the same
    gc.collect()
    assert gone() is None
