"""The installable package: every console command of pyproject.toml is a callable of the package."""

import importlib
import subprocess
import sys
import tomllib

import pytest
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


@pytest.mark.parametrize("script", ["run_full_pipeline.py", "data_generator.py", "plot_heatmap.py", "train.py",
                                    "schedule_visualizer_single_channel.py", "schedule_visualizer_duel_channel.py",
                                    "plan.py", "pipeline_trace.py"])
def test_help_answers_without_the_compiler_or_the_plotting_libraries(script):
    """A command's --help (and so its argument errors) loads neither numba, pandas, matplotlib nor PyTorch: what a
    run needs is loaded once its arguments are read."""
    code = (f"import runpy, sys\nsys.argv = [{script!r}, '--help']\n"
            f"try:\n    runpy.run_path({str(ROOT / script)!r}, run_name='__main__')\nexcept SystemExit as end:\n"
            "    assert end.code == 0, end.code\n"
            "loaded = [name for name in ('numba', 'pandas', 'matplotlib', 'torch') if name in sys.modules]\n"
            "assert not loaded, loaded")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {script}")


def test_the_package_names_every_public_name_it_loads_later():
    """``dir`` (so ``help`` and completion) lists the names the package loads when first asked for, without loading
    them; each of ``__all__`` is there and resolves."""
    code = ("import sys, pipeline_sim as p\nnames = dir(p)\nassert 'numba' not in sys.modules\n"
            "missing = [n for n in p.__all__ if n not in names or getattr(p, n) is None]\nassert not missing, missing")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_readme_names_every_model_and_gpu_preset():
    from pipeline_sim.workload import GPU_PRESETS, MODEL_PRESETS

    rows = {line.split("|")[1].strip(): line for line in (ROOT / "README.md").read_text().splitlines()
            if line.startswith("| `model` |") or line.startswith("| `gpu` |")}
    for key, presets in (("`model`", MODEL_PRESETS), ("`gpu`", GPU_PRESETS)):
        assert [name for name in presets if f"`{name}`" not in rows[key]] == []


def test_the_readme_links_to_its_own_headings_and_files():
    """Every ``](#anchor)`` of the README names one of its headings (as GitHub makes their anchors) and every
    relative link a file of the repository."""
    import re

    text = (ROOT / "README.md").read_text()
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)  # a code block's comments are no headings
    anchors = {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
               for line in prose.splitlines() if line.startswith("#")}
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert [link for link in links if link.startswith("#") and link[1:] not in anchors] == []
    files = [link.split("#")[0] for link in links if not link.startswith(("#", "http"))]
    assert files and [path for path in files if not (ROOT / path).exists()] == []


def test_the_readme_says_what_every_shipped_config_sweeps():
    text = (ROOT / "README.md").read_text().split("Shipped configs (`configs/`):")[1].split("\n\n")[1]
    named = {name.strip() for row in text.splitlines()[2:] for name in row.split("|")[1].replace("`", "").split(",")}
    assert named == {path.name for path in (ROOT / "configs").glob("*.json")}
