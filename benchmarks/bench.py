"""Speed and memory of the simulator, the sweep and the figures, printed as a table and as JSON.

    python benchmarks/bench.py              # everything (about nine minutes on 2 cores)
    python benchmarks/bench.py --quick      # smaller samples, no first compile, a 100,000-simulation memory sweep
    python benchmarks/bench.py --large      # the memory sweep at 5,003,350 simulations (about 80 more minutes)
    python benchmarks/bench.py --json out.json
    python benchmarks/bench.py --hindsight  # only dispatch = hindsight's seconds per draw
    python benchmarks/bench.py --moe        # only a DeepSeek-V3 iteration at its published layout
    python benchmarks/bench.py --replay     # only reading and replaying a committed PyTorch trace
    python benchmarks/bench.py --lookahead  # only dispatch = lookahead's time per iteration
    python benchmarks/bench.py --learned    # only a learned dispatcher's iteration, played and stepped from Python
    python benchmarks/bench.py --doubling   # only graph construction against the kernel (about a minute)
    python benchmarks/bench.py --instructions  # only the kernel's instructions and cache misses per task, callgrind

Measures: simulations per second on one core (default environment, all 121 policies
of the sweep: shared, exclusive and priority-0 layers), compiled and as plain Python
(the same kernel with NUMBA_DISABLE_JIT=1), and the full-record API; the same for each
schedule (n=8, or 10 for dualpipe-v, on 4 GPUs); a learned dispatcher's iteration played inside the compiled loop
against the same decisions stepped from Python (``--learned``); time per simulated task for
n in {8, 32, 128, 512} x num_gpus in {4, 16, 64} (144 to 160,000 tasks); the first simulation of an environment
whose structure is known against a repeat (1F1B and ZB-H1, 16 and 64 GPUs, n 64 and 256); graph construction
against the kernel per task (``--doubling``): the first simulation of 201,696 tasks, every schedule from 4 to 64
GPUs and 8 to 1,024 micro-batches, and 1F1B per doubling of tasks up to 1,306,624 (GPUs and micro-batches doubled in
turn) and to 1,245,184 (8 GPUs), each in a fresh process, a size's first build apart from its later ones; the example
config's sweep with one worker and with every core; the example pipeline end to end,
split into start-up, kernel load, simulations and figures; CPU time per heatmap; a noisy
sweep (20 samples) against a noise-free one as large; the first compile of the kernel
into an empty cache, before a first sweep, before a first chart and then of the learned and look-ahead
dispatchers' step-by-step entry points, wall and CPU seconds; peak memory
(proportional set size, summed over the processes) of a 1,000,000-simulation sweep and of drawing its heatmaps,
against a stated bound; with the [cluster] extra, a 200,000-simulation sweep on the process pool and on a local Dask
cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline_sim import SCHEDULES, EnvParams, Policy, simulate  # noqa: E402
from pipeline_sim.allocator import keep_freed_memory  # noqa: E402
from pipeline_sim.config import EnvironmentGrid  # noqa: E402
from pipeline_sim.engine import compile_kernel, dispatch_arguments, graph_arrays, simulate_figures  # noqa: E402
from pipeline_sim.files import OutputError, atomic_output, output_target  # noqa: E402
from pipeline_sim.learned import LearnedPolicy, play  # noqa: E402
from pipeline_sim.model import DISPATCHERS, ParameterError  # noqa: E402
from pipeline_sim.scenarios import policy_grid  # noqa: E402
from pipeline_sim.sweep import SweepPlan, run_sweep  # noqa: E402
from pipeline_sim.taskgraph import empty_caches, estimated_tasks, task_lengths  # noqa: E402

keep_freed_memory()  # as every command does: what is measured is what a run of the command line gets

SIZES_N = (8, 32, 128, 512)
SIZES_GPUS = (4, 16, 64)
SCALING_POLICY = Policy(priorities={"fwd_prop": 0.5, "grad_prop": 0.3, "grad_sync": 0.2})
#: Drawing the heatmaps of MEMORY_GRID's 1,000,000-row CSV must stay under this (MB, all processes).
PLOT_MEMORY_BOUND_MB = 600
# 827 x 10 environments x 121 policies = 1,000,670 simulations of the default size (827 x 121 with --quick).
MEMORY_GRID = {"bwd_len": {"start": 1.0, "stop": 9.26, "step": 0.01},
               "fwd_len": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9]}
MEMORY_GRID_QUICK = {"bwd_len": {"start": 1.0, "stop": 9.26, "step": 0.01}}
# 827 x 50 environments x 121 policies = 5,003,350 simulations (--large).
MEMORY_GRID_LARGE = {"bwd_len": {"start": 1.0, "stop": 9.26, "step": 0.01},
                     "fwd_len": {"start": 1.0, "stop": 5.9, "step": 0.1}}


def sims_per_second(seconds: float, params: EnvParams | None = None) -> dict:
    """The sweep's path: every policy of the grid in one kernel call, figures only."""
    params, policies = params or EnvParams(), policy_grid(0.1)
    simulate_figures(params, policies)  # warm caches
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        simulate_figures(params, policies)
        count += len(policies)
    elapsed = time.perf_counter() - start
    tasks = len(graph_arrays(params).gpu)
    return {"simulations": count, "seconds": elapsed, "sims_per_second": count / elapsed, "tasks": tasks}


def api_sims_per_second(seconds: float) -> float:
    """``simulate``: one call per policy, every task's timeline and segments returned as Python objects."""
    params, policies = EnvParams(), policy_grid(0.1)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for policy in policies:
            simulate(params, policy)
        count += len(policies)
    return count / (time.perf_counter() - start)


_PURE = """
import sys, time
sys.path.insert(0, {root!r})
from pipeline_sim import EnvParams
from pipeline_sim.engine import simulate_figures
from pipeline_sim.scenarios import policy_grid
policies = policy_grid(0.1)
start = time.perf_counter()
simulate_figures(EnvParams(), policies)
print(len(policies) / (time.perf_counter() - start))
"""


def pure_python_sims_per_second() -> float:
    """The same kernel run as plain Python (NUMBA_DISABLE_JIT=1), all 121 policies once."""
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    result = subprocess.run([sys.executable, "-c", _PURE.format(root=str(ROOT))], env=env, capture_output=True,
                            text=True, check=True)
    return float(result.stdout)


def per_schedule(seconds: float) -> list[dict]:
    rows = []
    for name in SCHEDULES:
        params = EnvParams(schedule=name, n=10 if name == "dualpipe-v" else 8)
        rows.append({"schedule": name, "n": params.n, **sims_per_second(seconds, params)})
    return rows


