"""The sweep's chunks and the planner's layouts on a Dask cluster: the same in-order map as
``parallel.ordered_map``, over the network.

Optional: needs ``dask[distributed]`` (``pip install "pipeline-sim[cluster]"``). ``address``
is a scheduler's (``tcp://host:8786``) or ``local`` for a ``LocalCluster`` of worker
processes on this machine. Every chunk is one task with its own key, so Dask never merges
two chunks (noise samples included) however alike their arguments; a chunk whose worker
dies is run again elsewhere, and results are yielded in input order whatever order they
finish in, so the CSV is the same bytes as the process pool's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
import uuid
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Generator, Iterable, Iterator, TypeVar

from .allocator import child_environment
from .parallel import die_with_parent

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")

#: Environment variable read when no --cluster is given.
CLUSTER_VARIABLE = "PIPELINE_SIM_CLUSTER"
#: Seconds to wait for a scheduler before saying it cannot be reached.
CONNECT_SECONDS = 5
#: Seconds to wait for a first worker to join a scheduler that has none.
WORKER_SECONDS = 30
#: Times a chunk is run again after its worker died or it failed, before the sweep stops.
RETRIES = 3


class ClusterError(ValueError):
    """A cluster that cannot be used: Dask missing, a scheduler out of reach, a sweep's chunk that kept failing."""


class ClusterLost(ClusterError):
    """The scheduler went away mid-run (a sweep keeps the rows written before)."""


class TaskKilled(ClusterError):
    """A task whose workers kept dying (a sweep keeps the rows before it)."""


class DaskCluster:
    """Where a sweep's chunks run: the Dask scheduler at ``address``, or ``local`` (a ``LocalCluster`` of
    ``workers`` processes). Connects on ``connect`` or on first use; ``close`` ends a local cluster."""

    def __init__(self, address: str, workers: int = 1) -> None:
        self.address, self.workers = address, workers
        self.client: Any = None  # a distributed.Client once connected
        self.local: Any = None  # the LocalCluster (its scheduler) this object started, if any
        self.processes: subprocess.Popen | None = None  # the `dask worker` process of a local cluster

    def connect(self) -> DaskCluster:
        """Start or reach the cluster now; ``ClusterError`` in one line when Dask is missing, the scheduler does
        not answer as one within ``CONNECT_SECONDS``, or no worker has joined it within ``WORKER_SECONDS``."""
        if self.client is not None:
            return self
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise ClusterError("--cluster needs Dask's distributed scheduler: pip install \"pipeline-sim[cluster]\" "
                               "(or dask[distributed])") from None
        if self.address == "local":
            import dask

            # The scheduler runs in this process; the workers in a `dask worker` process of a session of their
            # own, so that Ctrl-C, which the terminal sends to its whole group, reaches this process alone: it
            # stops the sweep and then the workers, and no worker prints a traceback of its own. They end with
            # this process however it ends. No route is served over HTTP, on a port of the system's choosing: no
            # dashboard.
            with dask.config.set({"distributed.scheduler.http.routes": []}):
                self.local = LocalCluster(n_workers=0, processes=False, protocol="tcp://", host="127.0.0.1",
                                          scheduler_port=0, dashboard_address="127.0.0.1:0",
                                          scheduler_kwargs={"dashboard": False}, silence_logs=50)
            try:
                self.client = Client(self.local)
                self.processes = _start_workers(self.local.scheduler_address, self.workers)
                self._wait_for_workers(self.workers)
            except BaseException:
                self.close()
                raise
            return self
        where = f"the Dask scheduler at {self.address}"
        try:
            # Asked first, briefly: a peer that accepts and never answers, or a server of another protocol, would
            # otherwise hang the client or have it read a length of exabytes.
            identity = asyncio.run(_identity(self.address, CONNECT_SECONDS))
        except (OSError, TimeoutError, ValueError) as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ClusterError(f"cannot reach {where} within {CONNECT_SECONDS} s ({reason}); start one with "
                               f"`dask scheduler` or use --cluster local") from None
        except Exception as error:
            raise ClusterError(f"no Dask answer from {self.address} ({type(error).__name__}); is it a Dask "
                               f"scheduler's address?") from None
        if not isinstance(identity, dict) or identity.get("type") != "Scheduler":
            raise ClusterError(f"no Dask scheduler answered at {self.address}; is it a Dask scheduler's address?")
        try:
            self.client = Client(self.address, timeout=f"{CONNECT_SECONDS}s")
        except (OSError, TimeoutError) as error:
            self.close()
            raise ClusterError(f"cannot reach {where} within {CONNECT_SECONDS} s ({type(error).__name__})") from None
        self._wait_for_workers(1)
        return self

    def _wait_for_workers(self, count: int) -> None:
        """``ClusterError`` when fewer than ``count`` workers have joined within ``WORKER_SECONDS``."""
        deadline = time.monotonic() + WORKER_SECONDS
        while len(self.client.scheduler_info(n_workers=-1)["workers"]) < count:
            if time.monotonic() > deadline or (self.processes is not None and self.processes.poll() is not None):
                address = self.client.scheduler.address
                self.close()
                start = "" if self.address == "local" else f"; start some with `dask worker {address}`"
                raise ClusterError(f"no worker joined the Dask scheduler at {address} within {WORKER_SECONDS} s"
                                   f"{start}")
            time.sleep(0.1)

    def threads(self) -> int:
        """The worker threads the cluster has now (at least one, once connected)."""
        return max(1, sum(self.connect().client.nthreads().values()))

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.processes is not None:
            self.processes.terminate()  # `dask worker` stops its workers on SIGTERM
            try:
                self.processes.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.processes.kill()
                self.processes.wait()
        if self.local is not None:
            self.local.close()
        self.client = self.local = self.processes = None

    def map(self, function: Callable[[_Item], _Result], items: Iterable[_Item],
            batch: int = 1) -> Generator[_Result, None, None]:
        """``map`` on the cluster, results in input order. ``batch`` items make one Dask task (a task costs the
        scheduler about a millisecond, so each should carry far more work than that); at most four tasks per
        worker thread are in flight."""
        client = self.connect().client
        run = uuid.uuid4().hex[:12]  # keys of this sweep alone, on a scheduler others may share
        threads = self.threads()
        pending: deque = deque()
        try:
            for index, group in enumerate(_batches(items, batch)):
                pending.append(client.submit(_apply, function, group, key=f"pipeline-sim-{run}-task-{index}",
                                             pure=False, retries=RETRIES))
                if len(pending) >= 4 * threads:
                    yield from _result(pending.popleft())
            while pending:
                yield from _result(pending.popleft())
        except (Exception, asyncio.CancelledError) as error:  # Dask cancels futures with asyncio's kind
            if _lost(error):
                raise ClusterLost(f"the Dask scheduler at {self.address} was lost "
                                  f"({type(error).__name__})") from None
            missing = error if isinstance(error, ImportError) else error.__cause__
            if not isinstance(missing, ImportError):
                raise
            # the scheduler unpickles each task, and the workers run it: both need the package
            raise ClusterError(f"the Dask cluster at {self.address} cannot import {missing.name or 'pipeline_sim'}: "
                               f"install the package on the scheduler's and every worker's machine (pip install "
                               f"\"pipeline-sim[cluster]\"), or start them with PYTHONPATH pointing at it") from None
        finally:
            for future in pending:
                future.cancel()


