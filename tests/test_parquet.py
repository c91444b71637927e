"""Parquet output: the same rows as the CSV, typed, in row groups, resumable; heatmaps equal to the CSV's."""

import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT, assert_one_line_error, run_here, run_script

from pipeline_sim import parquet
from pipeline_sim.config import EnvironmentGrid
from pipeline_sim.results import ResultsError, environments, load_results, read_results
from pipeline_sim.scenarios import policy_count
from pipeline_sim.sweep import SweepPlan, partial_paths, run_sweep, samples_path

pq = pytest.importorskip("pyarrow.parquet", reason="Parquet needs the [cluster] extra (pyarrow)")

SMALL = {"n": [3, 5], "num_gpus": [2, 3], "sync_freq": [1, 2]}
NOISY = {"n": 4, "num_gpus": 2, "schedule": ["1f1b", "zb-h1"], "compute_jitter": [0.0, 0.2], "samples": 3}


def plan_of(grid, **kwargs):
    return SweepPlan(EnvironmentGrid.from_mapping(grid), step=0.25, **kwargs)


def sweep(plan, output, **kwargs):
    for _ in run_sweep(plan, output, **kwargs):
        pass
    return output.read_bytes()


@pytest.fixture
def small_parts(monkeypatch):
    """Parts and row groups of a few rows, so that a small sweep has many of each."""
    monkeypatch.setattr(parquet, "PART_ROWS", 20)
    monkeypatch.setattr(parquet, "ROW_GROUP_ROWS", 32)


@pytest.mark.parametrize("grid", [SMALL, NOISY])
def test_parquet_holds_the_csv_rows_typed(grid, tmp_path, small_parts):
    with_samples = grid is NOISY
    sweep(plan_of(grid, with_samples=with_samples), tmp_path / "out.csv", workers=2,
          **({"samples_output": tmp_path / "s1.csv"} if with_samples else {}))
    plan = plan_of(grid, format="parquet", with_samples=with_samples)
    sweep(plan, tmp_path / "out.parquet", workers=2, **({"samples_output": tmp_path / "s2.csv"} if with_samples
                                                         else {}))
    from_csv, from_parquet = load_results(tmp_path / "out.csv"), load_results(tmp_path / "out.parquet")
    pd.testing.assert_frame_equal(from_csv, from_parquet)  # every value and every dtype
    handle = pq.ParquetFile(tmp_path / "out.parquet")
    assert handle.metadata.num_rows == plan.num_rows
    assert [handle.metadata.row_group(i).num_rows for i in range(handle.num_row_groups)][:-1] == \
        [32] * (handle.num_row_groups - 1)
    types = {field.name: str(field.type) for field in handle.schema_arrow}
    assert types["n"] == "int64" and types["fwd_len"] == "double" and types["policy"] == "string"
    assert types["tier_grad_sync"] == "string" and types["samples"] == "int64"
    if with_samples:
        assert (tmp_path / "s1.csv").read_bytes() == (tmp_path / "s2.csv").read_bytes()
    assert not list(tmp_path.glob("*.partial*"))


def test_same_bytes_whatever_the_workers(tmp_path, small_parts):
    plan = plan_of(SMALL, format="parquet")
    assert sweep(plan, tmp_path / "one.parquet", workers=1) == sweep(plan, tmp_path / "two.parquet", workers=2)


@pytest.mark.parametrize("stop_after", [1, 4])
def test_interrupted_then_resumed_equals_uninterrupted(tmp_path, small_parts, stop_after):
    plan = plan_of(NOISY, format="parquet", with_samples=True)
    reference = sweep(plan, tmp_path / "reference.parquet", samples_output=tmp_path / "reference_samples.csv")
    output, samples = tmp_path / "out.parquet", tmp_path / "samples.csv"
    progress = run_sweep(plan, output, samples_output=samples, workers=2)
    for _, done in zip(range(stop_after + 1), progress):
        pass
    progress.close()  # what Ctrl-C does to the generator: the rows gathered are written as a part
    partial, meta = partial_paths(output)
    assert partial.is_dir() and meta.exists() and not output.exists()
    assert parquet.verified_parts(partial).rows == done and 0 < done < plan.num_rows
    progress = run_sweep(plan, output, samples_output=samples, workers=2, resume=True)
    assert next(progress) == done
    for _ in progress:
        pass
    assert output.read_bytes() == reference
    assert samples.read_bytes() == (tmp_path / "reference_samples.csv").read_bytes()
    assert not partial.exists() and not meta.exists()


