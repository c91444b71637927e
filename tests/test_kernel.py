"""The compiled kernel against the same functions run as plain Python, and its compile-once behaviour."""

import json
import multiprocessing
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from test_invariants import random_case

from pipeline_sim import engine, kernel, simulate
from pipeline_sim.metrics import schedule_metrics
from pipeline_sim.model import DEFAULT_POLICY, EnvParams

# Plain Python runs the kernel about a hundred times slower: a sample of cases, every schedule among them.
PURE_CASES = [random_case(random.Random(7000 + seed)) for seed in range(24)]

_PURE_RUN = """
import json, random, sys
sys.path[:0] = [{root!r}, {tests!r}]
from test_invariants import random_case
from pipeline_sim import kernel, simulate
assert not hasattr(kernel.simulate, 'py_func')  # plain Python, not a compiled dispatcher
out = []
for seed in range(24):
    params, policy = random_case(random.Random(7000 + seed))
    s = simulate(params, policy)
    out.append([s.completion_time] + [[t.ready, t.start, t.end, t.throttled_time, t.segments] for t in s.tasks])
print(json.dumps(out))
"""


def test_pure_python_run_gives_the_same_bits():
    assert len({params.schedule for params, _ in PURE_CASES}) == 6
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    code = _PURE_RUN.format(root=str(ROOT), tests=str(ROOT / "tests"))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    pure = json.loads(result.stdout)
    for (params, policy), expected in zip(PURE_CASES, pure):
        s = simulate(params, policy)
        compiled = [s.completion_time] + [[t.ready, t.start, t.end, t.throttled_time, [list(x) for x in t.segments]]
                                          for t in s.tasks]
        assert compiled == expected, (params, policy)  # JSON keeps every bit of a float


_HEAP_RUN = """
import json, random, sys
sys.path[:0] = [{root!r}]
import numpy as np
from pipeline_sim.kernel.events import heap_pop, heap_remove, heap_set
from pipeline_sim.kernel.state import HEAP_SIZE
rng = random.Random(5)
problems, pops = [], 0
for trial in range(200):
    tasks = rng.randint(1, 40)
    HT, HI, C = np.empty(tasks), np.empty((3, tasks), dtype=np.int64), np.zeros(7, dtype=np.int64)
    HI[2] = -1
    expected, number = {{}}, 0  # task: (time, number), what the heap should hold
    for _ in range(rng.randint(1, 200)):
        task, action = rng.randrange(tasks), rng.random()
        if action < 0.6:
            number += 1
            at = float(rng.randint(0, 8))  # few times: many ties, ordered by number
            heap_set(HT, HI, C, at, number, task)
            expected[task] = (at, number)
        elif action < 0.8:
            heap_remove(HT, HI, C, task)
            expected.pop(task, None)
        elif expected:
            first = min(expected, key=expected.get)
            if (HT[0], HI[0, 0], HI[1, 0]) != (*expected.pop(first), first):
                problems.append(f"trial {{trial}}: popped task {{HI[1, 0]}}, expected {{first}}")
            heap_pop(HT, HI, C)
            pops += 1
        size = C[HEAP_SIZE]
        held = {{int(HI[1, k]): (float(HT[k]), int(HI[0, k])) for k in range(size)}}
        if held != expected or any(HI[2, HI[1, k]] != k for k in range(size)) or sum(HI[2] >= 0) != size:
            problems.append(f"trial {{trial}}: the heap holds {{held}}, expected {{expected}}")
print(json.dumps([problems[:3], pops]))
"""


