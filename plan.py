"""Search the layouts, schedules and policies of a model on a number of GPUs; see `--help`."""

from pipeline_sim.cli.common import exit_with
from pipeline_sim.cli.plan import main

if __name__ == "__main__":
    exit_with(main())
