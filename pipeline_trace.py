"""Record real PyTorch pipeline runs, replay their traces, predict other schedules from them; see `--help`."""

from pipeline_sim.cli.common import exit_with
from pipeline_sim.cli.trace import main

if __name__ == "__main__":
    exit_with(main())
