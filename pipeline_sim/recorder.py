"""Real pipeline runs with ``torch.distributed.pipelining``, traced by ``torch.profiler`` (needs the ``[trace]`` extra).

One process per rank over gloo (NCCL on GPUs), each single-threaded, runs a stack of MLP blocks as a pipeline under
one of PyTorch's schedules and writes its rank's Chrome/Kineto trace. Every compute action and every posted send is a
``record_function`` range named as the simulator names tasks (``pipeline:1F3``: stage 1's forward of micro-batch 3;
``pipeline:send 1F3 262144``: its output sent, in bytes), and every iteration one ``pipeline:iteration k`` range, so
that ``measured.read_run`` finds them whatever else the trace holds. Only those events are kept, with the profiler's
``c10d::send`` ranges (an unfiltered trace of a big model runs to gigabytes); the file stays a Kineto trace that
Perfetto opens.
"""

from __future__ import annotations

import atexit
import gzip
import json
import logging
import os
import signal
import sys
import tempfile
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.profiler import ProfilerActivity, profile, record_function

from .parallel import release_stops, stops_held
from .schedules import get_schedule

#: Our schedule name -> PyTorch's class that runs it (``ScheduleInterleavedZeroBubble`` with one stage per rank runs
#: ZB-H1's order exactly).
TORCH_SCHEDULES: dict[str, Any] = {
    "gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved-1f1b": ScheduleInterleaved1F1B,
    "zb-h1": ScheduleInterleavedZeroBubble, "zb-v": ScheduleZBVZeroBubble, "dualpipe-v": ScheduleDualPipeV,
}
PREFIX = "pipeline:"
#: PyTorch's classes that need at least as many micro-batches as the pipeline has stages.
AT_LEAST_THE_STAGES = (Schedule1F1B, ScheduleDualPipeV)


@dataclass(frozen=True)
class RunSpec:
    """What one traced run is: the schedule, its ranks and stages, the model and how many iterations."""

    schedule: str
    ranks: int = 2
    chunks: int = 2  # stages per rank of a schedule that reads ``chunks`` (interleaved-1f1b)
    microbatches: int = 8
    batch: int = 64  # rows per micro-batch
    width: int = 512  # the hidden size
    layers: int = 8  # Linear + ReLU layers of the whole model, split evenly over its stages
    warmup: int = 2  # untraced iterations first
    iterations: int = 3
    backend: str = "gloo"
    port: int = 29517

    @property
    def stages(self) -> int:
        return self.ranks * get_schedule(self.schedule).v(self.chunks)

    @property
    def least_microbatches(self) -> int:
        """The fewest micro-batches PyTorch's class of the schedule runs."""
        return self.stages if TORCH_SCHEDULES[self.schedule] in AT_LEAST_THE_STAGES else 1


def _stage_module(spec: RunSpec, stage: int) -> torch.nn.Module:
    torch.manual_seed(stage)  # the same weights on every run
    per_stage = spec.layers // spec.stages
    return torch.nn.Sequential(*(module for _ in range(per_stage)
                                 for module in (torch.nn.Linear(spec.width, spec.width), torch.nn.ReLU())))


def _named(method: Any, name: Any) -> Any:
    """``method`` run inside a ``record_function`` range named by ``name(*args, **kwargs)``."""
    def run(*args: Any, **kwargs: Any) -> Any:
        with record_function(PREFIX + name(*args, **kwargs)):
            return method(*args, **kwargs)
    return run


def _send_marker(method: Any, stage: int, kind: str) -> Any:
    """``get_*_send_ops`` that marks, as a range of its own, when the send is posted and how many bytes it carries."""
    def run(mb: int) -> Any:
        ops = method(mb)
        size = sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
        if ops:
            with record_function(f"{PREFIX}send {stage}{kind}{mb} {size}"):
                pass
        return ops
    return run


