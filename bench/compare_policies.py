"""Side-by-side policy comparison on one machine, in one run (paper §6, Figures 1, 9, 10).

    python bench/compare_policies.py --json [--rates 2,4,8,12] [--num-requests 80]
        [--profile prof/profile.json]

Serves the same checkpoint with --policy dualpace, gated and gpu-only (same GPU KV pool,
small enough that the host tier matters; GPU and CPU workers pinned to different cores),
replays the same Azure conversation slice with bench/loadgen.py at a sweep of rates, and
reports per policy: the sustainable rate at a normalized-latency target and at a P99-ITL
target (linear interpolation, never extrapolated), P99 TTFT per rate, and per rate the
CPU-tier stall p99 and longest stall (Figure 1's meaning: gaps while a CPU-resident request
was ready). Targets for this small model: a multiple (--target-factor) of the value measured
at the lowest rate under gpu-only, the unloaded reference. The last line with --json is
{"policies": {"dualpace": {"sustainable_rate": ..}, "gated": {..}, "gpu-only": {..}}, ..};
plots go to --out. Each real point also says what share of the host's CPU time the
hypervisor gave to other guests meanwhile (``host_steal_fraction``, /proc/stat's steal): on
a shared cloud box that share is what makes one sweep differ from the next, and
``--max-steal`` leaves out the points where it was high (``median_sweep``,
``fit_measured_profile``).

Every server logs its steps (``serve --step-log``); the run fits the simulator's step costs
to them and writes ``--out``/profile-measured.json. ``--repeat N`` runs the whole real sweep
N times (``--out``/rep1 .. repN, each with its own compare.json): ``--out``/compare.json is
then the per-rate median of the N sweeps, and the profile is fitted to all their steps (on
a shared box one sweep can differ from the next by half its sustainable rate).
``--simulate`` runs the very same sweep (same servers' shapes, jobs, offsets, targets and
keys) in the simulator with that profile (or ``--sim-profile``), so the two JSONs compare
the simulator with the runtime it models; with ``--repeat N`` it takes the per-rate
median of N jitter seeds (``simulated_sweeps``). ``--simulate --per-sweep`` on the
directory of a real ``--repeat`` run simulates each real sweep with step costs fitted to
that sweep's own steps and validates the per-rate median of those simulations against the
real median (``per_sweep_simulation``): like with like where one sweep ran slower.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import loadgen
from common import (
    REPO,
    emit,
    free_port,
    frozen_server_env,
    host_cpu_times,
    scrape_metrics,
    steal_fraction,
    wait_healthy,
)

from dualpace.engine.metrics import histogram_quantile
from dualpace.sim.plot import plot_sweep
from dualpace.sim.run import engine_latencies
from dualpace.workload import sweep_summary, sweep_targets

POLICIES = ("dualpace", "gated", "gpu-only")
TRACE = REPO.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def profile_flags(path: str | None) -> list[str]:
    """dualpace's routing thresholds from a profile when it finds Dense Assist worthwhile
    (some batch up to its C routes to Split-Final or Fused-Assist); else none (no assist,
    F = C). Only the thresholds: every policy keeps the same token and batch limits."""
    if not path:
        return []
    from dualpace.runtime.routing import assist_reachable

    prof = json.loads(Path(path).read_text())
    p, f = prof["assist_thresholds"]
    if not assist_reachable(prof["cpu_batch_limit"], p, f):
        return []
    return ["--assist-thresholds", f"{p},{f}", "--cpu-batch-limit", str(prof["cpu_batch_limit"])]


def engine_flags(policy: str, args) -> list[str]:
    """The engine options of one policy's server (the simulator resolves the same)."""
    flags = ["--policy", policy, "--gpu-device", "cpu", "--gpu-kv-blocks",
             str(args.gpu_kv_blocks), "--cpu-kv-gib", str(args.cpu_kv_gib), "--max-num-seqs",
             str(args.max_num_seqs)]
    if policy == "dualpace":
        flags += profile_flags(getattr(args, "profile", None))
    return flags


def step_log(policy: str, out) -> Path:
    """Where ``policy``'s server logs its steps in the sweep directory ``out``."""
    return Path(out) / f"steps-{policy}.jsonl"


def client_log(policy: str, out) -> Path:
    """Where ``policy``'s client times go in the sweep directory ``out`` (what the
    simulator's delivery model is fitted to, with the step log's request records)."""
    return Path(out) / f"clients-{policy}.json"


def start_server(model: str, policy: str, args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "dualpace", "serve", "--model", model, "--port", str(port),
           *engine_flags(policy, args), "--log-level", "warning"]
    if hasattr(args, "simulate"):  # compare_policies' own runs log their steps
        log = step_log(policy, args.out)
        log.unlink(missing_ok=True)
        cmd += ["--step-log", str(log)]
    proc = subprocess.Popen(cmd, env=frozen_server_env())
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc)
    return proc, url