def dispatched(seconds: float, rounds: int = 3) -> list[dict]:
    """Per schedule and dispatcher, simulations per second against the static order of the same environment:
    runs alternate (static, rule, static, rule, ...) and each side keeps its median."""
    rows = []
    for schedule in ("1f1b", "zb-h1", "zb-v"):
        static = EnvParams(schedule=schedule, compute_jitter=0.2)
        for rule in DISPATCHERS[1:]:
            params = EnvParams(schedule=schedule, compute_jitter=0.2, dispatch=rule)
            pairs = [(sims_per_second(seconds, static)["sims_per_second"],
                      sims_per_second(seconds, params)["sims_per_second"]) for _ in range(rounds)]
            base, ruled = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
            rows.append({"schedule": schedule, "dispatch": rule, "static_sims_per_second": base,
                         "sims_per_second": ruled, "static_over_dispatched": base / ruled})
    return rows


def random_network(params: EnvParams, rng: np.random.Generator) -> LearnedPolicy:
    """A 64 x 64 tanh network of random weights for ``params``' episodes, 32-bit floats as training gives them."""
    from pipeline_sim.episode import Episode
    fields, actions = Episode.layout(params)
    shapes = ((len(fields), 64), (64, 64), (64, len(actions)))
    return LearnedPolicy(tuple(((rng.normal(size=shape) / np.sqrt(shape[0])).astype(np.float32).astype(np.float64),
                                np.zeros(shape[1])) for shape in shapes), fields, actions, {})


def learned_cost(rounds: int = 5, draws: int = 20, repeats: int = 10) -> dict:
    """A learned dispatcher's iteration (ZB-H1, n = 8, 4 GPUs, 20% jitter, a 64 x 64 network of random weights):
    milliseconds of this process's CPU time played inside the compiled loop, and stepped from Python
    (``Episode.step`` with ``LearnedPolicy.act`` at each decision that has a choice: the same decisions). Runs
    alternate (played, stepped, ...) over the same ``draws`` draws, played ``repeats`` times over; each side keeps
    its median over ``rounds`` rounds. CPU time, not wall: on a shared machine another process's turn on the core
    would land on either side at random."""
    from pipeline_sim.episode import Episode

    params = EnvParams(n=8, num_gpus=4, schedule="zb-h1", compute_jitter=0.2, comm_jitter=0.2)
    network = random_network(params, np.random.default_rng(0))
    episode = Episode(params, Policy())

    def stepped(sample: int) -> None:
        episode.reset(sample)
        while not episode.done:
            mask = episode.mask()
            allowed = np.flatnonzero(mask)
            episode.step(int(allowed[0]) if len(allowed) == 1 else network.act(episode.observe(), mask))

    stepped(0)  # loaded
    played_ms, stepped_ms = [], []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(repeats):
            for sample in range(draws):
                play(episode, network, sample)
        played_ms.append((time.process_time() - started) / (repeats * draws) * 1e3)
        started = time.process_time()
        for sample in range(draws):
            stepped(sample)
        stepped_ms.append((time.process_time() - started) / draws * 1e3)
    played, stepped_median = statistics.median(played_ms), statistics.median(stepped_ms)
    return {"played_ms": played, "stepped_ms": stepped_median, "stepped_over_played": stepped_median / played}


def decisions_per_second(seconds: float) -> list[dict]:
    """Dispatch decisions per second on one core, a random masked choice each: the episode alone (the kernel
    stopping and continuing), and through the Gymnasium environment (observations too) when the [rl] extra is
    installed."""
    from pipeline_sim.episode import Episode
    rows = []
    for n in (8, 16, 64):
        params = EnvParams(n=n, num_gpus=4, schedule="zb-h1", compute_jitter=0.2, comm_jitter=0.2)
        episode, rng = Episode(params, Policy()), np.random.default_rng(0)
        count, start, sample = 0, time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            episode.reset(sample)
            sample += 1
            while not episode.done:
                episode.step(int(rng.choice(np.flatnonzero(episode.mask()))))
                count += 1
        row = {"n": n, "episode": count / (time.perf_counter() - start)}
        # a learned dispatcher's play: a 64 x 64 tanh network choosing at every decision that has a choice
        network = random_network(params, rng)
        played, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            play(episode, network, played)
            played += 1
        row["learned"] = played / (time.perf_counter() - start)
        try:
            from pipeline_sim.rl import PipelineDispatchEnv
        except ImportError:
            rows.append(row)
            continue
        env = PipelineDispatchEnv(params, Policy())
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            env.reset()
            done = False
            while not done:
                done = env.step(int(rng.choice(np.flatnonzero(env.action_masks()))))[2]
                count += 1
        rows.append({**row, "environment": count / (time.perf_counter() - start)})
    return rows


def scaling(budget: float) -> list[dict]:
    rows = []
    for num_gpus in SIZES_GPUS:
        for n in SIZES_N:
            params = EnvParams(n=n, num_gpus=num_gpus)
            runs, elapsed, tasks = 0, 0.0, 0
            tasks = len(graph_arrays(params).gpu)
            while runs == 0 or elapsed < budget:
                start = time.perf_counter()
                simulate_figures(params, [SCALING_POLICY])
                elapsed += time.perf_counter() - start
                runs += 1
            per_sim = elapsed / runs
            rows.append({"n": n, "num_gpus": num_gpus, "tasks": tasks, "runs": runs,
                         "ms_per_sim": per_sim * 1e3, "us_per_task": per_sim / tasks * 1e6})
    return rows


def first_of_structure(rounds: int = 3) -> list[dict]:
    """Per task, the first ``simulate_figures`` of an environment whose structure is known (another ``fwd_len``: new
    lengths, nothing else) against a repeat of the same call, the kernel's own time: what the planner pays per
    environment on top of the kernel. Medians of ``rounds`` environments."""
    rows = []
    for schedule in ("1f1b", "zb-h1"):
        for num_gpus in (16, 64):
            for n in (64, 256):
                known = EnvParams(schedule=schedule, num_gpus=num_gpus, n=n)
                simulate_figures(known, [SCALING_POLICY])  # the structure cached
                first, repeat = [], []
                for k in range(rounds):
                    params = replace(known, fwd_len=1.0 + (k + 1) / 64)
                    for times in (first, repeat):
                        start = time.perf_counter()
                        simulate_figures(params, [SCALING_POLICY])
                        times.append(time.perf_counter() - start)
                tasks = len(graph_arrays(known).gpu)
                rows.append({"schedule": schedule, "num_gpus": num_gpus, "n": n, "tasks": tasks,
                             "first_us_per_task": statistics.median(first) / tasks * 1e6,
                             "repeat_us_per_task": statistics.median(repeat) / tasks * 1e6,
                             "first_over_repeat": statistics.median(first) / statistics.median(repeat)})
    return rows


