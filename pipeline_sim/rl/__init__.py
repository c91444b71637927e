"""A learned scheduler's side of the simulator: a Gymnasium environment whose steps are the run-time dispatch
decisions of an episode (docs/model.md section 12.4). Needs the ``[rl]`` extra."""

from __future__ import annotations

try:
    import gymnasium  # noqa: F401
except ImportError as error:  # a missing extra is one line, not a traceback far from its cause
    raise ImportError("pipeline_sim.rl needs the [rl] extra: pip install -r requirements-rl.txt "
                      "(or pip install 'pipeline-sim[rl]')") from error

from ..episode import OBSERVATION_FIELDS
from .env import PipelineDispatchEnv

__all__ = ["OBSERVATION_FIELDS", "PipelineDispatchEnv"]
