"""The measured spread of step times around the fitted costs (costs.jitter_table, Jittered):
tables by step size, mean-preserving draws, the same seed the same run."""

import numpy as np
import pytest

from dualpace.runtime.step_work import CpuStepWork, GpuStepWork
from dualpace.sim.costs import (
    JITTER_QUANTILES,
    FittedCosts,
    Jittered,
    decode_ranks,
    encode_ranks,
    jitter_table,
)


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


def test_a_bin_spanning_decodes_and_prefills_is_split_so_prefills_keep_their_own_tail():
    """Most steps are one-row decodes of one size, so every quantile edge falls among them
    and the top bin holds 2 ms multi-row decodes (10% of them at 8x) beside 25 ms prefills
    (all within 1.1x): the wide bin is cut at its sizes' geometric middle, and a prefill
    draws from its own table (the log of 2026-12-02 put a decode's 7.6x tail on them)."""
    rng = np.random.default_rng(0)
    one_row = np.full(3000, 0.001)
    rows = np.full(900, 0.002)
    prefill = rng.uniform(0.020, 0.030, 150)
    pred = np.concatenate([one_row, rows, prefill])
    ratio = np.concatenate([np.ones(3000), np.where(np.arange(900) % 10 == 0, 8.0, 1.0),
                            np.where(np.arange(150) % 2 == 0, 1.1, 1.0)])
    t = jitter_table(pred * ratio, pred)
    # the quartiles: 1 ms and 2 ms; the cut between 2 ms and the prefills' smallest
    assert t["edges"][:2] == pytest.approx([0.001, 0.002]) and len(t["edges"]) == 3
    assert t["edges"][2] == pytest.approx(np.sqrt(0.002 * prefill.max()))
    assert 0.002 < t["edges"][2] < prefill.min()
    decodes, prefills = t["tables"][2], t["tables"][3]
    assert max(decodes) == pytest.approx(8.0 / 1.7, abs=1e-3)  # mean 1.7 divided out
    assert max(prefills) == pytest.approx(1.1 / 1.05, abs=1e-3)
    # too few long steps for a table of their own: no cut
    few = jitter_table(np.concatenate([one_row, rows, prefill[:50]]),
                       np.concatenate([one_row, rows, prefill[:50]]))
    assert few["edges"] == pytest.approx([0.001])


def test_a_bin_of_multi_row_decodes_is_split_so_large_batches_keep_their_own_tail():
    """CPU steps: 1-row decodes (0.7 ms) fill three quantile edges, and the top bin held
    2-row (1.1 ms, 5% at 3.5x), 3-row (1.4 ms, 5% at 2.9x) and 12-row steps (3.5 ms, 5% at
    1.8x), a span of 3.2x. Split at 2x (JITTER_SPAN), the 12-row steps draw their own
    tail, not the short batches' (this box's log, 2026-12-04: one bin from 1.1 to 4 ms put
    the 2-3-row tail on the CPU tier's large batches, P99 inter-token latency +19-40%)."""
    def steps(n, size, tail):
        pred = np.full(n, size)
        return pred, pred * np.where(np.arange(n) % 20 == 0, tail, 1.0)

    parts = [steps(3000, 7e-4, 4.4), steps(600, 1.1e-3, 3.5), steps(300, 1.4e-3, 2.9),
             steps(300, 3.5e-3, 1.8)]
    pred = np.concatenate([p for p, _ in parts])
    t = jitter_table(np.concatenate([a for _, a in parts]), pred)
    assert t["edges"] == pytest.approx([7e-4, 1.1e-3, np.sqrt(1.1e-3 * 3.5e-3)])
    short, large = t["tables"][2], t["tables"][3]
    assert max(large) == pytest.approx(1.8 / (0.95 + 0.05 * 1.8), abs=1e-3)
    # 2- and 3-row steps: of 100 quantiles, 95 at 1, 2 at 2.9 and 3 at 3.5
    assert max(short) == pytest.approx(3.5 / ((95 + 2 * 2.9 + 3 * 3.5) / 100), abs=1e-3)


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


