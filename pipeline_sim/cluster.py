"""The sweep's chunks on a Dask cluster: the same in-order map as ``parallel.ordered_map``, over the network.

Optional: needs ``dask[distributed]`` (``pip install "pipeline-sim[cluster]"``). ``address``
is a scheduler's (``tcp://host:8786``) or ``local`` for a ``LocalCluster`` of worker
processes on this machine. Every chunk is one task with its own key, so Dask never merges
two chunks (noise samples included) however alike their arguments; a chunk whose worker
dies is run again elsewhere, and results are yielded in input order whatever order they
finish in, so the CSV is the same bytes as the process pool's.
"""

from __future__ import annotations

import uuid
from collections import deque
from typing import Any, Callable, Generator, Iterable, Iterator, TypeVar

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")

#: Environment variable read when no --cluster is given.
CLUSTER_VARIABLE = "PIPELINE_SIM_CLUSTER"
#: Seconds to wait for a scheduler before saying it cannot be reached.
CONNECT_SECONDS = 5
#: Times a chunk is run again after its worker died or it failed, before the sweep stops.
RETRIES = 3


class ClusterError(ValueError):
    """A cluster that cannot be used: Dask missing, a scheduler out of reach, a sweep's chunk that kept failing."""


class DaskCluster:
    """Where a sweep's chunks run: the Dask scheduler at ``address``, or ``local`` (a ``LocalCluster`` of
    ``workers`` processes). Connects on ``connect`` or on first use; ``close`` ends a local cluster."""

    def __init__(self, address: str, workers: int = 1) -> None:
        self.address, self.workers = address, workers
        self.client: Any = None  # a distributed.Client once connected
        self.local: Any = None  # the LocalCluster this object started, if any

    def connect(self) -> DaskCluster:
        """Start or reach the cluster now; ``ClusterError`` in one line when Dask is missing or the scheduler
        does not answer within ``CONNECT_SECONDS``."""
        if self.client is not None:
            return self
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise ClusterError("--cluster needs Dask's distributed scheduler: pip install \"pipeline-sim[cluster]\" "
                               "(or dask[distributed])") from None
        if self.address == "local":
            self.local = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True,
                                      dashboard_address=None, silence_logs=50)
            self.client = Client(self.local)
            return self
        try:
            self.client = Client(self.address, timeout=f"{CONNECT_SECONDS}s")
        except (OSError, TimeoutError, ValueError) as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ClusterError(f"cannot reach the Dask scheduler at {self.address} within {CONNECT_SECONDS} s "
                               f"({reason}); start one with `dask scheduler` or use --cluster local") from None
        return self

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.local is not None:
            self.local.close()
        self.client = self.local = None

    def map(self, function: Callable[[_Item], _Result], items: Iterable[_Item],
            batch: int = 1) -> Generator[_Result, None, None]:
        """``map`` on the cluster, results in input order. ``batch`` items make one Dask task (a task costs the
        scheduler about a millisecond, so each should carry far more work than that); at most four tasks per
        worker thread are in flight."""
        client = self.connect().client
        run = uuid.uuid4().hex[:12]  # keys of this sweep alone, on a scheduler others may share
        threads = max(1, sum(client.nthreads().values()))
        pending: deque = deque()
        try:
            for index, group in enumerate(_batches(items, batch)):
                pending.append(client.submit(_apply, function, group, key=f"pipeline-sim-{run}-task-{index}",
                                             pure=False, retries=RETRIES))
                if len(pending) >= 4 * threads:
                    yield from _result(pending.popleft())
            while pending:
                yield from _result(pending.popleft())
        except Exception as error:
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
            raise ClusterError(f"task {future.key} was on workers that died {RETRIES + 1} times; the rows before it "
                               f"are kept (rerun with --resume)") from None
        raise
