"""Train a learned dispatcher on the environments of a sweep config; see `--help`."""

from pipeline_sim.cli.common import exit_with
from pipeline_sim.cli.train import main

if __name__ == "__main__":
    exit_with(main())
