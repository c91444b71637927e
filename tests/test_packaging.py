"""The installable package: every console command of pyproject.toml is a callable of the package."""

import importlib
import tomllib

from conftest import ROOT


def test_console_commands_mirror_the_scripts():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    commands = project["scripts"]
    assert set(commands) == {"pipeline-sim-run", "pipeline-sim-generate", "pipeline-sim-heatmap",
                             "pipeline-sim-gantt", "pipeline-sim-gantt-dual", "pipeline-sim-plan",
                             "pipeline-sim-train", "pipeline-sim-trace"}
    for target in commands.values():
        module, name = target.split(":")
        assert callable(getattr(importlib.import_module(module), name))
    runtime = {line.split("==")[0] for line in (ROOT / "requirements.txt").read_text().splitlines()
               if line and not line.startswith("#")}
    assert {dependency.split(">=")[0] for dependency in project["dependencies"]} == runtime


def _pinned(name: str) -> set[str]:
    """The packages a requirements file pins, those of the files it includes (``-r``) too."""
    lines = [line for line in (ROOT / name).read_text().splitlines() if line and not line.startswith("#")]
    return {pin for line in lines for pin in (_pinned(line[3:]) if line.startswith("-r ") else {line.split("==")[0]})}


def test_the_extras_pin_what_their_requirements_files_install():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for extra in ("rl", "trace", "solver"):
        pinned = _pinned(f"requirements-{extra}.txt")
        assert {dependency.split(">=")[0] for dependency in project["optional-dependencies"][extra]} == pinned
        assert f"-r requirements-{extra}.txt" in (ROOT / "requirements-test.txt").read_text().splitlines()
