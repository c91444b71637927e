"""A learned scheduler's side of the simulator: a Gymnasium environment whose steps are the run-time dispatch
decisions of an episode (docs/model.md section 12.4). Needs the ``[rl]`` extra."""

from __future__ import annotations

try:
    import gymnasium  # noqa: F401
except ImportError as error:  # a missing extra is one line, not a traceback far from its cause
    raise ImportError("pipeline_sim.rl needs the [rl] extra: pip install -r requirements-rl.txt "
                      "(or pip install 'pipeline-sim[rl]')") from error

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..episode import OBSERVATION_FIELDS
    from .env import PipelineDispatchEnv

#: Names loaded when first asked for, by their module: the environment brings the kernel, which training's settings
#: (``settings``, read by train.py's ``--help``) do not need.
_LOADED_LATER = {"OBSERVATION_FIELDS": "..episode", "PipelineDispatchEnv": ".env"}


def __getattr__(name: str) -> Any:
    if name not in _LOADED_LATER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_LOADED_LATER[name], __name__), name)
    globals()[name] = value
    return value


__all__ = ["OBSERVATION_FIELDS", "PipelineDispatchEnv"]