def test_a_sweep_killed_outright_resumes_from_its_parts(tmp_path, small_parts):
    """A kill leaves finished parts, perhaps a half-written one and samples beyond the last part: resume keeps
    the parts, drops the rest and redoes it."""
    plan = plan_of(NOISY, format="parquet", with_samples=True)
    reference = sweep(plan, tmp_path / "reference.parquet", samples_output=tmp_path / "reference_samples.csv")
    output, samples = tmp_path / "out.parquet", tmp_path / "samples.csv"
    progress = run_sweep(plan, output, samples_output=samples)
    for _, done in zip(range(4), progress):
        pass
    progress.close()
    partial, _ = partial_paths(output)
    kept = parquet.verified_parts(partial).rows
    (partial / ".part-000099.parquet").write_bytes(b"PAR1 torn")  # a part the kill interrupted
    with open(samples_path(output), "a") as handle:  # samples of rows whose part was never written
        handle.write("4,2,1,1.0,2.0,1.0,2.0,0.2,0.2,1.0,1f1b,,,,0.2,0.0,lognormal,-1,1.0,0,single_channel,F1,0,9.0\n")
    progress = run_sweep(plan, output, samples_output=samples, resume=True)
    assert next(progress) == kept
    for _ in progress:
        pass
    assert output.read_bytes() == reference
    assert samples.read_bytes() == (tmp_path / "reference_samples.csv").read_bytes()


def stopped(plan, output, steps, **kwargs):
    """``plan`` run into ``output`` and stopped after ``steps`` results, as Ctrl-C stops it."""
    progress = run_sweep(plan, output, **kwargs)
    for _ in zip(range(steps), progress):
        pass
    progress.close()
    return partial_paths(output)[0]


def resumed(plan, output, **kwargs):
    """``plan`` resumed into ``output``: the lines it reported."""
    lines = []
    for _ in run_sweep(plan, output, resume=True, report=lines.append, **kwargs):
        pass
    return lines


@pytest.mark.parametrize("harm", ["delete", "damage", "truncate", "foreign"])
def test_a_gap_or_a_damaged_part_is_named_and_computed_again(tmp_path, small_parts, harm):
    """Rows past a missing or damaged part are never stitched on: the resume keeps the parts before it, says
    which part, and computes the rest again."""
    plan = plan_of(SMALL, format="parquet")
    reference = sweep(plan, tmp_path / "reference.parquet")
    output = tmp_path / "out.parquet"
    partial = stopped(plan, output, 5)
    parts = sorted(partial.glob("part-*"))
    assert len(parts) >= 3
    victim = parts[1]
    if harm == "delete":
        victim.unlink()
    elif harm == "damage":
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
    elif harm == "truncate":
        victim.write_bytes(victim.read_bytes()[:100])
    else:  # a part of another sweep with a well-formed name, in place of the real one
        victim.rename(victim.with_name(victim.name.replace(victim.name.split("-")[-1], "0" * 32 + ".parquet")))
    lines = resumed(plan, output)
    first_missing = int(victim.name.split("-")[1])
    assert len(lines) == 1 and f"computing the rows from {first_missing:,} on again" in lines[0], lines
    if harm == "delete":
        assert "have no part" in lines[0]
    else:
        assert "is damaged" in lines[0] and victim.name.split("-")[1] in lines[0]
    assert output.read_bytes() == reference
    assert not partial.exists()


