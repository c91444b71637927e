"""Speed and memory of the simulator and the sweep, printed as a table and as JSON.

    python benchmarks/bench.py              # everything (about 70 seconds on 2 cores)
    python benchmarks/bench.py --quick      # smaller samples and a 10,000-simulation memory sweep
    python benchmarks/bench.py --json out.json

Measures: simulations per second on one core (default environment, all 121 policies
of the sweep: shared, exclusive and priority-0 layers), and the same for each schedule
(n=8, or 10 for dualpipe-v, on 4 GPUs); time per simulated task for
n in {8, 32, 128, 512} x num_gpus in {4, 16, 64}; the example config's sweep with one
worker and with every core, and the parallel efficiency; a noisy sweep (20 samples)
against a noise-free one as large, in simulations per second; peak memory (resident set,
summed over the sweep's processes) of a 100,000-simulation sweep.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline_sim import SCHEDULES, EnvParams, Policy, simulate  # noqa: E402
from pipeline_sim.config import EnvironmentGrid  # noqa: E402
from pipeline_sim.scenarios import policy_grid  # noqa: E402
from pipeline_sim.sweep import SweepPlan, run_sweep  # noqa: E402

SIZES_N = (8, 32, 128, 512)
SIZES_GPUS = (4, 16, 64)
SCALING_POLICY = Policy(priorities={"fwd_prop": 0.5, "grad_prop": 0.3, "grad_sync": 0.2})
# 827 environments x 121 policies = 100,067 simulations of the default size.
MEMORY_GRID = {"bwd_len": {"start": 1.0, "stop": 9.26, "step": 0.01}}
MEMORY_GRID_QUICK = {"bwd_len": {"start": 1.0, "stop": 1.82, "step": 0.01}}


def sims_per_second(seconds: float, params: EnvParams | None = None) -> dict:
    params, policies = params or EnvParams(), policy_grid(0.1)
    simulate(params, policies[0])  # warm caches
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for policy in policies:
            simulate(params, policy)
        count += len(policies)
    elapsed = time.perf_counter() - start
    tasks = len(simulate(params, policies[0]).tasks)
    return {"simulations": count, "seconds": elapsed, "sims_per_second": count / elapsed, "tasks": tasks}


def per_schedule(seconds: float) -> list[dict]:
    rows = []
    for name in SCHEDULES:
        params = EnvParams(schedule=name, n=10 if name == "dualpipe-v" else 8)
        rows.append({"schedule": name, "n": params.n, **sims_per_second(seconds, params)})
    return rows


def scaling(budget: float) -> list[dict]:
    rows = []
    for num_gpus in SIZES_GPUS:
        for n in SIZES_N:
            params = EnvParams(n=n, num_gpus=num_gpus)
            runs, elapsed, tasks = 0, 0.0, 0
            while runs == 0 or elapsed < budget:
                start = time.perf_counter()
                tasks = len(simulate(params, SCALING_POLICY).tasks)
                elapsed += time.perf_counter() - start
                runs += 1
            per_sim = elapsed / runs
            rows.append({"n": n, "num_gpus": num_gpus, "tasks": tasks, "runs": runs,
                         "ms_per_sim": per_sim * 1e3, "us_per_task": per_sim / tasks * 1e6})
    return rows


def sweep_wall_time(workers: int) -> float:
    plan = SweepPlan(EnvironmentGrid.load(ROOT / "configs" / "example.json"))
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        for _ in run_sweep(plan, Path(folder) / "example.csv", workers=workers):
            pass
        return time.perf_counter() - start


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


def _tree_rss_kib(pid: int) -> int:
    """Resident memory of a process and all its descendants (Linux /proc)."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            total += int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
            for task in Path(f"/proc/{current}/task").iterdir():
                stack.extend(int(child) for child in (task / "children").read_text().split())
        except (OSError, StopIteration, ValueError):
            continue
    return total


def sweep_peak_memory(grid: dict, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "memory.json"
        config.write_text(json.dumps(grid))
        plan = SweepPlan(EnvironmentGrid.load(config))
        command = [sys.executable, str(ROOT / "data_generator.py"), "-c", str(config), "-o",
                   str(Path(folder) / "memory.csv"), "--workers", str(workers)]
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        peak = 0
        while process.poll() is None:
            peak = max(peak, _tree_rss_kib(process.pid))
            time.sleep(0.05)
        elapsed = time.perf_counter() - start
        if process.returncode != 0:
            raise SystemExit(f"memory sweep failed with exit status {process.returncode}")
        rows = sum(1 for _ in open(Path(folder) / "memory.csv")) - 1
    return {"simulations": plan.num_simulations, "rows_written": rows, "workers": workers,
            "seconds": elapsed, "peak_rss_mb": peak / 1024}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller samples, 10,000-simulation memory sweep")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args()
    cores = os.cpu_count() or 1

    single = sims_per_second(1.0 if args.quick else 4.0)
    print(f"single core, default environment, 121-policy mix: {single['sims_per_second']:,.0f} simulations/s",
          flush=True)
    schedules = per_schedule(0.5 if args.quick else 2.0)
    print("\n  schedule           n  tasks   sims/s   us/task")
    for row in schedules:
        print(f"  {row['schedule']:<16} {row['n']:>3} {row['tasks']:>6} {row['sims_per_second']:>8,.0f} "
              f"{1e6 / row['sims_per_second'] / row['tasks']:>9.2f}", flush=True)
    rows = scaling(0.2 if args.quick else 1.0)
    print("\n  n  GPUs   tasks   ms/sim   us/task")
    for row in rows:
        print(f"{row['n']:>4} {row['num_gpus']:>4} {row['tasks']:>7} {row['ms_per_sim']:>8.2f} "
              f"{row['us_per_task']:>9.2f}")
    smallest, largest = rows[0]["us_per_task"], rows[-1]["us_per_task"]
    print(f"time per task at n=512, 64 GPUs is {largest / smallest:.2f}x that at n=8, 4 GPUs", flush=True)

    serial = sweep_wall_time(1)
    parallel = sweep_wall_time(cores)
    efficiency = serial / (cores * parallel)
    print(f"\nexample sweep (2,178 simulations): {serial:.2f} s on 1 worker, {parallel:.2f} s on {cores}; "
          f"parallel efficiency {efficiency:.0%}", flush=True)

    noisy = noisy_sweep(1 if args.quick else 3)
    print(f"noisy sweep (jitter 0.2 compute / 0.1 comm, 20 samples, 1 worker, median of alternating runs): "
          f"{noisy['noisy']['sims_per_second']:,.0f} simulations/s, against {noisy['plain']['sims_per_second']:,.0f} "
          f"without noise: {noisy['noisy_over_plain']:.2f}x", flush=True)

    memory = sweep_peak_memory(MEMORY_GRID_QUICK if args.quick else MEMORY_GRID, cores)
    print(f"memory sweep: {memory['simulations']:,} simulations in {memory['seconds']:.1f} s on {cores} workers, "
          f"peak resident memory {memory['peak_rss_mb']:.0f} MB (all processes)", flush=True)

    results = {
        "machine": {"python": platform.python_version(), "cores": cores, "platform": platform.platform()},
        "single_core": single, "schedules": schedules, "scaling": rows, "scaling_ratio": largest / smallest,
        "sweep": {"simulations": 2178, "serial_seconds": serial, "parallel_seconds": parallel, "workers": cores,
                  "parallel_efficiency": efficiency},
        "noisy_sweep": noisy, "memory": memory,
    }
    text = json.dumps(results, indent=2)
    print("\n" + text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
