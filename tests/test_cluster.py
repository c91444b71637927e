"""Sweeps on a Dask cluster: the same bytes as the process pool, through worker deaths, interruptions and bad
addresses."""

import os
import signal

import pytest
from conftest import ROOT, assert_one_line_error, run_script
from test_hardening import BIG, start, wait_for_rows, write_config

distributed = pytest.importorskip("distributed", reason="the [cluster] extra (dask[distributed]) is not installed")

from pipeline_sim.cluster import DaskCluster  # noqa: E402
from pipeline_sim.config import EnvironmentGrid  # noqa: E402
from pipeline_sim.sweep import SweepPlan, run_sweep  # noqa: E402

NOISY = {"n": [4, 6], "compute_jitter": 0.2, "comm_jitter": [0.0, 0.1], "samples": 3}


def sweep(folder, grid, name, **kwargs):
    plan = SweepPlan(EnvironmentGrid.from_mapping(grid), with_samples=True)
    for _ in run_sweep(plan, folder / f"{name}.csv", samples_output=folder / f"{name}.samples.csv", **kwargs):
        pass
    return (folder / f"{name}.csv").read_bytes(), (folder / f"{name}.samples.csv").read_bytes()


@pytest.mark.parametrize("grid", [{"n": [4, 8], "ingress_capacity": [0.5, 1.0]}, NOISY])
def test_a_local_cluster_writes_the_pools_bytes(tmp_path, grid):
    pool = sweep(tmp_path, grid, "pool", workers=2)
    cluster = DaskCluster("local", 2)
    try:
        assert sweep(tmp_path, grid, "dask", cluster=cluster) == pool
    finally:
        cluster.close()


def test_a_worker_killed_mid_sweep_loses_and_repeats_nothing(tmp_path):
    reference = sweep(tmp_path, BIG, "pool", workers=2)
    local = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                     silence_logs=50)
    cluster = DaskCluster(local.scheduler_address)
    try:
        plan = SweepPlan(EnvironmentGrid.from_mapping(BIG), with_samples=True)
        killed = None
        for rows in run_sweep(plan, tmp_path / "dask.csv", samples_output=tmp_path / "dask.samples.csv",
                              cluster=cluster, workers=2):
            if rows and killed is None:
                pids = cluster.connect().client.run(os.getpid)
                killed = sorted(pids.values())[0]
                os.kill(killed, signal.SIGKILL)  # the nanny starts a new worker; its chunks run again
        assert killed is not None and rows == plan.num_rows
        assert ((tmp_path / "dask.csv").read_bytes(), (tmp_path / "dask.samples.csv").read_bytes()) == reference
    finally:
        cluster.close()
        local.close()


def test_an_interrupted_cluster_sweep_resumes_to_the_same_bytes(tmp_path):
    config = write_config(tmp_path, BIG)
    clean = run_script("data_generator.py", "-c", str(config), "-o", "clean.csv", cwd=tmp_path)
    assert clean.returncode == 0, clean.stderr
    args = [ROOT / "data_generator.py", "-c", config, "-o", "out.csv", "--cluster", "local", "--workers", "2"]
    process = start(args, tmp_path)
    wait_for_rows(tmp_path / "out.csv.partial", process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and "--resume" in err, err
    env = dict(os.environ, PIPELINE_SIM_CLUSTER="local")  # the address may come from the environment
    resumed = run_script("data_generator.py", "-c", str(config), "-o", "out.csv", "--resume", "--workers", "2",
                         cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "local Dask cluster" in resumed.stdout and "resuming" in resumed.stdout
    assert (tmp_path / "out.csv").read_bytes() == (tmp_path / "clean.csv").read_bytes()


def test_an_unreachable_scheduler_is_one_line_and_leaves_no_files(tmp_path):
    result = run_script("data_generator.py", "-c", str(ROOT / "configs" / "quick.json"), "-o", "x.csv",
                        "--cluster", "tcp://127.0.0.1:9", cwd=tmp_path, timeout=60)
    assert_one_line_error(result, "cannot reach the Dask scheduler at tcp://127.0.0.1:9 within 5 s")
    assert not list(tmp_path.glob("x.csv*"))