#: Pipeline degree and micro-batches of the doubling line: each row twice the tasks of the one before (1F1B, about
#: 4 p n tasks), up to a million.
DOUBLINGS = ((8, 128), (16, 128), (16, 256), (32, 256), (32, 512), (64, 512), (64, 1024), (128, 1024),
             (128, 2048))
#: The same with the GPUs held at 8, micro-batches doubling from 128 to 32,768 (4,864 to 1,245,184 tasks): the cost
#: of more tasks apart from that of more GPUs, which a longer pipeline adds to each task (more GPUs coupled by an
#: event, a deeper heap).
MICROBATCH_DOUBLINGS = tuple((8, 128 * 2 ** k) for k in range(9))


def first_and_repeat(params: EnvParams, rounds: int = 1) -> dict:
    """``params`` built from nothing (``taskgraph.empty_caches``, which frees the structure and environment built
    before, as a sweep's full caches let one go for each they take; then ``graph_arrays``, the noise-free lengths
    and the dispatch arguments: all that a simulation reads, its graph built from the orders), then its first
    ``simulate_figures``, then a repeat of the same call (the kernel alone, its state's memory reused): per task,
    medians over ``rounds`` such builds. ``first_seconds``: the first simulation from nothing, its graph included,
    in seconds; ``tasks``: those of ``params``; ``graph_us_per_task``: the median build; ``first_build_us_per_task``
    and ``later_builds_us_per_task``: the first build (in memory the process never had, when ``params`` is larger
    than all it built before) and the median of the others (in the memory the first freed)."""
    built, first, repeat = [], [], []
    for _ in range(rounds):
        start = time.perf_counter()
        empty_caches()
        graph_arrays(params)
        task_lengths(params)
        dispatch_arguments(params)
        built.append(time.perf_counter() - start)
        for times in (first, repeat):
            start = time.perf_counter()
            simulate_figures(params, [SCALING_POLICY])
            times.append(time.perf_counter() - start)
    tasks = len(graph_arrays(params).gpu)
    return {"tasks": tasks, "first_seconds": statistics.median(b + f for b, f in zip(built, first)),
            "graph_us_per_task": statistics.median(built) / tasks * 1e6,
            "first_build_us_per_task": built[0] / tasks * 1e6,
            "later_builds_us_per_task": statistics.median(built[1:] or built) / tasks * 1e6,
            "kernel_us_per_task": statistics.median(repeat) / tasks * 1e6}


def rounds_of(params: EnvParams) -> int:
    """How many times ``first_and_repeat`` builds ``params``: 101 below 10,000 tasks, where a build takes
    microseconds and a process's first ten or so take up to 1.5 times as long as later ones (its Python code not
    yet specialized by the interpreter, nor in the CPU's caches), so that they do not decide the median; else four,
    of which the first builds in memory the process never had (a row has more tasks than the one before), faulting
    its pages in, and the other three in the memory the first freed, as a sweep's or the planner's later
    environments do (``allocator.keep_freed_memory``; blocks of more than 32 MiB excepted, which the C library maps
    anew)."""
    return 101 if estimated_tasks(params) < 10_000 else 4


def warm_up() -> None:
    """Build and simulate structures of a size no row measures (2 GPUs, 2 to 17 micro-batches, every schedule that
    runs there), unmeasured: a process's first structures take up to twice as long, its Python code not yet
    specialized by the interpreter (which it does after a few calls), nor in the CPU's caches. The rows measure
    construction, as the kernel's repeat measures the kernel, not a process starting."""
    for schedule in SCHEDULES:
        for n in range(2, 18):
            try:
                params = EnvParams(schedule=schedule, num_gpus=2, n=n)
            except ParameterError:
                continue
            simulate_figures(params, [SCALING_POLICY])


def doubling(sizes: tuple[tuple[int, int], ...] = DOUBLINGS) -> list[dict]:
    """Per task, for each doubling of the tasks (1F1B; GPUs and micro-batches of ``sizes``): graph construction
    against the kernel (medians of ``rounds_of`` builds)."""
    rows = []
    for num_gpus, n in sizes:
        params = EnvParams(num_gpus=num_gpus, n=n)
        rows.append({"num_gpus": num_gpus, "n": n, **first_and_repeat(params, rounds_of(params))})
    return rows


#: GPUs and micro-batches of the per-schedule line: the corners of 4 to 64 GPUs and 8 to 1,024 micro-batches (64
#: GPUs with the fewest micro-batches every schedule runs there) and one size between.
SCHEDULE_SIZES = ((4, 8), (4, 1024), (16, 128), (64, 128), (64, 1024))


def schedule_doubling() -> list[dict]:
    """Per schedule and size of ``SCHEDULE_SIZES``: graph construction against the kernel, per task (medians of
    ``rounds_of`` builds), listed by schedule; measured size by size, every schedule's smallest first, so that
    no row is measured in a process that has just built and run one a thousand times larger."""
    rows = []
    for num_gpus, n in SCHEDULE_SIZES:
        for schedule in SCHEDULES:
            params = EnvParams(schedule=schedule, num_gpus=num_gpus, n=n)
            rows.append({"schedule": schedule, "num_gpus": num_gpus, "n": n,
                         **first_and_repeat(params, rounds_of(params))})
    return sorted(rows, key=lambda row: list(SCHEDULES).index(row["schedule"]))


#: The first simulation of about 200,000 tasks: ZB-H1 on 64 GPUs, 528 micro-batches (201,696 tasks).
LARGE_FIRST = EnvParams(schedule="zb-h1", num_gpus=64, n=528)


def sweep_wall_time(workers: int) -> float:
    plan = SweepPlan(EnvironmentGrid.load(ROOT / "configs" / "example.json"))
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        for _ in run_sweep(plan, Path(folder) / "example.csv", workers=workers):
            pass
        return time.perf_counter() - start


_PIPELINE = """
import sys, time
start = time.perf_counter()
sys.path.insert(0, {root!r})
from pathlib import Path

import numpy as np
from pipeline_sim.cli.heatmap import write_heatmaps
from pipeline_sim.config import EnvironmentGrid
from pipeline_sim.engine import compile_kernel
from pipeline_sim.sweep import SweepPlan, run_sweep
imported = time.perf_counter()
compile_kernel()
loaded = time.perf_counter()
plan = SweepPlan(EnvironmentGrid.load(Path({root!r}) / "configs" / "example.json"))
for _ in run_sweep(plan, Path({folder!r}) / "example.csv", workers={workers}):
    pass
simulated = time.perf_counter()
write_heatmaps(Path({folder!r}) / "example.csv", Path({folder!r}) / "figures", workers={workers})
drawn = time.perf_counter()
print(imported - start, loaded - imported, simulated - loaded, drawn - simulated)
"""