def loadgen_args(url: str, seed: int) -> argparse.Namespace:
    """loadgen.run_rate's options for one Poisson run against ``url``."""
    return argparse.Namespace(base_url=url, model=None, api_key=None, burstiness=1.0,
                              seed=seed, replay_timestamps=False, timestamp_scale=1.0,
                              max_concurrency=0, request_timeout=3600, save_detailed=False,
                              no_progress=True)


def run_policy(model: str, policy: str, jobs, args) -> list[dict]:
    proc, url = start_server(model, policy, args)
    runs, clients = [], []
    before = scrape_metrics(url)  # also opens the first longest-stall window
    try:
        for rate in args.rates:
            cpu0, t0 = host_cpu_times(), time.monotonic()
            kept: list = []
            run = asyncio.run(loadgen.run_rate(loadgen_args(url, args.seed), jobs, rate, kept))
            clients += [{"start": r.start, "input_len": r.input_len, "ttft": r.ttft,
                         "itl": r.itl, "ok": r.ok} for r in kept]
            run["host_steal_fraction"] = steal_fraction(cpu0, host_cpu_times())
            run["window"] = [round(t0, 4), round(time.monotonic(), 4)]  # the step logs' clock
            m = scrape_metrics(url)  # closes this rate's longest-stall window
            run["cpu_tier_longest_stall_s"] = m.get("dualpace:cpu_tier_longest_stall_seconds",
                                                    0.0)
            run["cpu_stall_p99_s"] = histogram_quantile(
                0.99, "dualpace:cpu_tier_stall_seconds", m, before)
            run.update(engine_latencies(m, before))
            run["cpu_tokens"] = m.get('dualpace:generation_tokens_total{engine="cpu"}', 0.0)
            run["assist_calls"] = {
                k.split('route="')[1].rstrip('"}'): v - before.get(k, 0.0)
                for k, v in m.items() if k.startswith("dualpace:dense_assist_calls_total")}
            before = m
            runs.append(run)
            print(f"{policy} rate {rate}: norm {run['mean_normalized_latency_s']:.3f} s/tok, "
                  f"p99 itl {run['p99_itl_ms']:.0f} ms, p99 ttft {run['p99_ttft_ms']:.0f} ms",
                  file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        if hasattr(args, "simulate"):
            client_log(policy, args.out).write_text(json.dumps(clients))
    return runs


def add_workload_args(ap: argparse.ArgumentParser, out: str) -> None:
    """The checkpoint, trace slice and server shape (shared with dashboard_snapshot.py)."""
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--model", default=None, help="checkpoint (default: a small demo model)")
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--num-requests", type=int, default=80)
    ap.add_argument("--clip-input", type=int, default=2048)
    ap.add_argument("--clip-output", type=int, default=256)
    ap.add_argument("--gpu-kv-blocks", type=int, default=48)
    ap.add_argument("--cpu-kv-gib", type=float, default=0.5)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / out))
    ap.add_argument("--profile", default=None,
                    help="a `dualpace profile` JSON: dualpace serves with its thresholds when "
                         "its routing calls Dense Assist at some reachable batch")


def prepare(args) -> tuple[str, list]:
    """The checkpoint (a 4-layer demo model unless --model) and the loadgen jobs."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model is None:
        from dualpace.demo_model import DemoSpec, make_demo_model

        model = str(make_demo_model(out / "model-4k", DemoSpec(
            hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
            intermediate_size=768, max_position_embeddings=4096)))
    if os.path.exists(args.trace):
        jobs = loadgen.load_trace(args.trace, args.num_requests, args.clip_input,
                                  args.clip_output, 256, args.seed)
    else:
        # said out loud, and in the JSON (workload): a checkout outside its usual tree
        # (a worktree in /tmp) once ran a whole validation sweep on random jobs unawares
        print(f"compare_policies: no trace at {args.trace}: random jobs instead",
              file=sys.stderr)
        jobs = loadgen.random_jobs(args.num_requests, args.clip_input // 2,
                                   args.clip_output // 2, 0.9, 256, args.seed)
    return model, jobs


def workload(args) -> str:
    """What prepare replays: the trace's path, or random jobs where there is none."""
    return args.trace if os.path.exists(args.trace) else "random"


# The flags that make one sweep comparable with another: what is replayed, against which
# servers, at which rates, judged by which target. Every real compare.json records them
# (``shape``); --simulate and --resummarize take them from the real sweep they work on
# unless given (``resolve_shape``). Without this, a --simulate of a 200-request real
# sweep that did not repeat --num-requests simulated the default 80 requests and
# "validated" them against the 200 (2026-12-06: P99 TTFT 34-83% short, as if the
# simulator were that wrong; its queues were only shorter).
SHAPE = ("model", "trace", "num_requests", "clip_input", "clip_output", "gpu_kv_blocks",
         "cpu_kv_gib", "max_num_seqs", "seed", "profile", "rates", "target_factor")
UNSET = object()  # a shape flag's parsed value where it was not given


def sweep_shape(args) -> dict:
    """The SHAPE flags' values, as a compare.json records them (``rates`` as a list)."""
    return {k: list(getattr(args, k)) if k == "rates" else getattr(args, k) for k in SHAPE}


