"""The measured spread of step times around the fitted costs (costs.jitter_table, Jittered):
tables by step size, mean-preserving draws, the same seed the same run."""

import numpy as np
import pytest

from dualpace.runtime.step_work import CpuStepWork, GpuStepWork
from dualpace.sim.costs import JITTER_QUANTILES, FittedCosts, Jittered, jitter_table


def test_jitter_table_bins_by_predicted_size_and_keeps_each_bins_mean():
    # short steps (1 ms predicted): 90% on time, 10% at 3x; long ones (10 ms): all at 1.2x
    pred = np.array([0.001] * 100 + [0.010] * 100)
    actual = np.concatenate([np.full(90, 0.001), np.full(10, 0.003), np.full(100, 0.012)])
    t = jitter_table(actual, pred)
    # the quartiles of the prediction (the median halfway between the two sizes); a step
    # on an edge belongs to the bin above it
    assert t["edges"] == pytest.approx([0.001, 0.0055, 0.010])
    empty, short, empty2, long_ = t["tables"]
    assert empty == empty2 == [1.0]
    assert len(short) == JITTER_QUANTILES and np.mean(short) == pytest.approx(1.0, abs=1e-3)
    # ratios 1 (x90) and 3 (x10), mean 1.2: the draws 1/1.2 and 3/1.2
    assert sorted(set(short)) == pytest.approx([1 / 1.2, 3 / 1.2], abs=1e-4)
    assert short.count(round(3 / 1.2, 4)) == 10
    assert set(long_) == {1.0}  # a constant ratio is no spread once the mean is divided out


def test_jitter_bins_follow_the_size_steps_are_looked_up_by():
    """With a contention term a simulated step is priced, and its jitter looked up, by its
    time alone; the bins are cut on that size, the ratios still taken to the prediction."""
    pred = np.array([0.002] * 100 + [0.010] * 100)  # with contention
    alone = pred / 2
    actual = np.concatenate([np.full(90, 0.002), np.full(10, 0.006), np.full(100, 0.012)])
    t = jitter_table(actual, pred, alone)
    assert t["edges"] == pytest.approx([0.001, 0.003, 0.005])
    assert sorted(set(t["tables"][1])) == pytest.approx([1 / 1.2, 3 / 1.2], abs=1e-4)
    assert set(t["tables"][3]) == {1.0}


def test_jitter_table_without_enough_steps_is_no_spread():
    assert jitter_table(np.array([0.002] * 5), np.array([0.001] * 5)) == {
        "edges": [], "tables": [[1.0]]}


def _costs(gpu_jitter, cpu_jitter):
    zero = {"batch": 0.0, "context": 0.0}
    return FittedCosts({
        "gpu": {"overhead": 0.002, "prefill_tokens": 0.0, "decode_rows": 0.0, "context": 0.0,
                "prefill_context": 0.0, "link_tokens": 0.0, "carried_rows": 0.0,
                "prefill_step": 0.0, "jitter": gpu_jitter},
        "cpu": {r: {"overhead": 0.004, **zero, "attention": {"overhead": 0.001, **zero},
                    "jitter": cpu_jitter} for r in ("full-cpu", "neo-pipeline")}})


def test_jittered_draws_from_the_steps_bin_and_repeats_with_the_seed():
    gpu = {"edges": [0.003], "tables": [[0.5, 1.5], [7.0]]}  # the 2 ms step is in bin 0
    cpu = {"edges": [], "tables": [[0.25, 1.75]]}
    a, b = Jittered(_costs(gpu, cpu), seed=3), Jittered(_costs(gpu, cpu), seed=3)
    draws = [a.gpu_step(GpuStepWork(decode_rows=1)) for _ in range(400)]
    assert draws == [b.gpu_step(GpuStepWork(decode_rows=1)) for _ in range(400)]
    assert sorted(set(draws)) == pytest.approx([0.001, 0.003]) and np.mean(draws) == pytest.approx(
        0.002, rel=0.1)
    c = a.cpu_step(CpuStepWork(2, 100, "full-cpu"))
    k = c.seconds / 0.004
    assert k in (pytest.approx(0.25), pytest.approx(1.75))
    assert c.attention == pytest.approx(0.001 * k)  # the whole step scales together
    # the gated pipeline's CPU step is never jittered: its logged spread is the wait on the
    # GPU step it rides, which the simulated workers model (it takes its attention, 1 ms)
    neo = [a.cpu_step(CpuStepWork(2, 100, "neo-pipeline")).seconds for _ in range(50)]
    assert neo == pytest.approx([0.001] * 50)
    carrying = [a.gpu_step(GpuStepWork(decode_rows=1, carried_rows=2)) for _ in range(50)]
    assert carrying == pytest.approx([0.002] * 50)  # nor the GPU step the pipeline rides


def test_fits_without_tables_draw_one():
    c = Jittered(_costs(None, None), seed=0)
    assert c.gpu_step(GpuStepWork(decode_rows=1)) == pytest.approx(0.002)
    assert c.cpu_step(CpuStepWork(1, 10, "full-cpu")).seconds == pytest.approx(0.004)


def test_the_gated_pipelines_cpu_half_takes_its_attention_not_the_logged_step():
    """Its logged time is the whole pipelined step, as is the carrying GPU step's, and the
    engine waits for both: the CPU half costs what it computes alone."""
    c = _costs(None, None)
    neo = c.cpu_step(CpuStepWork(2, 100, "neo-pipeline"))
    assert neo.seconds == pytest.approx(0.001) and neo.attention == pytest.approx(0.001)
    full = c.cpu_step(CpuStepWork(2, 100, "full-cpu"))
    assert full.seconds == pytest.approx(0.004) and full.attention == pytest.approx(0.001)


def test_a_jitter_seed_changes_the_draws_and_keeps_the_arrivals():
    """compare_policies --simulate --repeat: each seed redraws the step jitter over the same
    arrivals (every real sweep replays the same offsets)."""
    from dualpace.sim.run import simulate

    from .test_simulator import _jobs, _small_setup

    costs = _costs({"edges": [], "tables": [[0.5, 1.5]]}, {"edges": [], "tables": [[0.5, 1.5]]})
    jobs = _jobs(20)
    base = simulate(_small_setup(), costs, "dualpace", jobs, rate=10.0, seed=4)
    same = simulate(_small_setup(), costs, "dualpace", jobs, rate=10.0, seed=4, jitter_seed=4)
    other = simulate(_small_setup(), costs, "dualpace", jobs, rate=10.0, seed=4, jitter_seed=5)
    assert same["mean_e2el_ms"] == base["mean_e2el_ms"]
    assert other["mean_e2el_ms"] != base["mean_e2el_ms"]
    assert other["completed"] == base["completed"] == 20
