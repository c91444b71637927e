"""What a training run does, and whether this installation can train: light, so that train.py's ``--help`` and its
argument errors answer without loading PyTorch."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass

from ..model import ParameterError

#: The libraries of the [rl] extra that training loads, in the order it loads them.
EXTRA_MODULES = ("gymnasium", "sb3_contrib", "torch")


def missing_extra(name: str) -> str:
    """The one line that says training lacks the library ``name`` of the [rl] extra, and how to install it."""
    return (f"training needs the [rl] extra ({name} is missing): pip install -r requirements-rl.txt "
            "(or pip install 'pipeline-sim[rl]')")


def extra_missing() -> str | None:
    """``missing_extra`` of the first library of the [rl] extra this installation lacks, found without loading any;
    None when it has them all."""
    for name in EXTRA_MODULES:
        try:
            found = sys.modules[name] is not None if name in sys.modules else \
                importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return missing_extra(name)
    return None


@dataclass(frozen=True)
class Settings:
    """What a training run does; the defaults train ``configs/learned.json`` in about 45 s on 2 cores. No
    entropy bonus: the file keeps the network's most likely action, which an entropy bonus keeps unsure."""

    steps: int = 300_000
    environments_per_update: int = 4  # parallel copies, each ``rollout`` steps per update
    rollout: int = 1024
    batch_size: int = 256
    epochs: int = 4
    learning_rate: float = 3e-4
    entropy: float = 0.0
    hidden: tuple[int, ...] = (64, 64)
    evaluate_every: int = 20_000
    validation_samples: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "environments_per_update", "rollout", "batch_size", "epochs", "evaluate_every",
                     "validation_samples"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ParameterError(name, getattr(self, name), "must be an integer >= 1")
        if not 0 < self.learning_rate < 1:
            raise ParameterError("learning_rate", self.learning_rate, "must be between 0 and 1")
