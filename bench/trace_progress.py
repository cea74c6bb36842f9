"""Per-token progress trace of one run per policy, plotted like the paper's Figure 1.

    python bench/trace_progress.py --json [--out bench/results/trace]

Serves the same workload with --policy dualpace and --policy gated (GPU worker and CPU
worker pinned to different cores, a GPU KV pool far smaller than the workload), records
every generated token's timestamp tagged by the engine that produced it, saves the trace
(JSON) and draws cumulative tokens over time, total and CPU-resident (PNG). Reports
tokens/s and the longest CPU-tier stall: the longest gap between two CPU-engine tokens
while CPU-owned requests were waiting to advance.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
from pathlib import Path

from common import REPO, emit

from dualpace.config import EngineConfig
from dualpace.demo_model import DemoSpec, make_demo_model
from dualpace.engine.serving import ServingEngine
from dualpace.sampling.params import SamplingParams


async def _drain(stream) -> None:
    async for _ in stream:
        continue


async def run_policy(model: str, policy: str, args) -> dict:
    cfg = EngineConfig(model=model, gpu_device="cpu", policy=policy,
                       gpu_kv_blocks=args.gpu_kv_blocks, cpu_kv_gib=0.25,
                       max_num_seqs=args.max_num_seqs, max_num_batched_tokens=512)
    serving = ServingEngine(cfg)
    await serving.start()
    eng = serving.engine
    eng.trace = []
    stalls: list[float] = []
    rng = random.Random(args.seed)
    jobs = [([rng.randrange(256) for _ in range(rng.randint(16, args.max_prompt))],
             rng.randint(args.max_tokens // 4, args.max_tokens)) for _ in range(args.requests)]
    gaps = [rng.expovariate(args.rate) for _ in jobs]
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def one(prompt, n, delay):
        await asyncio.sleep(delay)
        stream = serving.add_request(prompt, SamplingParams(temperature=0, max_tokens=n,
                                                            ignore_eos=True))
        await _drain(stream)

    async def watch_stalls():
        # Sample whether CPU-owned, ready work is waiting; a stall is a stretch without a
        # CPU-engine token during which such work existed.
        last_cpu, waiting_since = None, None
        while True:
            await asyncio.sleep(0.002)
            st = eng.state
            has_cpu_work = any(r.ready and not r.finished
                               for r in list(st.cpu_waiting) + st.cpu_running)
            cpu_times = [t for t, e, _ in eng.trace[-64:] if e == "cpu"]
            if cpu_times:
                last_cpu = cpu_times[-1]
            now = loop.time()
            if has_cpu_work:
                start = max(last_cpu or now, waiting_since or now)
                waiting_since = waiting_since or now
                stalls.append(now - start)
            else:
                waiting_since = None

    watcher = asyncio.create_task(watch_stalls())
    delays = [sum(gaps[:i + 1]) for i in range(len(gaps))]
    await asyncio.gather(*(one(p, n, d) for (p, n), d in zip(jobs, delays)))
    watcher.cancel()
    await serving.stop()
    trace = [(t - t0, e, rid) for t, e, rid in eng.trace]
    end = trace[-1][0] if trace else 0.0
    n_cpu = sum(1 for _, e, _ in trace if e == "cpu")
    return {"trace": trace, "duration_s": round(end, 3), "tokens": len(trace),
            "tokens_per_s": round(len(trace) / end, 1) if end else 0.0,
            "cpu_tokens": n_cpu,
            "longest_cpu_stall_s": round(max(stalls, default=0.0), 3)}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for policy, res in results.items():
        times = [t for t, _, _ in res["trace"]]
        cpu = [t for t, e, _ in res["trace"] if e == "cpu"]
        axes[0].plot(times, range(1, len(times) + 1), label=policy)
        axes[1].plot(cpu, range(1, len(cpu) + 1), label=policy)
    axes[0].set_title("Total tokens generated")
    axes[1].set_title("CPU-resident decoded tokens")
    for ax in axes:
        ax.set_xlabel("Time (s)")
        ax.set_ylabel("Cumulative tokens")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "trace"))
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--rate", type=float, default=8.0, help="requests per second (Poisson)")
    ap.add_argument("--max-prompt", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--gpu-kv-blocks", type=int, default=48)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default="dualpace,gated")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = make_demo_model(os.path.join(tmp, "m"), DemoSpec(
            hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=768,
            max_position_embeddings=1024))
        results = {p: asyncio.run(run_policy(str(model), p, args))
                   for p in args.policies.split(",")}
    (out / "trace.json").write_text(json.dumps(results))
    plot(results, out / "figure1.png")
    summary = {p: {k: v for k, v in r.items() if k != "trace"} for p, r in results.items()}
    emit({"bench": "trace_progress", "policies": summary, "trace": str(out / "trace.json"),
          "plot": str(out / "figure1.png")}, args.json)


if __name__ == "__main__":
    main()
