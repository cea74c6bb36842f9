"""A real (quick) `dualpace profile` run on a tiny checkpoint, then serving with it."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from dualpace import LLM, SamplingParams
from dualpace.profiler import run as run_mod
from dualpace.profiler.fitting import peak_batch
from dualpace.profiler.run import (
    ProfileSettings,
    cpu_decode_throughput,
    cpu_primitives,
    gpu_microbenchmarks,
    gpu_prefill_throughput,
    interleaved_rounds,
)
from dualpace.runtime import protocol as P
from dualpace.runtime.gpu_worker import GpuWorker
from dualpace.runtime.layouts import OP_POST_ATTN
from dualpace.runtime.routing import route_for


def test_profile_then_serve_with_it(llama_checkpoint, tmp_path):
    path, _ = llama_checkpoint
    out = tmp_path / "prof"
    r = subprocess.run([sys.executable, "-m", "dualpace", "profile", "--model", str(path),
                        "--gpu-device", "cpu", "--gpu-kv-blocks", "32", "--cpu-kv-gib", "0.05",
                        "--max-num-seqs", "16", "--out", str(out), "--quick"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    prof = json.loads((out / "profile.json").read_text())
    assert prof["format"] == 2
    p, f = prof["assist_thresholds"]
    assert (p, f) == (0, 0) or 0 <= f < p
    assert prof["routes"] == {str(b): route_for(b, p, f) for b in (1, 4, 16)}
    assert prof["cpu_batch_limit"] in (1, 4, 16)
    # Appendix B: calibration calls of every path and row with GPU-main busy (W/R/I quick),
    # and the components assembled by Eq. 14-15 from what was measured.
    ab = prof["appendix_b"]
    for x in ("p", "lS", "lA"):
        assert ab["calibration"][x]["calls"] == 3 * 3
        assert ab["calibration"][x]["q_s"] >= 0 and ab["calibration"][x]["o_s"] > 0
    # the calibration load's decode step alone, and half of one of its layer stages
    layers = json.loads((path / "config.json").read_text())["num_hidden_layers"]
    step = ab["calibration_gpu_main_step_s"]
    assert step > 0
    assert ab["calibration_half_stage_s"] == pytest.approx(step / layers / 2)
    for b in ("1", "4", "16"):
        pr, g, c = ab["cpu_primitives_s"][b], ab["gpu_cuda_s"][b], prof["components"][b]
        q = {x: ab["calibration"][x]["q_s"] for x in ("p", "lS", "lA")}
        o = {x: ab["calibration"][x]["o_s"] for x in ("p", "lS", "lA")}
        assert c["w_p"] == pytest.approx(pr["a_w"] + q["p"] + g["p"] + pr["a_r"])
        assert c["w_lS"] == pytest.approx(pr["h_w"] + q["lS"] + g["lS"])
        assert c["w_lA"] == pytest.approx(pr["a_w"] + q["lA"] + g["lA"])
        assert c["d_p"] == pytest.approx(o["p"] + g["p"])
        assert all(v > 0 for v in (*pr.values(), *g.values()))
    assert len(prof["gpu_prefill"]["tokens"]) >= 5  # the plateau rule's K distinct n
    assert prof["cpu_dtype"] in ("float32", "bfloat16")
    if prof["max_num_batched_tokens_rule"].startswith("plateau"):
        assert prof["max_num_batched_tokens"] in prof["gpu_prefill"]["tokens"]
    else:  # a flat throughput curve keeps the configured limit
        assert prof["max_num_batched_tokens"] == 2048
    fitted = prof["gpu_prefill"]["fitted"]
    assert all(a <= b for a, b in itertools.pairwise(fitted))
    for b, scores in prof["route_scores"].items():
        assert set(scores) == {"full-cpu", "split-final", "fused-assist"}
        assert all(v > 0 for v in scores.values()), b
    assert (out / "profile.png").stat().st_size > 0
    with LLM(str(path), gpu_device="cpu", gpu_kv_blocks=32, cpu_kv_gib=0.05,
             profile=str(out / "profile.json")) as llm:
        assert llm.config.profile
        o = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0))[0]
        assert len(o.token_ids) == 4


class _SpellClock:
    """A fake host: ``call(cost)`` advances the clock by ``cost``, 1.5x while the clock is
    inside the slow spell [start, end); every call is recorded."""

    def __init__(self, start: float, end: float):
        self.t, self.start, self.end = 0.0, start, end
        self.calls: list[str] = []

    def __call__(self) -> float:
        return self.t

    def case(self, name: str, cost: float):
        def call():
            self.calls.append(name)
            self.t += cost * (1.5 if self.start <= self.t < self.end else 1.0)
        return call


def test_rounds_interleave_every_case_after_all_warmups():
    s = ProfileSettings(warmup=1, repeats=2, iters=2)
    clock = _SpellClock(0.0, 0.0)
    rounds = interleaved_rounds({"a": [clock.case("a0", 1.0), clock.case("a1", 3.0)],
                                 "b": [clock.case("b0", 2.0)]}, s, clock,
                                sync=lambda: clock.calls.append("sync"))
    timed = [e for name in ("a0", "a1", "b0") for e in ("sync", name, name, "sync")]
    assert clock.calls == ["a0", "a1", "b0", *timed, *timed]
    assert rounds == {"a": [3.0, 3.0], "b": [2.0, 2.0]}  # the slowest rank's, per call


def test_a_slow_spell_spoils_one_round_not_the_order():
    """Two cases 5% apart and a slow spell as long as one case's measurement: measured one
    after the other, the first case takes all of it and comes out slower; in rounds it
    spoils one round of each, and the medians keep the order."""
    s = ProfileSettings(warmup=1, repeats=3, iters=10)

    def measured(interleaved: bool) -> dict[str, float]:
        clock = _SpellClock(2.0, 30.0)
        cases = {"fast": [clock.case("fast", 1.0)], "slow": [clock.case("slow", 1.05)]}
        if interleaved:
            rounds = interleaved_rounds(cases, s, clock)
        else:
            rounds = {k: interleaved_rounds({k: v}, s, clock)[k] for k, v in cases.items()}
        return {k: statistics.median(r) for k, r in rounds.items()}

    one_after_the_other = measured(False)
    assert one_after_the_other["fast"] > one_after_the_other["slow"]
    in_rounds = measured(True)
    assert in_rounds == pytest.approx({"fast": 1.0, "slow": 1.05})


class _FakeRankModel:
    """A rank's model whose post-attention and post-layer record the batch they ran."""

    def __init__(self, log: list[tuple[str, int]], num_layers: int = 4):
        self.cfg = SimpleNamespace(hidden_size=8, q_size=4, num_layers=num_layers)
        self.dtype = torch.float32
        self.log = log
        self.layers: list[int] = []

    def post_attention(self, layer: int, h: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        self.log.append(("t_p", h.shape[0]))
        self.layers.append(layer)
        return h

    def post_layer(self, h: torch.Tensor) -> torch.Tensor:
        self.log.append(("t_l", h.shape[0]))
        return torch.zeros(h.shape[0], 16)


def test_cpu_primitives_time_every_batch_size_in_each_round():
    """Repeat j of every (batch, primitive) is round j, so a slow spell spoils a round of
    all batch sizes instead of every repeat of a few: the order of the calls says so."""
    log: list[tuple[str, int]] = []
    ch = SimpleNamespace(buf={"hidden_in": torch.zeros(8, 8), "attn_in": torch.zeros(8, 4),
                              "hidden_out": torch.zeros(8, 8)}, _write_sampling=lambda rows: None)
    s = ProfileSettings(warmup=1, repeats=2, iters=1)
    out = cpu_primitives([_FakeRankModel(log)], ch, [2, 4, 8], s, ("t_p", "t_l", "a_w"))
    one = [("t_p", 2), ("t_l", 2), ("t_p", 4), ("t_l", 4), ("t_p", 8), ("t_l", 8)]
    assert log == one * 3  # the warm-ups, then round 1, then round 2
    assert set(out) == {2, 4, 8} and all(set(v) == {"t_p", "t_l", "a_w"} for v in out.values())
    assert all(t > 0 for v in out.values() for t in v.values())


def test_the_cpu_dtype_is_the_faster_over_every_batch_size():
    """The geometric mean of t_p(bf16) / t_p(fp32) over the batch sizes decides: bf16 below
    1, fp32 at 1 or above; the largest batch alone does not."""
    def t_p(ratios):
        return {"float32": {b: 1e-3 * b for b in ratios},
                "bfloat16": {b: 1e-3 * b * r for b, r in ratios.items()}}

    dtype, g = run_mod.choose_cpu_dtype(t_p({1: 0.7, 8: 0.8, 256: 1.02}))
    assert dtype == "bfloat16" and g == pytest.approx((0.7 * 0.8 * 1.02) ** (1 / 3))
    assert run_mod.choose_cpu_dtype(t_p({1: 0.5, 256: 2.0})) == ("float32", pytest.approx(1.0))
    assert run_mod.choose_cpu_dtype(t_p({1: 1.1, 4: 1.05, 256: 0.9}))[0] == "float32"
    assert run_mod.choose_cpu_dtype(t_p({1: 0.99}))[0] == "bfloat16"


def test_both_dtypes_post_attention_is_timed_in_the_same_rounds():
    """Every (batch, dtype) of the CPU-dtype choice is one case of the same rounds, so a slow
    spell of the host cannot land on one dtype's repeats alone."""
    log: list[tuple[str, int]] = []
    ch = SimpleNamespace(buf={"hidden_in": torch.zeros(8, 8), "attn_in": torch.zeros(8, 4),
                              "hidden_out": torch.zeros(8, 8)}, _write_sampling=lambda rows: None)
    fp32, bf16 = _FakeRankModel(log), _FakeRankModel(log)
    bf16.dtype = torch.bfloat16
    bf16.post_attention = lambda layer, h, a: log.append(("bf16", h.shape[0])) or h
    s = ProfileSettings(warmup=1, repeats=2, iters=1)
    out = run_mod.post_attention_by_dtype({"float32": [fp32], "bfloat16": [bf16]}, ch, [2, 4],
                                          s)
    one = [("t_p", 2), ("bf16", 2), ("t_p", 4), ("bf16", 4)]
    assert log == one * 3  # the warm-ups, then round 1, then round 2
    assert set(out) == {"float32", "bfloat16"}
    assert all(set(v) == {2, 4} and all(t > 0 for t in v.values()) for v in out.values())


def test_post_attention_takes_the_layers_in_turn():
    """A serving step reads every layer's weights once; one layer timed over and over
    would read its weights from the cache. Each batch size's t_p walks the layers."""
    ch = SimpleNamespace(buf={"hidden_in": torch.zeros(8, 8), "attn_in": torch.zeros(8, 4),
                              "hidden_out": torch.zeros(8, 8)}, _write_sampling=lambda rows: None)
    models = [_FakeRankModel([], num_layers=3), _FakeRankModel([], num_layers=3)]
    s = ProfileSettings(warmup=2, repeats=2, iters=2)  # 6 calls a batch size and rank
    cpu_primitives(models, ch, [2, 4], s, ("t_p",))
    # warm-ups (batch 2 twice, batch 4 twice), then the two rounds: each batch size's own
    # walk through the 3 layers
    assert models[0].layers == [0, 1, 0, 1, 2, 0, 2, 0, 1, 2, 1, 2]
    assert models[1].layers == models[0].layers


class _FakeHostLayer:
    """A model whose one-layer call costs ``rows / rate(rows)`` seconds of a fake clock,
    twice that during the first timed round (a slow spell of the host); ``rows`` is the
    hidden state's row count (a decode batch, or a prefill's batched tokens)."""

    def __init__(self, rates: dict[int, float], warmup_calls: int, round_calls: int,
                 num_layers: int = 1):
        self.cfg = SimpleNamespace(num_kv_heads=1, head_dim=8, hidden_size=8,
                                   num_layers=num_layers)
        self.dtype, self.device = torch.float32, torch.device("cpu")
        self.rates, self.now, self.calls = rates, 0.0, 0
        self.spell = range(warmup_calls, warmup_calls + round_calls)
        self.layers: dict[int, list[int]] = {}  # rows -> the layer of each call
        self.kv_tensors: set[int] = set()

    def layer(self, i, h, fb, kv):
        rows = h.shape[0]
        self.layers.setdefault(rows, []).append(i)
        self.kv_tensors |= {id(kv.k[i]), id(kv.v[i])}
        self.now += rows / self.rates[rows] * (2.0 if self.calls in self.spell else 1.0)
        self.calls += 1


def test_decode_throughput_is_each_batch_median_over_rounds(monkeypatch):
    s = ProfileSettings(warmup=1, repeats=3, iters=4)
    rates = {1: 100.0, 2: 300.0, 4: 250.0}
    model = _FakeHostLayer(rates, warmup_calls=3, round_calls=3 * 4)
    monkeypatch.setattr(run_mod.time, "perf_counter", lambda: model.now)
    got = cpu_decode_throughput([model], [1, 2, 4], [64], s, 16)
    assert got == pytest.approx(rates)  # the spoiled first round dropped
    assert peak_batch(list(got), list(got.values())) == 2


def test_prefill_throughput_is_each_shape_median_over_rounds(monkeypatch):
    s = ProfileSettings(warmup=1, repeats=3, iters=2)
    shapes = [(1, 16), (2, 16), (1, 64)]
    rates = {16: 1000.0, 32: 1800.0, 64: 2500.0}
    model = _FakeHostLayer(rates, warmup_calls=3, round_calls=3 * 2)
    monkeypatch.setattr(run_mod.time, "perf_counter", lambda: model.now)
    got = gpu_prefill_throughput(model, shapes, s, 16, lambda: None)
    assert [n for n, _ in got] == [16, 32, 64]
    assert [t for _, t in got] == pytest.approx([1000.0, 1800.0, 2500.0])  # spell dropped


@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_one_layer_sweeps_take_the_layers_in_turn_over_one_layers_kv(phase):
    """The decode and prefill sweeps time "one decoder layer" as a serving step runs it:
    the calls walk the model's layers (weights read as a step reads them), every layer
    reading and writing one shared KV tensor pair (one layer's memory, not N)."""
    s = ProfileSettings(warmup=1, repeats=2, iters=2)
    if phase == "decode":
        model = _FakeHostLayer({1: 1.0, 2: 1.0}, 0, 0, num_layers=3)
        cpu_decode_throughput([model], [1, 2], [64], s, 16)
        walked = model.layers
    else:
        model = _FakeHostLayer({16: 1.0, 32: 1.0}, 0, 0, num_layers=3)
        gpu_prefill_throughput(model, [(1, 16), (2, 16)], s, 16, lambda: None)
        walked = model.layers
    assert set(walked) == ({1, 2} if phase == "decode" else {16, 32})
    for layers in walked.values():
        assert layers == [0, 1, 2, 0, 1]  # 1 warm-up + 2 rounds x 2 calls
    # one K and one V tensor for every layer (decode: one pair per context, shared by sizes;
    # prefill: one pair per shape)
    assert len(model.kv_tensors) == (2 if phase == "decode" else 4)


def test_gpu_microbenchmark_calls_take_the_layers_in_turn():
    """ProfileAssist's calls walk ``layers`` layers from ``layer`` (modulo the model's), so
    g_x reads weights as serving does; ``layers`` below 1 is refused."""
    seen: list[int] = []
    worker = SimpleNamespace(
        tp_rank=0, assist=None, model=SimpleNamespace(cfg=SimpleNamespace(num_layers=4)),
        ops=SimpleNamespace(wait_compute=lambda: None),
        _run_assist=lambda leader, ch, op, layer, rows: seen.append(layer))
    msg = P.ProfileAssist(step_id=1, op=OP_POST_ATTN, rows=2, layer=2, layers=3, warmup=1,
                          repeats=2, iters=3)
    done = GpuWorker.profile_assist(worker, msg)
    assert seen == [2, 3, 0, 2, 3, 0, 2]  # 1 warm-up + 2 repeats x 3 calls
    assert len(done.repeat_us) == 2
    seen.clear()
    GpuWorker.profile_assist(worker, P.ProfileAssist(step_id=2, op=OP_POST_ATTN, rows=2,
                                                     layer=1, warmup=0, repeats=1, iters=2))
    assert seen == [1, 1]  # the default: one layer
    with pytest.raises(ValueError, match="layers must be at least 1"):
        GpuWorker.profile_assist(worker, P.ProfileAssist(step_id=3, op=OP_POST_ATTN, rows=2,
                                                         layers=0))


def test_gpu_microbenchmarks_walk_every_layer_in_rounds_and_take_the_slowest_rank():
    """Each (batch, path)'s ProfileAssist walks all N layers; first every case's warm-ups,
    then R rounds of one repeat of every case; g_x is Eq. 10-11 over the ranks' repeats
    (the slowest rank's, the mean over rounds, per call)."""
    sent: list[P.ProfileAssist] = []
    staged: list[tuple[int, int]] = []
    rank_us = {0: [100, 300], 1: [200, 200]}  # per round: rank 0's, rank 1's time

    async def step_all(msg):
        sent.append(msg)
        rnd = sum(m.repeats for m in sent[:-1]) // 6  # 6 cases a round
        return [P.ProfileDone(step_id=msg.step_id, repeat_us=[rank_us[q][rnd]] * msg.repeats)
                for q in (0, 1)]

    rt = SimpleNamespace(gpu=SimpleNamespace(step_all=step_all))
    ch = SimpleNamespace(stage_inputs=lambda op, layer, h, a, rows: staged.append(
        (h.shape[0], op)))
    s = ProfileSettings(warmup=3, repeats=2, iters=10)
    g = asyncio.run(gpu_microbenchmarks(rt, ch, 8, 4, 5, [1, 2], s, itertools.count()))
    cases = [(b, op) for b in (1, 2) for op in run_mod.PATH_OPS.values()]
    assert [(m.rows, m.op) for m in sent] == cases * 3 and staged == cases * 3
    assert [(m.warmup, m.repeats) for m in sent] == [(3, 0)] * 6 + [(0, 1)] * 12
    assert all(m.layer == 0 and m.layers == 5 and m.iters == 10 for m in sent)
    # round 1: max(100, 200) us, round 2: max(300, 200) us, over 10 calls each
    assert set(g) == {1, 2}
    for b in (1, 2):
        assert g[b] == pytest.approx({x: (20e-6 + 30e-6) / 2 for x in ("p", "lS", "lA")})


def test_calibration_calls_of_p_take_the_layers_in_turn(monkeypatch):
    """Appendix B's calibration: p's calls (post-attention, which serves every layer of a
    CPU step) walk the layers as t_p and g_p do, on across batch sizes; lA's are the last
    layer's (post-attention of layer N − 1, then the head); every call is counted with its
    wait and the worker's G, L, F."""
    import threading

    class FakeLoad:
        def __init__(self, rt, rows, context, steps, ids):
            self.decoding = threading.Event()
            self.decoding.set()

        async def run(self, populations=None):
            if populations is None:
                await asyncio.sleep(3600)  # GPU-main busy until cancelled
            return [0.002]

    pending: list[list[int]] = []
    calls: list[tuple[int, int, int]] = []

    def call(op, layer, h, a, rows, alive, timeout, waits):
        calls.append((op, layer, h.shape[0]))
        waits.append(0.001)
        pending.append([op, 0, 50, 10, 5])

    async def assist_samples():
        out = pending[:]
        pending.clear()
        return out

    monkeypatch.setattr(run_mod, "GpuLoad", FakeLoad)
    monkeypatch.setattr(run_mod, "pid_alive", lambda pid: None)
    rt = SimpleNamespace(gpu=SimpleNamespace(pid=1), assist_samples=assist_samples)
    s = ProfileSettings(calibration_calls=4)
    out, alone = asyncio.run(run_mod.calibrate(rt, SimpleNamespace(call=call), 8, 4, 3, [1, 2],
                                               s, itertools.count()))
    assert alone == 0.002
    by_op: dict[int, list[tuple[int, int]]] = {}
    for op, layer, rows in calls:
        by_op.setdefault(op, []).append((layer, rows))
    ops = run_mod.PATH_OPS
    assert by_op[ops["p"]] == [(0, 1), (1, 1), (2, 1), (0, 1), (1, 2), (2, 2), (0, 2), (1, 2)]
    assert by_op[ops["lA"]] == [(2, 1)] * 4 + [(2, 2)] * 4
    for x in ops:
        assert [c.rows for c in out[x]] == [1] * 4 + [2] * 4
        assert all((c.wait, c.cuda, c.launch, c.finalize) == pytest.approx(
            (0.001, 50e-6, 10e-6, 5e-6)) for c in out[x])
