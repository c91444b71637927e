"""Event-driven simulation of 1F1B pipeline-parallel training with contended network ports."""

from .engine import SimulationStuckError, calculate_full_pipeline_schedule, simulate
from .model import COMM_KINDS, EnvParams, ParameterError, Policy, Schedule, Task, TaskId, TaskKind

__all__ = [
    "COMM_KINDS", "EnvParams", "ParameterError", "Policy", "Schedule", "SimulationStuckError", "Task", "TaskId", "TaskKind",
    "calculate_full_pipeline_schedule", "simulate",
]
