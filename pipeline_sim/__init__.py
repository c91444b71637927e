"""Event-driven simulation of pipeline-parallel training schedules with contended network ports."""

from .engine import SimulationStuckError, calculate_full_pipeline_schedule, simulate
from .model import COMM_KINDS, Action, EnvParams, Pair, ParameterError, Policy, Schedule, Task, TaskId, TaskKind
from .orders import compute_orders
from .schedules import SCHEDULES
from .workload import GPU_PRESETS, MODEL_PRESETS, Workload, WorkloadReport, workload_environment, workload_report

__all__ = [
    "COMM_KINDS", "GPU_PRESETS", "MODEL_PRESETS", "SCHEDULES", "Action", "EnvParams", "Pair", "ParameterError",
    "Policy", "Schedule", "SimulationStuckError", "Task", "TaskId", "TaskKind", "Workload", "WorkloadReport",
    "calculate_full_pipeline_schedule", "compute_orders", "simulate", "workload_environment", "workload_report",
]
