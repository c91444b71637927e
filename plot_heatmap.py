"""Draw one heatmap per environment of a data_generator.py CSV; see `--help`."""

from pipeline_sim.cli.common import exit_with
from pipeline_sim.cli.heatmap import main

if __name__ == "__main__":
    exit_with(main())