def resolve_shape(args, defaults: dict, reference: dict | None) -> list[str]:
    """Fill every SHAPE flag that was not given (still UNSET) from ``reference``, the shape
    of the real sweep this run simulates or resummarizes, or from ``defaults`` where there
    is none (or it predates ``shape``). Returns, one line each, the flags given with a
    value other than the reference's: such a run is not of the same sweep."""
    ref = reference or {}
    differ = []
    for k in SHAPE:
        given = getattr(args, k)
        if given is UNSET:
            setattr(args, k, ref[k] if k in ref else defaults[k])
            continue
        if k in ref and _shape_value(k, given) != _shape_value(k, ref[k]):
            differ.append(f"--{k.replace('_', '-')} {given} (the real sweep: {ref[k]})")
    args.rates = _shape_value("rates", args.rates)
    return differ


def _shape_value(key: str, value):
    """``rates`` as a list of floats whether given as "2,4" or recorded as [2.0, 4.0]."""
    if key == "rates" and isinstance(value, str):
        return [float(x) for x in value.split(",")]
    return value


def simulate_policy(model: str, policy: str, jobs, args, profile: dict,
                    jitter_seed: int | None = None) -> list[dict]:
    """The same sweep on the virtual clock: the server's engine shape, the same offsets."""
    from dualpace.cli import build_parser
    from dualpace.sim.costs import profile_costs
    from dualpace.sim.delivery import policy_delivery
    from dualpace.sim.run import simulate
    from dualpace.sim.setup import setup_from_config

    ns = build_parser().parse_args(["serve", "--model", model, *engine_flags(policy, args)])
    from dualpace.cli import _engine_options
    from dualpace.config import EngineConfig

    setup = setup_from_config(EngineConfig.from_options(model, **_engine_options(ns)))
    costs = profile_costs(profile, policy, contended=args.contention)
    runs = []
    for rate in args.rates:
        run = simulate(setup, costs, policy, jobs, rate, args.seed, jitter_seed=jitter_seed,
                       delivery=None if args.no_delivery else policy_delivery(profile, policy))
        print(f"{policy} rate {rate} (simulated): norm "
              f"{run['mean_normalized_latency_s']:.3f} s/tok, p99 itl {run['p99_itl_ms']:.0f} "
              f"ms, p99 ttft {run['p99_ttft_ms']:.0f} ms", file=sys.stderr)
        runs.append(run)
    return runs


def simulated_sweeps(model: str, jobs, policies, args, profile: dict) -> tuple[dict, list]:
    """--simulate --repeat N: the sweep with N jitter seeds (args.seed + i; the arrivals stay
    those of args.seed, as in every real sweep), the per-rate median as the result, as the
    real --repeat does: a single seed's sustainable rate moved by 5-20% when nothing but the
    order of its jitter draws changed, since the latency curve crosses the target at a
    shallow angle."""
    sweeps = [{p: simulate_policy(model, p, jobs, args, profile, args.seed + i)
               for p in policies} for i in range(args.repeat)]
    if args.repeat == 1:
        return sweeps[0], []
    per_seed = [{p: v["sustainable_rate"] for p, v in
                 summarize(s, args.target_factor, real=False)[1].items()} for s in sweeps]
    median = {p: [median_run([s[p][k] for s in sweeps]) for k in range(len(args.rates))]
              for p in policies}
    return median, per_seed


def per_sweep_simulation(model: str, jobs, policies, args, out: Path,
                         reps: list[dict]) -> tuple[dict, dict]:
    """--simulate --per-sweep: each real sweep a --repeat run left in ``out``/rep1 .. repN
    (``reps``, their runs by policy),
    simulated with step costs fitted to its own steps alone (rep<i>/profile-measured.json,
    ``fit_measured_profile``) over args.repeat jitter seeds (``simulated_sweeps``); the
    result is the per-rate median of those N simulated sweeps, as the real compare.json is
    the median of the N real ones. A profile pooled from every sweep lets a slow sweep's
    steps set the simulated tails while the real median leaves that sweep out (on the Zen 4
    box, 2026-12-06: dualpace's simulated P99 ITL +20-41% from three sweeps pooled, within
    9% from the two consistent ones fitted alone); fitted sweep by sweep, each simulated
    sweep carries its own sweep's pace into the median. Also returns, per sweep, its profile
    and its simulation validated against that sweep alone (at that sweep's own targets)."""
    import copy

    sims, each = [], {}
    for i, runs in enumerate(reps, 1):
        rep_args = copy.copy(args)
        rep_args.out = str(out / f"rep{i}")
        path = fit_measured_profile(policies, rep_args, [(Path(rep_args.out), runs)])
        sim, per_seed = simulated_sweeps(model, jobs, policies, args,
                                         json.loads(path.read_text()))
        sims.append(sim)
        each[f"rep{i}"] = {"profile": str(path),
                           "validation": validation({"runs": runs}, sim, args.target_factor),
                           **({"repeats": per_seed} if per_seed else {})}
    median = {p: [median_run([s[p][k] for s in sims]) for k in range(len(args.rates))]
              for p in policies}
    return median, each


