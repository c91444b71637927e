"""Sweeps on a Dask cluster: the same bytes as the process pool, through worker deaths, interruptions and bad
addresses."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import BIG, ROOT, assert_one_line_error, run_script, write_config
from test_hardening import start, wait_for_rows

distributed = pytest.importorskip("distributed", reason="the [cluster] extra (dask[distributed]) is not installed")

from pipeline_sim import cluster  # noqa: E402
from pipeline_sim.cluster import ClusterError, DaskCluster  # noqa: E402
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


def test_an_interrupted_cluster_sweep_resumes_to_the_same_bytes(tmp_path, big_reference):
    config = write_config(tmp_path, BIG)
    args = [ROOT / "data_generator.py", "-c", config, "-o", "out.csv", "--cluster", "local", "--workers", "2"]
    process = start(args, tmp_path)
    wait_for_rows(tmp_path / "out.csv.partial", process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 143 and "--resume" in err, err
    env = dict(os.environ, PIPELINE_SIM_CLUSTER="LOCAL")  # the address may come from the environment, in any case
    resumed = run_script("data_generator.py", "-c", str(config), "-o", "out.csv", "--resume", "--workers", "2",
                         cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "local Dask cluster" in resumed.stdout and "resuming" in resumed.stdout
    assert (tmp_path / "out.csv").read_bytes() == big_reference


def test_an_unreachable_scheduler_is_one_line_and_leaves_no_files(tmp_path):
    result = run_script("data_generator.py", "-c", str(ROOT / "configs" / "quick.json"), "-o", "x.csv",
                        "--cluster", "tcp://127.0.0.1:9", cwd=tmp_path, timeout=60)
    assert_one_line_error(result, "cannot reach the Dask scheduler at tcp://127.0.0.1:9 within 5 s")
    assert not list(tmp_path.glob("x.csv*"))


def serve(greeting):
    """A TCP server on localhost that accepts every connection, sends ``greeting`` and never anything else."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted = []

    def run():
        while True:
            connection, _ = server.accept()
            accepted.append(connection)
            connection.sendall(greeting)

    threading.Thread(target=run, daemon=True).start()
    return f"tcp://127.0.0.1:{server.getsockname()[1]}"