def test_the_heap_of_projected_ends_pops_in_order_and_holds_one_entry_a_task():
    """Random sets, moves and removals of tasks' projected ends, run as plain Python (the heap's functions are called
    only from compiled code): each pop is the earliest end, equal ends by sequence number, and every task's recorded
    place is its entry's."""
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    result = subprocess.run([sys.executable, "-c", _HEAP_RUN.format(root=str(ROOT))], env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    problems, pops = json.loads(result.stdout)
    assert problems == [] and pops > 1000


@pytest.mark.parametrize("seed", range(200))
def test_figures_of_many_policies_equal_one_simulation_each(seed):
    rng = random.Random(9000 + seed)
    cases = [random_case(rng) for _ in range(3)]
    params = cases[0][0]
    policies = [policy for _, policy in cases]
    figures = engine.simulate_figures(params, policies)
    for policy, row in zip(policies, figures):
        metrics = schedule_metrics(simulate(params, policy))
        p = params.num_gpus
        assert row[0] == metrics.completion_time and row[1] == metrics.throttled_time
        assert row[2] == metrics.throttled_transfers
        assert tuple(row[3:3 + p]) == metrics.busy_time and tuple(row[3 + p:3 + 2 * p]) == metrics.spans
        assert tuple(row[3 + 2 * p:]) == metrics.gpu_peak_activations


def test_peaks_are_the_highest_step_of_the_activation_curve():
    for seed in range(100):
        params, policy = random_case(random.Random(11000 + seed))
        s = simulate(params, policy)
        curve = [max(level for _, level in steps) for steps in s.activation_steps()]
        assert tuple(curve) == schedule_metrics(s).gpu_peak_activations


def test_the_first_compile_is_announced_once(tmp_path, monkeypatch, capsys):
    """Without a stamp of a completed compile the command line says it compiles; afterwards it says nothing."""
    from pipeline_sim.cli.common import ready_kernel

    monkeypatch.setattr(engine, "_stamp_path", lambda: tmp_path / "stamp")
    # a compile without a stamp drops the cache it finds: an empty folder's, not the package's, which every later
    # test's scripts load (they would each compile the kernel again, half a minute each)
    monkeypatch.setattr(engine.compile_cache, "cache_folder", lambda module: tmp_path)
    assert not engine.kernel_is_compiled()
    ready_kernel()
    assert "compiling the simulation kernel, once per installation, about" in capsys.readouterr().err
    assert engine.kernel_is_compiled()
    ready_kernel()
    assert capsys.readouterr().err == ""
    ready_kernel(episodes=True)  # the step-by-step entry points: announced once too
    assert "compiling the step-by-step kernel of learned and look-ahead dispatch, once per installation" in \
        capsys.readouterr().err
    assert engine.kernel_is_compiled(("episodes",))
    ready_kernel(episodes=True)
    assert capsys.readouterr().err == ""
    # one part compiled before: what a run adds is the rest, which takes less than a first compile
    (tmp_path / "stamp").write_text(f"{engine._kernel_stamp()}\nfigures")
    ready_kernel(parts=("records",))
    assert f"compiling the rest of the simulation kernel, once per installation, about {engine.REST_SECONDS} s" in \
        capsys.readouterr().err
    assert engine.kernel_is_compiled()
    (tmp_path / "stamp").write_text("an older kernel")
    assert not engine.kernel_is_compiled()


def test_a_compile_estimate_says_when_the_machine_is_busy(monkeypatch):
    """The estimate is an idle machine's: where other work holds every core, the line says so rather than promise
    a third of the wait."""
    import os

    from pipeline_sim.cli.common import busy_note

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (3.62, 3.0, 3.0))
    assert busy_note() == " on an idle machine; this one is busy (load 3.6 on 2 cores)"
    monkeypatch.setattr(os, "getloadavg", lambda: (1.2, 1.0, 1.0))
    assert busy_note() == ""


def test_the_process_compiling_beside_compiles_what_the_run_calls(tmp_path):
    """What the second process of a first compile writes is each function as the run calls it: a first compile
    into an empty cache, the run and the process beside it together, leaves one signature of each in the cache (a
    signature of the process's own would be a second), and the run compiled each of them once at most."""
    code = """
from pipeline_sim import engine, kernel
engine.compile_kernel()
functions = (kernel.simulate_policies, kernel.simulate, kernel.loop.advance, kernel.lower_bound, kernel.memory_bound,
             *kernel.loop.SHARED_COMPILE, *kernel.jit.AT_ADDRESS)
print([(function.py_func.__name__, len(function._cache._cache_file._load_index()),
        sum(function.stats.cache_misses.values())) for function in functions])
"""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    for name, signatures, compiled in eval(run.stdout):
        assert signatures == 1 and compiled <= 1, name


def _fails(parts, claims, parent):
    raise SystemExit(3)


def _claims_all_then_fails(parts, claims, parent):
    for name in [*(function.py_func.__name__ for function in kernel.loop.SHARED_COMPILE), "lower_bound",
                 "memory_bound", "advance", "simulate_policies", "simulate"]:
        (Path(claims) / name).touch()
    raise SystemExit(3)


@pytest.mark.parametrize("beside", [_fails, _claims_all_then_fails, None],
                         ids=["fails at once", "claims everything, writes nothing", "never starts"])
def test_a_failed_process_beside_leaves_the_compile_to_the_run(tmp_path, monkeypatch, beside):
    """A process beside that fails, even one that claimed every function first, or none at all: the run waits
    for it no longer than it lives, and compiles the rest itself."""
    monkeypatch.setattr(engine, "_stamp_path", lambda: tmp_path / "stamp")
    monkeypatch.setattr(engine.compile_cache, "cache_folder", lambda module: tmp_path)
    monkeypatch.setattr(engine, "BESIDE_SECONDS", 600)

    def start(parts, claims):
        if beside is None:
            return None
        process = multiprocessing.get_context("fork").Process(target=beside, args=(parts, str(claims), os.getpid()))
        process.start()
        return process
    monkeypatch.setattr(engine, "_compile_beside", start)
    started = time.monotonic()
    engine.compile_kernel()
    assert engine.kernel_is_compiled()
    assert time.monotonic() - started < 300  # not the wait for a process beside that has ended



