"""Schedules as data (docs/model.md section 6): orders by hand, a list-scheduling reference, memory, errors."""

import random
import re

import numpy as np
import pytest
import reference_orders

from pipeline_sim import EnvParams, ParameterError, Policy, calculate_full_pipeline_schedule, compute_orders, simulate
from pipeline_sim.metrics import ideal_time, schedule_metrics
from pipeline_sim.orders import order_parts
from pipeline_sim.schedules import SCHEDULES
from pipeline_sim.validate import validate_schedule

ALL = tuple(SCHEDULES)


def orders(schedule, p, n, chunks=2):
    return [" ".join(order) for order in compute_orders(schedule, num_gpus=p, n=n, chunks=chunks)]


# -- orders written out by hand from section 6.4 ----------------------------------------------

def test_gpipe_order():
    assert orders("gpipe", 2, 2) == ["0F0 0F1 0B0 0B1", "1F0 1F1 1B0 1B1"]


def test_one_f_one_b_order():
    assert orders("1f1b", 3, 4) == ["0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3", "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3",
                                    "2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3"]


def test_interleaved_order():
    assert orders("interleaved-1f1b", 2, 4) == [
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3"]


def test_zb_h1_order():
    assert orders("zb-h1", 2, 3) == ["0F0 0F1 0I0 0W0 0F2 0I1 0W1 0I2 0W2",
                                     "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1W2"]


def test_zb_v_order():
    assert orders("zb-v", 2, 3) == [
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 3F2 3I2 3W2 0I1 0W1 0I2 0W2",
        "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1I1 2I2 1I2 1W1 2W2 1W2"]


def test_dualpipe_v_order_small():
    assert orders("dualpipe-v", 2, 4) == [
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 (0F3;3B1) (3F2;0B0) 3B2 (3F3;0B1) 3B3 0I2 0W2 0I3 0W3",
        "1F0 2F0 1F1 2F1 1F2 2B0 (2F2;1B0) (1F3;2B1) (2F3;1B1) 2B2 1B2 2I3 1I3 2W3 1W3"]


def test_dualpipe_v_example_of_the_model():
    first = orders("dualpipe-v", 4, 10)[0]
    assert first.startswith("0F0 0F1 0F2 0F3 0F4 0F5 0F6 7F0 7I0 7W0 7F1 7I1 7W1 7F2 7I2 7W2 7F3 (0F7;7B3) "
                            "(7F4;0B0) ")


@pytest.mark.parametrize("schedule", ALL)
def test_compiled_orders_are_the_reference_orders(schedule):
    """Every part of the compiled orders, for p 1 to 8, n 1 to 4p + 2 and 2 to 3 chunks, paired for the all-to-all's
    overlap or not, split for a dispatcher or not, is the reference's (numpy and plain Python, as first written)."""
    compared = 0
    for p in range(1, 9):
        for n in range(1, 4 * p + 3):
            for chunks, pairing, dispatch in ((2, 0, "static"), (3, 1, "static"), (2, 0, "critical-path")):
                try:
                    params = EnvParams(schedule=schedule, num_gpus=p, n=n, chunks=chunks, dispatch=dispatch,
                                       a2a_len=0.5 * pairing, ep_overlap=pairing)
                except ParameterError:
                    continue
                for got, want in zip(order_parts(params), reference_orders.order_parts(params), strict=True):
                    assert np.array_equal(got, want), (params, got, want)
                compared += 1
    assert compared >= 100


def parts(text):
    return re.findall(r"(\d+)([FBIW])(\d+)", text)


@pytest.mark.parametrize("schedule", ALL)
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 10, 12])
def test_every_gpu_runs_each_of_its_actions_once(schedule, p, n):
    try:
        params = EnvParams(schedule=schedule, num_gpus=p, n=n, chunks=3)
    except ParameterError:
        return  # requirements are tested apart
    v = params.v
    stages = {s: g for g in range(p) for s in range(v * p) if s in _stages_of(schedule, g, p, v)}
    for gpu, order in enumerate(orders(schedule, p, n, chunks=3)):
        actions = [(int(s), kind, int(m)) for s, kind, m in parts(order)]
        assert len(actions) == len(set(actions)), (gpu, order)
        assert all(stages[s] == gpu for s, _, _ in actions)
        for s in _stages_of(schedule, gpu, p, v):
            for m in range(n):
                present = {kind for stage, kind, mb in actions if (stage, mb) == (s, m)}
                assert present in ({"F", "B"}, {"F", "I", "W"}), (gpu, s, m, present)