def _err(real, sim):
    return round(sim / real - 1, 4) if real and sim else None


def reference_warning(real: dict, out: Path) -> str | None:
    """What --simulate says when the real sweep it validates against (``real``, the
    compare.json in ``out``) is a single one; None for a median of several, or a file from
    before compare.json said how many sweeps it holds."""
    if real.get("sweeps") != 1:
        return None
    return (f"compare_policies: the real sweep in {out} is a single one: its P99 TTFT moved "
            "9-61% (max over min) from one 200-request sweep to the next on the 2-core "
            "validation box (2026-12-05), so its per-rate errors are mostly the reference's "
            "noise; run the real side with --repeat 3 and validate against their medians")


def _spread(real: float | None, sim: float | None, values: list) -> dict:
    """A validation entry: the real (median) and simulated values, the simulation's relative
    error, and with the real sweeps' own values (``values``, one a sweep, None where one
    had none), their range and whether the simulation falls inside it."""
    entry = {"real": real, "simulated": sim, "error": _err(real, sim)}
    nums = [v for v in values if v is not None]
    if len(values) > 1 and nums:
        entry["real_range"] = [min(nums), max(nums)]
        # a plain bool: interpolated rates are numpy floats, and numpy's bool is no JSON
        entry["within_real_range"] = bool(sim is not None and min(nums) <= sim <= max(nums))
    return entry


def one_sided(real: list[dict], sim: list[dict], metric: str, target: float,
              side: str) -> dict:
    """Why a sustainable rate exists on one side only (it is never extrapolated), and how far
    apart the curves are where that is decided: ``outside``, the side without a rate and
    whether its curve was already above the target at the sweep's lowest rate ("below": the
    rate lies under the sweep) or never reached it ("beyond"); the metric on both sides at
    that edge rate and the simulation's relative error there. ``side``: "real" or
    "simulated", the one without a rate. On the Zen 4 box (2026-12-06)
    gated's real curve ran 0.0165 s/token at 2 req/s against a 12x target of 0.0168, the
    simulated one 0.0171: a rate of 2.0 against none, from curves 3.6% apart."""
    runs = sim if side == "simulated" else real
    where = "below" if runs[0][metric] > target else "beyond"
    k = 0 if where == "below" else len(runs) - 1
    a, b = float(real[k][metric]), float(sim[k][metric])  # numpy's from the simulator
    return {"outside": side, "where": where, "rate": runs[k]["request_rate"],
            "real_metric": a, "simulated_metric": b, "metric_error": _err(a, b),
            "target": target}


def validation(real: dict, simulated: dict, factor: float,
               reps: list[dict] | None = None) -> dict:
    """The simulated sweep against the real one in --out, at the *real* run's targets (each
    run's own targets come from its own gpu-only point at the lowest rate, one noisy
    measurement; a shared target compares the curves, not that point): per policy, the real
    and simulated sustainable rates and the simulation's relative error at the target
    factor and at 2x and 4x it (a policy that never meets the strict target still gets a
    rate compared), and per rate the P99 latencies: TTFT as the client saw it, inter-token
    latency as the engine stamped it (``engine_latencies``) and as the client saw it (its
    tail carries the HTTP/SSE delivery on cores the client, the server and the workers
    share, which the simulator draws from the profile's delivery model where it has one).
    ``reps``: the real sweeps that ``real`` is the median of; each entry then also gives
    their range (``real_range``) and whether the simulation falls inside it: on the 2-core
    validation boxes one 200-request sweep's P99 TTFT differed from the next by up to 2.9x,
    so an error against the median can be the reference's own noise. A rate that exists on
    one side only also says why and how far apart the curves are there (``one_sided``)."""
    runs = real["runs"]
    reps = [r for r in reps or [] if all(p in r for p in simulated if p in runs)]
    ref = runs.get("gpu-only", next(iter(runs.values())))
    out = {}
    for p, sim_runs in simulated.items():
        if p not in runs:
            continue
        out[p] = {}
        for f in (factor, 2 * factor, 4 * factor):
            targets = sweep_targets(ref, f)
            a, b = sweep_summary(runs[p], targets), sweep_summary(sim_runs, targets)
            each = [sweep_summary(rep[p], targets) for rep in reps]
            for key, metric in (("sustainable_rate", "mean_normalized_latency_s"),
                                ("sustainable_rate_p99_ttft", "p99_ttft_ms")):
                name = key if f == factor else f"{key}_at_{f:g}x"
                out[p][name] = _spread(a[key], b[key], [e[key] for e in each])
                if (a[key] is None) != (b[key] is None):
                    out[p][name]["one_sided"] = one_sided(
                        runs[p], sim_runs, metric, targets[metric],
                        "real" if a[key] is None else "simulated")
        per_rate = {}
        for i, (r, s) in enumerate(zip(runs[p], sim_runs)):
            per_rate[str(r["request_rate"])] = {
                k: _spread(r.get(k), s.get(k), [rep[p][i].get(k) for rep in reps])
                for k in ("p99_ttft_ms", "engine_p99_itl_ms", "p99_itl_ms")}
        out[p]["per_rate"] = per_rate
    return out


