"""What a simulated iteration of a workload means in seconds, tokens per second, MFU and gigabytes."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..model import EnvParams, ParameterError
from .flops import iteration_flops
from .memory import gpu_memory_gb

if TYPE_CHECKING:
    from .definition import Workload


def seconds_text(seconds: float) -> str:
    """``73.6 ms``, ``15.7 s``, ``126 us``: a duration in the unit that reads best."""
    if seconds >= 1.0 or seconds == 0.0:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


@dataclass(frozen=True, slots=True)
class WorkloadReport:
    """What an iteration of a workload means in seconds, tokens and bytes."""

    fwd_seconds: float
    bwd_seconds: float
    prop_seconds: float
    sync_seconds: float
    iteration_seconds: float
    tokens_per_second: float
    mfu: float
    memory_gb: tuple[float, ...]  # per GPU: static + peak activations
    gpu_memory_gb: float
    optimizer_seconds: float = 0.0  # the fullest GPU's step
    a2a_seconds: float = 0.0  # a GPU's all-to-all in one forward (docs/model.md section 16)
    gather_seconds: float = 0.0  # the fullest GPU's all-gather of its parameters under zero (section 15)
    gathers: str = ""  # when it gathers: after the step (zero 1 and 2), or before each forward and backward (3)
    exchange_seconds: float = 0.0  # a forward's key and value exchange of context parallelism (section 15)

    @property
    def peak_memory_gb(self) -> float:
        return max(self.memory_gb)

    @property
    def memory_fits(self) -> bool:
        return self.peak_memory_gb <= self.gpu_memory_gb

    def lines(self) -> list[str]:
        """The report as text, for the command line."""
        fits = "fits" if self.memory_fits else "DOES NOT FIT"
        return [f"derived times: fwd {seconds_text(self.fwd_seconds)}, bwd {seconds_text(self.bwd_seconds)}, "
                f"prop {seconds_text(self.prop_seconds)}, sync {seconds_text(self.sync_seconds)}"
                + (f", optimizer step {seconds_text(self.optimizer_seconds)} (fullest GPU)" if self.optimizer_seconds
                   else "") + (f", all-to-all {seconds_text(self.a2a_seconds)} a forward" if self.a2a_seconds else "")
                + (f", gather {seconds_text(self.gather_seconds)} (fullest GPU; {self.gathers})"
                   if self.gather_seconds else "")
                + (f", key-value exchange {seconds_text(self.exchange_seconds)} a forward" if self.exchange_seconds
                   else ""),
                f"iteration {seconds_text(self.iteration_seconds)}, {self.tokens_per_second:,.0f} tokens/s, "
                f"MFU {self.mfu:.1%}",
                f"peak memory per GPU: {self._memory_text()} of {self.gpu_memory_gb:g} GB: {fits}"]

    def _memory_text(self) -> str:
        """Every GPU's peak, or beyond ``LISTED_GPUS`` of them the least and the most and which GPU holds it."""
        if len(self.memory_gb) <= LISTED_GPUS:
            return " ".join(f"{gb:,.1f}" for gb in self.memory_gb) + " GB"
        fullest = max(range(len(self.memory_gb)), key=self.memory_gb.__getitem__)
        return f"{min(self.memory_gb):,.1f} to {self.memory_gb[fullest]:,.1f} GB (the most on GPU {fullest})"

    def columns(self) -> dict[str, float | bool]:
        return {"tokens_per_second": self.tokens_per_second, "mfu": self.mfu, "peak_memory_gb": self.peak_memory_gb,
                "gpu_memory_gb": self.gpu_memory_gb, "memory_fits": self.memory_fits}


#: The most GPUs whose peak memory the report lists one by one.
LISTED_GPUS = 16
#: The report's columns of a workload sweep's CSV (iteration seconds are ``completion_time``).
REPORT_COLUMNS = ("tokens_per_second", "mfu", "peak_memory_gb", "gpu_memory_gb", "memory_fits")
#: A sweep whose ``layers_per_stage`` takes ``auto`` adds the split auto chose and the share of the balanced split's
#: iteration time it saves (empty on rows of another ``layers_per_stage``).
AUTO_COLUMNS = ("auto_layers", "auto_gain")


def workload_report(workload: Workload, params: EnvParams, completion_time: float,
                    gpu_peak_activations: list[float] | tuple[float, ...]) -> WorkloadReport:
    """Iteration time, throughput, MFU and memory of one simulated iteration of ``workload`` in ``params``: its
    ``completion_time`` (seconds, >= 0) and each GPU's peak activations (``params.num_gpus`` of them)."""
    if not (isinstance(completion_time, (int, float)) and completion_time >= 0.0):
        raise ParameterError("completion_time", completion_time, "must be a time in seconds, >= 0")
    if len(gpu_peak_activations) != params.num_gpus:
        raise ParameterError("gpu_peak_activations", tuple(gpu_peak_activations),
                             f"must give one peak per GPU, {params.num_gpus}")
    if not all(isinstance(peak, numbers.Real) and 0.0 <= peak < math.inf for peak in gpu_peak_activations):
        raise ParameterError("gpu_peak_activations", tuple(gpu_peak_activations),
                             "must be micro-batches of activations, each finite and >= 0")
    batch = params.n * workload.micro_batch_size * workload.data_parallel
    total_gpus = params.num_gpus * workload.model_parallel * workload.data_parallel
    assert workload.seq_len is not None
    peak_flops = workload.device.tflops * 1e12
    flops = iteration_flops(workload, batch)
    mfu = flops / (completion_time * total_gpus * peak_flops) if completion_time else math.nan
    memory = gpu_memory_gb(workload, params, gpu_peak_activations)
    return WorkloadReport(fwd_seconds=params.fwd_len, bwd_seconds=params.bwd_len, prop_seconds=params.prop_len,
                          sync_seconds=params.sync_base_len, iteration_seconds=completion_time,
                          optimizer_seconds=max(params.step_lengths()), a2a_seconds=params.a2a_len,
                          gather_seconds=max(params.gather_lengths()) if params.zero else 0.0,
                          gathers="before each forward and backward" if params.zero == 3 else "after the step",
                          exchange_seconds=params.cp_len,
                          tokens_per_second=batch * workload.seq_len / completion_time if completion_time else math.nan,
                          mfu=mfu, memory_gb=memory, gpu_memory_gb=workload.device.memory_gb)