_LARGE_RUN = """
import json, sys
sys.path[:0] = [{root!r}]
from pipeline_sim import EnvParams, kernel
from pipeline_sim.engine import graph_arrays, simulate_figures
from pipeline_sim.kernel.jit import PREFETCH_TASKS
from pipeline_sim.model import DEFAULT_POLICY
assert not hasattr(kernel.simulate_policies, 'py_func')  # plain Python, not a compiled dispatcher
params = EnvParams(num_gpus=4, n=2048, compute_jitter=0.2, seed=3)
assert len(graph_arrays(params).gpu) >= PREFETCH_TASKS
print(json.dumps(simulate_figures(params, [DEFAULT_POLICY])[0].tolist()))
"""


def test_a_run_that_fetches_rows_ahead_gives_the_plain_pythons_bits():
    """A run of PREFETCH_TASKS tasks or more, where the compiled loop asks for the rows of what each task releases
    before it ends (plain Python asks for nothing): the same figures to the bit."""
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    result = subprocess.run([sys.executable, "-c", _LARGE_RUN.format(root=str(ROOT))], env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    params = EnvParams(num_gpus=4, n=2048, compute_jitter=0.2, seed=3)
    assert engine.simulate_figures(params, [DEFAULT_POLICY])[0].tolist() == json.loads(result.stdout)


def test_a_room_used_before_gives_each_simulation_what_a_new_one_gives():
    """The state taken from a room that other simulations filled (larger ones, other graphs, garbage), or from one
    too small, which the kernel replaces: every policy's figures to the bit as from a new room; a room large enough
    is the one used, and the engine keeps the room of a simulation of ``ROOM_KEPT_TASKS`` tasks or more."""
    import numpy as np

    from pipeline_sim.engine import ROOM_KEPT_TASKS, graph_arrays, in_unit, policy_arrays, task_lengths
    from pipeline_sim.model import Policy

    policies = (DEFAULT_POLICY, Policy(priorities={"fwd_prop": 0.6, "grad_prop": 0.1, "grad_sync": 0.3}),
                Policy(exclusive_tiers={"grad_sync": "a"}))
    tiers, priorities = policy_arrays(policies)

    def figures(params, room):
        arrays = graph_arrays(params)
        arguments = arrays.kernel_arguments(in_unit(task_lengths(params), params.time_unit), params)
        return kernel.simulate_policies(*arguments, arrays.rises, engine.activation_units(params), tiers, priorities,
                                        params.ingress_capacity, room)
    rng = random.Random(11)
    cases = [random_case(rng)[0] for _ in range(30)]
    garbage = np.arange(2_000_000, dtype=np.int64) * 7919
    for params in cases:
        fresh, room = figures(params, np.empty(0, dtype=np.int64))
        assert len(room) > 0
        for given in (garbage.copy(), room[: len(room) // 2].copy(), room):
            out, used = figures(params, given)
            assert out.tobytes() == fresh.tobytes(), params
            assert (used is given) == (len(given) >= len(room))
    large = EnvParams(num_gpus=4, n=ROOM_KEPT_TASKS // 16 + 8)
    assert len(graph_arrays(large).gpu) >= ROOM_KEPT_TASKS
    first = engine.simulate_figures(large, policies)
    kept = engine._kept_room
    assert len(kept) > 0 and engine.simulate_figures(large, policies).tobytes() == first.tobytes()
    assert engine._kept_room is kept  # the same room, used again
    small = cases[0]  # fewer tasks, in the room kept
    assert engine.simulate_figures(small, policies).tobytes() == figures(small, np.empty(0, np.int64))[0].tobytes()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise's huge pages are Linux's")
def test_large_state_asks_for_huge_pages_and_the_run_is_unchanged():
    """The kernel calls the C library's madvise from compiled code on state of 32 MiB or more: the call is accepted,
    and a run whose state is advised gives what the same environment gives through every other entry point."""
    import numba
    import numpy as np

    from pipeline_sim.engine import simulate_figures
    from pipeline_sim.kernel.jit import HUGE_PAGE_BYTES, HUGE_PAGES, MADV_HUGEPAGE, _madvise
    from pipeline_sim.model import DEFAULT_POLICY, EnvParams

    assert HUGE_PAGES

    @numba.njit
    def advise(array):
        return _madvise(np.int64(array.ctypes.data), np.int64(array.nbytes), np.int32(MADV_HUGEPAGE))

    block = np.empty(HUGE_PAGE_BYTES // 8 + 2 ** 19)  # page-aligned, as the C library maps a block this large
    assert advise(block[(-block.ctypes.data % 4096) // 8:][: 2 ** 22]) == 0
    params = EnvParams(num_gpus=8, n=1536)  # 58,368 tasks: its 14 floats a task alone come to 6.5 MB; 8 x more below
    large = EnvParams(num_gpus=8, n=12288)  # 466,944 tasks, 52 MB of floats: advised
    for environment in (params, large):
        figures = simulate_figures(environment, [DEFAULT_POLICY])[0]
        assert figures[0] == simulate(environment, DEFAULT_POLICY).completion_time