def _median_values(points: list[dict]) -> dict:
    """Key by key (the first point's keys): the median of the numbers, dicts of numbers
    recursively, else the first point's value; a value missing or None in some points is
    the median of the others."""
    out: dict = {}
    for key in points[0]:
        vals = [d.get(key) for d in points]
        nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if nums:
            out[key] = statistics.median(nums)
        elif any(isinstance(v, dict) for v in vals):
            out[key] = _median_values([v for v in vals if isinstance(v, dict)])
        else:
            out[key] = vals[0]
    return out


def median_run(runs: list[dict]) -> dict:
    """One sweep point from the same point of several sweeps (``_median_values``); the rate
    must agree."""
    rates = {r["request_rate"] for r in runs}
    if len(rates) != 1:
        raise ValueError(f"median_run: sweep points at different rates {sorted(rates)}")
    return _median_values(runs)


def quiet(run: dict, max_steal: float | None) -> bool:
    """Whether a real point ran on the whole box: the hypervisor gave at most ``max_steal`` of
    the host's CPU time to other guests meanwhile (``host_steal_fraction``; a point that did
    not measure it cannot say). ``None``: every point counts."""
    if max_steal is None:
        return True
    steal = run.get("host_steal_fraction")
    return steal is not None and steal <= max_steal


def _quiet_steps(records: list[dict], runs: list[dict], max_steal: float, log: Path) -> list:
    """The step records logged during the sweep's quiet points (their ``window``s)."""
    if any("t" not in s for s in records):
        raise SystemExit(f"compare_policies: {log} has steps without a time ('t'): a log "
                         "from before --max-steal existed; run the sweep again")
    windows = [r["window"] for r in runs if quiet(r, max_steal)]
    return [s for s in records if any(a <= s["t"] <= b for a, b in windows)]


def _fit_deliveries(served: dict[str, list], clients: dict[str, list]) -> dict:
    """The profile's delivery sections: pooled over the policies (``delivery``, the
    fallback) and each policy's own (``delivery_by_policy``); none from logs written before
    the engine recorded requests, without the client's times, or where no request joined
    (all failed: the sweep's other results still stand)."""
    from dualpace.sim.delivery import fit_delivery

    def fitted(records: list[dict], times: list[dict]) -> dict | None:
        try:
            return fit_delivery(records, times)
        except ValueError:  # nothing joined
            return None

    both = [p for p in served if served[p] and clients.get(p)]
    pooled = fitted([r for p in both for r in served[p]], [c for p in both for c in clients[p]])
    if pooled is None:
        return {}
    own = {p: d for p in both if (d := fitted(served[p], clients[p])) is not None}
    return {"delivery": pooled, "delivery_by_policy": own}


# Sweeps whose paces (sweep_paces) differ by more than this factor are warned of. On the Zen
# 4 box (2026-12-06) consistent sweeps ran 1.04-1.08x apart, and the sweep whose P99 ITL
# ran 1.5x the others' was 1.20x apart from the fastest.
PACE_SPREAD = 1.15


def sweep_paces(steps: dict[str, dict[str, list]], fits: dict) -> dict:
    """Per policy and sweep (``steps[policy][sweep]``: its step-log records), the sweep's
    pace: its steps' measured seconds over the seconds the policy's fit (``fits[policy]``,
    fitted to every sweep's steps together) prices them at (``record_seconds``). 1 is the
    pooled average; a sweep that ran on a slower box, or a slower stretch of one, is above
    it, and its steps then set the pooled jitter tables' tails."""
    from dualpace.runtime.routing import NEO_PIPELINE
    from dualpace.sim.costs import FittedCosts, record_seconds

    out: dict = {}
    for p, by_sweep in steps.items():
        if not (fits.get(p) or {}).get("gpu"):
            continue
        costs = FittedCosts(fits[p])
        out[p] = {}
        for name, records in by_sweep.items():
            # the gated pipeline's CPU steps are priced at their attention, not at their
            # logged time (FittedCosts.cpu_step): their pace would not be 1 on average
            rs = [r for r in records if r["kind"] == "gpu"
                  or (r["kind"] == "cpu" and r["route"] != NEO_PIPELINE)]
            priced = sum(record_seconds(costs, r) for r in rs)
            if priced > 0:
                out[p][name] = round(sum(r["seconds"] for r in rs) / priced, 3)
    return out