def example_pipeline(workers: int) -> dict:
    """``run_full_pipeline.py`` on the example config, wall time, and the same steps timed one by one."""
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        subprocess.run([sys.executable, str(ROOT / "run_full_pipeline.py"), "-c",
                        str(ROOT / "configs" / "example.json"), "--workers", str(workers)],
                       cwd=folder, check=True, capture_output=True)
        wall = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-c", _PIPELINE.format(root=str(ROOT), folder=folder,
                                                                        workers=workers)],
                                check=True, capture_output=True, text=True)
        total = time.perf_counter() - start
    _, load, simulations, figures = map(float, result.stdout.split())  # start-up: interpreter and imports
    return {"wall_seconds": wall, "workers": workers, "start_up": total - load - simulations - figures,
            "kernel_load": load, "simulations": simulations, "figures": figures}


def heatmap_cpu(count: int = 18) -> float:
    """CPU seconds per heatmap of the example config (121 policies), drawn one after another in one process."""
    import pandas as pd

    from pipeline_sim.plotting.heatmap import heatmap_figure

    plan = SweepPlan(EnvironmentGrid.load(ROOT / "configs" / "example.json"))
    with tempfile.TemporaryDirectory() as folder:
        for _ in run_sweep(plan, Path(folder) / "example.csv", workers=1):
            pass
        rows = pd.read_csv(Path(folder) / "example.csv")
        environments = [rows.iloc[i:i + 121].reset_index(drop=True) for i in range(0, len(rows), 121)]
        figure = heatmap_figure(10)
        start = time.process_time()
        for i in range(count):
            figure.draw(environments[i % len(environments)], title=f"environment {i}")
            figure.save(Path(folder) / f"{i}.png")
        return (time.process_time() - start) / count


def first_compile() -> dict:
    """Seconds of the first compile into an empty cache, each in a fresh process: what a first sweep waits for
    (the kernel's ``figures`` part: ``run_full_pipeline.py`` on the example config), what a first chart waits for
    (the ``records`` part: the visualizers), and the learned and look-ahead dispatchers' step-by-step entry points
    after both parts (``episode.compile_episode``), with the CPU seconds of the compiling process and of the one it
    runs beside it on the other core (user and system, the interpreter's start and imports included; for the
    episodes, both parts' compile too), and the load average when each began (a busy machine compiles slower, and a
    second process then has no idle core to use)."""
    result = {}
    for name, parts in (("sweep", ("figures",)), ("chart", ("records",)), ("episodes", None)):
        with tempfile.TemporaryDirectory() as folder:
            env = dict(os.environ, NUMBA_CACHE_DIR=folder)
            before_timed, timed = ("", f"compile_kernel({parts!r})") if parts else \
                ("compile_kernel(); from pipeline_sim.episode import compile_episode; ", "compile_episode()")
            code = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r}); from pipeline_sim.engine import "
                    f"compile_kernel; {before_timed}start = time.perf_counter(); {timed}; "
                    "print(time.perf_counter() - start)")
            load = os.getloadavg()[0]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            result[name] = {"seconds": float(run.stdout), "cpu_seconds": cpu, "load_average": load}
    return result


# 1,653 environments x 121 policies = 200,013 simulations
CLUSTER_GRID = {"bwd_len": {"start": 1.0, "stop": 17.525, "step": 0.01}}


def cluster_overhead(workers: int) -> dict | None:
    """A 200,013-simulation sweep on the process pool and on a local Dask cluster of as many processes (its
    start included), wall time each and their ratio; None without the [cluster] extra."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        return None
    from pipeline_sim.cluster import DaskCluster

    plan = SweepPlan(EnvironmentGrid.from_mapping(CLUSTER_GRID))
    seconds = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in ("pool", "dask"):
            start = time.perf_counter()
            cluster = DaskCluster("local", workers) if name == "dask" else None
            try:
                for _ in run_sweep(plan, Path(folder) / f"{name}.csv", workers=workers, cluster=cluster):
                    pass
            finally:
                if cluster is not None:
                    cluster.close()
            seconds[name] = time.perf_counter() - start
        same = (Path(folder) / "pool.csv").read_bytes() == (Path(folder) / "dask.csv").read_bytes()
    return {"simulations": plan.num_simulations, "workers": workers, "pool_seconds": seconds["pool"],
            "dask_seconds": seconds["dask"], "dask_over_pool": seconds["dask"] / seconds["pool"],
            "byte_identical": same}


NOISY_GRID = {"compute_jitter": 0.2, "comm_jitter": 0.1, "samples": 20}
PLAIN_GRID = {"bwd_len": {"start": 2.0, "stop": 2.19, "step": 0.01}}  # 20 environments: as many simulations


def noisy_sweep(rounds: int = 3) -> dict:
    """Simulations per second of a one-worker sweep with 20 noisy samples, and of a noise-free one as large.

    The two alternate (noisy, plain, noisy, ...) and each reports its median round, so
    that a shared machine's drift falls on both alike.
    """
    seconds: dict[str, list[float]] = {"noisy": [], "plain": []}
    plans = {"noisy": SweepPlan(EnvironmentGrid.from_mapping(NOISY_GRID)),
             "plain": SweepPlan(EnvironmentGrid.from_mapping(PLAIN_GRID))}
    for _ in range(rounds):
        for name, plan in plans.items():
            with tempfile.TemporaryDirectory() as folder:
                start = time.perf_counter()
                for _ in run_sweep(plan, Path(folder) / "sweep.csv", workers=1):
                    pass
                seconds[name].append(time.perf_counter() - start)
    results: dict = {name: {"simulations": plans[name].num_simulations, "seconds": statistics.median(times),
                            "sims_per_second": plans[name].num_simulations / statistics.median(times)}
                     for name, times in seconds.items()}
    results["noisy_over_plain"] = results["noisy"]["sims_per_second"] / results["plain"]["sims_per_second"]
    return results


def _tree_memory_kib(pid: int) -> int:
    """Memory of a process and all its descendants (Linux /proc): their proportional set sizes, so that the pages
    forked workers share with their parent count once, not once per process (resident sizes where the kernel
    has no ``smaps_rollup``)."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            rollup = Path(f"/proc/{current}/smaps_rollup")
            lines = (rollup if rollup.exists() else Path(f"/proc/{current}/status")).read_text().splitlines()
            total += int(next(line.split()[1] for line in lines if line.startswith(("Pss:", "VmRSS:"))))
            for task in Path(f"/proc/{current}/task").iterdir():
                stack.extend(int(child) for child in (task / "children").read_text().split())
        except (OSError, StopIteration, ValueError):
            continue
    return total