def _instrument(stage: Any) -> None:
    s = stage.stage_index
    stage.forward_one_chunk = _named(stage.forward_one_chunk, lambda mb, *a, **k: f"{s}F{mb}")
    stage.backward_one_chunk = _named(stage.backward_one_chunk,
                                      lambda mb, *a, full_backward=True, **k: f"{s}{'B' if full_backward else 'I'}{mb}")
    stage.backward_weight_one_chunk = _named(stage.backward_weight_one_chunk, lambda mb, *a, **k: f"{s}W{mb}")
    stage.get_fwd_send_ops = _send_marker(stage.get_fwd_send_ops, s, "F")
    stage.get_bwd_send_ops = _send_marker(stage.get_bwd_send_ops, s, "B")


#: The profiler's own ranges kept beside ours: how long posting a send took (gloo may hold the sender there until the
#: receiver has posted its receive, which no simulated transfer does).
KEPT = ("c10d::send",)


def _kept(event: dict) -> bool:
    name = str(event.get("name", ""))
    return event.get("ph") == "M" or name.startswith(PREFIX) or name in KEPT


def launched() -> bool:
    """Whether this process is one rank of a run that a launcher started (``torchrun``: one process per rank, on
    one host or many), rather than the process that starts the ranks itself."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"))


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """The process's standard error closed for a moment: the profiler's library writes a line there at each start
    and stop, which would mix with the progress a user reads."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _forked_rank(rank: int, spec: RunSpec, out: str) -> None:
    """A rank forked by ``record``: its own handlers of the stops first (Ctrl-C an interrupt, which PyTorch's wrapper
    of the rank takes as an end; SIGTERM, by which PyTorch stops the other ranks once one has failed, an end at once),
    then the stops this process was forked holding, then the run."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    release_stops()
    _rank_main(rank, spec, out)


def _rank_main(rank: int, spec: RunSpec, out: str) -> None:
    torch.set_num_threads(1)
    if launched():  # the process group of every run of this process, made once (``record``)
        local = int(os.environ["LOCAL_RANK"])  # the rank's GPU: its place on its own host
    else:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(spec.port)
        dist.init_process_group(spec.backend, rank=rank, world_size=spec.ranks)
        local = rank
    try:
        placement = get_schedule(spec.schedule).placement
        v = spec.stages // spec.ranks
        device = torch.device("cuda", local) if spec.backend == "nccl" else torch.device("cpu")
        own = [s for s in range(spec.stages) if placement(s, spec.ranks, v) == rank]
        stages = [PipelineStage(_stage_module(spec, s).to(device), s, spec.stages, device) for s in own]
        for stage in stages:
            _instrument(stage)
        cls = TORCH_SCHEDULES[spec.schedule]
        loss = torch.nn.MSELoss()
        runner = cls(stages[0], spec.microbatches, loss_fn=loss) if len(stages) == 1 and cls in (
            ScheduleGPipe, Schedule1F1B) else cls(stages, spec.microbatches, loss_fn=loss)
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(spec.batch * spec.microbatches, spec.width, generator=generator).to(device)
        y = torch.randn(spec.batch * spec.microbatches, spec.width, generator=generator).to(device)
        first, last = 0 in own, spec.stages - 1 in own

        def step() -> None:
            args = (x,) if first else ()
            runner.step(*args, target=y if last else None, losses=[] if last else None)

        for _ in range(spec.warmup):
            step()
        dist.barrier()
        load = os.getloadavg()[0]  # other work on the host stretches every length: said beside the trace
        prof = profile(activities=[ProfilerActivity.CPU])
        with _quiet_stderr():
            prof.start()
        try:
            for k in range(spec.iterations):
                dist.barrier()
                with record_function(f"{PREFIX}iteration {k}"):
                    step()
        finally:
            with _quiet_stderr():
                prof.stop()
        raw = Path(out) / f".rank{rank}.json"
        prof.export_chrome_trace(str(raw))
        trace = json.loads(raw.read_text())
        raw.unlink()
        trace["traceEvents"] = [event for event in trace["traceEvents"] if _kept(event)]
        trace["pipelineRun"] = {**asdict(spec), "rank": rank, "stages": spec.stages, "load_average": load}
        final = Path(out) / f"rank{rank}.json.gz"
        partial = final.with_suffix(".partial")
        with gzip.open(partial, "wt") as handle:
            json.dump(trace, handle)
        partial.replace(final)
    finally:
        if not launched():
            dist.destroy_process_group()


@contextmanager
def _level(logger: str, level: int) -> Iterator[None]:
    """``logger`` at ``level`` meanwhile."""
    log = logging.getLogger(logger)
    before = log.level
    log.setLevel(level)
    try:
        yield
    finally:
        log.setLevel(before)


@contextmanager
def _private_temporary_files() -> Iterator[None]:
    """The temporary files made meanwhile (PyTorch's, by which a failed rank reports its error, left behind when one
    fails) in a folder of their own, removed with all it holds."""
    with tempfile.TemporaryDirectory(prefix="pipeline-trace-") as folder:
        before, tempfile.tempdir = tempfile.tempdir, folder
        try:
            yield
        finally:
            tempfile.tempdir = before


def record(spec: RunSpec, out: Path) -> list[Path]:
    """Run ``spec`` for real on ``spec.ranks`` processes and write ``out/rank<r>.json.gz``; the paths written (under
    a launcher, this process runs its own rank and writes its own file: on a cluster, each host writes its ranks')."""
    out.mkdir(parents=True, exist_ok=True)
    ranks = [int(os.environ["RANK"])] if launched() else list(range(spec.ranks))
    written = [out / f"rank{rank}.json.gz" for rank in ranks]
    try:
        if launched():
            if not dist.is_initialized():  # the launcher's rendezvous, once: it cannot be joined again
                dist.init_process_group(spec.backend)
                atexit.register(dist.destroy_process_group)
            _rank_main(ranks[0], spec, str(out))
        else:  # forked, the ranks share the imported torch instead of importing it again (seconds on a busy host)
            # PyTorch logs each rank it stops after one failed; the failure itself is what the command says
            with _private_temporary_files(), _level("torch.multiprocessing.spawn", logging.ERROR):
                with stops_held():
                    forked = mp.start_processes(_forked_rank, args=(spec, str(out)), nprocs=spec.ranks, join=False,
                                                start_method="fork")
                while not forked.join():
                    pass
    except BaseException:  # a run stopped leaves none of its files, so that what reads the folder finds no half run
        for rank, path in zip(ranks, written):
            for leftover in (path, path.with_suffix(".partial"), out / f".rank{rank}.json"):
                leftover.unlink(missing_ok=True)
        with suppress(OSError):
            out.rmdir()  # only if empty
        raise
    return written


#: What a run's record (``pipelineRun`` of each rank's trace) must share with a spec for the run to be the spec's.
_SAME_RUN = ("schedule", "ranks", "chunks", "microbatches", "batch", "width", "layers", "warmup", "iterations",
             "backend")


def recorded(spec: RunSpec, folder: Path) -> bool:
    """Whether ``folder`` holds a whole run of ``spec``: a trace of every rank, its record that spec's."""
    try:
        with gzip.open(folder / "rank0.json.gz", "rt") as handle:
            run = json.load(handle).get("pipelineRun", {})
    except (OSError, ValueError, EOFError):
        return False
    return all((folder / f"rank{rank}.json.gz").is_file() for rank in range(spec.ranks)) and \
        all(run.get(key) == value for key, value in asdict(spec).items() if key in _SAME_RUN)


def record_rounds(specs: list[RunSpec], out: Path, rounds: int, kept: frozenset[Path] = frozenset()
                  ) -> Iterator[tuple[Path, bool]]:
    """Each of ``specs`` ``rounds`` times, in turn (a round runs every spec once, so that a slow spell of the host
    falls on all schedules alike), into ``out/<schedule>/run<r>/``; each folder as it is written, or as it was when
    it is one of ``kept`` (not run again), with whether it was."""
    for r in range(rounds):
        for spec in specs:
            folder = out / spec.schedule / f"run{r}"
            if folder not in kept:
                record(spec, folder)
            yield folder, folder in kept
