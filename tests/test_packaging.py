"""The installable package: every console command of pyproject.toml is a callable of the package."""

import importlib
import tomllib

from conftest import ROOT


def test_console_commands_mirror_the_scripts():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    commands = project["scripts"]
    assert set(commands) == {"pipeline-sim-run", "pipeline-sim-generate", "pipeline-sim-heatmap",
                             "pipeline-sim-gantt", "pipeline-sim-gantt-dual", "pipeline-sim-plan",
                             "pipeline-sim-train"}
    for target in commands.values():
        module, name = target.split(":")
        assert callable(getattr(importlib.import_module(module), name))
    runtime = {line.split("==")[0] for line in (ROOT / "requirements.txt").read_text().splitlines()
               if line and not line.startswith("#")}
    assert {dependency.split(">=")[0] for dependency in project["dependencies"]} == runtime


def test_the_rl_extra_pins_what_its_requirements_file_installs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = {line.split("==")[0] for line in (ROOT / "requirements-rl.txt").read_text().splitlines()
              if line and not line.startswith("#")}
    assert {dependency.split(">=")[0] for dependency in project["optional-dependencies"]["rl"]} == pinned
    assert "-r requirements-rl.txt" in (ROOT / "requirements-test.txt").read_text().splitlines()
