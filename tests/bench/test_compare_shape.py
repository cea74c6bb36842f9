"""compare_policies: --simulate and --resummarize work on the real sweep's own shape (its
requests, servers, rates and target), recorded in its compare.json (``shape``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

TRACE_ROWS = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
              "2023-11-16 18:15:46.6805900,12,5\n2023-11-16 18:15:50.1000000,30,9\n"
              "2023-11-16 18:15:51.2000000,40,3\n")


def _unset_args(**given):
    from compare_policies import SHAPE, UNSET

    return argparse.Namespace(**{**dict.fromkeys(SHAPE, UNSET), **given})


def _defaults(**over):
    from compare_policies import SHAPE

    d = dict.fromkeys(SHAPE, 0)
    d.update(model=None, trace="t.csv", num_requests=80, rates="2,4,8,12,16",
             target_factor=3.0, profile=None)
    d.update(over)
    return d


def test_flags_not_given_come_from_the_real_sweep_and_given_ones_are_checked():
    from compare_policies import resolve_shape

    ref = {**_defaults(), "num_requests": 200, "rates": [2.0, 4.0], "gpu_kv_blocks": 96}
    # given equal to the real sweep's (rates as typed vs as recorded): the same sweep
    args = _unset_args(rates="2,4", seed=0)
    assert resolve_shape(args, _defaults(), ref) == []
    assert (args.num_requests, args.rates, args.gpu_kv_blocks) == (200, [2.0, 4.0], 96)
    # given otherwise: each such flag is named with both values
    args = _unset_args(num_requests=80, rates="2,4,8")
    differ = resolve_shape(args, _defaults(), ref)
    assert len(differ) == 2
    assert "--num-requests 80 (the real sweep: 200)" in differ[0]
    assert differ[1].startswith("--rates 2,4,8")
    assert args.num_requests == 80 and args.rates == [2.0, 4.0, 8.0]  # taken as given


def test_without_a_recorded_shape_the_defaults_apply():
    from compare_policies import resolve_shape

    args = _unset_args(num_requests=5)
    assert resolve_shape(args, _defaults(), None) == []
    assert (args.num_requests, args.rates, args.target_factor) == (5, [2.0, 4.0, 8.0, 12.0,
                                                                     16.0], 3.0)


def _point(rate: float) -> dict:
    return {"request_rate": rate, "mean_normalized_latency_s": 0.01, "p99_ttft_ms": 50.0,
            "p99_itl_ms": 5.0, "completed": 3, "failed": 0}


def _real_sweep(out: Path, trace: Path, **shape) -> None:
    from compare_policies import SHAPE

    out.mkdir(parents=True, exist_ok=True)
    rec = {**dict.fromkeys(SHAPE), "model": "ckpt", "trace": str(trace), "num_requests": 2,
           "clip_input": 2048, "clip_output": 256, "gpu_kv_blocks": 48, "cpu_kv_gib": 0.5,
           "max_num_seqs": 64, "seed": 0, "rates": [3.0, 6.0], "target_factor": 2.0, **shape}
    (out / "compare.json").write_text(json.dumps(
        {"summary": {}, "runs": {"gpu-only": [_point(3.0), _point(6.0)]},
         "workload": str(trace), "shape": rec, "sweeps": 3}))
    (out / "profile-measured.json").write_text("{}")


class _Stop(Exception):
    pass


def test_simulate_replays_the_real_sweeps_requests_and_rates(tmp_path, monkeypatch):
    """The bug this guards: `--simulate` without the real sweep's --num-requests simulated
    80 requests against a 200-request sweep and validated one against the other."""
    import compare_policies

    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE_ROWS)
    out = tmp_path / "out"
    _real_sweep(out, trace)
    seen = {}

    def fake(model, jobs, policies, args, profile):
        seen.update(model=model, jobs=len(jobs), rates=args.rates, factor=args.target_factor)
        raise _Stop

    monkeypatch.setattr(compare_policies, "simulated_sweeps", fake)
    monkeypatch.setattr(sys, "argv", ["compare_policies.py", "--simulate", "--out", str(out)])
    with pytest.raises(_Stop):
        compare_policies.main()
    assert seen == {"model": "ckpt", "jobs": 2, "rates": [3.0, 6.0], "factor": 2.0}


def test_a_simulation_of_another_shape_is_not_validated_against_the_real_sweep(
        tmp_path, monkeypatch, capsys):
    import compare_policies

    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE_ROWS)
    out = tmp_path / "out"
    _real_sweep(out, trace)

    monkeypatch.setattr(compare_policies, "simulated_sweeps", lambda m, j, pols, a, p: (
        {pol: [_point(r) for r in a.rates] for pol in pols}, []))
    monkeypatch.setattr(compare_policies, "plot_sweep", lambda *a: None)
    argv = ["compare_policies.py", "--simulate", "--json", "--out", str(out),
            "--policies", "gpu-only"]
    monkeypatch.setattr(sys, "argv", argv)
    compare_policies.main()
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "validation" in res and res["num_requests"] == 2
    monkeypatch.setattr(sys, "argv", [*argv, "--num-requests", "3"])
    compare_policies.main()
    cap = capsys.readouterr()
    res = json.loads(cap.out.strip().splitlines()[-1])
    assert "validation" not in res and res["num_requests"] == 3
    assert "--num-requests 3 (the real sweep: 2)" in cap.err and "no validation" in cap.err


def test_resummarize_refuses_flags_that_differ_from_the_sweeps_it_reads(tmp_path,
                                                                        monkeypatch):
    import compare_policies

    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE_ROWS)
    _real_sweep(tmp_path / "out" / "rep1", trace)
    monkeypatch.setattr(sys, "argv", ["compare_policies.py", "--resummarize", "--out",
                                      str(tmp_path / "out"), "--rates", "2,4"])
    with pytest.raises(SystemExit, match=r"--rates 2,4 \(the real sweep: \[3.0, 6.0\]\).*"
                                         "--resummarize"):
        compare_policies.main()


def test_resummarize_of_sweeps_without_a_recorded_shape_says_so(tmp_path, monkeypatch,
                                                                capsys):
    import compare_policies

    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE_ROWS)
    rep = tmp_path / "out" / "rep1"
    rep.mkdir(parents=True)
    (rep / "compare.json").write_text(json.dumps({"runs": {}, "workload": str(trace)}))

    def stop(*a):
        raise _Stop

    monkeypatch.setattr(compare_policies, "prepare", stop)
    monkeypatch.setattr(sys, "argv", ["compare_policies.py", "--resummarize", "--out",
                                      str(tmp_path / "out")])
    with pytest.raises(_Stop):
        compare_policies.main()
    assert "predates recorded sweep shapes" in capsys.readouterr().err