def _peak_memory_mb(command: list[str]) -> tuple[float, float]:
    """Run ``command``; its wall seconds and the peak memory of it and its workers (proportional set size), in MB."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while process.poll() is None:
        peak = max(peak, _tree_memory_kib(process.pid))
        time.sleep(0.05)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed with exit status {process.returncode}")
    return time.perf_counter() - start, peak / 1024


def sweep_peak_memory(grid: dict, workers: int) -> dict:
    """Sweep ``grid`` into a CSV, then draw every heatmap of that CSV: wall time and peak memory of each."""
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "memory.json"
        config.write_text(json.dumps(grid))
        plan = SweepPlan(EnvironmentGrid.load(config))
        csv = Path(folder) / "memory.csv"
        elapsed, peak = _peak_memory_mb([sys.executable, str(ROOT / "data_generator.py"), "-c", str(config), "-o",
                                      str(csv), "--workers", str(workers)])
        rows = sum(1 for _ in open(csv)) - 1
        plot_seconds, plot_peak = _peak_memory_mb([sys.executable, str(ROOT / "plot_heatmap.py"), str(csv), "-o",
                                                str(Path(folder) / "maps"), "--workers", str(workers)])
        figures = len(list((Path(folder) / "maps").glob("*.png")))
        csv_mb = csv.stat().st_size / 2 ** 20
    return {"simulations": plan.num_simulations, "rows_written": rows, "workers": workers,
            "seconds": elapsed, "peak_memory_mb": peak, "plot_seconds": plot_seconds, "plot_peak_memory_mb": plot_peak,
            "heatmaps": figures, "csv_mb": csv_mb}


def large_chart() -> dict:
    """The single-channel visualizer on a 64-stage, 512-micro-batch ZB-H1 iteration (about 160,000 tasks), chart
    included, end to end as a user runs it: wall time and the chart's pixels."""
    with tempfile.TemporaryDirectory() as folder:
        chart = Path(folder) / "chart.png"
        start = time.perf_counter()
        subprocess.run([sys.executable, str(ROOT / "schedule_visualizer_single_channel.py"), "--pipeline-parallel",
                        "64", "-n", "512", "--schedule", "zb-h1", "--no-show", "--output", str(chart)],
                       cwd=folder, check=True, capture_output=True)
        wall = time.perf_counter() - start
        from PIL import Image

        with Image.open(chart) as image:
            size = image.size
    return {"seconds": wall, "pixels": size}


def planner_405b(workers: int) -> dict:
    """The planner's Llama 3 405B question on 8,192 H100 (README, "The planner"): its wall time on ``workers``
    processes, the kernel compiled, and what it searched."""
    from pipeline_sim.plan import plan
    from pipeline_sim.workload import Workload

    base = Workload(model="llama3-405b", gpu="h100-80gb", seq_len=8192, global_batch_size=2048,
                    compute_efficiency=0.602, optimizer_step=True, elementwise=True, flash_attention=True,
                    dropout=False)
    started = time.perf_counter()
    result = plan(base, 8192, workers=workers)
    meta = result.layout_ranks().get((8, 1, 16, 64, 1))  # Dubey et al. 2024, table 4
    return {"workers": workers, "seconds": time.perf_counter() - started, "enumerated": result.enumerated,
            "simulated": len(result.tried), "best": result.ranked[0].layout.describe(), "meta_layout_rank": meta}


def deepseek_v3() -> dict:
    """A DeepSeek-V3 iteration at its published layout (benchmarks/published.py's first mixture-of-experts row: 16
    DualPipeV stages, 120 micro-batches, the all-to-all of 64-way expert parallelism): seconds of its first
    simulation (the task graph built) and of a repeat, on one core, and its tasks."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from published import MOE, moe_environment

    _, params = moe_environment(MOE[0])
    started = time.perf_counter()
    run = simulate(params, Policy())
    first = time.perf_counter() - started
    started = time.perf_counter()
    simulate(params, Policy())
    return {"tasks": len(run.tasks), "first_seconds": first, "repeat_seconds": time.perf_counter() - started,
            "iteration_seconds": run.completion_time}


def replay_trace() -> dict:
    """A committed PyTorch trace (Interleaved1F1B, 2 ranks, 4 stages, 8 micro-batches) read and replayed: seconds to
    read its ranks' files, to fit the transfers, and per iteration replayed, medians of five."""
    from pipeline_sim.measured import fit_comm, read_run
    from pipeline_sim.replay import replay

    folder = ROOT / "tests" / "data" / "traces" / "interleaved-1f1b" / "run0"
    reads, fits, replays = [], [], []
    for _ in range(5):
        started = time.perf_counter()
        run = read_run([folder])
        reads.append(time.perf_counter() - started)
        started = time.perf_counter()
        comm = fit_comm(run.iterations)
        fits.append(time.perf_counter() - started)
        started = time.perf_counter()
        for k in range(len(run.iterations)):
            replay(run, k, comm)
        replays.append((time.perf_counter() - started) / len(run.iterations))
    return {"iterations": len(run.iterations), "read_seconds": statistics.median(reads),
            "fit_seconds": statistics.median(fits), "replay_seconds": statistics.median(replays)}


def _print_doubling(rows: list[dict], title: str) -> None:
    """A table of ``first_and_repeat`` rows: the first simulation from nothing, its graph built (median over the
    builds); per task the graph's construction, a size's first build apart from its later ones; the kernel."""
    print(f"\n  {title}\n"
          f"  {'':40} {'first sim from':>14} {'construction, us/task':^26} {'kernel':>9}\n"
          f"  {'schedule':<16} {'GPUs':>5} {'n':>6} {'tasks':>10} {'nothing (ms)':>14} {'first build':>12} "
          f"{'later builds':>13} {'us/task':>9}")
    for row in rows:
        print(f"  {row.get('schedule', '1f1b'):<16} {row['num_gpus']:>5} {row['n']:>6} {row['tasks']:>10,} "
              f"{row['first_seconds'] * 1e3:>14.2f} {row['first_build_us_per_task']:>12.3f} "
              f"{row['later_builds_us_per_task']:>13.3f} {row['kernel_us_per_task']:>9.3f}", flush=True)


_CONSTRUCTION = """
import json, sys
sys.path.insert(0, {folder!r})
import bench
bench.compile_kernel()
if {part!r} != "large":
    bench.warm_up()
print(json.dumps({{"large": lambda: bench.first_and_repeat(bench.LARGE_FIRST), "schedules": bench.schedule_doubling,
                  "doubling": bench.doubling,
                  "microbatches": lambda: bench.doubling(bench.MICROBATCH_DOUBLINGS)}}[{part!r}]()))
"""