def pace_warning(paces: dict) -> str | None:
    """What the fit says when a policy's sweeps ran more than PACE_SPREAD apart: on the Zen
    4 box (2026-12-06) one of three sweeps ran dualpace's P99 inter-token latency 1.5x the
    others' (its steps 1.11x the pooled fit, the fastest sweep's 0.93x), and the profile
    pooled from all three put the simulated P99 ITL 20-41% above the three sweeps' median;
    fitted from the other two it came within 9%."""
    apart = [f"{p}: " + ", ".join(f"{n} {v:.2f}x" for n, v in by.items())
             for p, by in paces.items()
             if len(by) > 1 and max(by.values()) > PACE_SPREAD * min(by.values())]
    if not apart:
        return None
    return ("compare_policies: the sweeps ran at different paces (their steps' time over the "
            f"pooled fit's), more than {PACE_SPREAD}x apart: {'; '.join(apart)}. The "
            "profile's tails pool the slow sweep's steps while the real median leaves that "
            "sweep out; --simulate --per-sweep simulates each sweep with its own steps' fit "
            "and validates the median of those against the real median")


def fit_measured_profile(policies, args, sweeps: list[tuple[Path, dict]]) -> Path:
    """The step costs of every policy's server, fitted together over ``sweeps`` (each: the
    directory with its step logs and that sweep's runs by policy): --out/profile-measured.json.
    With ``--max-steal``, only the steps logged during quiet points count (``quiet``): a step
    that lost its core to another guest says nothing about this runtime, and the tables of
    the spread around the fit (``jitter_table``) then had 99th percentiles of 3-7x and
    outliers of 10-47x the fit on a noisy day, against 2-4x on a quiet one. With several
    sweeps, each one's pace against the fit goes in as ``sweep_paces`` and sweeps far apart
    are warned of (``pace_warning``)."""
    from dualpace.profile_file import PROFILE_FORMAT
    from dualpace.sim.costs import OVERLAP, fit_step_costs

    max_steal = getattr(args, "max_steal", None)
    by_policy: dict[str, list] = {}
    served: dict[str, list] = {}  # each policy's engine request records ...
    clients: dict[str, list] = {}  # ... and the client's times of the same requests
    per_sweep: dict[str, dict[str, list]] = {}  # each policy's steps by sweep
    for p in policies:
        for d, runs in sweeps:
            log = step_log(p, d)
            if log.exists():
                records = [json.loads(line) for line in log.read_text().splitlines() if line]
                served.setdefault(p, []).extend(r for r in records if r["kind"] == "request")
                if client_log(p, d).exists():
                    clients.setdefault(p, []).extend(json.loads(client_log(p, d).read_text()))
                if max_steal is not None:
                    records = _quiet_steps(records, runs.get(p, []), max_steal, log)
                by_policy.setdefault(p, []).extend(records)
                per_sweep.setdefault(p, {})[d.name] = records
    prof = json.loads(Path(args.profile).read_text()) if args.profile else {}
    pooled = [s for v in by_policy.values() for s in v]
    with_gpu = {p: v for p, v in by_policy.items() if any(s["kind"] == "gpu" for s in v)}
    prof.update({"format": PROFILE_FORMAT,
                 "step_costs": fit_step_costs(pooled),
                 "step_costs_by_policy": {p: fit_step_costs(v) for p, v in with_gpu.items()}})
    if pooled and all(OVERLAP in s for s in pooled):
        prof.update({  # the logs record each step's overlap: --simulate --contention
            "step_costs_contended": fit_step_costs(pooled, contention=True),
            "step_costs_contended_by_policy": {p: fit_step_costs(v, contention=True)
                                               for p, v in with_gpu.items()}})
    prof.update(_fit_deliveries(served, clients))
    if len(sweeps) > 1:
        prof["sweep_paces"] = sweep_paces(per_sweep, prof["step_costs_by_policy"])
        if warning := pace_warning(prof["sweep_paces"]):
            print(warning, file=sys.stderr)
    path = Path(args.out) / "profile-measured.json"
    path.write_text(json.dumps(prof, indent=1))
    return path


def summarize(results: dict, factor: float, real: bool) -> tuple[dict, dict]:
    """The targets (``factor`` x gpu-only's lowest-rate point) and each policy's summary;
    ``real``: with the CPU-tier stall and assist figures only real servers report."""
    targets = sweep_targets(results.get("gpu-only", next(iter(results.values()))), factor)
    summary = {}
    for p, runs in results.items():
        summary[p] = sweep_summary(runs, targets)
        if real:
            summary[p].update({
                "longest_cpu_stall_s": max(r["cpu_tier_longest_stall_s"] for r in runs),
                "cpu_stall_p99_s": {str(r["request_rate"]): r["cpu_stall_p99_s"] and
                                    round(r["cpu_stall_p99_s"], 4) for r in runs},
                "cpu_tokens": runs[-1]["cpu_tokens"],
                "assist_calls": {str(r["request_rate"]): r["assist_calls"] for r in runs},
                "host_steal_fraction": {str(r["request_rate"]): r.get("host_steal_fraction")
                                        for r in runs}})
    return targets, summary


