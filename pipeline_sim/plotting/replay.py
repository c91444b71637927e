"""A measured iteration above its replay: two Gantt charts on one time axis (milliseconds)."""

from __future__ import annotations

from statistics import median

from matplotlib.figure import Figure

from ..replay import Replay
from .gantt import plot_gantt


def replay_figure(result: Replay, *, title: str) -> Figure:
    """Measured (top) and simulated (bottom) timelines of ``result``, the same time scale, with the errors titled."""
    rows = result.simulated.params.num_gpus * 2
    fig = Figure(figsize=(16, 1.2 + 0.75 * rows * 2))
    top, bottom = fig.subplots(2, 1, sharex=True)
    stage_chunk = [0] * (result.simulated.params.num_gpus * result.simulated.params.v)
    for stage in range(len(stage_chunk)):
        stage_chunk[stage] = stage // result.simulated.params.num_gpus
    for ax, schedule, name in ((top, result.measured, "measured"), (bottom, result.simulated, "simulated")):
        plot_gantt(ax, schedule, stage_chunk=stage_chunk, show_completion_time=True)
        ax.set_title(f"{name}: {schedule.completion_time:.1f} ms", fontsize=10, loc="left")
    top.set_xlabel("")  # the axis is shared: its numbers and its name are the bottom chart's
    bottom.set_xlabel("time (ms)")
    end = max(result.measured.completion_time, result.simulated.completion_time) * 1.02
    top.set_xlim(0, end)
    fig.suptitle(f"{title}: replay error {result.iteration_error:+.1%}; task start error median "
                 f"{median(result.start_errors):.1%}, worst {max(result.start_errors):.0%}\n"
                 "measured: each action as it ran, each transfer from its post for its fitted time; simulated: an "
                 "action's length counts its rank's time since the previous one unless it waited for a transfer",
                 fontsize=10)
    fig.tight_layout()
    return fig