@pytest.mark.parametrize("format", ["parquet", "csv"])
@pytest.mark.parametrize("killed", ["before the samples file", "while cleaning up"])
def test_a_finished_output_is_never_replaced_by_a_resume(tmp_path, small_parts, monkeypatch, format, killed):
    """A kill after a sweep's output is in place (before its samples file is, or while its partial is being
    removed) leaves a partial that may lack its first parts; --resume then keeps the output as it is, moves
    the samples file, removes the leftovers and says so."""
    from pipeline_sim import sweep as sweep_module

    plan = plan_of(NOISY, format=format, with_samples=True)
    suffix = ".parquet" if format == "parquet" else ".csv"
    reference = sweep(plan, tmp_path / f"reference{suffix}", samples_output=tmp_path / "reference_samples.csv")
    output, samples = tmp_path / f"out{suffix}", tmp_path / "samples.csv"
    replace, remove = os.replace, sweep_module._remove_leftovers

    def killed_replace(source, target):
        if Path(target) == samples:
            raise KeyboardInterrupt
        replace(source, target)

    def killed_cleanup(path):
        if not output.exists():  # a new sweep's start
            return remove(path)
        for part in sorted(partial_paths(output)[0].glob("part-*"))[:2]:  # the first parts gone, the rest left
            part.unlink()
        raise KeyboardInterrupt

    if killed == "before the samples file":
        monkeypatch.setattr(sweep_module.os, "replace", killed_replace)
    else:
        monkeypatch.setattr(sweep_module, "_remove_leftovers", killed_cleanup)
    with pytest.raises(KeyboardInterrupt):
        sweep(plan, output, samples_output=samples)
    monkeypatch.undo()
    before = os.stat(output)
    assert output.read_bytes() == reference and partial_paths(output)[1].exists()
    lines = resumed(plan, output, samples_output=samples)
    assert lines == [f"{output} is already complete; removed what its sweep left behind ({output.name}.partial)"]
    assert os.path.samestat(before, os.stat(output)) and output.read_bytes() == reference
    assert samples.read_bytes() == (tmp_path / "reference_samples.csv").read_bytes()
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith("out")) == [output.name]


def test_a_kill_during_the_merge_leaves_nothing_beside_the_output(tmp_path, small_parts, monkeypatch):
    from pipeline_sim import sweep as sweep_module

    plan = plan_of(SMALL, format="parquet")
    reference = sweep(plan, tmp_path / "reference.parquet")
    output = tmp_path / "out.parquet"
    merge = parquet.merge_parts

    def killed_merge(parts, target, types):
        target.write_bytes(b"PAR1")  # as far as a merge gets before its first row group
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_module, "merge_parts", killed_merge)
    with pytest.raises(KeyboardInterrupt):
        sweep(plan, output)
    monkeypatch.setattr(sweep_module, "merge_parts", merge)
    assert sorted(path.name for path in tmp_path.iterdir() if path.name != "reference.parquet") == \
        ["out.parquet.partial", "out.parquet.partial.json"]
    assert resumed(plan, output) == []
    assert output.read_bytes() == reference and not partial_paths(output)[0].exists()


def test_a_csv_partial_does_not_resume_as_parquet(tmp_path):
    progress = run_sweep(plan_of(SMALL), tmp_path / "out.csv")
    next(progress), next(progress)
    progress.close()
    with pytest.raises(ValueError, match=r"out\.csv\.partial was written with --format csv \(this run: parquet\); "
                                         r"rerun with its settings and --resume to continue it"):
        next(run_sweep(plan_of(SMALL, format="parquet"), tmp_path / "out.csv", resume=True))


def test_read_in_pieces_gives_the_environments_of_the_whole(tmp_path):
    sweep(plan_of(NOISY), tmp_path / "out.csv")
    whole = [(params, rows.reset_index(drop=True)) for params, rows in environments(load_results(tmp_path / "out.csv"))]
    pieces = [(params, rows.reset_index(drop=True)) for params, rows in
              environments(read_results(tmp_path / "out.csv", rows=7))]
    assert [params for params, _ in whole] == [params for params, _ in pieces] and len(whole) == 4
    for (_, a), (_, b) in zip(whole, pieces):
        pd.testing.assert_frame_equal(a, b)


