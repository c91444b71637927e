"""The allocator keeps what a simulation frees for the next one (pipeline_sim/allocator.py): measured in page faults
of a sweep's environments in fresh processes, against glibc's own behaviour; what the user set is left as it is; only
the command line changes the process."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_sim import allocator
from pipeline_sim.cli import common

ROOT = Path(__file__).resolve().parents[1]

#: A sweep over micro-batches (8 GPUs, n = 256 to 1,024: a new environment, its graph built, each time): the page
#: faults of its second half, in a process that imported the package and, unless told not to, asked for freed memory
#: to be kept.
_REPEATED = """
import json, resource, sys
sys.path.insert(0, {root!r})
from pipeline_sim import EnvParams, Policy, allocator
from pipeline_sim.engine import simulate_figures
kept = allocator.keep_freed_memory()
sizes = range(256, 1025, 64)
for k, n in enumerate(sizes):
    if k == len(sizes) // 2:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    simulate_figures(EnvParams(num_gpus=8, n=n), [Policy()])
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({{"kept": kept, "faults": faults}}))
"""


def _repeated(**environment: str) -> dict:
    env = {name: value for name, value in os.environ.items()
           if not allocator.left_as_it_is({name: value}) and name != "GLIBC_TUNABLES"}
    result = subprocess.run([sys.executable, "-c", _REPEATED.format(root=str(ROOT))], env={**env, **environment},
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's allocator")
def test_a_sweep_reuses_the_memory_the_environments_before_freed():
    glibc = _repeated(**{allocator.SWITCH: "0"})  # glibc's own behaviour
    assert glibc["kept"] is False
    if glibc["faults"] < 200:
        pytest.skip(f"glibc alone faults only {glibc['faults']} pages in again here: nothing to keep")
    kept = _repeated()
    assert kept["kept"] is True
    assert kept["faults"] * 3 < glibc["faults"] * 2
    # a process started with glibc's variables for the same thresholds (a local Dask cluster's workers) keeps it too
    started = {name: value for name, value in allocator.child_environment({}).items()}
    assert sorted(started) == ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"]
    told = _repeated(**started)
    assert told["kept"] is False and told["faults"] * 3 < glibc["faults"] * 2


def test_a_local_clusters_workers_start_with_the_thresholds(monkeypatch):
    from pipeline_sim import cluster

    started = {}

    def popen(command, env, **kwargs):
        started.update(env)
    monkeypatch.setattr(cluster.subprocess, "Popen", popen)
    monkeypatch.delenv(allocator.SWITCH, raising=False)
    for name in allocator.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    cluster._start_workers("tcp://127.0.0.1:1", 2)
    assert started["MALLOC_MMAP_THRESHOLD_"] == str(allocator.MMAP_THRESHOLD)
    assert started["MALLOC_TRIM_THRESHOLD_"] == str(allocator.TRIM_THRESHOLD)
    assert allocator.child_environment({"MALLOC_TOP_PAD_": "0", "X": "1"}) == {"MALLOC_TOP_PAD_": "0", "X": "1"}
    assert allocator.child_environment({allocator.SWITCH: "0"}) == {allocator.SWITCH: "0"}


@pytest.mark.parametrize("environ, left", [
    ({}, False),
    ({"MALLOC_ARENA_MAX": "2", "GLIBC_TUNABLES": "glibc.pthread.rseq=0:glibc.elision.enable=1"}, False),
    ({allocator.SWITCH: "1"}, False),
    ({allocator.SWITCH: "0"}, True),
    *[({name: "131072"}, True) for name in allocator.USER_SETTINGS],
    *[({"GLIBC_TUNABLES": f"glibc.pthread.rseq=0:{name}=131072"}, True) for name in allocator.USER_TUNABLES],
])
def test_what_the_user_set_is_left_as_it_is(environ, left):
    assert allocator.left_as_it_is(environ) is left


def test_without_mallopt_nothing_is_changed(monkeypatch):
    class NoMallopt:
        def __init__(self, name: object) -> None:
            pass
    monkeypatch.setattr(ctypes, "CDLL", NoMallopt)
    monkeypatch.delenv(allocator.SWITCH, raising=False)
    for name in allocator.USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert allocator.keep_freed_memory.__wrapped__() is False


def test_a_command_keeps_freed_memory_before_it_simulates_and_the_library_alone_does_not(monkeypatch):
    calls = []
    monkeypatch.setattr(common, "keep_freed_memory", lambda: calls.append(True))
    assert common.run_command("prog", lambda: 0) == 0
    assert calls == []  # a command that draws only (plot_heatmap.py) leaves the allocator as it is
    common.ready_kernel(parts=("figures",))
    assert calls == [True]
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import pipeline_sim, pipeline_sim.engine, "
            "pipeline_sim.allocator as a; print(a.keep_freed_memory.cache_info().currsize)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "0"
