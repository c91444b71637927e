"""The planner (docs/model.md section 14): a run end to end, its pruning against simulation, an exhaustive search
on a small model, and bad input in one line."""

import csv
import re
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from conftest import ROOT, assert_one_line_error, assert_png_drawn, run_script

from pipeline_sim import Policy
from pipeline_sim.engine import simulate_figures
from pipeline_sim.plan import (
    ABOVE_BOUND,
    COLUMNS,
    LOWER_ZERO,
    OVER_MEMORY,
    TOP,
    TOP_LAYOUTS,
    PlanError,
    chunk_counts,
    enumerate_layouts,
    estimated_memory_gb,
    plan,
)
from pipeline_sim.scenarios import policy_grid
from pipeline_sim.workload import GPU_PRESETS, ModelShape, Workload, gpu_memory_gb

SMALL = ["--model", "llama3-8b", "--gpu", "h100-80gb", "--gpus", "8", "--global-batch-size", "64", "--seq-len",
         "4096"]


def test_a_small_plan_end_to_end(tmp_path):
    result = run_script("plan.py", *SMALL, "-o", "plan.csv", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # a model's faithful settings by default: its element-wise work, the optimizer step, and Llama without dropout
    assert lines[0].startswith("llama3-8b on 8 x h100-80gb, batch 64 x 4096 tokens, efficiency 0.5, optimizer step, "
                               "element-wise work, no dropout:")
    listed = [line for line in lines if line[:3].strip().isdigit()]
    assert lines[1].startswith(f"the {TOP_LAYOUTS} fastest layouts, each by its fastest run")
    with open(tmp_path / "plan.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == COLUMNS
    enumerated = int(lines[0].split(" runs simulated of ")[1].split()[0])
    assert len(rows) == enumerated  # every layout enumerated has its row
    ranked = [row for row in rows if row["rank"]]
    assert len(ranked) >= TOP and rows[:len(ranked)] == ranked
    for row in rows:
        degrees = [int(row[key]) for key in ("tensor_parallel", "context_parallel", "pipeline_parallel",
                                             "data_parallel")]
        assert np.prod(degrees) == 8 and 64 % (int(row["micro_batch_size"]) * degrees[3]) == 0
        assert sum(map(int, row["layers_per_stage"].split())) == 32
        assert row["zero"] == "0" or degrees[3] > 1
        over = float(row["memory_gb"]) - float(row["gpu_memory_gb"])
        assert (float(row["over_gb"] or 0) == pytest.approx(over)) if over > 0 else row["over_gb"] in ("", "0.0")
        if row["rank"]:
            assert over <= 0 and row["simulated"] in ("full", "extrapolated")
            tokens = float(row["tokens_per_second"])
            assert tokens == pytest.approx(64 * 4096 / float(row["iteration_seconds"]))
            assert float(row["tflops_per_gpu"]) == pytest.approx(float(row["mfu"]) * 989)
        else:
            assert row["simulated"] in ("full", "extrapolated", OVER_MEMORY, ABOVE_BOUND, LOWER_ZERO)
            assert row["simulated"] != OVER_MEMORY or over > 0
    times = [float(row["iteration_seconds"]) for row in ranked]
    assert times == sorted(times) and [int(row["rank"]) for row in ranked] == list(range(1, len(ranked) + 1))
    assert {row["simulated"] for row in ranked[:TOP]} == {"full"}
    # a layout (its four degrees) ranks by its fastest run; the printed list is each layout's first run in the top
    degrees = [tuple(row[key] for key in ("tensor_parallel", "context_parallel", "pipeline_parallel",
                                          "data_parallel")) for row in ranked]
    firsts = [index for index, key in enumerate(degrees) if key not in degrees[:index]]
    assert [int(ranked[index]["layout_rank"]) for index in firsts] == list(range(1, len(firsts) + 1))
    assert all(row["layout_rank"] == ranked[degrees.index(key)]["layout_rank"] for row, key in zip(ranked, degrees))
    shown = firsts[:TOP_LAYOUTS]
    assert len(listed) == len(shown) == TOP_LAYOUTS
    assert {row["simulated"] for row in ranked if row in [ranked[index] for index in shown]} == {"full"}
    for line, index in zip(listed, shown):
        row = ranked[index]
        assert row["schedule"] in line and f"t {row['tensor_parallel']} " in line
        assert f" p {row['pipeline_parallel']} d {row['data_parallel']}," in line
    by_run = run_script("plan.py", *SMALL, "-o", "runs.csv", "--by", "run", cwd=tmp_path)
    assert by_run.returncode == 0, by_run.stderr
    runs = [line for line in by_run.stdout.splitlines() if line[:3].strip().isdigit()]
    assert len(runs) == TOP and runs[0].split()[1:] == listed[0].split()[1:]
    assert_png_drawn(tmp_path / "plan.png", min_width=1000, min_height=600)
    # a second plan of the same name is refused, and replaced with --overwrite
    again = run_script("plan.py", *SMALL, "-o", "plan.csv", cwd=tmp_path)
    assert_one_line_error(again, "plan.csv exists; pass --overwrite")


def test_pins_headroom_and_names(tmp_path):
    result = run_script("plan.py", *SMALL, "--tensor-parallel", "1", "--pipeline-parallel", "2,4", "--zero", "1",
                        "--schedule", "zb-h1,interleaved-1f1b", "--chunks", "2", "--memory-headroom", "30",
                        "--mark", "pipeline_parallel=4", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no dropout, tensor parallel 1, pipeline parallel 2/4, zero 1, schedule interleaved-1f1b/zb-h1, " \
           "chunks 2, headroom 30 GB" in result.stdout.splitlines()[0]
    # the mark's run is told in the terminal as in the figure: its layout's rank and its own, as the CSV ranks them
    mark = next(line for line in result.stdout.splitlines() if line.startswith("--mark pipeline_parallel=4: "))
    layout_rank, run_rank = map(int, re.match(r"--mark pipeline_parallel=4: layout #(\d+), run #(\d+): ",
                                              mark).groups())
    name = "plan_llama3-8b_8xh100-80gb_gbs64_s4096_eff0.5_headroom30_opt_ew_nodrop_tensor1_pipeline2-4_zero1_" \
           "schedule-interleaved-1f1b-zb-h1_chunks2"
    folder = tmp_path / "outputs" / "plan"
    assert sorted(path.name for path in folder.iterdir()) == [f"{name}.csv", f"{name}.png"]
    with open(folder / f"{name}.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["tensor_parallel"] for row in rows} == {"1"} and {row["zero"] for row in rows} == {"1"}
    assert {row["pipeline_parallel"] for row in rows} == {"2", "4"}
    assert {row["chunks"] for row in rows if row["schedule"] == "interleaved-1f1b"} == {"2"}
    assert all(float(row["memory_gb"]) <= GPU_PRESETS["h100-80gb"].memory_gb - 30 for row in rows if row["rank"])
    # the budget each row is measured against is in the CSV: the GPU's memory less the headroom
    assert {float(row["budget_gb"]) for row in rows} == {GPU_PRESETS["h100-80gb"].memory_gb - 30}
    leader = min((row for row in rows if row["rank"] and row["pipeline_parallel"] == "4"),
                 key=lambda row: int(row["rank"]))
    assert (int(leader["layout_rank"]), int(leader["rank"])) == (layout_rank, run_rank)
    for row in rows:
        over = float(row["memory_gb"]) - float(row["budget_gb"])
        if over > 0:
            assert float(row["over_gb"]) == pytest.approx(over)
        else:
            assert row["over_gb"] in ("", "0.0")


def test_chunk_counts_divide_a_gpus_layers():
    assert chunk_counts(126, 16) == [2, 4, 7]  # 7 or 8 layers a GPU; 8 chunks would need 128 layers
    assert chunk_counts(32, 4) == [2, 4, 8]
    assert chunk_counts(8, 8) == []


TINY = ModelShape(layers=8, hidden=256, heads=8, kv_heads=4, ffn_hidden=1024, vocab=4000, seq_len=512)


def tiny(**kwargs):
    return Workload(**{"model": TINY, "gpu": {"tflops": 10, "memory_gb": 0.08, "nvlink_bandwidth": 100},
                       "global_batch_size": 16, "p2p_bandwidth": 1.0, "dp_bandwidth": 1.0} | kwargs)


def test_layouts_divide_and_pruning_never_drops_what_simulation_keeps():
    found = enumerate_layouts(tiny(), 4)
    assert found.enumerated > len(found.layouts) > 20  # some layouts hold more state than the 80 MB GPU
    for layout in found.layouts:
        w, p = layout.workload, layout.params
        assert w.tensor_parallel * p.num_gpus * w.data_parallel == 4
        assert TINY.heads % w.tensor_parallel == 0 and TINY.kv_heads % w.tensor_parallel == 0
        figures = simulate_figures(p, [Policy()])[0]
        # the bound is below the simulated time and the memory estimate below the simulated memory
        assert layout.bound <= figures[0] * (1 + 1e-9)
        memory = max(gpu_memory_gb(w, p, tuple(figures[3 + 2 * p.num_gpus:])))
        assert estimated_memory_gb(layout) <= memory * (1 + 1e-5)  # peaks in units of 2^-20 of a stage


def test_layouts_enumerated_on_workers_are_those_enumerated_alone_in_the_same_order():
    alone = enumerate_layouts(tiny(), 16)
    shared = enumerate_layouts(tiny(), 16, workers=2)
    assert len(alone.layouts) > 40 and alone.too_large  # enough choices that each worker gets chunks
    assert shared == alone


def test_the_best_of_a_small_plan_is_the_best_of_every_layout():
    base = tiny()
    result = plan(base, 4)
    assert all(outcome.fits for outcome in result.ranked)
    best = None
    for layout in enumerate_layouts(base, 4).layouts:  # every layout, every policy, in full
        policies = (Policy(), *policy_grid(1.0))
        figures = simulate_figures(layout.params, policies)
        peaks = tuple(figures[0, 3 + 2 * layout.params.num_gpus:])
        if max(gpu_memory_gb(layout.workload, layout.params, peaks)) > 0.08:
            continue
        time = float(np.min(figures[:, 0]))
        best = time if best is None else min(best, time)
    assert result.ranked[0].seconds == pytest.approx(best)


def test_divisors_are_found_in_pairs_and_a_billion_gpus_at_once(tmp_path):
    from pipeline_sim.plan import _divisors

    for number in range(1, 500):
        assert _divisors(number) == [k for k in range(1, number + 1) if number % k == 0]
    assert _divisors(10**9)[-3:] == [250_000_000, 500_000_000, 10**9] and len(_divisors(10**9)) == 100
    # a count past a billion is refused before any work: its divisors alone would take minutes
    result = run_script("plan.py", "--model", "llama3-8b", "--gpus", "99999999999999999999", "--global-batch-size", "8",
                        cwd=tmp_path)
    assert_one_line_error(result, "argument --gpus: 99999999999999999999 must be from 1 to 1,000,000,000")


def test_an_iteration_too_large_to_simulate_stays_extrapolated(monkeypatch):
    import pipeline_sim.plan as planner

    base = tiny(global_batch_size=64)
    whole = plan(base, 4)
    assert all(outcome.full for outcome in whole.ranked[:TOP])
    monkeypatch.setattr(planner, "MAX_TASKS", 100)  # every run of this model above it: none simulated in full
    simulated = []
    measure = planner._measure
    monkeypatch.setattr(planner, "_measure", lambda params, *rest: simulated.append(params.n) or measure(params, *rest))
    estimated = plan(base, 4)
    longest = max(layout.params.n for layout in enumerate_layouts(base, 4).layouts)
    assert simulated and max(simulated) < longest  # only short runs
    listed = estimated.ranked[:TOP]
    short = [o.full for o in listed if o.layout.params.n <= 2 * planner.SCREEN_ROUNDS * o.layout.params.num_gpus]
    assert all(short)  # a run no longer than the screening's is the iteration itself
    assert len(short) < len(listed) and not any(o.full for o in listed if o.layout.params.n > max(simulated))
    # the extrapolation of a steady pipeline is close to the whole iteration's time
    assert estimated.ranked[0].seconds == pytest.approx(whole.ranked[0].seconds, rel=0.02)


def test_a_mark_says_where_its_layout_stands_or_why_it_has_none():
    from pipeline_sim.cli.plan import marked, named_runs
    from pipeline_sim.plan import LAYOUT_COLUMNS

    result = plan(tiny(), 4)
    heavy = next(u for u in result.unsimulated if u.reason == OVER_MEMORY)
    named = dict(zip(LAYOUT_COLUMNS, map(str, heavy.cells)))
    over = {key: named[key] for key in ("tensor_parallel", "pipeline_parallel", "data_parallel", "zero", "recompute",
                                        "micro_batch_size", "schedule", "partition")}
    second = result.best_layouts()[1]
    simulated = {"tensor_parallel": str(second.layout.tensor), "context_parallel": str(second.layout.context),
                 "pipeline_parallel": str(second.layout.pipeline), "data_parallel": str(second.layout.data)}
    said = marked(result, [simulated, {"tensor_parallel": "3"}, over])
    # the marked layout's fastest run that fits: the second layout's leader, and its own place among all runs
    assert said[0] == (",".join(f"{key}={value}" for key, value in simulated.items()), second,
                       f"layout #2, run #{result.ranked.index(second) + 1}")
    # the figure names each run once, with all that names it: a mark of the best layout joins the best's label
    best = result.ranked[0]
    on_best = {"tensor_parallel": str(best.layout.tensor), "pipeline_parallel": str(best.layout.pipeline)}
    runs = named_runs(result, marked(result, [on_best, simulated]))
    assert [outcome for outcome, _ in runs][::len(runs) - 1] == [best, second]
    assert runs[0][1] == (f"best that fits, marked tensor_parallel={best.layout.tensor}, pipeline_parallel="
                          f"{best.layout.pipeline} (layout #1, run #1)")
    assert runs[-1][1].startswith("marked tensor_parallel=")
    assert runs[-1][1].endswith(f"(layout #2, run #{result.ranked.index(second) + 1})")
    assert said[1:] == [
        ("tensor_parallel=3", None, "not on the figure; no layout enumerated has these values"),
        (",".join(f"{key}={value}" for key, value in over.items()), None,
         "not on the figure; its layouts were not simulated (over memory)")]


@pytest.mark.parametrize("gpus, filters", [(4, {}), (2, {"zero": {3}})])  # the second lists fewer than TOP runs
def test_the_planners_progress_counts_choices_then_layouts_and_ends_at_its_total(gpus, filters):
    told = []
    plan(tiny(), gpus, progress=lambda done, total, unit: told.append((done, total, unit)), filters=filters)
    units = [unit for _, _, unit in told]
    assert units == sorted(units) and set(units) == {"choice", "layout"}  # every choice before any layout
    for unit in ("choice", "layout"):
        counts = [(done, total) for done, total, said in told if said == unit]
        assert [done for done, _ in counts] == sorted(done for done, _ in counts)
        assert all(0 <= done <= total for done, total in counts)
        assert counts[-1][0] == counts[-1][1], counts[-1]  # the bar ends full


TITLE = ("llama3-405b on 8192 x h100-80gb, batch 2048 x 8192 tokens, efficiency 0.602, optimizer step, element-wise "
         "work, flash attention, no dropout\n111 runs simulated of 2706")


def _label_of(width: int) -> str:
    """A planner's label of about ``width`` characters on its first line: words, as a run's description has."""
    words = " ".join(["t 8 p 16 d 64, b 1, zb-v,"] * (width // 25 + 1))[:width]
    return f"marked {words}\n11.5 s, MFU 47.5%, 81.7 GB, policy F1 G1 S1"


@pytest.mark.parametrize("size, widths", [
    ((11, 7), (40, 40, 40)),
    ((11, 7), (96, 62)),  # together just short of the axes' width once they are laid out
    ((11, 7), (100, 120, 400, 130, 30, 30)),  # the third broken into lines
    ((6, 4), (60, 60, 60, 60, 60, 60)),
])
def test_the_planners_labels_cover_neither_each_other_nor_a_point(size, widths):
    """Two labels share a row only where both fit the axes as finally laid out (a long marked label beside the
    best's covered it), and one wider than the axes is broken between words."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.text import Annotation

    from pipeline_sim.plotting.plan import plot_plan

    figure, ax = plt.subplots(figsize=size, layout="constrained")
    points = len(widths) + 20
    memory, seconds = [10.0 + 3 * i for i in range(points)], [20.0 + (i % 7) for i in range(points)]
    plot_plan(ax, memory, seconds, [True] * points, 80.0, 80.0,
              [(i, _label_of(width)) for i, width in enumerate(widths)], TITLE)
    figure.draw_without_rendering()
    renderer = figure.canvas.get_renderer()
    texts = [text for text in ax.texts if text.get_bbox_patch() and not isinstance(text, Annotation)]  # the labels
    boxes = [text.get_bbox_patch().get_window_extent(renderer) for text in texts]
    assert len(boxes) == len(widths)
    assert not any(a.overlaps(b) for k, a in enumerate(boxes) for b in boxes[k + 1:])
    assert all(ax.bbox.x0 <= box.x0 and box.x1 <= ax.bbox.x1 and ax.bbox.y0 <= box.y0 for box in boxes)
    dots = ax.transData.transform(list(zip(memory, seconds)))
    assert not any(box.contains(x, y) for box in boxes for x, y in dots)
    assert ax.get_ylim()[0] < ax.get_ylim()[1]
    assert [text.get_text().count("\n") > 1 for text in texts] == [width > 200 for width in widths]
    plt.close(figure)


def test_a_plan_that_nothing_answers():
    with pytest.raises(PlanError, match="fits no layout on 4 x"):
        plan(tiny(gpu={"tflops": 10, "memory_gb": 0.001, "nvlink_bandwidth": 100}), 4)
    # without NVLink figures or tp_bandwidth, tensor parallelism cannot be timed: only t = 1 is tried
    assert {layout.tensor for layout in enumerate_layouts(tiny(gpu={"tflops": 10, "memory_gb": 1}), 4).layouts} == {1}
    with pytest.raises(PlanError, match="no layout of"):
        plan(tiny(), 37)


def test_a_reader_that_stops_early_still_gets_the_files_written(tmp_path):
    """``plan.py ... | head -1``: the listing's reader gone after its first line, the CSV and the figure are written
    all the same, and the run ends quietly."""
    process = subprocess.Popen([sys.executable, str(ROOT / "plan.py"), *SMALL, "-o", "plan.csv"], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert " runs simulated of " in process.stdout.readline()
    process.stdout.close()  # as `| head -1` does
    err = process.stderr.read()
    process.wait(timeout=300)
    assert process.returncode == 0 and "error" not in err.lower(), err
    assert (tmp_path / "plan.csv").read_text().count("\n") > TOP and (tmp_path / "plan.png").stat().st_size > 0


def test_pinned_chunks_are_a_schedules_own():
    """A chunk count pinned with a schedule that has it (zb-v's two) searches that schedule; one that none searched
    has is refused, naming what each has."""
    result = plan(tiny(), 4, filters={"schedule": frozenset({"zb-v"}), "chunks": frozenset({2})})
    assert result.ranked and {outcome.layout.params.schedule for outcome in result.ranked} == {"zb-v"}
    with pytest.raises(PlanError, match="chunks = 3: no schedule searched has that many chunks a GPU: zb-h1 1$"):
        plan(tiny(), 4, filters={"schedule": frozenset({"zb-h1"}), "chunks": frozenset({3})})


def test_a_plan_with_fewer_layouts_than_it_lists_says_how_many(tmp_path):
    """A global batch of 63 on 16 GPUs leaves only a data-parallel degree of 1: four layouts fit, and four are said."""
    result = run_script("plan.py", "--model", "llama3-8b", "--gpus", "16", "--global-batch-size", "63", "-o",
                        "plan.csv", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    listed = [line for line in lines if line[:3].strip().isdigit()]
    assert 1 < len(listed) < TOP_LAYOUTS
    assert lines[1].startswith(f"the {len(listed)} fastest layouts, each by its fastest run")


@pytest.mark.parametrize("args, fragments", [
    (["--model", "nope", "--gpus", "8", "--global-batch-size", "8"], ("model = 'nope': unknown preset",)),
    (["--model", "llama3-8b", "--gpus", "37", "--global-batch-size", "64"],
     ("gpus = 37: no layout of llama3-8b on 37 GPUs", "tried tensor degrees")),
    (["--model", "llama3-405b", "--gpu", "a100-40gb", "--gpus", "8", "--global-batch-size", "8"],
     ("model = llama3-405b: fits no layout on 8 x a100-40gb", "811.7 GB per GPU")),
    (["--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "64", "--pipeline-parallel", "3"],
     ("pipeline_parallel = 3: does not divide gpus = 8",)),
    (["--model", "mixtral-8x7b", "--gpus", "64", "--global-batch-size", "256", "--expert-parallel", "8,16"],
     ("expert_parallel = 16: must divide the 8 experts of mixtral-8x7b",)),
    (["--model", "mixtral-8x7b", "--gpus", "64", "--global-batch-size", "256", "--expert-parallel", "1",
      "--route-nodes", "1"], ("--route-nodes 1: --expert-parallel 1 splits no experts over GPUs",)),
    (["--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "64", "--context-parallel", "3"],
     ("context_parallel = 3: must cut seq_len = 8192 into 2 x c equal chunks",)),
    (["--model", "mixtral-8x7b", "--gpus", "64", "--global-batch-size", "256", "--expert-imbalance", "5"],
     ("expert_imbalance = 5: more than the busiest GPU can take at any expert degree (at most 2 at 2, 4 at 4, 4 at "
      "8)",)),
    (["--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "64", "--bytes-per-param", "3", "--zero", "0,1"],
     ("bytes_per_param = 3: must hold a weight and a gradient (4 bytes) for zero 1 to shard the rest",)),
    (["--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "64", "--tensor-parallel", "3,5"],
     ("tensor_parallel = 3/5: none divides gpus = 8",)),
    # pinned degrees that divide the GPUs alone but not together, chunks no layout takes
    (["--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "64", "--tensor-parallel", "8",
      "--pipeline-parallel", "4"], ("tensor_parallel 8 x pipeline_parallel 4 = 32: more than gpus = 8",)),
    (["--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "64", "--tensor-parallel", "2,4",
      "--pipeline-parallel", "8"],
     ("tensor_parallel 2 x pipeline_parallel 8 = 16: more than gpus = 8 (the least of the pinned degrees together)",)),
    (["--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "64", "--chunks", "3", "--schedule", "1f1b"],
     ("chunks = 3: no schedule searched has that many chunks a GPU: 1f1b 1",)),
    (["--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "64", "--chunks", "3"],
     ("chunks = 3: no schedule searched has that many chunks a GPU: 1f1b 1, interleaved-1f1b 2/4/8/16 (its 32 layers "
      "on pipelines of 2/4/8 GPUs), zb-h1 1, zb-v 2",)),
    (["--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "8", "--jitter", "2"], ("--jitter 2.0",)),
    (["--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "64", "--schedule", "dualpipe-v"],
     ("schedule = dualpipe-v: not searched for llama3-8b, a model without experts",)),
    (["--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "64", "--expert-parallel", "2,4"],
     ("expert_parallel = 2/4: llama3-8b has no experts to split; pin expert_parallel 1, or leave it out",)),
    (["--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "8", "-o", "x.txt"], ("ending in .csv",)),
    (["--model", "llama3-8b", "--gpus", "0", "--global-batch-size", "8"], ("--gpus",)),
    (["--model", '{"layers": 4', "--gpus", "8", "--global-batch-size", "8"], ("""model = '{"layers": 4': is not""",)),
    (["--model", '{"layers": 4}', "--gpus", "8", "--global-batch-size", "8"], ("model = {'layers': 4}: lacks hidden",)),
    (["--model", "[1, 2]", "--gpus", "8", "--global-batch-size", "8"], ("model = '[1, 2]': is not a JSON object",)),
    (["--model", '{"layers": 4, "hiden": 256}', "--gpus", "8", "--global-batch-size", "8"],
     ("model.hiden = 256: unknown field of a model (did you mean 'hidden'?); allowed: layers, hidden",)),
    (["--model", "llama3-8b", "--gpu", '{"tflops": 500, "memory_gb": 80, "foo": 1}', "--gpus", "8",
      "--global-batch-size", "8"], ("gpu.foo = 1: unknown field of a gpu; allowed: tflops",)),
    (["--model", '{"layers": 4, "hidden": 256, "heads": 4, "ffn_hidden": 1024, "vocab": 1000, "experts": 8, '
                 '"top_k": 2}', "--gpus", "8", "--global-batch-size", "8"],
     ("model.expert_ffn_hidden = not given: a model with experts needs it, an integer >= 1",)),
    (["--model", "llama3-8b", "--gpu", '{"tflops": 989, "memory_gb": 20}', "--gpus", "8", "--global-batch-size", "8"],
     ("fits no layout on 8 x tflops=989 memory_gb=20", "tensor degree 1 only (the gpu states no nvlink_bandwidth")),
])
def test_bad_plans_get_one_line(tmp_path, args, fragments):
    assert_one_line_error(run_script("plan.py", *args, cwd=tmp_path), *fragments)


def test_under_jitter_layouts_rank_by_the_95th_percentile_of_their_draws():
    result = plan(tiny(), 4, env={"compute_jitter": 0.1, "comm_jitter": 0.1, "seed": 3}, samples=5)
    best = result.ranked[0]
    policy = next(p for p in (Policy(), *policy_grid(1.0)) if p.label == best.policy)
    times = [simulate_figures(best.layout.params, [policy], sample)[0, 0] for sample in range(5)]
    assert best.seconds == pytest.approx(np.percentile(times, 95))
    assert [o.seconds for o in result.ranked] == sorted(o.seconds for o in result.ranked)


def test_a_custom_model_and_gpu_as_json(tmp_path):
    model = '{"layers": 4, "hidden": 256, "heads": 8, "ffn_hidden": 1024, "vocab": 1000, "seq_len": 512}'
    gpu = '{"tflops": 100, "memory_gb": 16, "nvlink_bandwidth": 200}'
    result = run_script("plan.py", "--model", model, "--gpu", gpu.replace(', "nvlink_bandwidth": 200', ""), "--gpus",
                        "4", "--global-batch-size", "16", "--workers", "1", "-o", "alone.csv", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert ", tensor degree 1 only (the gpu states no nvlink_bandwidth; give it, or --tp-bandwidth): " in \
        result.stdout.splitlines()[0]
    assert " t 2 " not in result.stdout and " t 1 " in result.stdout
    result = run_script("plan.py", "--model", model, "--gpu", gpu, "--gpus", "4", "--global-batch-size", "16",
                        "--workers", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("layers=4 hidden=256 heads=8 kv_heads=8 ffn_hidden=1024 vocab=1000 seq_len=512 "
                                    "on 4 x tflops=100 memory_gb=16 nvlink_bandwidth=200, batch 16 x 512 tokens")
    name = "plan_layers4-hidden256-heads8-kv_heads8-ffn_hidden1024-vocab1000-seq_len512_4xtflops100-memory_gb16-" \
           "nvlink_bandwidth200_gbs16_s512_eff0.5"
    assert sorted(path.name for path in (tmp_path / "outputs" / "plan").iterdir()) == [f"{name}.csv", f"{name}.png"]


def test_a_second_planner_on_the_same_output_is_refused(tmp_path):
    import os

    from pipeline_sim.files import exclusive_writer

    output = tmp_path / "plan.csv"
    with exclusive_writer(output):  # a planner of this process holds it
        result = run_script("plan.py", *SMALL, "-o", str(output), "--overwrite", cwd=tmp_path)
    assert_one_line_error(result, f"another run (pid {os.getpid()}) is writing")
    assert not output.exists()


@pytest.mark.parametrize("flags, message", [
    (["--seed", "3"], "--seed 3: draws are made only under --jitter above 0; give it, or leave --seed out"),
    (["--samples", "5"], "--samples 5: draws are made only under --jitter above 0"),
    (["--jitter", "0.05", "--seed", "-1"], "argument --seed: -1 must be from 0 to 9,223,372,036,854,775,807"),
    (["--chunks", "1"], "argument --chunks: '1': must be an integer >= 2"),
    (["--mark", "tensor_parallel=abc"], "--mark 'tensor_parallel=abc': tensor_parallel 'abc' is not an integer"),
    (["--mark", "zero=7"], "--mark 'zero=7': zero '7': allowed 0, 1, 2, 3"),
    (["--mark", "schedule=banana"], "--mark 'schedule=banana': schedule 'banana': allowed 1f1b"),
    (["--mark", "tensor_parallel=8,tensor_parallel=4"], "tensor_parallel given twice; a run has one value of each"),
    (["--mark", "partition=even"], "--mark 'partition=even': partition 'even': allowed balanced, bottleneck"),
    (["--a2a-class", "grad_sync"], "--a2a-class grad_sync: llama3-8b has no experts, so no all-to-all for it to "
                                   "change; leave it out"),
    (["--route-nodes", "2"], "--route-nodes 2: llama3-8b has no experts"),
    (["--expert-imbalance", "1.5"], "--expert-imbalance 1.5: llama3-8b has no experts"),
])
def test_what_the_plan_would_not_read_or_cannot_match_is_refused_before_it_runs(tmp_path, flags, message):
    """A seed out of range had searched every layout and then said no layout fit; a mark's value no run can have
    had been searched for in vain; options a dense model or a noiseless plan never reads had been taken silently."""
    result = run_script("plan.py", "--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "64", *flags,
                        "-o", "plan.csv", cwd=tmp_path)
    assert_one_line_error(result, message)
    assert not (tmp_path / "plan.csv").exists()


def test_the_draws_options_at_their_defaults_are_taken_without_jitter(tmp_path):
    """--seed 0 and --samples 8 say what the plan does anyway: a script that always passes them runs."""
    result = run_script("plan.py", *SMALL, "--seed", "0", "--samples", "8", "-o", "plan.csv", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_gradients_in_fp32_cost_memory_and_sync_time(tmp_path):
    """--grad-bytes 4 (and so 18 bytes a parameter): zero 1 keeps 2 bytes more of each parameter a GPU holds, and the
    gradients' reduce-scatter moves twice the bytes; the answer's name and header say so."""
    pins = ("--tensor-parallel", "1", "--pipeline-parallel", "2", "--zero", "1", "--schedule", "1f1b")
    plain = run_script("plan.py", *SMALL, *pins, cwd=tmp_path)
    fp32 = run_script("plan.py", *SMALL, *pins, "--grad-bytes", "4", cwd=tmp_path)  # 18 bytes a parameter then
    assert plain.returncode == 0 and fp32.returncode == 0, plain.stderr + fp32.stderr
    assert fp32.stdout.splitlines()[0].endswith("gradients of 4 bytes: " + fp32.stdout.splitlines()[0].split(": ")[-1])
    rows = {}
    for path in sorted((tmp_path / "outputs" / "plan").glob("*.csv")):
        with open(path, newline="") as handle:
            rows["grad4" in path.name] = {tuple(row[key] for key in ("data_parallel", "micro_batch_size",
                                                                     "recompute", "layers_per_stage")): row
                                          for row in csv.DictReader(handle)}
    assert "_grad4_opt" in next(path.name for path in (tmp_path / "outputs" / "plan").glob("*grad4*.csv"))
    assert rows[True].keys() == rows[False].keys()
    for key, row in rows[False].items():
        wide = rows[True][key]
        assert float(wide["memory_gb"]) > float(row["memory_gb"])
        if row["simulated"] == wide["simulated"] == "full" and int(row["data_parallel"]) > 1:
            assert float(wide["iteration_seconds"]) >= float(row["iteration_seconds"])


def test_the_csv_and_its_figure_are_written_together_and_checked_first(tmp_path):
    (tmp_path / "e.png").mkdir()
    for extra in ((), ("--overwrite",)):  # refused before the search, with --overwrite too
        assert_one_line_error(run_script("plan.py", *SMALL, "-o", "e.csv", *extra, cwd=tmp_path), "e.png")
    assert not (tmp_path / "e.csv").exists()
    # a figure without its CSV is what a stopped run left: the run replaces it
    (tmp_path / "p.png").write_bytes(b"left behind")
    result = run_script("plan.py", *SMALL, "--tensor-parallel", "1", "--pipeline-parallel", "2", "--zero", "1",
                        "--schedule", "1f1b", "-o", "p.csv", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_png_drawn(tmp_path / "p.png")
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith("p.")) == ["p.csv", "p.png"]


def test_a_pinned_value_below_the_searchs_own_limits_is_searched():
    """Context degrees leaving fewer than 8,192 tokens a rank, and selective recomputation beside flash attention,
    are left out of a search only when nothing pins them."""
    base = Workload(model="llama3-8b", gpu="h100-80gb", global_batch_size=32, flash_attention=True)
    pinned = plan(base, 16, filters={"context_parallel": frozenset({2}), "tensor_parallel": frozenset({2}),
                                     "pipeline_parallel": frozenset({2})})
    assert {outcome.layout.workload.context_parallel for outcome in pinned.tried} == {2}
    selective = plan(base, 16, filters={"recompute": frozenset({"selective"}), "tensor_parallel": frozenset({2}),
                                        "pipeline_parallel": frozenset({2})})
    assert {outcome.layout.workload.recompute for outcome in selective.tried} == {"selective"}
    both = plan(base, 16, filters={"recompute": frozenset({"none", "selective"}), "tensor_parallel": frozenset({2}),
                                   "pipeline_parallel": frozenset({2})})  # selective is none again: not twice
    assert {outcome.layout.workload.recompute for outcome in both.tried} == {"none"}
    odd = plan(replace(base, seq_len=4095), 8, filters={"context_parallel": frozenset({1}),
                                                        "pipeline_parallel": frozenset({4})})
    assert odd.ranked
    # an imbalance some expert degrees cannot take leaves those out, not the search
    mixtral = Workload(model="mixtral-8x7b", gpu="h100-80gb", global_batch_size=256, seq_len=4096,
                       expert_imbalance=2.5)
    experts = {outcome.layout.workload.expert_parallel
               for outcome in plan(mixtral, 64, filters={"pipeline_parallel": frozenset({8}),
                                                         "tensor_parallel": frozenset({1})}).tried}
    assert 2 not in experts and experts & {4, 8}