def _stages_of(schedule, gpu, p, v):
    if v == 1:
        return [gpu]
    if schedule == "interleaved-1f1b":
        return [gpu + c * p for c in range(v)]
    return [gpu, 2 * p - 1 - gpu]


# -- completion times against a plain list-scheduling of the orders -----------------------------

def list_schedule(schedule, p, n, fwd, bwd, chunks=2, w_fraction=0.5, fb_overlap=0.0):
    """Each action starts when its GPU's previous action and every producer of its parts have ended."""
    v = EnvParams(schedule=schedule, num_gpus=p, n=n, chunks=chunks).v
    f, b = fwd / v, bwd / v
    last = v * p - 1
    done = {}  # (stage, kind, mb) -> end; B and I both count as (stage, "B", mb)
    plans = [[parts(action) for action in order.split()] for order in orders(schedule, p, n, chunks)]
    position, free = [0] * p, [0.0] * p
    progress = True
    while progress:
        progress = False
        for gpu in range(p):
            while position[gpu] < len(plans[gpu]):
                action = [(int(s), kind, int(m)) for s, kind, m in plans[gpu][position[gpu]]]
                needs = []
                for s, kind, m in action:
                    if kind == "F" and s > 0:
                        needs.append((s - 1, "F", m))
                    elif kind in "BI":
                        needs.append((s + 1, "B", m) if s < last else (s, "F", m))
                    elif kind == "W":
                        needs.append((s, "B", m))
                if any(need not in done for need in needs):
                    break
                start = max([free[gpu]] + [done[need] for need in needs])
                if len(action) == 2:
                    length = (f + b) * (1 - fb_overlap)
                else:
                    kind = action[0][1]
                    length = {"F": f, "B": b, "I": b * (1 - w_fraction), "W": b * w_fraction}[kind]
                free[gpu] = start + length
                for s, kind, m in action:
                    done[s, "B" if kind in "BI" else kind, m] = free[gpu]
                position[gpu] += 1
                progress = True
    assert all(position[g] == len(plans[g]) for g in range(p)), "the orders deadlock"
    return max(free)


@pytest.mark.parametrize("schedule, expected", [("gpipe", 33.0), ("1f1b", 33.0), ("interleaved-1f1b", 28.5)])
def test_hand_checked_completion_with_free_communication(schedule, expected):
    s = calculate_full_pipeline_schedule(schedule=schedule, num_gpus=4, n=8, fwd_len=1, bwd_len=2, w_fraction=0.5,
                                         prop_len=0, sync_base_len=0, fwd_impact=0, bwd_impact=0)
    assert s.completion_time == pytest.approx(expected, rel=1e-12)
    assert list_schedule(schedule, 4, 8, 1.0, 2.0) == pytest.approx(expected, rel=1e-12)
    assert ideal_time(s.params) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("seed", range(120))
def test_free_communication_equals_list_scheduling(seed):
    rng = random.Random(seed)
    schedule = ALL[seed % len(ALL)]
    p = rng.randint(1, 5)
    n = {"interleaved-1f1b": p * rng.randint(1, 3), "dualpipe-v": 2 * p + rng.randint(0, 4)}.get(
        schedule, rng.randint(1, 9))
    kw = dict(fwd=rng.uniform(0.2, 2), bwd=rng.uniform(0.2, 3), chunks=rng.randint(2, 4),
              w_fraction=rng.choice([0.0, 0.3, 0.5, rng.random() * 0.99]), fb_overlap=rng.choice([0.0, 0.25]))
    s = calculate_full_pipeline_schedule(schedule=schedule, num_gpus=p, n=n, fwd_len=kw["fwd"], bwd_len=kw["bwd"],
                                         chunks=kw["chunks"], w_fraction=kw["w_fraction"],
                                         fb_overlap=kw["fb_overlap"], prop_len=0, sync_base_len=0,
                                         fwd_impact=0, bwd_impact=0)
    assert s.completion_time == pytest.approx(list_schedule(schedule, p, n, **kw), rel=1e-9), (schedule, p, n, kw)
    assert validate_schedule(s) == []


# -- memory ---------------------------------------------------------------------------------

def test_activation_peaks():
    one = calculate_full_pipeline_schedule(schedule="1f1b", num_gpus=4, n=8)
    assert schedule_metrics(one).gpu_peak_activations == (4, 3, 2, 1)
    gpipe = calculate_full_pipeline_schedule(schedule="gpipe", num_gpus=4, n=8)
    assert schedule_metrics(gpipe).gpu_peak_activations == (8, 8, 8, 8)
    metrics = schedule_metrics(one)
    assert metrics.peak_activations == 4 and metrics.gpu_peak_activations == (4, 3, 2, 1)
    assert all(steps[-1][1] == 0 for steps in one.activation_steps())  # every activation is freed


