"""Both visualizer scripts run as a user runs them (their messages and charts checked in this process)."""

import importlib
from dataclasses import replace

import pytest
from conftest import assert_one_line_error, assert_png_drawn, run_here, run_script

from pipeline_sim import calculate_full_pipeline_schedule
from pipeline_sim.engine import bound_of_run, memory_bound
from pipeline_sim.metrics import schedule_metrics

SCRIPTS = ["schedule_visualizer_single_channel.py", "schedule_visualizer_duel_channel.py"]
DEFAULT_PRIORITIES = {"fwd_prop": 0.5, "grad_prop": 0.3, "grad_sync": 0.2}


def test_both_scripts_export_the_same_core():
    single = importlib.import_module("schedule_visualizer_single_channel")
    dual = importlib.import_module("schedule_visualizer_duel_channel")
    assert single.calculate_full_pipeline_schedule is dual.calculate_full_pipeline_schedule
    assert single.calculate_full_pipeline_schedule is calculate_full_pipeline_schedule
    assert single.DEFAULT_PRIORITIES == {"fwd_prop": 0.5, "grad_prop": 0.3, "grad_sync": 0.2}


@pytest.mark.parametrize("script", SCRIPTS)
def test_chart_and_trace(script, tmp_path, load_json):
    result = run_script(script, "-n", "6", "--num-gpus", "3", "--show-throttling", "--show-completion-time",
                        "--no-show", "--output", "chart.png", "--trace", "trace.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_png_drawn(tmp_path / "chart.png")
    trace = load_json(tmp_path / "trace.json")
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    tasks = 3 * 6 * 2 + 2 * 6 * 2 + 3 * 6
    assert len(complete) == tasks
    assert len({e["args"]["task"] for e in complete}) == tasks
    assert {e["pid"] for e in complete} == {0, 1, 2}
    # compute on thread 0, transfers on 1 and more where they run at once: on every thread, events never overlap
    # (a trace's complete events must nest), and every thread is named
    assert {0, 1} <= {e["tid"] for e in complete}
    threads = {(e["pid"], e["tid"]) for e in complete}
    for pid, tid in threads:
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in complete if (e["pid"], e["tid"]) == (pid, tid))
        assert all(start >= end - 1e-6 for (_, end), (start, _) in zip(spans, spans[1:]))  # floats of one time
    named = {(e["pid"], e["tid"]) for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads <= named
    from pipeline_sim import EnvParams, Policy, simulate

    expected = simulate(EnvParams(n=6, num_gpus=3), Policy(priorities={"fwd_prop": 0.5, "grad_prop": 0.3,
                                                                       "grad_sync": 0.2}))
    assert trace["otherData"]["completion_time"] == expected.completion_time
    last = max(e["ts"] + e["dur"] for e in complete)
    assert last == pytest.approx(expected.completion_time * 1000)
    assert f"{expected.completion_time:.6g}" in result.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_default_output_location_and_policy_flags(script, tmp_path):
    result = run_script(script, "-n", "4", "--exclusive", "grad_sync=a", "--priority", "fwd_prop=0.7",
                        "--sync-solo-w", "3", "--no-show", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    charts = list((tmp_path / "outputs" / "gantt").glob("*.png"))
    assert len(charts) == 1
    assert_png_drawn(charts[0])


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("args, fragments", [
    (["-n", "0"], ["-n/--num_groups", "n = 0", ">= 1"]),
    (["--fwd-impact", "1.5"], ["--fwd-impact", "fwd_impact = 1.5", "0 <= x < 1"]),
    (["--exclusive", "grad_sync=9"], ["--exclusive", "'9'", "one letter"]),
    (["--priority", "fwd_prop=lots"], ["--priority", "must be a number: 0, or from 1e-06 to 1"]),
    (["--priority", "bogus=0.5"], ["--priority", "fwd_prop, grad_prop, grad_sync"]),
    (["--priority", "fwd_prop=0.5", "--priority", "fwd_prop=0.7"],
     ["--priority 'fwd_prop=0.7': fwd_prop is given twice (--priority fwd_prop=0.5 too)"]),
    (["--exclusive", "fwd_prop=a", "--priority", "fwd_prop=0.5"],
     ["--priority fwd_prop=0.5: fwd_prop is exclusive (--exclusive fwd_prop=a), which takes no shared priority"]),
    (["--num-gpus", "two"], ["--num-gpus", "invalid int value"]),
    (["--ingress-capacity", "0"], ["--ingress-capacity", "ingress_capacity = 0.0"]),
    (["--num-gpus", "100000"], ["error: -n and --num-gpus: n = 8: on 100000 GPUs gives about 4,900,000 tasks"]),
    (["--model", "llama3-8b", "--global-batch-size", "100000000"],
     ["error: --global-batch-size and --pipeline-parallel (n is the global batch over the micro-batch size and the "
      "data-parallel degree): n = 100000000: on 4 GPUs"]),
])
def test_user_mistakes_get_one_line(script, args, fragments, tmp_path):
    result = run_here(script, *args, "--no-show", cwd=tmp_path)
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "outputs").exists()


def test_unwritable_output_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_here(SCRIPTS[0], "--no-show", "--output", str(blocker / "chart.png"), cwd=tmp_path)
    assert_one_line_error(result)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_documents_the_flags(script, tmp_path):
    result = run_here(script, "--help", cwd=tmp_path)
    assert result.returncode == 0
    for flag in ["--num_groups", "--num-groups", "-o FILE, --output FILE", "--fwd-impact", "--bwd-impact",
                 "--sync-solo-w", "--sync-freq", "--no-show",
                 "--show-throttling", "--show-completion-time", "--num-gpus", "--fwd-len", "--bwd-len",
                 "--prop-len", "--sync-base-len", "--ingress-capacity", "--priority", "--exclusive", "--output",
                 "--trace", "no effect", "--schedule", "--chunks", "--w-fraction", "--fb-overlap", "--show-memory",
                 "--print-order", "dualpipe-v"]:
        assert flag in result.stdout, flag


@pytest.mark.parametrize("schedule, n", [("gpipe", 8), ("interleaved-1f1b", 8), ("zb-h1", 8), ("zb-v", 8),
                                         ("DualPipe-V", 10)])
def test_every_schedule_draws_with_memory_and_order(schedule, n, tmp_path):
    from pipeline_sim import compute_orders

    chart = tmp_path / "chart.png"
    result = run_here(SCRIPTS[0], "--schedule", schedule, "-n", str(n), "--show-memory", "--print-order",
                        "--no-show", "--output", str(chart), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    expected = compute_orders(schedule, num_gpus=4, n=n)
    assert lines[:4] == [f"GPU {g}: {' '.join(order)}" for g, order in enumerate(expected)]
    direct = calculate_full_pipeline_schedule(schedule=schedule, n=n, priorities=DEFAULT_PRIORITIES)
    assert f"completion time {direct.completion_time:.6g}" in lines[4]
    assert f"peak activations {schedule_metrics(direct).peak_activations:g}" in lines[4]
    assert f"lower bound {direct.lower_bound:.6g}: {direct.completion_time / direct.lower_bound - 1:.1%} above it" \
        in lines[4]
    held = bound_of_run(memory_bound(direct.params, 0, direct.memory_limit), direct.completion_time, direct.params)
    if held > direct.lower_bound:  # named as the bound it is, with the limit it holds to
        assert f"; memory-aware bound {held:.6g}, at most {direct.memory_limit:g} micro-batches of activations in " \
               f"flight: {direct.completion_time / held - 1:.1%} above it" in lines[4]
    assert_png_drawn(chart)


@pytest.mark.parametrize("args, fragments", [
    (["--schedule", "interleaved-1f1b", "-n", "6"], ["-n/--num_groups", "interleaved-1f1b", "multiple of num_gpus"]),
    (["--schedule", "dualpipe-v", "-n", "7"], ["-n/--num_groups", "dualpipe-v", "n >= 2 x num_gpus (8)"]),
    # n made by the workload's batch: the flag that made it is named, not -n
    (["--model", "llama3-8b", "--global-batch-size", "6", "--schedule", "interleaved-1f1b"],
     ["error: --global-batch-size (n is the global batch over the micro-batch size and the data-parallel degree): "
      "n = 6: schedule interleaved-1f1b with num_gpus = 4 requires n to be a multiple of num_gpus (4)"]),
    (["--schedule", "pipedream"], ["--schedule", "'pipedream'", "gpipe, 1f1b, interleaved-1f1b"]),
    (["--chunks", "1"], ["--chunks", "chunks = 1", ">= 2"]),
    (["--w-fraction", "1"], ["--w-fraction", "w_fraction = 1.0"]),
])
def test_schedule_mistakes_get_one_line(args, fragments, tmp_path):
    result = run_here(SCRIPTS[1], *args, "--no-show", cwd=tmp_path)
    assert_one_line_error(result, *fragments)


def _chart(params, width):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    from pipeline_sim import Policy
    from pipeline_sim.engine import simulate
    from pipeline_sim.plotting.gantt import plot_gantt

    schedule = simulate(params, Policy())
    fig, ax = plt.subplots(figsize=(width, 4))
    aggregated = plot_gantt(ax, schedule, show_memory=True)
    bars = [c for c in ax.collections if isinstance(c, PolyCollection)]
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    plt.close(fig)
    return schedule, aggregated, bars, len(ax.images), legend


def test_a_chart_draws_every_bar_until_bars_are_narrower_than_pixels():
    from pipeline_sim import EnvParams

    params = EnvParams(n=8, num_gpus=4, schedule="zb-h1")
    schedule, aggregated, bars, images, legend = _chart(params, 12)
    parts = sum(len(task.parts) for task in schedule.tasks if task.parts and task.end > task.start)
    assert not aggregated and images == 0
    # one collection of compute bars (a rectangle per part), one of transfer pieces (at least one per transfer)
    assert len(bars[0].get_paths()) == parts
    transfers = sum(1 for task in schedule.tasks if not task.parts and task.end > task.start)
    assert len(bars[1].get_paths()) >= transfers

    # 400 micro-batches on a 4-inch axis: no bar is 3 pixels wide, so each pixel column shows what ran in it
    many = EnvParams(n=400, num_gpus=4, schedule="zb-h1")
    schedule, aggregated, bars, images, legend = _chart(many, 6)
    assert aggregated and bars == [] and images == 4 * 2  # a compute and a transfer row per GPU
    count = sum(1 for task in schedule.tasks if task.parts and task.end > task.start)
    assert any(text.startswith(f"{count:,} compute bars, too narrow") for text in legend)


def test_pixel_columns_hold_what_ran_in_them():
    import numpy as np

    from pipeline_sim.plotting.gantt import _busy

    edges = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    # [0.5, 2.5) at rate 1 and [1.5, 4) at rate 0.5: each column's integral of the rates
    busy = _busy(np.array([0.5, 1.5]), np.array([2.5, 4.0]), np.array([1.0, 0.5]), edges)
    assert busy == pytest.approx([0.5, 1.0 + 0.25, 0.5 + 0.5, 0.5])


def _pixels(schedule, width):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from pipeline_sim.plotting.gantt import plot_gantt

    fig, ax = plt.subplots(figsize=(width, 4))
    aggregated = plot_gantt(ax, schedule)
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba()).copy()
    plt.close(fig)
    return aggregated, pixels


def test_a_chart_by_pixel_column_reads_the_arrays_as_the_records_say():
    from pipeline_sim import EnvParams, Policy
    from pipeline_sim.engine import simulate
    from pipeline_sim.model import RunTasks

    # pairs and chunks: parts of one task in two colours, a GPU's later chunk lighter
    schedule = simulate(EnvParams(n=200, num_gpus=4, schedule="dualpipe-v", fb_overlap=0.3), Policy())
    aggregated, from_arrays = _pixels(schedule, 6)
    assert aggregated and isinstance(schedule.tasks, RunTasks)
    assert schedule.run is schedule.run  # drawn from the kernel's arrays: no record made
    records = replace(schedule, tasks=list(schedule.tasks))  # the same run as records, as a replay gives them
    assert records.run is not records.run
    assert (_pixels(records, 6)[1] == from_arrays).all()


def test_a_run_as_arrays_is_its_records():
    import numpy as np

    from pipeline_sim import EnvParams, Policy
    from pipeline_sim.engine import simulate
    from pipeline_sim.model import Run

    for params in (EnvParams(n=6, num_gpus=3, schedule="dualpipe-v", fb_overlap=0.3, compute_jitter=0.2),
                   EnvParams(n=8, num_gpus=4, schedule="zb-h1", optimizer_len=0.5, zero=3, gather_len=0.5)):
        schedule = simulate(params, Policy(), sample=2)
        run = schedule.run
        records = Run.of(schedule.tasks)
        for field in Run._fields:
            assert np.array_equal(getattr(run, field), getattr(records, field)), field
        # the records, once made, are what a reader may change, and the arrays follow them
        schedule.tasks.pop()
        assert len(schedule.run.gpu) == len(run.gpu) - 1


def test_a_row_by_pixel_column_stacks_from_its_floor():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from pipeline_sim.plotting.gantt import _ColumnRow

    fig, ax = plt.subplots(figsize=(2, 2), dpi=100)
    ax.set_xlim(0, 1)
    ax.set_ylim(0.5, -0.5)  # as a chart: y grows downwards, a row's floor below its top
    # one column: the first band up to a quarter of the row, the second up to three quarters, clear above
    red, blue = [255, 0, 0, 255], [0, 0, 255, 255]
    ax.add_image(_ColumnRow(ax, np.array([[0.25], [0.75]]), np.array([[red], [blue]], np.uint8),
                            np.array([0.0, 1.0]), 0.0))
    fig.canvas.draw()
    box = ax.get_window_extent()
    pixels = np.asarray(fig.canvas.buffer_rgba())
    column = pixels[:, int(box.x0 + box.width / 2)]

    def at(share):  # the canvas row (its first is its top) at ``share`` of the row's height above its floor
        return int(pixels.shape[0] - (box.y0 + box.height * (0.1 + 0.8 * share)))  # the row: 0.1 to 0.9 of the axes
    assert list(column[at(0.1)]) == red and list(column[at(0.5)]) == blue
    assert list(column[at(0.9)]) == [255, 255, 255, 255]  # clear: the figure's white
    plt.close(fig)


def test_a_chart_by_pixel_column_saves_as_a_vector_file(tmp_path):
    result = run_script(SCRIPTS[0], "--schedule", "zb-h1", "-n", "400", "--num-gpus", "4", "--no-show", "--output",
                        "chart.svg", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "chart.svg").read_text()
    # the rows by pixel column as one embedded image, the axes, ticks and legend as vectors
    assert text.startswith("<?xml") and text.count("<image") == 1


def test_a_deep_pipeline_is_drawn_within_a_height_a_viewer_opens(tmp_path):
    """Hundreds of GPUs: the chart stops at MAX_HEIGHT, its rows thinner, and the GPU axis labels the first row of
    every few GPUs where a label a row would overlap; 64 GPUs keep a label a row."""
    from PIL import Image

    from pipeline_sim.plotting.gantt import DPI, MAX_HEIGHT

    result = run_here(SCRIPTS[0], "--num-gpus", "400", "-n", "2", "--no-show", "-o", "deep.png", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with Image.open(tmp_path / "deep.png") as image:
        assert image.size[1] == round(MAX_HEIGHT * DPI) and image.size[0] * image.size[1] < 89_478_485

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline_sim import EnvParams, Policy
    from pipeline_sim.engine import simulate
    from pipeline_sim.plotting.gantt import chart_height, plot_gantt

    for gpus, every in ((64, 0), (400, 1), (1000, 2)):
        fig, ax = plt.subplots(figsize=(12, chart_height(gpus * 2.5)))
        plot_gantt(ax, simulate(EnvParams(n=2, num_gpus=gpus), Policy()))
        labels = [label.get_text() for label in ax.get_yticklabels()]
        plt.close(fig)
        expected = [f"GPU {g} {row}" if not every else f"GPU {g}" if r == 0 and g % every == 0 else ""
                    for g in range(gpus) for r, row in enumerate(("compute", "comm"))]
        assert labels == expected


def test_a_narrow_bar_takes_the_shortest_label_that_fits_and_the_completion_label_covers_none():
    """A label that would run into its neighbours gives way to a shorter one (``F3·s5``, ``F3``, ``3``); the completion
    label stands in a band of its own above the first GPU, in the axis's unit (ms for an iteration under 2 s)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline_sim import EnvParams, Policy, Workload, workload_environment
    from pipeline_sim.engine import simulate
    from pipeline_sim.plotting.gantt import plot_gantt

    fig, ax = plt.subplots()
    from pipeline_sim.plotting.gantt import _label
    _label(ax, ("F3·s5", "F3", "3"), 0.0, 3.0, 0.0, 1.0, 7)  # room for two characters and one to spare
    _label(ax, ("F3·s5", "F3", "3"), 0.0, 1.5, 0.0, 1.0, 7)  # for none
    assert [text.get_text() for text in ax.texts] == ["F3"]
    plt.close(fig)

    schedule = simulate(EnvParams(schedule="interleaved-1f1b", n=8, num_gpus=4), Policy())
    shortest = min(task.end - task.start for task in schedule.tasks if task.parts)
    fig, ax = plt.subplots(figsize=(schedule.completion_time / shortest * 0.22, 4))  # as the visualizers draw it
    plot_gantt(ax, schedule, stage_chunk=[0, 0, 0, 0, 1, 1, 1, 1], show_completion_time=True)
    rows = {gpu * 2.5 for gpu in range(4)}  # each GPU's compute row, then its port's, then a gap
    labels = [text for text in ax.texts if text.get_position()[1] in rows]
    computes = [task for task in schedule.tasks if task.parts]
    assert len(labels) == len(computes)  # every compute bar labelled, however short its label had to be
    texts = {text.get_text() for text in labels}
    assert {"0", "7"} <= texts and any("·s" in text for text in texts)  # the fullest where it fits
    (completion,) = [text for text in ax.texts if text.get_text().startswith("completion")]
    assert completion.get_position()[1] < -0.75 and ax.get_ylim()[1] < completion.get_position()[1]
    plt.close(fig)

    w = Workload(model="llama2-7b", gpu="a100-80gb", global_batch_size=4, seq_len=2048)
    fast = simulate(workload_environment(w, num_gpus=2), Policy())
    assert fast.completion_time < 2.0
    fig, ax = plt.subplots(figsize=(12, 4))
    plot_gantt(ax, fast, show_completion_time=True, seconds=True)
    (completion,) = [text for text in ax.texts if text.get_text().startswith("completion")]
    assert ax.get_xlabel() == "time (ms)"
    assert completion.get_text() == f"completion {fast.completion_time * 1e3:.4g} ms "
    plt.close(fig)


def test_the_title_says_whether_gradients_are_synced_as_the_run_did():
    from pipeline_sim import EnvParams, Policy
    from pipeline_sim.engine import simulate
    from pipeline_sim.plotting.gantt import gantt_title

    def title(params):
        return gantt_title(simulate(params, Policy()), schedule_name="1f1b", ideal_time=1.0).splitlines()[0]

    assert "sync every 2;" in title(EnvParams(sync_freq=2))
    assert "no gradient sync;" in title(EnvParams(sync_freq=2, sync_base_len=0.0))


@pytest.mark.parametrize("flags, message", [
    (["--chunks", "3"], "--chunks: chunks = 3: changes nothing, as schedule 1f1b does not read it; leave it out"),
    (["--schedule", "zb-h1", "--fb-overlap", "0.5"], "--fb-overlap: fb_overlap = 0.5: changes nothing, as schedule "
                                                     "zb-h1 does not read it"),
    (["--schedule", "gpipe", "--w-fraction", "0.9"], "--w-fraction: w_fraction = 0.9: changes nothing"),
    (["--ep-overlap", "1"], "--ep-overlap: ep_overlap = 1: changes nothing, as there is no all-to-all (a2a_len 0)"),
    (["--slow-factor", "2"], "--slow-factor: slow_factor = 2.0: changes nothing, as there is no straggler"),
    (["--seed", "4"], "--seed: seed = 4: changes nothing, as no length is drawn (compute_jitter and comm_jitter 0)"),
    (["--sample", "5"], "--sample: sample = 5: changes nothing, as no length is drawn"),
    (["--memory-limit", "3"], "--memory-limit: memory_limit = 3.0: changes nothing, as the static order"),
    (["--model", "llama3-8b", "--expert-imbalance", "2"], "--expert-imbalance: expert_imbalance = 2.0: changes "
                                                          "nothing, as there is no all-to-all (expert_parallel 1)"),
])
def test_a_flag_the_run_does_not_read_is_refused(tmp_path, flags, message):
    """Each of these drew the same chart as without the flag, with nothing said."""
    result = run_here("schedule_visualizer_single_channel.py", *flags, "--no-show", "-o", "chart.png", cwd=tmp_path)
    assert_one_line_error(result, message)
    assert not (tmp_path / "chart.png").exists()


def test_a_run_past_the_size_limits_is_refused_unless_allowed(tmp_path):
    """A look-ahead run of hundreds of estimated hours had started with nothing but its estimate; the visualizer now
    refuses it as a sweep would, and --allow-large lifts both limits."""
    result = run_here("schedule_visualizer_single_channel.py", "--schedule", "zb-h1", "-n", "1024", "--num-gpus", "64",
                      "--dispatch", "lookahead", "--no-show", "-o", "chart.png", cwd=tmp_path)
    assert_one_line_error(result, "lookahead dispatch of 1,024 micro-batches on 64 GPUs would take up to about ",
                          " hours (by a slow day's estimate); at most 24 hours are allowed (fewer micro-batches or "
                          "GPUs, or pass --allow-large)")
    result = run_here("schedule_visualizer_single_channel.py", "-n", "100000", "--num-gpus", "64", "--no-show",
                      cwd=tmp_path)
    assert_one_line_error(result, "gives about 38,400,064 tasks; at most 1,000,000 fit in memory (pass --allow-large "
                                  "to try anyway)")
    assert not (tmp_path / "chart.png").exists()


def test_a_memory_limit_between_two_steps_says_the_one_in_force(tmp_path):
    """A limit counts in whole steps of 1/v (docs/model.md section 12.1): 1.5 on a schedule of one chunk a GPU holds
    as 1, which the run's line and title say instead of 1.5 alone."""
    result = run_here("schedule_visualizer_single_channel.py", "--schedule", "zb-h1", "--dispatch", "greedy",
                      "--memory-limit", "1.5", "--no-show", "-o", "chart.png", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "greedy memory limit=1.5, 1 in force (whole micro-batches): completion time" in result.stdout
    exact = run_here("schedule_visualizer_single_channel.py", "--schedule", "zb-h1", "--dispatch", "greedy",
                     "--memory-limit", "1", "--no-show", "-o", "exact.png", cwd=tmp_path)
    assert "in force" not in exact.stdout
    assert exact.stdout.split("completion time ")[1].split()[0] == result.stdout.split("completion time ")[1].split()[0]


def test_a_recomputation_mode_in_capitals_is_the_mode(tmp_path):
    """As the planner and a config take it: --recompute Full is full."""
    flags = ("--model", "llama3-8b", "--gpu", "h100-80gb", "--num-gpus", "2", "-n", "4", "--no-show")
    runs = [run_here("schedule_visualizer_single_channel.py", *flags, "--recompute", mode, "-o", f"{mode}.png",
                     cwd=tmp_path) for mode in ("Full", "full", "none")]
    assert all(run.returncode == 0 for run in runs), [run.stderr for run in runs]
    texts = [run.stdout.replace(f"chart: {mode}.png", "") for run, mode in zip(runs, ("Full", "full", "none"))]
    assert texts[0] == texts[1] != texts[2]
    assert "batch 4 x 8192 tokens, full recomputation, optimizer step" in texts[0]
