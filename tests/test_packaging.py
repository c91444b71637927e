"""The installable package: every console command of pyproject.toml is a callable of the package."""

import importlib
import tomllib

import pytest
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


@pytest.mark.parametrize("extra", ["rl", "solver"])
def test_an_extra_pins_what_its_requirements_file_installs(extra):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = {line.split("==")[0] for line in (ROOT / f"requirements-{extra}.txt").read_text().splitlines()
              if line and not line.startswith("#")}
    assert {dependency.split(">=")[0] for dependency in project["optional-dependencies"][extra]} == pinned
    assert f"-r requirements-{extra}.txt" in (ROOT / "requirements-test.txt").read_text().splitlines()
