"""Sweep every priority policy over a JSON grid of environments into one CSV; see `--help`."""

from pipeline_sim.cli.common import exit_with
from pipeline_sim.cli.generate import main

if __name__ == "__main__":
    exit_with(main())