def construction() -> dict:
    """Graph construction against the kernel, printed as measured: the first simulation of about 200,000 tasks,
    every schedule over ``SCHEDULE_SIZES``, and 1F1B per doubling of tasks, by GPUs and micro-batches in turn and by
    micro-batches alone; each in a process of its own, so that
    each structure is new to it (the last two after ``warm_up``)."""
    def measured(part: str):
        result = subprocess.run([sys.executable, "-c", _CONSTRUCTION.format(folder=str(Path(__file__).parent),
                                                                            part=part)],
                                check=True, capture_output=True, text=True)
        return json.loads(result.stdout.splitlines()[-1])
    large = measured("large")
    kernel = large["kernel_us_per_task"] * large["tasks"] / 1e6
    print(f"first simulation of {large['tasks']:,} tasks (ZB-H1, 64 GPUs, n = 528, one core): "
          f"{large['first_seconds']:.2f} s, of which the kernel {kernel:.2f} s", flush=True)
    schedules = measured("schedules")
    _print_doubling(schedules, "every schedule, each size built from nothing")
    grown = measured("doubling")
    _print_doubling(grown, "1F1B, GPUs and micro-batches doubling the tasks in turn")
    longer = measured("microbatches")
    _print_doubling(longer, "1F1B on 8 GPUs, micro-batches doubling")
    return {"large_first": large, "schedules": schedules, "doubling": grown, "microbatch_doubling": longer}


_SIMULATIONS = """
import os, sys
sys.path.insert(0, {folder!r})
import bench
params = bench.EnvParams(num_gpus={num_gpus}, n={n})
bench.simulate_figures(params, [bench.SCALING_POLICY])
os.getppid()  # callgrind's counts are written before each call: the second part is the repeat alone
bench.simulate_figures(params, [bench.SCALING_POLICY])
os.getppid()
"""
#: The simulated caches: a first level of 32 KiB and a second of 1 MiB, the sizes of this machine's.
_CACHES = ("--D1=32768,8,64", "--I1=32768,8,64", "--LL=1048576,8,64")


def instructions(sizes: tuple[tuple[int, int], ...] = DOUBLINGS) -> list[dict] | None:
    """Per task of the kernel, along the doubling line (1F1B; GPUs and micro-batches of ``sizes``): instructions
    and simulated cache misses under Valgrind's callgrind, which a processor's speed and its neighbours on a shared
    machine leave alone. Each size is built and simulated once, then simulated again, and the repeat is counted
    alone (the kernel, as the doubling line's repeat times it); compiled for a generic x86-64 processor, whose
    instructions callgrind knows, and loaded from the cache after a first compile outside it. None without
    Valgrind."""
    import shutil

    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    folder = str(Path(__file__).parent)
    environment = {**os.environ, "NUMBA_CPU_NAME": "generic"}
    subprocess.run([sys.executable, "-c", _SIMULATIONS.format(folder=folder, num_gpus=2, n=2)], check=True,
                   env=environment)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for num_gpus, n in sizes:
            out = Path(scratch) / f"callgrind.{num_gpus}x{n}"
            subprocess.run([valgrind, "--tool=callgrind", "--cache-sim=yes", *_CACHES, "--dump-before=getppid",
                            f"--callgrind-out-file={out}", sys.executable, "-c",
                            _SIMULATIONS.format(folder=folder, num_gpus=num_gpus, n=n)],
                           check=True, env=environment, capture_output=True)
            lines = Path(f"{out}.2").read_text().splitlines()
            events = next(line for line in lines if line.startswith("events:")).split()[1:]
            summary = next(line for line in lines if line.startswith("summary:")).split()[1:]
            tasks = len(graph_arrays(EnvParams(num_gpus=num_gpus, n=n)).gpu)
            one = {event: int(value) / tasks for event, value in zip(events, summary)}
            rows.append({"num_gpus": num_gpus, "n": n, "tasks": tasks, "instructions_per_task": one["Ir"],
                         "first_level_misses_per_task": one["D1mr"] + one["D1mw"],
                         "second_level_misses_per_task": one["DLmr"] + one["DLmw"]})
            print(f"  {num_gpus:>5} {n:>6} {tasks:>10,} {one['Ir']:>13,.0f} {one['D1mr'] + one['D1mw']:>13.1f} "
                  f"{one['DLmr'] + one['DLmw']:>13.1f}", flush=True)
    return rows


def hindsight_per_draw(draws: int = 5) -> dict | None:
    """``dispatch = hindsight`` on n = 8, 4 GPUs, ZB-H1 at 30% jitter: seconds per draw to solve and replay its
    order (one core), and how many draws the solver proved optimal; None without the [solver] extra."""
    from pipeline_sim.hindsight import hindsight, simulate_hindsight, solver_available

    if not solver_available():
        return None
    params = EnvParams(n=8, num_gpus=4, schedule="zb-h1", compute_jitter=0.3, comm_jitter=0.3, dispatch="hindsight")
    seconds, statuses = [], []
    for sample in range(draws):
        started = time.perf_counter()
        simulate_hindsight(params, Policy(), sample)
        seconds.append(time.perf_counter() - started)
        statuses.append(hindsight(params, sample).status)
    return {"draws": draws, "median_seconds": statistics.median(seconds), "max_seconds": max(seconds),
            "optimal": statuses.count("optimal")}


