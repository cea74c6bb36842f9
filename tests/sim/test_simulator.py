"""The simulator: the virtual clock's event order, the cost models' formulas on hand-computed
cases, the step-cost fit, and simulated runs of the production scheduler with the invariants
checked after every round (sim/run.py raises on the first violation)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys

import pytest

from dualpace.engine.state import Limits
from dualpace.runtime import protocol as P
from dualpace.runtime.step_work import CpuStepWork, GpuStepWork, gpu_step_work
from dualpace.sim.costs import GPU_FEATURES, FittedCosts, RooflineCosts, fit_step_costs, nnls
from dualpace.sim.hardware import CpuSpec, GpuSpec, Hardware, load_hardware, shipped_setups
from dualpace.sim.loop import SimulationStalled, run_virtual
from dualpace.sim.run import InvariantViolation, simulate
from dualpace.sim.setup import SimSetup, load_shape, setup_from_hardware
from dualpace.sim.shape import ModelShape
from dualpace.workload import Job

from .tailed_cpu_log import COUNTS, mean_seconds, tailed_steps

# --- the virtual clock ------------------------------------------------------------------------


def test_timers_fire_in_time_order_and_ties_in_scheduling_order():
    async def main():
        loop = asyncio.get_running_loop()
        seen = []

        async def at(name, d):
            await asyncio.sleep(d)
            seen.append((name, loop.time()))

        await asyncio.gather(at("c", 2.0), at("a", 0.5), at("b", 2.0), at("now", 0))
        ev = asyncio.Event()
        loop.call_later(3.0, ev.set)
        await ev.wait()
        seen.append(("event", loop.time()))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 1.5)
        seen.append(("timeout", loop.time()))
        return seen

    assert run_virtual(main()) == [("now", 0.0), ("a", 0.5), ("c", 2.0), ("b", 2.0),
                                   ("event", 5.0), ("timeout", 6.5)]


def test_a_deadlocked_simulation_is_reported_not_hung():
    async def main():
        await asyncio.Event().wait()

    with pytest.raises(SimulationStalled):
        run_virtual(main())


def test_virtual_time_costs_no_real_time():
    import time

    async def main():
        for _ in range(1000):
            await asyncio.sleep(3600)
        return asyncio.get_running_loop().time()

    t0 = time.perf_counter()
    assert run_virtual(main()) == 3_600_000
    assert time.perf_counter() - t0 < 5


# --- the cost models --------------------------------------------------------------------------
SHAPE = ModelShape(num_layers=2, hidden=8, q_size=8, kv_size=4, intermediate=16, vocab=10)
GPU = GpuSpec(count=1, hbm_gib=1, hbm_gbps=1, bf16_tflops=1e-3, link_gbps=2, eff_mem=1,
              eff_flops=1, eff_link=1, step_overhead_s=0.5, assist_overhead_s=0.25)
CPU = CpuSpec(cores=2, dram_gbps=1, amx=True, amx_tflops_per_core=1e-3, per_core_gbps=0.25,
              eff_mem=1, eff_flops=1, step_overhead_s=0.125)
HW = Hardware("toy", GPU, CPU, host_kv_gib=1)


def test_model_shape_by_hand():
    # qkv 8*(8+8)=128; post 8*8 + 3*8*16 = 448; layer 576; head 80; dense 2*576+80 = 1232
    assert (SHAPE.qkv_params, SHAPE.post_attn_params, SHAPE.head_params) == (128, 448, 80)
    assert SHAPE.dense_params == 1232
    assert SHAPE.weight_bytes == (1232 + 80) * 2
    assert SHAPE.kv_bytes_per_token == 2 * 2 * 4 * 2


def test_gpu_roofline_by_hand():
    c = RooflineCosts(HW, SHAPE)
    # memory: 1232 params x 2 B / 1e9 B/s; compute: 2 x 1232 x 1000 / 1e9 FLOP/s
    assert c.gpu_dense(1232, 1) == pytest.approx(2464e-9)
    assert c.gpu_dense(1232, 1000) == pytest.approx(2464e-6)
    w = GpuStepWork(decode_rows=3, context=300, link_tokens=10)
    # 0.5 overhead + dense(3 rows: 2 x 1232 x 3 FLOPs outweigh 2464 B) + 300 x 32 B KV / 1e9
    # + 10 x 32 B / 2e9
    assert c.gpu_step(w) == pytest.approx(0.5 + 7392e-9 + 9600e-9 + 160e-9)
    p = GpuStepWork(prefill_tokens=100, context=100, prefill_context=100 * 50)
    # dense compute-bound 2 x 1232 x 100 / 1e9; attention 4 x 2 x 8 x 5000 / 1e9 FLOPs
    assert c.gpu_step(p) == pytest.approx(0.5 + 246400e-9 + 320000e-9)


def test_cpu_roofline_by_hand():
    c = RooflineCosts(HW, SHAPE)
    bw = min(1, 2 * 0.25) * 1e9  # two cores stream 0.5 GB/s, under the node's 1 GB/s
    assert c.cpu_bandwidth() == bw
    att = 100 * 32 / bw
    assert c.cpu_attention(100) == pytest.approx(att)

    def dense(params, rows):  # max(bytes / bw, 2 params rows / (2 cores x 1 GFLOP/s))
        return max(params * 2 / bw, 2 * params * rows / 2e9)

    full = c.cpu_step(CpuStepWork(4, 100, "full-cpu"))
    want = 0.125 + att + 2 * dense(128, 4) + 2 * dense(448, 4) + dense(80, 4)
    assert full.seconds == pytest.approx(want) and full.gpu_disturbance == 0
    assert full.attention == pytest.approx(att)
    # Eq. 7-8's Fused-Assist: (N - 1) post-attention calls, then a final call that runs the
    # last post-attention stage and the post-layer; N = 2 layers here
    fused = c.cpu_step(CpuStepWork(4, 100, "fused-assist"))
    gpu_post = 0.25 + c.gpu_dense(448, 4)
    gpu_last = 0.25 + c.gpu_dense(448 + 80, 4)
    move = 2 * 4 * (8 + 8) * 4 / 2e9  # 4 rows of residual + attention output, fp32, both ways
    local = 0.125 + att + 2 * dense(128, 4)
    assert fused.seconds == pytest.approx(local + gpu_post + move + gpu_last + move)
    assert fused.gpu_disturbance == pytest.approx(gpu_post + gpu_last)
    # the workers run its calls one by one: each after its layer's share of the local work
    assert [v for x in fused.calls for v in (x.before, x.wait, x.gpu)] == pytest.approx(
        [local / 2, gpu_post + move, gpu_post, local / 2, gpu_last + move, gpu_last])
    split = c.cpu_step(CpuStepWork(4, 100, "split-final"))
    gpu_head = 0.25 + c.gpu_dense(80, 4)
    local = 0.125 + att + 2 * dense(128, 4) + 2 * dense(448, 4)
    move_head = 2 * 4 * 8 * 4 / 2e9
    assert split.seconds == pytest.approx(local + gpu_head + move_head)
    assert [v for x in split.calls for v in (x.before, x.wait, x.gpu)] == pytest.approx(
        [local, gpu_head + move_head, gpu_head])
    assert full.calls == ()
    neo = c.cpu_step(CpuStepWork(4, 100, "neo-pipeline"))
    assert neo.seconds == pytest.approx(0.125 + att) and neo.gpu_disturbance == 0


def test_tp_allreduce_by_hand():
    hw = dataclasses.replace(HW, gpu=dataclasses.replace(GPU, count=4, interconnect_gbps=1,
                                                         allreduce_latency_s=0.01))
    c = RooflineCosts(hw, SHAPE)
    # 10 tokens x 8 hidden x 2 B, ring 2 x 3/4, over 1 GB/s, + 0.01 s, per call
    assert c.gpu_allreduce(10, 3) == pytest.approx(3 * (160 * 1.5 / 1e9 + 0.01))
    assert RooflineCosts(HW, SHAPE).gpu_allreduce(10, 3) == 0


def test_nnls_and_the_step_cost_fit():
    import numpy as np

    x = np.array([[1.0, 0], [1, 1], [1, 2], [1, 3]])
    assert nnls(x, np.array([1.0, 3, 5, 7])) == pytest.approx([1, 2])
    assert nnls(x, np.array([7.0, 5, 3, 1]))[1] == 0  # a falling cost is clipped at 0
    samples = [{"kind": "gpu", "seconds": 0.01 + 1e-4 * t + 2e-3 * r, "prefill_tokens": t,
                "decode_rows": r, "context": 0, "prefill_context": 0, "link_tokens": 0,
                "carried_rows": 0} for t in (0, 64, 512) for r in (1, 4, 9)]
    samples += [{"kind": "cpu", "route": "full-cpu", "seconds": 0.02 + 1e-3 * b + 1e-6 * c,
                 "attention": 1e-6 * c, "batch": b, "context": c}
                for b in (1, 2, 8) for c in (100, 5000)]
    fit = json.loads(json.dumps(fit_step_costs(samples)))  # what the profile JSON holds
    costs = FittedCosts(fit)
    assert costs.gpu_step(GpuStepWork(prefill_tokens=100, decode_rows=3)) == pytest.approx(
        0.01 + 1e-2 + 6e-3)
    c = costs.cpu_step(CpuStepWork(5, 1000, "full-cpu"))
    assert c.seconds == pytest.approx(0.02 + 5e-3 + 1e-3) and c.attention == pytest.approx(1e-3)
    # a route never measured costs what Full-CPU does
    assert costs.cpu_step(CpuStepWork(5, 1000, "fused-assist")).seconds == pytest.approx(
        c.seconds)


def test_cpu_rows_are_priced_on_two_slopes():
    """A CPU step's rows cost one slope up to CPU_BATCH_KNEE rows and another past it
    (measured here: a steep one to 3 rows, a flat one to 13), and its context what the
    worker's attention timings say a token costs. Steps made so are fitted back, a 12-row
    step priced by hand; a profile fitted before the second slope existed prices every row
    at its one "batch" coefficient, as it was fitted."""
    from dualpace.sim.costs import CPU_BATCH_KNEE, cpu_linear

    assert CPU_BATCH_KNEE == 3

    def truth(b, c):  # 0.3 ms a row to 3 rows, 0.1 ms past them, 0.1 us a context token
        return 0.0005 + 3e-4 * min(b, 3) + 1e-4 * max(b - 3, 0) + 1e-7 * c

    samples = [{"kind": "cpu", "route": "full-cpu", "seconds": truth(b, c), "attention": 1e-7 * c,
                "batch": b, "context": c} for b in (1, 2, 3, 4, 6, 9, 13) for c in (200, 4000)]
    fit = json.loads(json.dumps(fit_step_costs(samples)))["cpu"]["full-cpu"]
    assert fit["batch"] == pytest.approx(3e-4, rel=1e-3)
    assert fit["batch_past_knee"] == pytest.approx(1e-4, rel=1e-3)
    costs = FittedCosts({"gpu": {"overhead": 0.0, **{f: 0.0 for f in GPU_FEATURES}},
                         "cpu": {"full-cpu": fit}})
    assert costs.cpu_step(CpuStepWork(12, 5000, "full-cpu")).seconds == pytest.approx(
        0.0005 + 3 * 3e-4 + 9 * 1e-4 + 5e-4, rel=1e-3)
    old = {"overhead": 1e-3, "batch": 2e-4, "context": 1e-7}  # no "batch_past_knee"
    assert cpu_linear(old, 12, 1000) == pytest.approx(1e-3 + 12 * 2e-4 + 1e-4)
    # the knee travels with the fit; a profile fitted at 4 rows, before it did, keeps 4
    assert fit["batch_knee"] == fit["attention"]["batch_knee"] == CPU_BATCH_KNEE
    at4 = {"overhead": 1e-3, "batch": 3e-4, "batch_past_knee": 1e-4, "context": 0.0}
    assert cpu_linear(at4, 12, 0) == pytest.approx(1e-3 + 4 * 3e-4 + 8 * 1e-4)
    assert cpu_linear({**at4, "batch_knee": 3}, 12, 0) == pytest.approx(
        1e-3 + 3 * 3e-4 + 9 * 1e-4)
    # Every row with the same context (rows and context grow together, as in a log): the
    # context term is the worker's attention timings', the rows take the rest.
    samples = [{"kind": "cpu", "route": "full-cpu", "seconds": truth(b, 1000 * b),
                "attention": 1e-5 + 1e-7 * 1000 * b, "batch": b, "context": 1000 * b}
               for b in (1, 2, 3, 4, 6, 9, 13)]
    fit = fit_step_costs(samples)["cpu"]["full-cpu"]
    assert fit["context"] == pytest.approx(1e-7, rel=1e-3)
    assert fit["batch"] == pytest.approx(3e-4, rel=1e-3)
    assert fit["batch_past_knee"] == pytest.approx(1e-4, rel=1e-3)


def test_cpu_steps_are_priced_at_each_batch_sizes_mean():
    """CPU steps are fitted by plain least squares: with every batch size's mean on the two
    slopes, each is priced at its mean, though most steps are 1-row ones whose right tail is
    the longest (here 5% of them at 4x, of 13-row ones at 1.5x). The weighted fit with its
    rescale to the total (the GPU's) priced a 1-row step 4% cheap and a 13-row one 5% dear,
    and the simulated CPU tier fell behind at high load (this box's log, 2026-12-04)."""
    from dualpace.sim.costs import cpu_linear
    samples = [{"kind": "cpu", "route": "full-cpu", "batch": b, "context": 400 * b,
                "attention": 4e-5 * b, "seconds": w + 4e-5 * b} for b, w in tailed_steps()]
    fit = fit_step_costs(samples)["cpu"]["full-cpu"]
    for b in COUNTS:
        assert cpu_linear(fit, b, 400 * b) == pytest.approx(
            mean_seconds(b) + 4e-5 * b, rel=0.01), b


def test_the_fit_keeps_the_measured_total():
    """Weighted toward the many short steps, a fit underestimates the few long ones; the
    rescale makes the predicted total the measured one, the shape the weighted fit's."""
    import numpy as np

    from dualpace.sim.costs import _relative, fit_total_preserving

    x = np.array([[1.0, 1], [1, 1], [1, 1], [1, 1], [1, 50], [1, 100]])
    y = np.array([0.01, 0.01, 0.01, 0.01, 0.1, 0.4])  # long steps cost more than linear
    weighted = nnls(*_relative(x, y))
    assert (x @ weighted).sum() < 0.95 * y.sum()
    coef = fit_total_preserving(x, y)
    assert (x @ coef).sum() == pytest.approx(y.sum())
    assert coef / coef.sum() == pytest.approx(weighted / weighted.sum())
    # hand-computed: an exact line stays exact (scale 1)
    line = np.array([[1.0, 0], [1, 2], [1, 4]])
    assert fit_total_preserving(line, np.array([1.0, 2, 3])) == pytest.approx([1, 0.5])


def test_step_work_from_descriptors():
    batch = P.GpuBatch(step_id=1, seqs=[
        P.SeqStep(req_id=1, token_ids=[5], start_pos=9),  # decode at context 10
        P.SeqStep(req_id=2, token_ids=[1] * 6, start_pos=4),  # a chunk: 6 x (4 + 3)
        P.SeqStep(req_id=3, token_ids=[1] * 8, start_pos=0, host_blocks=[1, 2],
                  forks=[P.Fork(req_id=4, blocks=[3, 4])])],  # P2C, copied twice
        swap_out=[P.Migration(req_id=7, src_blocks=[1], dst_blocks=[2], num_tokens=12)])
    w = gpu_step_work(batch, carried_rows=2)
    assert w == GpuStepWork(prefill_tokens=14, decode_rows=1, context=10 + 10 + 8,
                            prefill_context=6 * 7 + 8 * 4, link_tokens=16 + 12,
                            carried_rows=2)
    assert w.tokens == 17


def test_shipped_setups_load_and_size_their_pools():
    assert set(shipped_setups()) >= {"rtx4090-xeon4510", "2xh20-8469c", "4xh20-8469c",
                                     "h200-16c"}
    hw = load_hardware("rtx4090-xeon4510")
    shape = load_shape("llama-3.1-8b")
    assert shape.dense_params == pytest.approx(7.5e9, rel=0.02)  # 8.0B minus the embedding
    s = setup_from_hardware(hw, shape)
    block = 16 * shape.kv_bytes_per_token
    want = (24 * 0.9 - 2) * 2**30 - shape.weight_bytes
    assert s.gpu_blocks == int(want // block)
    assert s.host_blocks == int(120 * 2**30 // block)
    for name in shipped_setups():
        assert load_hardware(name).sources, name  # every figure says where it comes from
    with pytest.raises(ValueError, match="neither a file nor a shipped setup"):
        load_hardware("no-such-box")
    with pytest.raises(ValueError, match="neither a checkpoint directory"):
        load_shape("no-such-model")


# --- simulated runs ---------------------------------------------------------------------------
def _small_setup(gpu_blocks=60, host_blocks=400) -> SimSetup:
    return SimSetup(gpu_blocks, host_blocks, 16, Limits(
        max_num_seqs=16, gpu_token_limit=512, cpu_batch_limit=32, max_model_len=4096,
        staging_blocks=64), (0, 0), SHAPE.num_layers)


def _jobs(n=120, seed=1):
    import random

    rng = random.Random(seed)
    return [Job([1] * rng.randint(20, 400), rng.randint(5, 120)) for _ in range(n)]


class _Costs:
    """Simple known costs: GPU 10 ms + 0.1 ms a token, CPU 20 ms + 1 ms a row."""

    def gpu_step(self, w, beside=False):
        return 0.010 + 1e-4 * w.tokens

    def cpu_step(self, w):
        from dualpace.sim.costs import CpuStepCost

        t = 0.020 + 1e-3 * w.batch
        return CpuStepCost(t, t / 2, 0.005 if w.route != "full-cpu" else 0.0)

    def slowdown(self, kind, route=""):
        return 1.0  # separate chips


@pytest.mark.parametrize("policy", ["dualpace", "gated", "gpu-only"])
def test_simulated_runs_complete_every_request_with_invariants_checked(policy):
    out = simulate(_small_setup(), _Costs(), policy, _jobs(), rate=20.0)
    assert out["completed"] == 120 and out["failed"] == 0
    assert out["simulator"]["invariants_checked"]
    assert out["total_output_tokens"] == sum(j.max_tokens for j in _jobs())
    steps = out["simulator"]["steps"]
    if policy == "gpu-only":
        assert steps["cpu"] == 0
    else:
        assert steps["cpu"] > 0  # the small GPU pool sends work to the CPU tier
    # a single request alone: TTFT is its prefill step, ITL the decode step cost
    one = simulate(_small_setup(), _Costs(), policy, [Job([1] * 100, 4)], rate=1.0)
    assert one["mean_ttft_ms"] == pytest.approx(10 + 0.1 * 100)
    assert one["mean_itl_ms"] == pytest.approx(10.1)
    # the engine's own histogram: 3 gaps in (10, 12.5] ms, rank 0.99 x 3 interpolated inside
    assert one["engine_p99_itl_ms"] == pytest.approx(10 + 2.5 * 0.99, abs=0.01)


def test_gated_runs_on_when_waiting_decodes_fill_the_host_pool():
    """Prompts longer than the GPU pool and a host pool that waiting decodes fill, each a
    token short of its next block: no CPU decode fits Eq. 2 and the GPU has no work, where
    NEO's admission alone waited for ever (every seed here stalled the simulation, as a
    200-request sweep at 16 req/s did). The gated selection then recompute-preempts the
    youngest waiting requests until the first ready one fits (llm_engine._gated_liveness)."""
    import random

    for seed in (1, 2):
        rng = random.Random(seed)
        jobs = [Job([1] * rng.randint(100, 400), rng.randint(20, 120)) for _ in range(60)]
        out = simulate(_small_setup(gpu_blocks=20, host_blocks=60), _Costs(), "gated", jobs,
                       rate=50.0)
        assert out["completed"] == 60 and out["failed"] == 0, seed
        assert out["total_output_tokens"] == sum(j.max_tokens for j in jobs)


def test_a_round_commits_the_gpu_population_in_the_order_it_checked_eq2_with():
    """A round admitting a prompt and swapping a request in checks Eq. 2 with the reserve
    (Eq. 4) of its population ranked admissions before swap-ins; step 7 appended the
    swap-in first, so the next round's reserve, scanned from the tail, took the larger
    admission instead: 8 blocks published, 23 the next round, and Eq. 2 broken with no
    admission at all (used 41 + growth 4 + migration 23 > 60). Every round now also checks
    that the published reserve covers the committed population's (gpu_round.reserve_violation)."""
    import random

    rng = random.Random(1)
    jobs = [Job([1] * rng.randint(10, 300), rng.randint(5, 150)) for _ in range(50)]
    out = simulate(_small_setup(gpu_blocks=60, host_blocks=60), _Costs(), "dualpace", jobs,
                   rate=20.0)
    assert out["completed"] == 50 and out["failed"] == 0


STRESS = [(gpu, host, rate) for gpu in (32, 60) for host in (30, 60, 200) for rate in (20.0, 500.0)]


@pytest.mark.parametrize("policy", ["dualpace", "gated", "gpu-only"])
def test_small_pools_under_load_keep_every_invariant(policy):
    """The simulator as a stress test of the scheduler: small GPU and host pools, prompts of
    10-300 tokens and up to 150 outputs (every request fits either pool alone), a steady and
    a burst arrival rate. Each round checks single ownership, block accounting, Eq. 2 and
    the published reserve; every request must finish. A 216-run sweep like this found the
    two bugs tested above, which the property tests' smaller pools and prompts had not."""
    import itertools
    import random

    for (gpu, host, rate), seed in itertools.product(STRESS, (1, 2)):
        rng = random.Random(seed)
        jobs = [Job([1] * rng.randint(10, 300), rng.randint(5, 150)) for _ in range(50)]
        out = simulate(_small_setup(gpu_blocks=gpu, host_blocks=host), _Costs(), policy,
                       jobs, rate=rate)
        assert out["completed"] == 50 and out["failed"] == 0, (gpu, host, rate, seed)


def test_simulation_is_deterministic_and_load_raises_latency():
    a = simulate(_small_setup(), _Costs(), "dualpace", _jobs(), rate=20.0)
    b = simulate(_small_setup(), _Costs(), "dualpace", _jobs(), rate=20.0)
    assert {k: v for k, v in a.items() if k != "simulator"} == {
        k: v for k, v in b.items() if k != "simulator"}
    slow = simulate(_small_setup(), _Costs(), "dualpace", _jobs(), rate=200.0)
    assert slow["mean_normalized_latency_s"] > a["mean_normalized_latency_s"]


def test_an_invariant_violation_ends_the_run(monkeypatch):
    from dualpace.engine import state

    def broken(self):
        return "Eq. 2: planted"

    monkeypatch.setattr(state.SchedulerState, "eq2_violation", broken)
    with pytest.raises(InvariantViolation, match="planted"):
        simulate(_small_setup(), _Costs(), "dualpace", _jobs(10), rate=5.0)


def test_cli_hardware_mode_json(tmp_path):
    trace = tmp_path / "t.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:15:{i:02d}.000,{200 + 37 * i % 900},{20 + 13 * i % 200}"
             for i in range(40)]
    trace.write_text("\n".join(rows) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "dualpace", "simulate", "--hardware", "rtx4090-xeon4510",
         "--model", "llama-3.1-8b", "--trace", str(trace), "--num-requests", "40",
         "--rates", "1,4,16", "--json", "--host-kv-gib-sweep", "30,120",
         "--targets", "1,5,1.5"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(res["policies"]) == {"dualpace", "gated", "gpu-only"}
    for p in res["policies"].values():
        assert set(p["p99_ttft_ms"]) == {"1.0", "4.0", "16.0"}
    assert set(res["what_if"]) == {"host_kv_gib=30.0", "host_kv_gib=120.0"}
    assert res["setup"]["gpu_kv_blocks"] > 0
    # the paper's targets as given, not a multiple of the gpu-only point
    assert res["targets"] == {"mean_normalized_latency_s": 1.0, "p99_ttft_ms": 5000.0,
                              "p99_itl_ms": 1500.0}
    bad = subprocess.run([sys.executable, "-m", "dualpace", "simulate", "--model",
                          "llama-3.1-8b", "--hardware", "rtx4090-xeon4510", "--targets", "1,5",
                          "--trace", str(trace), "--rates", "1"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "three positive numbers" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "dualpace", "simulate", "--model", "x",
                          "--trace", str(trace), "--rates", "1"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "one of --hardware" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "dualpace", "simulate", "--model",
                          "llama-3.1-8b", "--hardware", "rtx4090-xeon4510", "--contention",
                          "--trace", str(trace), "--rates", "1"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--contention needs --profile" in bad.stderr


def test_the_engine_logs_every_step_with_its_work():
    """``on_step`` (serve --step-log) sees every executed step: its kind, the round-to-apply
    seconds and the worker round trip, and the work the cost models read."""
    from dualpace.sampling.params import SamplingParams

    from ..engine.fake_workers import FakeWorkers, fake_engine

    async def main():
        workers = FakeWorkers(delay=0.001)
        eng = fake_engine(workers, gpu_blocks=8, host_blocks=200)
        records, finished, seen = [], [], {}
        eng.on_step = records.append
        eng.on_request = finished.append
        eng.start()
        streams = [eng.add_request([1] * n, SamplingParams(max_tokens=6, temperature=0), 1000)
                   for n in (10, 20, 30)]
        for req in [eng.requests[s.rid] for s in streams]:  # before any finishes
            seen[len(req.prompt)] = req.token_times
        for s in streams:
            async for _ in s:
                pass
        await eng.stop()
        return records, workers, finished, seen

    records, workers, finished, seen = asyncio.run(main())
    # on_request: each finished request once, its arrival and every token's stamp after it
    assert sorted(r["prompt_tokens"] for r in finished) == [10, 20, 30]
    for r in finished:
        stamps = seen[r["prompt_tokens"]]
        assert r["tokens"] == pytest.approx([t - r["arrival"] for t in stamps], abs=2e-6)
        assert len(r["tokens"]) == 6 and r["t"] >= r["arrival"] + r["tokens"][-1] - 1e-4
    gpu = [r for r in records if r["kind"] == "gpu"]
    cpu = [r for r in records if r["kind"] == "cpu"]
    assert len(gpu) == workers.gpu.steps and len(cpu) == workers.cpu.steps > 0
    assert sum(r["prefill_tokens"] for r in gpu) == 60  # every prompt computed once
    # every output token came from one decode row or one prompt-completing step
    assert sum(r["decode_rows"] for r in gpu) + sum(r["batch"] for r in cpu) + 3 == 18
    assert all(r["seconds"] >= r["step_seconds"] > 0 for r in records)
    assert all(r["beside"] in (0, 1) for r in records)
    assert any(r["beside"] for r in gpu) and any(r["beside"] for r in cpu)  # both loops ran
    # the GPU step of the first round ran before any request could reach the CPU tier
    assert gpu[0]["beside"] == 0 and gpu[0]["overlap"] == 0
    # overlap: part of the worker round trip, and only where the other group ran
    assert all(0 <= r["overlap"] <= r["step_seconds"] + 1e-9 for r in records)
    assert all(r["beside"] for r in records if r["overlap"] > 0)
    assert any(r["overlap"] > 0 for r in gpu) and any(r["overlap"] > 0 for r in cpu)
    assert {r["route"] for r in cpu} == {"full-cpu"}


def test_assist_disturbance_lengthens_a_busy_gpu_and_neo_rows_ride_its_step():
    """Eq. 8 in the simulated workers: a Fused-Assist CPU step's GPU time is paid by the GPU
    step that follows while GPU-main was busy, not when it was idle; the gated pipeline's
    CPU rows are priced into the GPU step they ride on."""
    from dualpace.sim.workers import SimWorkers

    spec = P.SamplingSpec(temperature=0.0, top_p=1.0, top_k=-1, seed=0)

    def decode(rid):
        return P.SeqStep(req_id=rid, token_ids=[1], start_pos=5)

    async def main():
        loop = asyncio.get_running_loop()
        w = SimWorkers(_Costs(), (0, 0), SHAPE.num_layers)  # (0, 0): every batch assists
        for g in (w.gpu, w.cpu):
            for rid in (1, 2, 3):
                g.send(P.NewRequest(req_id=rid, sampling=spec))
        t = loop.time()
        await w.cpu.step(P.CpuBatch(step_id=1, seqs=[decode(2)]))  # GPU idle: no debt
        await w.gpu.step(P.GpuBatch(step_id=2, seqs=[decode(1)]))
        idle = loop.time() - t
        prefill = P.SeqStep(req_id=1, token_ids=[1] * 200, start_pos=0)  # a 30 ms step

        async def cpu_later():
            await asyncio.sleep(0.001)  # GPU-main is mid-step when the call arrives
            await w.cpu.step(P.CpuBatch(step_id=4, seqs=[decode(2)]))

        await asyncio.gather(w.gpu.step(P.GpuBatch(step_id=3, seqs=[prefill])), cpu_later())
        t_busy = loop.time()
        await w.gpu.step(P.GpuBatch(step_id=5, seqs=[decode(1)]))
        paid = loop.time() - t_busy
        t = loop.time()
        await asyncio.gather(w.gpu.step(P.GpuBatch(step_id=6, seqs=[decode(1)])),
                             w.cpu.step(P.CpuBatch(step_id=7, seqs=[decode(2), decode(3)],
                                                   route="neo-pipeline")))
        return idle, paid, loop.time() - t

    idle, paid, neo = run_virtual(main())
    assert idle == pytest.approx(0.021 + 0.0101)  # CPU 20 ms + 1 ms/row, then GPU 10.1 ms
    assert paid == pytest.approx(0.0101 + 0.005)  # the next GPU step pays the 5 ms assist
    # the GPU step carries 2 CPU rows (10 ms + 0.1 ms x 3 tokens); the CPU step is 22 ms
    assert neo == pytest.approx(max(0.0103, 0.022))


def test_gpu_steps_beside_a_busy_cpu_worker_are_fitted_apart():
    """Where the workers share cores, GPU steps run slower while the CPU worker runs (the
    engine marks them ``beside``): the fit keeps the two apart once each side has enough
    steps, and the simulated GPU step uses the one that applies."""
    def rec(rows, beside):
        t = (0.004 + 0.001 * rows) * (1.25 if beside else 1.0)
        return {"kind": "gpu", "seconds": t, "beside": beside, "prefill_tokens": 0,
                "decode_rows": rows, "context": 0, "prefill_context": 0, "link_tokens": 0,
                "carried_rows": 0}

    samples = [rec(r, b) for r in range(1, 11) for b in (0, 1) for _ in range(5)]
    costs = FittedCosts(fit_step_costs(samples))
    w = GpuStepWork(decode_rows=4)
    assert costs.gpu_step(w) == pytest.approx(0.008)
    assert costs.gpu_step(w, beside=True) == pytest.approx(0.010)
    few = FittedCosts(fit_step_costs(samples[:60]))  # too few beside steps: one pooled fit
    assert few.gpu_beside is None