def median_sweep(reps: list[dict], policies, max_steal: float | None) -> tuple[dict, dict]:
    """The per-rate median of several real sweeps (``median_run``); with ``max_steal``, of
    each rate's quiet points (``quiet``), or of all of them where none was. Also, per policy
    and rate, how many points were quiet."""
    median, counts = {}, {}
    for p in policies:
        median[p], counts[p] = [], {}
        for k in range(len(reps[0][p])):
            points = [r[p][k] for r in reps]
            calm = [x for x in points if quiet(x, max_steal)]
            median[p].append(median_run(calm or points))
            counts[p][str(points[0]["request_rate"])] = len(calm)
    return median, counts


def repeated_sweeps(model: str, jobs, policies, args) -> list[dict]:
    """--repeat: every policy's sweep args.repeat times, each into --out/rep<i> (its step
    logs and its own compare.json); returns each sweep's runs by policy."""
    import copy

    reps = []
    for i in range(1, args.repeat + 1):
        rep_args = copy.copy(args)
        rep_args.out = str(Path(args.out) / f"rep{i}")
        Path(rep_args.out).mkdir(parents=True, exist_ok=True)
        runs = {p: run_policy(model, p, jobs, rep_args) for p in policies}
        _, summary = summarize(runs, args.target_factor, real=True)
        (Path(rep_args.out) / "compare.json").write_text(
            json.dumps({"summary": summary, "runs": runs, "workload": workload(args),
                        "shape": sweep_shape(args), "sweeps": 1},
                       indent=2))
        reps.append(runs)
    return reps


def saved_sweeps(out: Path, policies) -> list[dict]:
    """--resummarize: the runs of the sweeps a --repeat run left in --out/rep1, rep2, ..."""
    reps = []
    while (out / f"rep{len(reps) + 1}" / "compare.json").exists():
        runs = json.loads((out / f"rep{len(reps) + 1}" / "compare.json").read_text())["runs"]
        missing = [p for p in policies if p not in runs]
        if missing:
            raise SystemExit(f"compare_policies: {out}/rep{len(reps) + 1} has no sweep of "
                             f"{', '.join(missing)}")
        reps.append(runs)
    if not reps:
        raise SystemExit(f"compare_policies: no {out}/rep1/compare.json to resummarize "
                         "(--resummarize reads what a --repeat run wrote)")
    return reps