def test_spans_run_from_first_compute_start_to_last_end():
    s = calculate_full_pipeline_schedule(schedule="1f1b", num_gpus=2, n=1, fwd_len=1, bwd_len=1, prop_len=1,
                                         sync_base_len=0)
    assert schedule_metrics(s).spans == (6.0, 2.0)  # GPU 0: F [0,1] .. B [5,6]; GPU 1: F [2,3], B [3,4]


def test_task_records_carry_stage_and_parts():
    s = calculate_full_pipeline_schedule(schedule="dualpipe-v", num_gpus=2, n=4)
    pair = s.find("(0F3;3B1)")
    assert pair.kind == "overlap_f_b" and pair.gpu == 0 and pair.stage == 0 and pair.label == "F3|B1"
    assert [str(part) for part in pair.parts] == ["0F3", "3B1"]
    activation = s.find("2FP0")  # stage 2 lives on GPU 1 and sends to stage 3 on GPU 0
    assert activation.gpu == 1 and activation.receiver == 0
    assert s.find("1F0").stage == 1 and s.task("forward", 3, 0).gpu == 0
    assert not any(t.kind == "fwd_prop" and t.stage == 1 for t in s.tasks)  # stages 1 and 2 share GPU 1


def test_zero_weight_work_is_a_zero_length_task():
    s = calculate_full_pipeline_schedule(schedule="zb-h1", num_gpus=2, n=3, w_fraction=0.0)
    w = s.find("0W1")
    assert w.length == 0 and w.start == w.end == w.ready and w.segments == []
    assert validate_schedule(s) == []


def test_backpressure_timeline_by_hand():
    # F [0,1]; fwd_prop at 0.5 (ingress) over [1,3]; GPU 1: F [3,4], B [4,6]; grad_prop [6,8]; B on GPU 0 [8,10]
    s = calculate_full_pipeline_schedule(num_gpus=2, n=1, ingress_capacity=0.5, sync_base_len=0)
    assert s.find("0FP0").segments == [(1.0, 3.0, 0.5)]
    assert s.find("1GP0").segments == [(6.0, 8.0, 0.5)]
    assert s.completion_time == 10.0


# -- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, fragment", [
    ({"schedule": "interleaved-1f1b", "n": 6}, "n = 6: schedule interleaved-1f1b with num_gpus = 4 requires n "
                                               "to be a multiple of num_gpus (4)"),
    ({"schedule": "dualpipe-v", "n": 7}, "n = 7: schedule dualpipe-v with num_gpus = 4 requires n >= 2 x "
                                         "num_gpus (8)"),
    ({"schedule": "pipedream"}, "schedule = 'pipedream': must be one of gpipe, 1f1b, interleaved-1f1b, zb-h1, "
                                "zb-v, dualpipe-v"),
    ({"chunks": 1}, "chunks = 1: must be an integer >= 2"),
    ({"w_fraction": 1.0}, "w_fraction = 1.0: must be a finite number with 0 <= x < 1"),
    ({"fb_overlap": -0.1}, "fb_overlap = -0.1"),
])
def test_bad_schedule_parameters(kwargs, fragment):
    with pytest.raises(ParameterError) as info:
        calculate_full_pipeline_schedule(**kwargs)
    assert fragment in str(info.value)


def test_names_are_case_insensitive_and_ignored_parameters_normalised():
    params = EnvParams(schedule="ZB-H1", chunks=5, fb_overlap=0.3)
    assert params.schedule == "zb-h1" and params.chunks == 2 and params.fb_overlap == 0.0
    # the static order ignores a memory limit, the gathers' work is read only with zero, and the all-to-all's
    # weights, class and overlap only with an all-to-all
    assert params.ignored() == ("chunks", "fb_overlap", "memory_limit", "gather_len", "a2a_weights", "a2a_class",
                                "ep_overlap")
    assert EnvParams(schedule="interleaved-1f1b", chunks=3).v == 3 and EnvParams(schedule="zb-v").v == 2


def test_one_f_one_b_is_the_default_and_unchanged():
    assert simulate(EnvParams(), Policy()).completion_time == \
        simulate(EnvParams(schedule="1f1b", chunks=3, w_fraction=0.1), Policy()).completion_time
