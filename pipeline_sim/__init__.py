"""Event-driven simulation of pipeline-parallel training schedules with contended network ports."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .model import COMM_KINDS, Action, EnvParams, Pair, ParameterError, Policy, Schedule, Task, TaskId, TaskKind
from .schedules import SCHEDULES

if TYPE_CHECKING:
    from .engine import SimulationStuckError, calculate_full_pipeline_schedule, simulate
    from .taskgraph import compute_orders
    from .workload import GPU_PRESETS, MODEL_PRESETS, Workload, WorkloadReport, workload_environment, workload_report

#: Names loaded when first asked for, by their module: the engine brings the compiler (numba), which a command's
#: ``--help`` and its argument errors do not need.
_LOADED_LATER = {"SimulationStuckError": "engine", "calculate_full_pipeline_schedule": "engine", "simulate": "engine",
                 "compute_orders": "taskgraph",
                 "GPU_PRESETS": "workload", "MODEL_PRESETS": "workload", "Workload": "workload",
                 "WorkloadReport": "workload", "workload_environment": "workload", "workload_report": "workload"}


def __getattr__(name: str) -> Any:
    if name not in _LOADED_LATER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_LOADED_LATER[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, those loaded when first asked for among them (``help``, completion)."""
    return sorted({*globals(), *_LOADED_LATER})


__all__ = [
    "COMM_KINDS", "GPU_PRESETS", "MODEL_PRESETS", "SCHEDULES", "Action", "EnvParams", "Pair", "ParameterError",
    "Policy", "Schedule", "SimulationStuckError", "Task", "TaskId", "TaskKind", "Workload", "WorkloadReport",
    "calculate_full_pipeline_schedule", "compute_orders", "simulate", "workload_environment", "workload_report",
]
