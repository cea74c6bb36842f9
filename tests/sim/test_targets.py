"""dualpace simulate's latency targets: a multiple of the unloaded gpu-only point (default)
or the paper's absolute main-figure targets (§6.1), and the gains at each of them."""

from __future__ import annotations

import pytest


def test_the_papers_targets_read_as_written():
    from dualpace.sim.cli import absolute_targets

    # §6.1: 1 s/token normalized latency, 5 s P99 TTFT, 1.5 s P99 ITL
    assert absolute_targets("1,5,1.5") == {"mean_normalized_latency_s": 1.0,
                                           "p99_ttft_ms": 5000.0, "p99_itl_ms": 1500.0}
    assert absolute_targets("") is None  # not given: --target-factor
    for bad in ("1,5", "1,5,1.5,2", "1,0,1.5", "1,-5,1.5", "1,five,1.5"):
        with pytest.raises(SystemExit, match="simulate: "):
            absolute_targets(bad)


def test_targets_decide_the_sustainable_rate():
    from dualpace.sim.cli import absolute_targets
    from dualpace.workload import sweep_summary, sweep_targets

    runs = [{"request_rate": r, "mean_normalized_latency_s": n, "p99_ttft_ms": t,
             "p99_itl_ms": i} for r, n, t, i in ((2.0, 0.05, 400.0, 100.0),
                                                 (4.0, 0.5, 3000.0, 900.0),
                                                 (6.0, 3.0, 20000.0, 2500.0))]
    paper = sweep_summary(runs, absolute_targets("1,5,1.5"))
    # 1 s/token between 4 (0.5) and 6 (3.0): 4 + 2 x 0.5 / 2.5; TTFT 5 s: 4 + 2 x 2 / 17;
    # ITL 1.5 s: 4 + 2 x 0.6 / 1.6
    assert paper["sustainable_rate"] == pytest.approx(4.4)
    assert paper["sustainable_rate_p99_ttft"] == pytest.approx(4 + 4 / 17)
    assert paper["sustainable_rate_p99_itl"] == pytest.approx(4.75)
    # 3x the lowest point (0.15 s/token) is crossed between 2 and 4: 2 + 2 x 0.1 / 0.45
    tight = sweep_summary(runs, sweep_targets(runs, 3.0))
    assert tight["sustainable_rate"] == pytest.approx(2 + 0.2 / 0.45)


def test_gains_at_every_target_where_both_rates_exist():
    from dualpace.sim.cli import policy_gains

    def rates(norm, ttft, itl):
        return {"sustainable_rate": norm, "sustainable_rate_p99_ttft": ttft,
                "sustainable_rate_p99_itl": itl}

    summary = {"dualpace": rates(4.0, 3.0, None), "gated": rates(2.0, 3.0, 2.0),
               "gpu-only": rates(None, 2.4, 1.0)}
    assert policy_gains(summary) == {"dualpace_over_gated": 1.0,
                                     "dualpace_over_gated_p99_ttft": 0.0,
                                     "dualpace_over_gpu-only_p99_ttft": 0.25}
    assert policy_gains({"gated": rates(1.0, 1.0, 1.0)}) == {}