def test_an_environment_split_in_two_places_is_refused(tmp_path):
    sweep(plan_of(SMALL), tmp_path / "out.csv")
    lines = (tmp_path / "out.csv").read_text().splitlines(keepends=True)
    (tmp_path / "moved.csv").write_text("".join([lines[0], *lines[1:4], *lines[50:], *lines[4:50]]))
    with pytest.raises(ResultsError, match="are not together"):
        list(environments(read_results(tmp_path / "moved.csv", rows=10)))


def test_heatmaps_from_parquet_equal_those_from_csv(tmp_path):
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    for fmt in ("csv", "parquet"):
        made = run_script("data_generator.py", "-c", "configs/jitter.json", "--format", fmt, "--samples", "2",
                          "--step", "0.5", "--workers", "2", "-o", f"out.{fmt}", cwd=tmp_path)
        assert made.returncode == 0, made.stderr
        drawn = run_script("plot_heatmap.py", f"out.{fmt}", "-o", fmt, "--workers", "2", "--metric",
                           "completion_p95", cwd=tmp_path)
        assert drawn.returncode == 0, drawn.stderr
        assert "robustness figure" in drawn.stdout
    csv_figures = sorted(path.name for path in (tmp_path / "csv").iterdir())
    assert csv_figures == sorted(path.name for path in (tmp_path / "parquet").iterdir()) and len(csv_figures) > 10
    for name in csv_figures:
        assert (tmp_path / "csv" / name).read_bytes() == (tmp_path / "parquet" / name).read_bytes(), name


def test_full_pipeline_writes_parquet(tmp_path):
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    result = run_script("run_full_pipeline.py", "-c", "configs/quick.json", "--format", "parquet",
                        "--priority-step", "0.5", "--workers", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (written,) = (tmp_path / "outputs" / "data").glob("quick_*.parquet")
    assert pq.ParquetFile(written).metadata.num_rows == 2 * policy_count(2)
    assert len(list((tmp_path / "outputs" / "heatmaps" / written.stem).glob("*.png"))) == 2


def test_without_pyarrow_parquet_is_one_line(tmp_path):
    blocker = tmp_path / "blocked"
    (blocker / "pyarrow").mkdir(parents=True)
    (blocker / "pyarrow" / "__init__.py").write_text("raise ImportError('pyarrow is blocked here')\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(blocker)}
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    result = run_script("data_generator.py", "-c", "configs/quick.json", "--format", "parquet", "-o", "x.parquet",
                        cwd=tmp_path, env=env)
    assert_one_line_error(result, "needs pyarrow", "pipeline-sim[cluster]")
    assert not list(tmp_path.glob("x.parquet*"))
    (tmp_path / "x.parquet").write_bytes(b"PAR1" + bytes(100))
    result = run_script("plot_heatmap.py", "x.parquet", cwd=tmp_path, env=env)
    assert_one_line_error(result, "x.parquet is Parquet", "needs pyarrow")


def test_a_damaged_parquet_file_is_one_line(tmp_path):
    (tmp_path / "x.parquet").write_bytes(b"PAR1" + bytes(100))
    result = run_here("plot_heatmap.py", "x.parquet", cwd=tmp_path)
    assert_one_line_error(result, "x.parquet", "not a readable Parquet file")
    (tmp_path / "y.parquet").write_text("garbage\n")  # not even its first bytes: no CSV either
    result = run_here("plot_heatmap.py", "y.parquet", cwd=tmp_path)
    assert_one_line_error(result, "y.parquet: not a Parquet file (it does not begin as one)")
    (tmp_path / "z.parquet").write_text("n,num_gpus,completion_time\n8,4,1.0\n")  # a sweep's CSV, renamed
    result = run_here("plot_heatmap.py", "z.parquet", cwd=tmp_path)
    assert_one_line_error(result, "z.parquet: a CSV, not a Parquet file (its first line is a sweep's CSV header); "
                                  "name it .csv")
