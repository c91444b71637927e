"""Simulate one iteration of a pipeline schedule and draw it: per GPU a compute row and one communication row.

Run ``python schedule_visualizer_single_channel.py --help`` for the options.
"""

from pipeline_sim.cli.common import exit_with
from pipeline_sim.cli.visualize import script_attribute as __getattr__  # noqa: F401 - calculate_full_pipeline_schedule
from pipeline_sim.cli.visualize import script_main
from pipeline_sim.model import DEFAULT_POLICY

#: Shared priorities of the transfer kinds used unless --priority/--exclusive are given (edit to change them).
DEFAULT_PRIORITIES: dict[str, float] = dict(DEFAULT_POLICY.priorities)  # fwd_prop 0.5, grad_prop 0.3, grad_sync 0.2
#: Exclusive tiers ('a' highest) used unless --priority/--exclusive are given.
DEFAULT_EXCLUSIVE_TIERS: dict[str, str] = dict(DEFAULT_POLICY.exclusive_tiers)

if __name__ == "__main__":
    exit_with(script_main("single_channel", DEFAULT_PRIORITIES, DEFAULT_EXCLUSIVE_TIERS))