def lookahead_cost(rounds: int = 5, draws: int = 4) -> list[dict]:
    """``dispatch = lookahead`` on ZB-H1 at 30% jitter, default policy: milliseconds per iteration and the copies it
    runs to the end per iteration, against one static run of the same draws; runs alternate (static, look-ahead,
    ...) and each side keeps its median over ``rounds`` rounds of ``draws`` draws."""
    from pipeline_sim.episode import Episode
    from pipeline_sim.model import DEFAULT_POLICY

    rows = []
    for n, gpus in ((8, 4), (12, 8)):
        params = EnvParams(n=n, num_gpus=gpus, schedule="zb-h1", compute_jitter=0.3, comm_jitter=0.3)
        episode = Episode(replace(params, dispatch="lookahead"), DEFAULT_POLICY)
        episode.look_ahead(0)  # loaded
        static, ahead, copies = [], [], 0
        for _ in range(rounds):
            started = time.perf_counter()
            for sample in range(draws):
                simulate_figures(params, [DEFAULT_POLICY], sample)
            static.append((time.perf_counter() - started) / draws)
            started = time.perf_counter()
            copies = sum(episode.look_ahead(sample) for sample in range(draws))
            ahead.append((time.perf_counter() - started) / draws)
        rows.append({"n": n, "num_gpus": gpus, "tasks": len(graph_arrays(params).gpu),
                     "ms_per_iteration": 1e3 * statistics.median(ahead), "copies_per_iteration": copies / draws,
                     "over_static": statistics.median(ahead) / statistics.median(static)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller samples, 100,067-simulation memory sweep")
    parser.add_argument("--large", action="store_true",
                        help="a 5,003,350-simulation memory sweep (41,350 heatmaps) instead of 1,000,670")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--planner", action="store_true", help="only the planner's Llama 3 405B question")
    parser.add_argument("--chart", action="store_true", help="only the visualizer's 64-stage, 512-micro-batch chart")
    parser.add_argument("--doubling", action="store_true",
                        help="only the cost per task of graph construction and kernel: 201,696 tasks, every schedule "
                             "from 4 to 64 GPUs and 8 to 1,024 micro-batches, 1F1B doubling tasks to a million")
    parser.add_argument("--instructions", action="store_true",
                        help="only the kernel's instructions and simulated cache misses per task along the 1F1B "
                             "doubling line, under Valgrind's callgrind (about 20 minutes; needs valgrind)")
    parser.add_argument("--hindsight", action="store_true", help="only dispatch = hindsight's seconds per draw")
    parser.add_argument("--moe", action="store_true", help="only a DeepSeek-V3 iteration at its published layout")
    parser.add_argument("--replay", action="store_true", help="only reading and replaying a committed PyTorch trace")
    parser.add_argument("--lookahead", action="store_true", help="only dispatch = lookahead's time per iteration")
    parser.add_argument("--learned", action="store_true",
                        help="only a learned dispatcher's iteration, played in the compiled loop and stepped")
    args = parser.parse_args()
    if args.json is not None:  # a path the results cannot be written to is said before the minutes of work
        try:
            output_target(args.json)
        except OutputError as error:
            parser.error(str(error))
    cores = os.cpu_count() or 1

    compile_kernel()
    machine = {"python": platform.python_version(), "cores": cores, "platform": platform.platform()}
    if args.doubling:
        return _written(args.json, {"machine": machine, "doubling": construction()})
    if args.instructions:
        print("the kernel per task, 1F1B, under callgrind (32 KiB first level, 1 MiB second; one simulation)\n"
              f"  {'GPUs':>5} {'n':>6} {'tasks':>10} {'instructions':>13} {'first-level':>13} {'second-level':>13}",
              flush=True)
        counted = instructions()
        if counted is None:
            print("valgrind is not installed: nothing measured", file=sys.stderr)
            return 1
        return _written(args.json, {"machine": machine, "instructions": counted})
    if args.replay:
        trace = replay_trace()
        print(f"PyTorch trace, Interleaved1F1B on 2 ranks ({trace['iterations']} iterations): read "
              f"{trace['read_seconds'] * 1e3:.0f} ms, transfers fitted {trace['fit_seconds'] * 1e3:.1f} ms, "
              f"{trace['replay_seconds'] * 1e3:.1f} ms per iteration replayed (medians of five)", flush=True)
        return _written(args.json, {"machine": machine, "replay": trace})
    if args.moe:
        moe = deepseek_v3()
        print(f"DeepSeek-V3 on 2,048 H800 (DualPipeV, p 16, e 64, n 120; {moe['tasks']:,} tasks): first simulation "
              f"{moe['first_seconds']:.2f} s, repeat {moe['repeat_seconds']:.2f} s on one core; iteration "
              f"{moe['iteration_seconds']:.2f} s", flush=True)
        return _written(args.json, {"machine": machine, "moe": moe})
    learned = learned_cost() if args.learned or not (args.planner or args.chart or args.hindsight or args.moe or
                                                     args.lookahead) else None
    if learned is not None:
        print(f"learned dispatcher, ZB-H1, n = 8, 4 GPUs, a 64 x 64 network: {learned['played_ms']:.2f} ms per "
              f"iteration inside the compiled loop, {learned['stepped_ms']:.1f} ms stepped from Python: "
              f"{learned['stepped_over_played']:.1f}x (CPU time, medians of alternating runs, one core)", flush=True)
    if args.learned:
        return _written(args.json, {"machine": machine, "learned": learned})
    ahead = lookahead_cost() if args.lookahead or not (args.planner or args.chart or args.hindsight or args.moe) else []
    for row in ahead:
        print(f"look-ahead, ZB-H1, n = {row['n']}, {row['num_gpus']} GPUs ({row['tasks']} tasks), 30% jitter: "
              f"{row['ms_per_iteration']:.1f} ms per iteration, {row['copies_per_iteration']:.0f} copies run to the "
              f"end, {row['over_static']:.0f}x a static run (medians of alternating runs, one core)", flush=True)
    if args.lookahead:
        return _written(args.json, {"machine": machine, "lookahead": ahead})
    solved = None
    if args.hindsight or not (args.planner or args.chart):
        solved = hindsight_per_draw()
        if solved is not None:
            print(f"hindsight, n = 8, 4 GPUs, ZB-H1, 30% jitter: {solved['median_seconds']:.1f} s per draw (median "
                  f"of {solved['draws']}, at most {solved['max_seconds']:.1f} s), {solved['optimal']} proven optimal",
                  flush=True)
        if args.hindsight:
            return _written(args.json, {"machine": machine, "hindsight": solved})
    if not args.planner:
        chart = large_chart()
        print(f"visualizer, ZB-H1 on 64 GPUs, 512 micro-batches, chart included: {chart['seconds']:.1f} s "
              f"({chart['pixels'][0]:,} x {chart['pixels'][1]:,} pixels)", flush=True)
        if args.chart:
            return _written(args.json, {"machine": machine, "chart": chart})
    planner = planner_405b(cores)
    print(f"planner, Llama 3 405B on 8,192 H100: {planner['seconds']:.1f} s on {cores} workers, "
          f"{planner['simulated']} of {planner['enumerated']:,} runs simulated; best {planner['best']}; Meta's "
          f"t 8 p 16 d 64 layout #{planner['meta_layout_rank']}", flush=True)
    if args.planner:
        return _written(args.json, {"machine": machine, "planner": planner})
    single = sims_per_second(1.0 if args.quick else 4.0)
    pure = pure_python_sims_per_second()
    api = api_sims_per_second(1.0 if args.quick else 3.0)
    print(f"single core, default environment, 121-policy mix: {single['sims_per_second']:,.0f} simulations/s "
          f"compiled, {pure:,.0f} as plain Python: {single['sims_per_second'] / pure:.0f}x; "
          f"{api:,.0f}/s through simulate() with every timeline", flush=True)
    schedules = per_schedule(0.5 if args.quick else 2.0)
    print("\n  schedule           n  tasks   sims/s   us/task")
    for row in schedules:
        print(f"  {row['schedule']:<16} {row['n']:>3} {row['tasks']:>6} {row['sims_per_second']:>8,.0f} "
              f"{1e6 / row['sims_per_second'] / row['tasks']:>9.2f}", flush=True)
    dispatch = dispatched(0.3 if args.quick else 1.0)
    print("\n  schedule  dispatch        sims/s  static sims/s  static/dispatched (medians of alternating runs)")
    for row in dispatch:
        print(f"  {row['schedule']:<8}  {row['dispatch']:<14} {row['sims_per_second']:>7,.0f} "
              f"{row['static_sims_per_second']:>14,.0f} {row['static_over_dispatched']:>8.2f}x", flush=True)
    decisions = decisions_per_second(0.5 if args.quick else 2.0)
    print("\n  decisions/s (ZB-H1, 4 GPUs, random masked choices)    n  episode  environment  learned iterations/s")
    for row in decisions:
        print(f"  {'':<50}{row['n']:>3} {row['episode']:>8,.0f} {row.get('environment', float('nan')):>12,.0f} "
              f"{row['learned']:>21,.1f}", flush=True)
    rows = scaling(0.2 if args.quick else 1.0)
    print("\n  n  GPUs   tasks   ms/sim   us/task")
    for row in rows:
        print(f"{row['n']:>4} {row['num_gpus']:>4} {row['tasks']:>7} {row['ms_per_sim']:>8.2f} "
              f"{row['us_per_task']:>9.2f}")
    smallest, largest = rows[0]["us_per_task"], rows[-1]["us_per_task"]
    print(f"time per task at n=512, 64 GPUs is {largest / smallest:.2f}x that at n=8, 4 GPUs", flush=True)
    structures = first_of_structure(1 if args.quick else 3)
    print("\n  new lengths, structure known: first simulate_figures against a repeat (medians)")
    print("  schedule  GPUs    n   tasks  first us/task  repeat us/task  first/repeat")
    for row in structures:
        print(f"  {row['schedule']:<8} {row['num_gpus']:>5} {row['n']:>4} {row['tasks']:>7} "
              f"{row['first_us_per_task']:>14.2f} {row['repeat_us_per_task']:>15.2f} "
              f"{row['first_over_repeat']:>12.2f}x", flush=True)
    grown = None if args.quick else construction()

    pipeline = example_pipeline(cores)
    print(f"example pipeline (2,178 simulations, 18 heatmaps) on {cores} workers: {pipeline['wall_seconds']:.2f} s "
          f"wall; steps: start-up {pipeline['start_up']:.2f} s, kernel load {pipeline['kernel_load']:.2f} s, "
          f"simulations {pipeline['simulations']:.2f} s, figures {pipeline['figures']:.2f} s", flush=True)
    heatmap = heatmap_cpu()
    print(f"one heatmap (121 policies, step 0.1): {heatmap:.3f} s of CPU", flush=True)
    compile_seconds = None if args.quick else first_compile()
    if compile_seconds is not None:
        sweep, first_chart, episodes = (compile_seconds[name] for name in ("sweep", "chart", "episodes"))
        print(f"first compile of the kernel into an empty cache: {sweep['seconds']:.1f} s before a first sweep "
              f"({sweep['cpu_seconds']:.1f} s of CPU, load average {sweep['load_average']:.1f}), "
              f"{first_chart['seconds']:.1f} s before a first chart ({first_chart['cpu_seconds']:.1f} s of CPU, "
              f"load average {first_chart['load_average']:.1f}); then the step-by-step entry points of learned and "
              f"look-ahead dispatch "
              f"{episodes['seconds']:.1f} s (load average {episodes['load_average']:.1f})", flush=True)

    serial = sweep_wall_time(1)
    parallel = sweep_wall_time(cores)
    efficiency = serial / (cores * parallel)
    print(f"\nexample sweep (2,178 simulations): {serial:.2f} s on 1 worker, {parallel:.2f} s on {cores}; "
          f"parallel efficiency {efficiency:.0%}", flush=True)

    noisy = noisy_sweep(1 if args.quick else 3)
    print(f"noisy sweep (jitter 0.2 compute / 0.1 comm, 20 samples, 1 worker, median of alternating runs): "
          f"{noisy['noisy']['sims_per_second']:,.0f} simulations/s, against {noisy['plain']['sims_per_second']:,.0f} "
          f"without noise: {noisy['noisy_over_plain']:.2f}x", flush=True)

    memory = sweep_peak_memory(MEMORY_GRID_LARGE if args.large else MEMORY_GRID_QUICK if args.quick else MEMORY_GRID,
                               cores)
    print(f"memory sweep: {memory['simulations']:,} simulations in {memory['seconds']:.1f} s on {cores} workers, "
          f"peak memory {memory['peak_memory_mb']:.0f} MB (all processes); drawing its {memory['heatmaps']:,} "
          f"heatmaps from the {memory['rows_written']:,}-row CSV ({memory['csv_mb']:.0f} MB): "
          f"{memory['plot_seconds']:.1f} s, peak {memory['plot_peak_memory_mb']:.0f} MB", flush=True)
    if not args.quick and not args.large:
        verdict = "within" if memory["plot_peak_memory_mb"] < PLOT_MEMORY_BOUND_MB else "OVER"
        print(f"drawing memory: {verdict} the {PLOT_MEMORY_BOUND_MB} MB bound", flush=True)

    cluster = cluster_overhead(cores)
    if cluster is not None:
        print(f"cluster sweep: {cluster['simulations']:,} simulations on {cores} workers: "
              f"{cluster['pool_seconds']:.1f} s on the process pool, {cluster['dask_seconds']:.1f} s on a local Dask "
              f"cluster (its start included): "
              f"{cluster['dask_over_pool']:.2f}x; byte-identical: {cluster['byte_identical']}", flush=True)

    results = {
        "machine": machine,
        "single_core": single, "pure_python_sims_per_second": pure,
        "kernel_over_pure_python": single["sims_per_second"] / pure, "api_sims_per_second": api,
        "example_pipeline": pipeline, "heatmap_cpu_seconds": heatmap, "first_compile_seconds": compile_seconds,
        "schedules": schedules, "dispatch": dispatch, "decisions": decisions, "scaling": rows, "hindsight": solved,
        "lookahead": ahead, "learned": learned,
        "first_of_structure": structures, "doubling": grown,
        "scaling_ratio": largest / smallest,
        "sweep": {"simulations": 2178, "serial_seconds": serial, "parallel_seconds": parallel, "workers": cores,
                  "parallel_efficiency": efficiency},
        "noisy_sweep": noisy, "memory": memory, "cluster": cluster, "planner": planner, "chart": chart,
    }
    print("\n" + json.dumps(results, indent=2))
    return _written(args.json, results)


def _written(path: Path | None, results: dict) -> int:
    """``results`` written to ``path`` as JSON, when one is given (``--json``); the exit status, 0."""
    if path is not None:
        with atomic_output(path) as temporary:
            temporary.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