@pytest.mark.parametrize("greeting, fragment", [
    (b"", "cannot reach the Dask scheduler at {} within 5 s"),
    (b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n", "no Dask answer from {} (MemoryError); is it a Dask scheduler"),
])
def test_a_silent_peer_or_another_server_is_one_line_within_seconds(tmp_path, greeting, fragment):
    address = serve(greeting)
    started = time.monotonic()
    result = run_script("data_generator.py", "-c", str(ROOT / "configs" / "quick.json"), "-o", "x.csv",
                        "--cluster", address, cwd=tmp_path, timeout=60)
    assert_one_line_error(result, fragment.format(address))
    assert time.monotonic() - started < 20 and not list(tmp_path.glob("x.csv*"))


def test_a_scheduler_without_workers_is_one_line(monkeypatch):
    monkeypatch.setattr(cluster, "WORKER_SECONDS", 1)
    local = distributed.LocalCluster(n_workers=0, dashboard_address=None, silence_logs=50)
    try:
        started = time.monotonic()
        with pytest.raises(ClusterError, match=f"no worker joined the Dask scheduler at {local.scheduler_address} "
                                               "within 1 s; start some with `dask worker"):
            DaskCluster(local.scheduler_address).connect()
        assert time.monotonic() - started < 10
    finally:
        local.close()


@contextlib.contextmanager
def remote_cluster(folder, threads=1):
    """A Dask scheduler started as a user would, and one worker of ``threads`` threads: its address, and the
    scheduler's process; both killed on leaving."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    dask = [sys.executable, "-m"]
    scheduler = subprocess.Popen([*dask, "distributed.cli.dask_scheduler", "--port", "0", "--no-dashboard",
                                  "--scheduler-file", "s.json"], cwd=folder, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
    worker = None
    try:
        deadline = time.monotonic() + 60
        while not (folder / "s.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        address = json.loads((folder / "s.json").read_text())["address"]
        worker = subprocess.Popen([*dask, "distributed.cli.dask_worker", address, "--nthreads", str(threads),
                                   "--no-dashboard"], cwd=folder, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        yield address, scheduler
    finally:
        for process in (scheduler, worker):
            if process is not None:
                process.kill()
                process.wait()


def test_a_scheduler_lost_mid_sweep_is_one_line_and_keeps_the_rows(tmp_path, big_reference):
    config = write_config(tmp_path, BIG)
    with remote_cluster(tmp_path) as (address, scheduler):
        sweep = start([ROOT / "data_generator.py", "-c", config, "-o", "out.csv", "--cluster", address], tmp_path)
        wait_for_rows(tmp_path / "out.csv.partial", sweep)
        scheduler.kill()
        _, err = sweep.communicate(timeout=60)
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip() and "%|" not in line]
    assert sweep.returncode != 0 and len(lines) == 1, err
    assert f"the Dask scheduler at {address} was lost" in lines[0]
    assert re.search(r"after [\d,]+ of [\d,]+ simulations; rows kept in out\.csv\.partial; to continue: python "
                     rf".*data_generator\.py -c {re.escape(str(config))} -o out\.csv --cluster \S+ --resume$",
                     lines[0]), lines[0]
    resumed = run_script("data_generator.py", "-c", str(config), "-o", "out.csv", "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert (tmp_path / "out.csv").read_bytes() == big_reference


def test_a_remote_cluster_is_priced_on_its_own_workers(tmp_path):
    """The day limit of a sweep on a remote cluster counts the cluster's worker threads, once reached, not this
    machine's cores: one thread here, where this machine has two; the refusal leaves no files."""
    config = write_config(tmp_path, {"n": 64, "num_gpus": 16, "schedule": "zb-h1", "dispatch": "lookahead",
                                     "samples": 50, "compute_jitter": 0.1})
    with remote_cluster(tmp_path, threads=1) as (address, _):
        refused = run_script("data_generator.py", "-c", str(config), "-o", "out.csv", "--cluster", address,
                             cwd=tmp_path)
    assert_one_line_error(refused, "would take about", " hours on 1 worker of the cluster as reached (each look-ahead "
                                                       "decision", "at most 24 hours are allowed")
    assert sorted(path.name for path in tmp_path.iterdir()) == [config.name, "s.json"]


@pytest.mark.parametrize("delay", [1.0, 2.5, None])
def test_ctrl_c_on_a_local_cluster_prints_only_our_line(tmp_path, delay):
    """Ctrl-C reaches the whole process group: while the cluster starts (``delay`` seconds after its first process
    appears, whatever the interpreter's start took on a busy machine), or once rows are written (None). The grid is
    BIG at twice the micro-batches (about 10 s of work), so that no machine finishes it before the signal."""
    import psutil  # the cluster's own requirement

    config = write_config(tmp_path, BIG | {"n": [128, 256]})
    process = subprocess.Popen([sys.executable, str(ROOT / "data_generator.py"), "-c", str(config), "-o", "out.csv",
                                "--cluster", "local", "--workers", "2"], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    if delay is None:
        wait_for_rows(tmp_path / "out.csv.partial", process)
    else:
        deadline = time.monotonic() + 60
        while not psutil.Process(process.pid).children() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(delay)
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=60)
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip() and "%|" not in line]
    assert process.returncode == 130 and len(lines) == 1 and "interrupted" in lines[0], err


def test_a_local_cluster_starts_no_dashboard():
    import urllib.error
    import urllib.request

    local = DaskCluster("local", 1).connect()
    try:
        port = local.local.scheduler.http_server.port
        assert port != 8787
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5)
    finally:
        local.close()


PLAN = ["--model", "llama3-8b", "--gpu", "h100-80gb", "--gpus", "8", "--global-batch-size", "64", "--seq-len", "4096"]


def test_a_plan_on_a_local_cluster_writes_the_pools_bytes(tmp_path):
    pool = run_script("plan.py", *PLAN, "--workers", "2", "-o", "pool.csv", cwd=tmp_path)
    assert pool.returncode == 0, pool.stderr
    dask = run_script("plan.py", *PLAN, "--workers", "2", "--cluster", "local", "-o", "dask.csv", cwd=tmp_path)
    assert dask.returncode == 0, dask.stderr
    assert (tmp_path / "dask.csv").read_bytes() == (tmp_path / "pool.csv").read_bytes()
    # the layouts listed are the same, and so is the count of those simulated (the run's seconds aside)
    assert [re.sub(r", [\d.]+ s$", "", line) for line in dask.stdout.splitlines()[:-2]] == \
        [re.sub(r", [\d.]+ s$", "", line) for line in pool.stdout.splitlines()[:-2]]


def test_a_plan_on_an_unreachable_cluster_is_one_line(tmp_path):
    address = serve(b"")
    result = run_script("plan.py", *PLAN, "-o", "x.csv", "--cluster", address, cwd=tmp_path, timeout=60)
    assert_one_line_error(result, f"cannot reach the Dask scheduler at {address} within 5 s")
    assert not list(tmp_path.glob("x.*"))
