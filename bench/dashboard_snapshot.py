"""The dashboard during a compare_policies-style run: one screenshot per policy, and each
policy's CPU-tier stall p99 (paper Figure 1: gaps while a CPU-resident request was ready).

    python bench/dashboard_snapshot.py --json [--policies dualpace,gated] [--rate 16]

For each policy: serve the checkpoint as bench/compare_policies.py does (same GPU KV pool,
trace slice and pinned workers), open GET /dashboard in headless chromium (polling every
0.5 s), replay the slice at --rate with bench/loadgen.py, and once the last request finished
and the page polled twice more, save <out>/<policy>.png. Reports the stall p99 and longest
stall over the run from /metrics, and the p99 the page shows (its last 60 s). The last line
with --json is {"policies": {name: {"stall_p99_s", "longest_stall_s", "page_stall_p99",
"cpu_tokens", "p99_itl_ms", "screenshot"}}}.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path

import compare_policies
import loadgen
from browser import headless_chromium
from common import emit, scrape_metrics

from dualpace.engine.metrics import histogram_quantile


def _polls(driver) -> int:
    return int(driver.execute_script("return document.body.dataset.polls"))


def snapshot(model: str, policy: str, jobs, args) -> dict:
    proc, url = compare_policies.start_server(model, policy, args)
    driver = headless_chromium(1400, 1500)
    try:
        before = scrape_metrics(url)  # opens the longest-stall window of the run
        driver.get(f"{url}/dashboard?interval=0.5&window={args.window}")
        run: dict = {}
        worker = threading.Thread(target=lambda: run.update(asyncio.run(loadgen.run_rate(
            compare_policies.loadgen_args(url, args.seed), jobs, args.rate))))
        worker.start()
        worker.join()
        polls = _polls(driver)
        deadline = time.monotonic() + 30
        while _polls(driver) < polls + 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        shot = Path(args.out) / f"{policy}.png"
        driver.save_screenshot(str(shot))
        page_p99 = driver.find_element("id", "stallp99").text
        m = scrape_metrics(url)
        stall = histogram_quantile(0.99, "dualpace:cpu_tier_stall_seconds", m, before)
        result = {
            "stall_p99_s": stall and round(stall, 4),
            "longest_stall_s": round(m.get("dualpace:cpu_tier_longest_stall_seconds", 0.0), 4),
            "page_stall_p99": page_p99,
            "cpu_tokens": m.get('dualpace:generation_tokens_total{engine="cpu"}', 0.0),
            "gpu_tokens": m.get('dualpace:generation_tokens_total{engine="gpu"}', 0.0),
            "p99_itl_ms": round(run["p99_itl_ms"], 1),
            "completed": run["completed"], "failed": run["failed"],
            "screenshot": str(shot),
        }
        print(f"{policy}: stall p99 {result['stall_p99_s']} s, longest "
              f"{result['longest_stall_s']} s -> {shot}", file=sys.stderr)
        return result
    finally:
        driver.quit()
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    compare_policies.add_workload_args(ap, "dashboard")
    ap.add_argument("--rate", type=float, default=16.0)
    ap.add_argument("--window", type=int, default=120, help="seconds on the page's charts")
    ap.add_argument("--policies", default="dualpace,gated")
    args = ap.parse_args()
    model, jobs = compare_policies.prepare(args)
    results = {p: snapshot(model, p, jobs, args) for p in args.policies.split(",")}
    emit({"bench": "dashboard_snapshot", "rate": args.rate, "num_requests": args.num_requests,
          "policies": results}, args.json)


if __name__ == "__main__":
    main()
