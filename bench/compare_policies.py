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
plots go to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import loadgen
from common import REPO, emit, free_port, histogram_quantile, scrape_metrics, wait_healthy

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


def start_server(model: str, policy: str, args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "dualpace", "serve", "--model", model, "--port", str(port),
           "--policy", policy, "--gpu-device", "cpu", "--gpu-kv-blocks",
           str(args.gpu_kv_blocks), "--cpu-kv-gib", str(args.cpu_kv_gib), "--max-num-seqs",
           str(args.max_num_seqs), "--log-level", "warning"]
    if policy == "dualpace":
        cmd += profile_flags(getattr(args, "profile", None))
    proc = subprocess.Popen(cmd)
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
    runs = []
    before = scrape_metrics(url)  # also opens the first longest-stall window
    try:
        for rate in args.rates:
            run = asyncio.run(loadgen.run_rate(loadgen_args(url, args.seed), jobs, rate))
            m = scrape_metrics(url)  # closes this rate's longest-stall window
            run["cpu_tier_longest_stall_s"] = m.get("dualpace:cpu_tier_longest_stall_seconds",
                                                    0.0)
            run["cpu_stall_p99_s"] = histogram_quantile(
                0.99, "dualpace:cpu_tier_stall_seconds", m, before)
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
    return runs


def plot(results: dict, targets: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [("mean_normalized_latency_s", "Normalized latency (s/token)"),
               ("p99_ttft_ms", "P99 TTFT (ms)"), ("p99_itl_ms", "P99 ITL (ms)")]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (m, title) in zip(axes, metrics):
        for policy, runs in results.items():
            ax.plot([r["request_rate"] for r in runs], [r[m] for r in runs], marker="o",
                    label=policy)
        if m in targets:
            ax.axhline(targets[m], linestyle="--", color="gray")
        ax.set_title(title)
        ax.set_xlabel("request rate (req/s)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


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
        jobs = loadgen.random_jobs(args.num_requests, args.clip_input // 2,
                                   args.clip_output // 2, 0.9, 256, args.seed)
    return model, jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(ap, "compare")
    ap.add_argument("--rates", default="2,4,8,12,16")
    ap.add_argument("--target-factor", type=float, default=3.0)
    ap.add_argument("--policies", default=",".join(POLICIES))
    args = ap.parse_args()
    args.rates = [float(x) for x in args.rates.split(",")]
    out = Path(args.out)
    model, jobs = prepare(args)
    policies = args.policies.split(",")
    results = {p: run_policy(model, p, jobs, args) for p in policies}
    ref = results.get("gpu-only", next(iter(results.values())))[0]
    targets = {"mean_normalized_latency_s": args.target_factor
               * ref["mean_normalized_latency_s"],
               "p99_itl_ms": args.target_factor * ref["p99_itl_ms"]}
    summary = {}
    for p, runs in results.items():
        rates = [r["request_rate"] for r in runs]
        summary[p] = {
            "sustainable_rate": loadgen.sustainable_rate(
                rates, [r["mean_normalized_latency_s"] for r in runs],
                targets["mean_normalized_latency_s"]),
            "sustainable_rate_p99_itl": loadgen.sustainable_rate(
                rates, [r["p99_itl_ms"] for r in runs], targets["p99_itl_ms"]),
            "p99_ttft_ms": {str(r["request_rate"]): round(r["p99_ttft_ms"], 1) for r in runs},
            "mean_normalized_latency_s": {str(r["request_rate"]):
                                          round(r["mean_normalized_latency_s"], 4)
                                          for r in runs},
            "p99_itl_ms": {str(r["request_rate"]): round(r["p99_itl_ms"], 1) for r in runs},
            "longest_cpu_stall_s": max(r["cpu_tier_longest_stall_s"] for r in runs),
            "cpu_stall_p99_s": {str(r["request_rate"]): r["cpu_stall_p99_s"] and
                                round(r["cpu_stall_p99_s"], 4) for r in runs},
            "cpu_tokens": runs[-1]["cpu_tokens"],
            "assist_calls": {str(r["request_rate"]): r["assist_calls"] for r in runs},
        }
    (out / "compare.json").write_text(json.dumps({"summary": summary, "runs": results},
                                                 indent=2))
    plot(results, targets, out / "compare.png")
    emit({"bench": "compare_policies", "policies": summary, "targets": targets,
          "rates": args.rates, "num_requests": args.num_requests,
          "clip": [args.clip_input, args.clip_output],
          "dualpace_profile": profile_flags(args.profile)[1:],
          "plot": str(out / "compare.png")}, args.json)


if __name__ == "__main__":
    main()
