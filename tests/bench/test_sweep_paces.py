"""compare_policies: each real sweep's pace against the profile fitted to all of them, and
the warning when sweeps ran far apart (a slow one's steps set the simulated tails)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

GPU = {"overhead": 0.001, "prefill_tokens": 1e-4, "decode_rows": 5e-4, "context": 0.0,
       "prefill_context": 0.0, "link_tokens": 0.0, "carried_rows": 0.0, "prefill_step": 0.0}
CPU_FIT = {"overhead": 0.002, "batch": 1e-3, "batch_past_knee": 5e-4, "context": 0.0,
           "batch_knee": 3}
FITS = {"gpu": GPU, "gpu_beside": {**GPU, "overhead": 0.003},
        "cpu": {"full-cpu": {**CPU_FIT, "attention": CPU_FIT}}}


def _gpu(rows: int, seconds: float, beside: int = 0) -> dict:
    return {"kind": "gpu", "seconds": seconds, "beside": beside, "prefill_tokens": 0,
            "decode_rows": rows, "context": 10 * rows, "prefill_context": 0, "link_tokens": 0,
            "carried_rows": 0}


def _cpu(batch: int, seconds: float, route: str = "full-cpu") -> dict:
    return {"kind": "cpu", "seconds": seconds, "batch": batch, "context": 100 * batch,
            "route": route, "attention": seconds / 2}


def test_a_logged_step_is_priced_by_its_own_kind_of_fit():
    from dualpace.sim.costs import FittedCosts, record_seconds

    costs = FittedCosts(FITS)
    # GPU: 1 ms + 4 rows x 0.5 ms; beside a CPU step the beside fit's 3 ms overhead
    assert record_seconds(costs, _gpu(4, 0.0)) == pytest.approx(0.003)
    assert record_seconds(costs, _gpu(4, 0.0, beside=1)) == pytest.approx(0.005)
    # CPU: 2 ms + 3 rows x 1 ms + 2 rows past the knee x 0.5 ms
    assert record_seconds(costs, _cpu(5, 0.0)) == pytest.approx(0.006)


def test_each_sweeps_pace_is_its_steps_time_over_the_fits_price():
    from compare_policies import sweep_paces

    steps = {"dualpace": {
        "rep1": [_gpu(4, 0.003), _cpu(5, 0.006), {"kind": "request"}],  # as priced
        "rep2": [_gpu(4, 0.0045), _cpu(5, 0.009)],  # 1.5x
        # the gated pipeline's CPU steps are priced at their attention: left out
        "rep3": [_gpu(4, 0.006), _cpu(5, 1.0, route="neo-pipeline")]}}
    assert sweep_paces(steps, {"dualpace": FITS}) == {
        "dualpace": {"rep1": 1.0, "rep2": 1.5, "rep3": 2.0}}
    assert sweep_paces(steps, {"dualpace": {"cpu": FITS["cpu"]}}) == {}  # no GPU fit


def test_sweeps_far_apart_are_warned_of_and_close_ones_are_not():
    from compare_policies import PACE_SPREAD, pace_warning

    assert pace_warning({"gated": {"rep1": 1.0, "rep2": PACE_SPREAD}}) is None
    assert pace_warning({"gated": {"rep1": 1.0}}) is None  # one sweep: nothing to compare
    warning = pace_warning({"gated": {"rep1": 1.0, "rep2": 1.02},
                            "dualpace": {"rep1": 0.93, "rep2": 0.96, "rep3": 1.11}})
    assert "dualpace: rep1 0.93x, rep2 0.96x, rep3 1.11x" in warning
    assert "gated" not in warning and "--simulate --per-sweep" in warning


def _sweep_log(d: Path, pace: float) -> None:
    d.mkdir(parents=True)
    rows = [1 + i % 4 for i in range(60)]
    records = ([_gpu(r, pace * (0.001 + 5e-4 * r)) for r in rows]
               + [_cpu(r, pace * (0.002 + 1e-3 * r)) for r in rows])
    (d / "steps-dualpace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_profile_of_several_sweeps_records_their_paces(tmp_path, capsys):
    import compare_policies

    _sweep_log(tmp_path / "rep1", 1.0)
    _sweep_log(tmp_path / "rep2", 1.5)
    args = argparse.Namespace(out=str(tmp_path), profile=None, max_steal=None)
    sweeps = [(tmp_path / "rep1", {}), (tmp_path / "rep2", {})]
    prof = json.loads(compare_policies.fit_measured_profile(["dualpace"], args,
                                                            sweeps).read_text())
    paces = prof["sweep_paces"]["dualpace"]
    # the fit is to both at once: rep2 1.5x rep1, the two either side of 1
    assert paces["rep2"] / paces["rep1"] == pytest.approx(1.5, rel=0.02)
    assert paces["rep1"] < 1.0 < paces["rep2"]
    assert "rep2" in capsys.readouterr().err
    prof = json.loads(compare_policies.fit_measured_profile(["dualpace"], args,
                                                            sweeps[:1]).read_text())
    assert "sweep_paces" not in prof  # one sweep: nothing to compare
