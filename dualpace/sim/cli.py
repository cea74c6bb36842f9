"""``dualpace simulate``: policies x offered rates (x what-if host KV sizes and CPU cores) on
the virtual clock, summarised like bench/compare_policies.py (same JSON keys).

    dualpace simulate --hardware rtx4090-xeon4510 --model llama-3.1-8b \\
        --trace AzureLLMInferenceTrace_conv.csv --rates 1,2,4,6,8 --json
    dualpace simulate --profile out/profile-measured.json --model DIR --trace T.csv \\
        --gpu-kv-blocks 48 --cpu-kv-gib 0.5 --rates 2,4,8 --json

With ``--hardware`` the costs are rooflines of the box (sim/hardware.py) and the pools come
from its memory; with ``--profile`` they are fitted to the real runtime's step log (the
profile's ``step_costs``) and the engine shape is what ``serve`` resolves from the same
flags, so a run here can be checked against the real one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

POLICIES = ("dualpace", "gated", "gpu-only")


def add_parser(sub, add_engine_flags) -> None:
    p = sub.add_parser("simulate", help="the scheduler on a virtual clock with cost models",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hardware", help="hardware JSON, or a shipped setup name")
    # --model, --profile (with 'step_costs': measured here) and the serve flags, which give
    # the engine shape in profile mode and override the paper's settings in hardware mode
    add_engine_flags(p)
    p.add_argument("--trace", required=True, help="Azure LLM inference trace CSV")
    p.add_argument("--num-requests", type=int, default=2000)
    p.add_argument("--clip-input", type=int, default=0, help="0: no clipping")
    p.add_argument("--clip-output", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--contention", action="store_true",
                   help="with --profile: the step costs that model the two workers sharing "
                        "cores (written from step logs that record each step's overlap)")
    p.add_argument("--no-jitter", action="store_true",
                   help="--profile: every step takes its fitted cost (default: the measured "
                        "spread around the fit, seeded with --seed)")
    p.add_argument("--no-delivery", action="store_true",
                   help="--profile: leave out the profile's delivery model (the front end's "
                        "admission and per-token delays, measured by compare_policies.py); "
                        "the client then sees the engine's stamps")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--rates", required=True, help="offered rates, e.g. 1,2,4,8")
    p.add_argument("--target-factor", type=float, default=3.0,
                   help="latency targets: this x gpu-only's value at the lowest rate")
    p.add_argument("--targets", default="",
                   help="absolute latency targets instead of --target-factor: normalized "
                        "latency (s/token), P99 TTFT (s) and P99 ITL (s), e.g. the paper's "
                        "main-figure targets 1,5,1.5 (§6.1)")
    p.add_argument("--host-kv-gib-sweep", default="",
                   help="what-if: host KV sizes (GiB), e.g. 30,60,120,240 (Figure 11)")
    p.add_argument("--cpu-cores-sweep", default="",
                   help="what-if (--hardware): CPU cores of the CPU tier, e.g. 12,24")
    p.add_argument("--no-check", action="store_true",
                   help="skip the per-round invariant checks (faster)")
    p.add_argument("--out", default="", help="directory for the JSON and the Figure-9 plot")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_simulate)


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"simulate: not a list of numbers: {text!r}") from None


def absolute_targets(text: str) -> dict[str, float] | None:
    """--targets "NORM,TTFT,ITL" (seconds) as sweep_summary's targets (TTFT and ITL in ms);
    None when not given. Paper §6.1: "The main figures use targets of 1 s/token normalized
    latency, 5 s P99 TTFT, and 1.5 s P99 ITL"; a multiple of this box's unloaded latency
    (--target-factor, the default) asks for a far tighter service level than those."""
    if not text:
        return None
    vals = _floats(text)
    if len(vals) != 3 or min(vals) <= 0:
        raise SystemExit(f"simulate: --targets takes three positive numbers, normalized "
                         f"latency (s/token), P99 TTFT (s) and P99 ITL (s): {text!r}")
    return {"mean_normalized_latency_s": vals[0], "p99_ttft_ms": 1000 * vals[1],
            "p99_itl_ms": 1000 * vals[2]}


# the sustainable rates compared between policies (``gains``), by the suffix of their key
GAIN_RATES = {"sustainable_rate": "", "sustainable_rate_p99_ttft": "_p99_ttft",
              "sustainable_rate_p99_itl": "_p99_itl"}


def policy_gains(summary: dict) -> dict[str, float]:
    """dualpace's sustainable rate over each baseline's, at each target (normalized latency:
    ``dualpace_over_gated``; P99 TTFT / ITL: ``..._p99_ttft`` / ``..._p99_itl``), where both
    rates exist inside the sweep (never extrapolated)."""
    gains = {}
    if "dualpace" not in summary:
        return gains
    for base in ("gated", "gpu-only"):
        for key, suffix in GAIN_RATES.items():
            a = summary["dualpace"][key]
            b = summary.get(base, {}).get(key)
            if a and b:
                gains[f"dualpace_over_{base}{suffix}"] = round(a / b - 1, 4)
    return gains


def build(args, config, policy: str, host_kv_gib: float | None = None,
          cpu_cores: int | None = None):
    """(setup, costs) of one policy at one point of the what-if sweep."""
    from dualpace.sim.costs import RooflineCosts, profile_costs
    from dualpace.sim.hardware import load_hardware
    from dualpace.sim.setup import load_shape, setup_from_config, setup_from_hardware

    if args.hardware:
        hw = load_hardware(args.hardware)
        if cpu_cores:
            hw = dataclasses.replace(hw, cpu=dataclasses.replace(hw.cpu, cores=cpu_cores))
        shape = load_shape(args.model)
        defaults = {f.name: f.default for f in dataclasses.fields(type(config))}
        kw = {k: getattr(config, k) for k in ("max_num_batched_tokens", "max_num_seqs",
                                              "cpu_batch_limit", "block_size")
              if getattr(config, k) != defaults[k]}
        if config.assist_thresholds:
            from dualpace.config import parse_thresholds

            kw["thresholds"] = parse_thresholds(config.assist_thresholds)
        setup = setup_from_hardware(hw, shape, host_kv_gib=host_kv_gib, **kw)
        return setup, RooflineCosts(hw, shape)
    prof = json.loads(Path(args.profile).read_text())
    if host_kv_gib:
        config = dataclasses.replace(config, cpu_kv_gib=host_kv_gib)
    try:
        return setup_from_config(config), profile_costs(prof, policy, args.contention)
    except ValueError as e:
        raise SystemExit(f"simulate: {args.profile}: {e}") from None


def sweep(args, config, jobs, policies, rates, host_kv_gib=None, cpu_cores=None,
          targets: dict | None = None) -> dict:
    """Every policy at every rate; ``targets``: absolute ones (--targets), else
    --target-factor x gpu-only's lowest-rate point."""
    from dualpace.sim.delivery import policy_delivery
    from dualpace.sim.run import simulate
    from dualpace.workload import sweep_summary, sweep_targets

    runs = {}
    profile = {}  # delivery: measured on the box a profile comes from; a hardware file has none
    if args.profile and not args.no_delivery:
        profile = json.loads(Path(args.profile).read_text())
    for policy in policies:
        setup, costs = build(args, config, policy, host_kv_gib, cpu_cores)
        runs[policy] = []
        for rate in rates:
            r = simulate(setup, costs, policy, jobs, rate, args.seed, check=not args.no_check,
                         jitter=not args.no_jitter,
                         delivery=policy_delivery(profile, policy))
            runs[policy].append(r)
            print(f"{policy} rate {rate}: norm {r['mean_normalized_latency_s']:.4f} s/tok, "
                  f"p99 ttft {r['p99_ttft_ms']:.0f} ms, p99 itl {r['p99_itl_ms']:.0f} ms "
                  f"({r['simulator']['wall_s']} s)", file=sys.stderr)
    ref = runs.get("gpu-only", next(iter(runs.values())))
    targets = targets or sweep_targets(ref, args.target_factor)
    summary = {p: sweep_summary(rs, targets) for p, rs in runs.items()}
    return {"policies": summary, "targets": targets, "gains": policy_gains(summary),
            "setup": {"gpu_kv_blocks": setup.gpu_blocks, "host_kv_blocks": setup.host_blocks,
                      "block_size": setup.block_size, "thresholds": list(setup.thresholds),
                      "stage_wait_s": round(setup.stage_wait_s, 6),
                      **dataclasses.asdict(setup.limits)},
            "runs": runs}


