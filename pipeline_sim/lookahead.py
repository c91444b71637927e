"""``dispatch = lookahead`` (docs/model.md section 12.7): at each decision every candidate is started on a copy of
the run whose unfinished tasks take their expected lengths, the static order runs the copy to its end, and the
candidate of the earliest end is started in the run itself. It runs as an episode's decisions, inside the compiled
loop (``kernel.look_ahead``): rows, charts and the validator read it as they read a compiled rule.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .engine import check_run, given_lengths, memory_in_force
from .episode import Episode, episode_schedule
from .model import EnvParams, Policy, Schedule


def lookahead_figures(params: EnvParams, policies: Sequence[Policy], sample: int = 0) -> np.ndarray:
    """``engine.simulate_figures`` of the look-ahead's run of draw ``sample``, one episode per policy."""
    memory_in_force(params)  # a limit the look-ahead cannot keep is refused, whoever calls
    rows = []
    for policy in policies:
        episode = Episode(params, policy, allow_large=True)
        episode.look_ahead(sample)
        rows.append(episode.figures())
    return np.array(rows)


def simulate_lookahead(params: EnvParams, policy: Policy, sample: int = 0,
                       lengths: Sequence[float] | None = None, progress: np.ndarray | None = None) -> Schedule:
    """The look-ahead's run of draw ``sample`` under ``policy``, as ``engine.simulate`` gives a run; ``lengths``,
    every task's work in task order, runs instead of the parameters' own (``engine.simulate``), while the
    look-ahead expects the parameters' own. ``progress[0]`` is kept at the tasks ended (``Episode.look_ahead``)."""
    check_run("simulate_lookahead", params, policy, sample)
    memory_in_force(params)  # a limit the look-ahead cannot keep is refused, whoever calls
    work = None if lengths is None else given_lengths(params, lengths)
    return episode_schedule(params, policy, sample, lambda episode: episode.look_ahead(sample, work, progress),
                            lengths=work)
