"""Draw one heatmap per environment of a data_generator.py CSV; see `--help`."""

from pipeline_sim.cli.heatmap import main

if __name__ == "__main__":
    raise SystemExit(main())