def quiet_dask() -> None:
    """Dask logs each connection it loses and each task it cancels, tracebacks included; what matters to a run is
    said in one line by its command. Its loggers are set up when it is imported, so it is imported first."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        return  # DaskCluster says how to install it
    for name in ["distributed", *logging.root.manager.loggerDict]:  # some carry levels of their own
        if name.split(".")[0] == "distributed":
            logging.getLogger(name).setLevel(logging.CRITICAL + 1)


@contextmanager
def connected(address: str | None, workers: int) -> Iterator[DaskCluster | None]:
    """The cluster at ``address`` (``local``: a local one of ``workers`` processes), connected, its logs quiet,
    closed on leaving; None without an address (the caller's process pool). An unreachable one raises
    ``ClusterError`` in one line before anything is done."""
    if not address:
        yield None
        return
    quiet_dask()
    cluster = DaskCluster(address, workers).connect()
    try:
        yield cluster
    finally:
        cluster.close()


def _start_workers(address: str, workers: int) -> subprocess.Popen:
    """``workers`` worker processes for the scheduler at ``address``, under one `dask worker` process in a session
    of its own; they import this very package, and keep what a simulation frees as a command does
    (``allocator.child_environment``)."""
    package_root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, (package_root, os.environ.get("PYTHONPATH"))))
    return subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nworkers",
                             str(workers), "--nthreads", "1", "--no-dashboard"],
                            env={**child_environment(os.environ), "PYTHONPATH": path},
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=die_with_parent)


async def _identity(address: str, seconds: float) -> Any:
    """What the server at ``address`` says it is, asked over Dask's protocol, each step within ``seconds``."""
    from distributed.comm import connect

    comm = await asyncio.wait_for(connect(address, timeout=seconds), seconds)
    try:
        await asyncio.wait_for(comm.write({"op": "identity"}), seconds)
        return await asyncio.wait_for(comm.read(), seconds)
    finally:
        comm.abort()


def _lost(error: BaseException) -> bool:
    """Whether ``error`` says the connection to the scheduler is gone (not that a chunk failed: a chunk's own
    errors come back as what the chunk raised)."""
    return isinstance(error, (OSError, TimeoutError, asyncio.CancelledError)) or \
        type(error).__name__ in ("CommClosedError", "FutureCancelledError", "CancelledError")


def _batches(items: Iterable[_Item], size: int) -> Iterator[list[_Item]]:
    group: list[_Item] = []
    for item in items:
        group.append(item)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def _apply(function: Callable[[_Item], _Result], items: list[_Item]) -> list[_Result]:
    """One Dask task: ``function`` over a batch of items, on a worker."""
    return [function(item) for item in items]


def _result(future):
    try:
        return future.result()
    except Exception as error:  # a chunk that failed on every retry, or whose workers kept dying
        if type(error).__name__ == "KilledWorker":
            raise TaskKilled(f"task {future.key} was on workers that died {RETRIES + 1} times") from None
        raise