def cmd_simulate(args) -> int:
    from dualpace.cli import _engine_options
    from dualpace.config import EngineConfig
    from dualpace.workload import load_trace

    if not args.model:
        raise SystemExit("simulate: --model is required (a checkpoint directory, or with "
                         "--hardware a shipped shape: llama-3.1-8b, qwen3-14b, qwen3-32b)")
    if bool(args.hardware) == bool(args.profile):
        raise SystemExit("simulate: give one of --hardware (rooflines of a box) or "
                         "--profile (step costs measured here)")
    if args.contention and not args.profile:
        raise SystemExit("simulate: --contention needs --profile (a hardware description's "
                         "tiers are separate chips that share no cores)")
    options = _engine_options(args)
    if args.hardware:  # the model may be a shipped shape name, not a directory
        config = EngineConfig(model=args.model, **options)
    else:
        config = EngineConfig.from_options(args.model, **options)
    jobs = load_trace(args.trace, args.num_requests, args.clip_input, args.clip_output, 256,
                      args.seed)
    policies = [p for p in args.policies.split(",") if p]
    rates = _floats(args.rates)
    if not rates:
        raise SystemExit("simulate: --rates is empty")
    targets = absolute_targets(args.targets)  # refused before anything runs
    kv_sweep = _floats(args.host_kv_gib_sweep) or [None]
    core_sweep = [int(c) for c in _floats(args.cpu_cores_sweep)] or [None]
    if core_sweep != [None] and not args.hardware:
        raise SystemExit("simulate: --cpu-cores-sweep needs --hardware (a profile measured "
                         "one core count)")
    results = {}
    for kv in kv_sweep:
        for cores in core_sweep:
            key = ",".join(f"{k}={v}" for k, v in (("host_kv_gib", kv), ("cpu_cores", cores))
                           if v is not None) or "base"
            results[key] = sweep(args, config, jobs, policies, rates, kv, cores, targets)
    base = next(iter(results.values()))
    out = {"bench": "simulate", "source": args.hardware or args.profile, "model": args.model,
           "num_requests": len(jobs), "rates": rates, "policies": base["policies"],
           "gains": base["gains"], "targets": base["targets"], "setup": base["setup"]}
    if len(results) > 1:
        out["what_if"] = {k: {"policies": {p: {"sustainable_rate": s["sustainable_rate"]}
                                           for p, s in v["policies"].items()},
                              "gains": v["gains"]} for k, v in results.items()}
    if args.out:
        d = Path(args.out)
        d.mkdir(parents=True, exist_ok=True)
        (d / "simulate.json").write_text(json.dumps(results, indent=1))
        from dualpace.sim.plot import plot_sweep

        out["plot"] = str(plot_sweep({p: base["runs"][p] for p in policies}, base["targets"],
                                     d / "simulate.png"))
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))
    return 0