def per_sweep_reps(out: Path, policies) -> list[dict]:
    """--per-sweep's real sweeps (``saved_sweeps``): the real median in ``out`` and every sweep
    it was taken of must be there."""
    real = out / "compare.json"
    for need in (real, out / "rep1" / "compare.json"):
        if not need.exists():
            raise SystemExit(f"compare_policies: --per-sweep simulates the sweeps of a "
                             f"--repeat run, and there is no {need}: run the real side with "
                             "--repeat N first")
    sweeps = json.loads(real.read_text()).get("sweeps")
    reps = saved_sweeps(out, policies)
    if sweeps != len(reps):
        raise SystemExit(f"compare_policies: {real} is the median of {sweeps} sweeps but "
                         f"{out} holds {len(reps)} (rep1 ..): --per-sweep would validate "
                         "against another set of sweeps than the median's")
    return reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(ap, "compare")
    ap.add_argument("--rates", default="2,4,8,12,16")
    ap.add_argument("--target-factor", type=float, default=3.0)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--simulate", action="store_true",
                    help="run the sweep in the simulator (dualpace simulate) instead")
    ap.add_argument("--sim-profile", default=None,
                    help="step costs for --simulate (default: --out/profile-measured.json, "
                         "written by a real run)")
    ap.add_argument("--no-delivery", action="store_true",
                    help="--simulate without the profile's delivery model: the client sees "
                         "the engine's stamps (see dualpace/sim/delivery.py)")
    ap.add_argument("--contention", action="store_true",
                    help="--simulate with the step costs that model the two workers sharing "
                         "cores (processor sharing; see dualpace/sim/costs.py)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="the sweep this many times (real: compare.json holds the per-rate "
                         "median, see above; --simulate: this many jitter seeds, their "
                         "per-rate median)")
    ap.add_argument("--max-steal", type=float, default=None,
                    help="real sweeps: the per-rate median and the fitted step costs only "
                         "from points during which the hypervisor gave at most this share of "
                         "the host's CPU time to other guests (host_steal_fraction; a rate "
                         "with no such point takes all of its points)")
    ap.add_argument("--per-sweep", action="store_true",
                    help="--simulate against a --repeat run: each real sweep (--out/rep<i>) "
                         "simulated with step costs fitted to its own steps "
                         "(rep<i>/profile-measured.json), and the per-rate median of those "
                         "validated against the real median; --repeat is then the jitter "
                         "seeds per sweep")
    ap.add_argument("--resummarize", action="store_true",
                    help="run nothing: the median and the profile again from the sweeps a "
                         "--repeat run left in --out/rep1.. (say, with another --max-steal)")
    defaults = {k: ap.get_default(k) for k in SHAPE}
    ap.set_defaults(**dict.fromkeys(SHAPE, UNSET))
    args = ap.parse_args()
    if args.max_steal is not None and not 0.0 <= args.max_steal <= 1.0:
        raise SystemExit("compare_policies: --max-steal is a share of CPU time, 0 to 1")
    if args.resummarize and args.simulate:
        raise SystemExit("compare_policies: --resummarize reads real sweeps; run --simulate "
                         "after it")
    if args.repeat < 1:
        raise SystemExit("compare_policies: --repeat must be at least 1")
    if args.per_sweep and not args.simulate:
        raise SystemExit("compare_policies: --per-sweep is a way to --simulate; give both")
    if args.per_sweep and args.sim_profile:
        raise SystemExit("compare_policies: --per-sweep fits each sweep's own profile; "
                         "--sim-profile would replace them: give one of the two")
    out = Path(args.out)
    # the real sweep this run works on: --simulate validates against it, --resummarize
    # rewrites its median
    reference = (out / "compare.json" if args.simulate
                 else out / "rep1" / "compare.json" if args.resummarize else None)
    ref_shape = (json.loads(reference.read_text()).get("shape")
                 if reference and reference.exists() else None)
    differ = resolve_shape(args, defaults, ref_shape)
    if differ and args.resummarize:
        raise SystemExit(f"compare_policies: {', '.join(differ)}: --resummarize recomputes "
                         "the sweeps as they ran; leave these out")
    if reference and reference.exists() and ref_shape is None:
        print(f"compare_policies: {reference} predates recorded sweep shapes: this run takes "
              "its flags as given (give the real sweep's own --num-requests, --rates, ..., or "
              "it works on another workload than that sweep's)", file=sys.stderr)
    model, jobs = prepare(args)
    policies = args.policies.split(",")
    extra = {}
    if args.simulate:
        name = "compare-sim"
        if args.per_sweep:
            results, extra["per_sweep"] = per_sweep_simulation(
                model, jobs, policies, args, out, per_sweep_reps(out, policies))
        else:
            sim_profile = Path(args.sim_profile or out / "profile-measured.json")
            if not sim_profile.exists():
                raise SystemExit(f"compare_policies: {sim_profile} does not exist: run "
                                 "without --simulate first (it measures the step costs), or "
                                 "pass --sim-profile")
            profile = json.loads(sim_profile.read_text())
            results, per_seed = simulated_sweeps(model, jobs, policies, args, profile)
            if per_seed:
                extra["repeats"] = per_seed
            extra["sim_profile"] = str(sim_profile)
    elif args.repeat == 1 and not args.resummarize:
        results = {p: run_policy(model, p, jobs, args) for p in policies}
        extra["measured_profile"] = str(fit_measured_profile(policies, args, [(out, results)]))
        name = "compare"
    else:
        reps = (saved_sweeps(out, policies) if args.resummarize
                else repeated_sweeps(model, jobs, policies, args))
        results, counts = median_sweep(reps, policies, args.max_steal)
        extra["repeats"] = [{p: v["sustainable_rate"] for p, v in
                             summarize(r, args.target_factor, real=True)[1].items()}
                            for r in reps]
        if args.max_steal is not None:
            extra["quiet_points"] = counts
            extra["max_steal"] = args.max_steal
        extra["measured_profile"] = str(fit_measured_profile(
            policies, args, [(out / f"rep{i}", r) for i, r in enumerate(reps, 1)]))
        name = "compare"
    targets, summary = summarize(results, args.target_factor, real=not args.simulate)
    if args.simulate and (out / "compare.json").exists():
        real = json.loads((out / "compare.json").read_text())
        if real.get("workload", workload(args)) != workload(args):
            differ.append(f"this one replays {workload(args)} (the real sweep: "
                          f"{real['workload']})")
        if differ:
            print(f"compare_policies: {'; '.join(differ)}: not the real sweep in {out}, so "
                  "no validation against it", file=sys.stderr)
        else:
            # the sweeps the real median was taken of, where they are still beside it
            reps = saved_sweeps(out, []) if (out / "rep1" / "compare.json").exists() else []
            if len(reps) != real.get("sweeps"):  # left from another run
                reps = []
            extra["validation"] = validation(real, results, args.target_factor, reps)
            extra["validation_real_sweeps"] = real.get("sweeps")
            if warning := reference_warning(real, out):
                print(warning, file=sys.stderr)
    sweeps = {} if args.simulate else {"sweeps": len(extra.get("repeats") or [0])}
    (out / f"{name}.json").write_text(json.dumps({"summary": summary, "runs": results,
                                                  "workload": workload(args),
                                                  "shape": sweep_shape(args), **sweeps},
                                                 indent=2))
    plot_sweep(results, targets, out / f"{name}.png")
    emit({"bench": "compare_policies", "simulated": args.simulate, "policies": summary,
          "targets": targets, "rates": args.rates, "workload": workload(args),
          "num_requests": args.num_requests,
          "clip": [args.clip_input, args.clip_output],
          "dualpace_profile": profile_flags(args.profile)[1:],
          "plot": str(out / f"{name}.png"), **extra}, args.json)


if __name__ == "__main__":
    main()
