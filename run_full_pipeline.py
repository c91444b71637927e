"""Config -> CSV -> heatmaps -> summary in one command: `python run_full_pipeline.py -c configs/example.json`."""

from pipeline_sim.cli.common import exit_with
from pipeline_sim.cli.full import main

if __name__ == "__main__":
    exit_with(main())