def test_jitter_ranks_give_each_measured_step_its_own_entry_in_log_order():
    """A step's rank is its place in its own bin's table: replayed, the table entry is that
    step's ratio to the fit (divided by the bin's mean), whatever order the log had."""
    rng = np.random.default_rng(7)
    pred = np.array([0.001, 0.010] * 100)  # two sizes, interleaved as a log would have them
    ratio = rng.lognormal(0.0, 0.4, 200)
    t = jitter_table(ratio * pred, pred)
    ranks = list(decode_ranks(t))
    assert len(ranks) == 200
    bins = np.searchsorted(t["edges"], pred, side="right")
    for b in set(bins.tolist()):
        table, mean = t["tables"][b], ratio[bins == b].mean()
        got = [table[r] for r, k in zip(ranks, bins) if k == b]
        assert got == pytest.approx((ratio[bins == b] / mean).tolist(), abs=2e-4)
    # 100 steps a bin fill the 100 entries once each
    assert sorted(r for r, k in zip(ranks, bins) if k == bins[0]) == list(range(100))


def _walk_costs(ranks):
    table = [(k + 1) / 50.5 for k in range(JITTER_QUANTILES)]  # mean 1
    return _costs({"edges": [], "tables": [table], "ranks": encode_ranks(ranks)}, None), table


def test_jittered_replays_the_measured_ranks_in_order_within_a_spell(monkeypatch):
    import dualpace.sim.costs as costs_mod

    monkeypatch.setattr(costs_mod, "JITTER_SPELL", 10 ** 12)  # never jumps
    log = [3, 1, 4, 0, 5, 9, 2, 6]
    costs, _ = _walk_costs(log)
    j = Jittered(costs, seed=1)
    k = [round(j.gpu_step(GpuStepWork(decode_rows=1)) / 0.002 * 50.5) - 1 for _ in range(20)]
    walk = [log[(log.index(k[0]) + i) % 8] for i in range(20)]
    assert k == walk  # consecutive measured steps, wrapping at the log's end


def test_jittered_spells_jump_at_their_mean_length_and_keep_the_mean(monkeypatch):
    import dualpace.sim.costs as costs_mod

    monkeypatch.setattr(costs_mod, "JITTER_SPELL", 20)
    costs, table = _walk_costs(list(range(JITTER_QUANTILES)))  # rank i at log position i
    j = Jittered(costs, seed=2)
    k = np.array([round(j.gpu_step(GpuStepWork(decode_rows=1)) / 0.002 * 50.5) - 1
                  for _ in range(20000)])
    jumps = int((np.diff(k) % JITTER_QUANTILES != 1).sum())
    assert 800 < jumps < 1200  # 1 in 20 steps (a jump onto the next step passes for none)
    assert np.mean(np.array(table)[k]) == pytest.approx(1.0, rel=0.03)
    assert len(set(k.tolist())) == JITTER_QUANTILES


def test_each_kind_of_step_walks_its_own_log(monkeypatch):
    import dualpace.sim.costs as costs_mod

    monkeypatch.setattr(costs_mod, "JITTER_SPELL", 10 ** 12)
    seq = list(range(JITTER_QUANTILES))
    table = [(k + 1) / 50.5 for k in range(JITTER_QUANTILES)]
    jit = {"edges": [], "tables": [table], "ranks": encode_ranks(seq)}
    j = Jittered(_costs(jit, dict(jit)), seed=5)
    g = [j.gpu_step(GpuStepWork(decode_rows=1)) / 0.002 for _ in range(3)]
    c = [j.cpu_step(CpuStepWork(1, 10, "full-cpu")).seconds / 0.004 for _ in range(3)]
    g.append(j.gpu_step(GpuStepWork(decode_rows=1)) / 0.002)
    # the GPU walk goes on where it was, untouched by the CPU steps between
    assert [round(x * 50.5) - 1 for x in g] == [(round(g[0] * 50.5) - 1 + i) % 100
                                                 for i in range(4)]
    assert [round(x * 50.5) - 1 for x in c] == [(round(c[0] * 50.5) - 1 + i) % 100
                                                 for i in range(3)]


def test_a_sweeps_points_draw_from_different_places(monkeypatch):
    """Each point of a simulated sweep seeds its jitter with the rate too: a real sweep's
    points run at different times, in different stretches of the box's noise."""
    import dualpace.sim.run as run_mod
    from dualpace.sim.run import simulate

    from .test_simulator import _jobs, _small_setup

    seeds = []

    class Recording(Jittered):
        def __init__(self, costs, seed):
            seeds.append(seed)
            super().__init__(costs, seed)

    monkeypatch.setattr(run_mod, "Jittered", Recording)
    costs = _costs({"edges": [], "tables": [[0.5, 1.5]]}, {"edges": [], "tables": [[0.5, 1.5]]})
    for rate in (5.0, 10.0, 5.0):
        simulate(_small_setup(), costs, "dualpace", _jobs(4), rate=rate, seed=4, jitter_seed=9)
    assert seeds[0] != seeds[1] and seeds[0] == seeds[2]
