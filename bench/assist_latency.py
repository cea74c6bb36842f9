"""Control-path latencies of the runtime: Dense Assist handshake, data-plane ring, ZeroMQ.

    python bench/assist_latency.py --json

Starts a real runtime (GPU worker on one core, CPU worker on another; `--gpu-device cpu`)
on a one-layer checkpoint with --hidden, then from this process, pinned to the CPU worker's
cores, measures round trips:
  assist_roundtrip_us      handshake with an empty payload (OP_ECHO, 0 rows)
  assist_payload_us[b]     the same carrying b x hidden fp32 activations each way
  ring_roundtrip_us        engine -> CPU worker -> engine (an empty CPU step)
  zmq_roundtrip_us         a control Ping/Pong with the GPU worker
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

import torch
from common import emit

from dualpace.config import EngineConfig
from dualpace.demo_model import DemoSpec, make_demo_model
from dualpace.runtime import protocol as P
from dualpace.runtime.layouts import OP_ECHO
from dualpace.runtime.supervisor import Runtime


def pct(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"p50": round(statistics.median(s), 2), "p99": round(s[int(0.99 * (len(s) - 1))], 2),
            "mean": round(statistics.fmean(s), 2), "n": len(s)}


def assist_roundtrips(ch, hidden: int, rows: int, n: int) -> list[float]:
    x = torch.randn(rows, hidden)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        ch.call(OP_ECHO, 0, x, None, None, lambda: True, timeout=10)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


async def run(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec = DemoSpec(hidden_size=args.hidden, num_layers=1, num_heads=args.hidden // 128,
                        num_kv_heads=max(1, args.hidden // 512), intermediate_size=1024)
        path = make_demo_model(os.path.join(tmp, "m"), spec)
        rt = Runtime(EngineConfig(model=str(path), gpu_device="cpu", gpu_kv_blocks=16,
                                  cpu_kv_gib=0.05, max_num_seqs=max(args.rows)))
        await rt.start()
        allowed = os.sched_getaffinity(0)
        try:
            os.sched_setaffinity(0, list(rt.config.cpu_cores))
            torch.set_num_threads(len(list(rt.config.cpu_cores)))  # as the CPU worker does
            ch = rt.assist_channel()
            assist_roundtrips(ch, args.hidden, 0, 200)  # warm-up
            result = {"assist_roundtrip_us": pct(assist_roundtrips(ch, args.hidden, 0, args.n))}
            result["assist_payload_us"] = {
                str(b): pct(assist_roundtrips(ch, args.hidden, b, max(200, args.n // 10)))
                for b in args.rows}
            os.sched_setaffinity(0, allowed)  # the engine itself is not pinned
            ring = []
            for i in range(args.n // 2):
                t0 = time.perf_counter()
                await rt.cpu.step(P.CpuBatch(step_id=i + 1))
                ring.append((time.perf_counter() - t0) * 1e6)
            result["ring_roundtrip_us"] = pct(ring[50:])
            zmq_rt = []
            for i in range(args.n // 5):
                t0 = time.perf_counter()
                await rt.ping("gpu", 0, nonce=i)
                zmq_rt.append((time.perf_counter() - t0) * 1e6)
            result["zmq_roundtrip_us"] = pct(zmq_rt[20:])
            result.update({"gpu_cores": list(rt.config.gpu_cores),
                           "cpu_cores": list(rt.config.cpu_cores)})
        finally:
            await rt.stop()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--rows", default="1,32,256")
    ap.add_argument("-n", type=int, default=5000, help="round trips per measurement")
    args = ap.parse_args()
    args.rows = [int(x) for x in args.rows.split(",")]
    res = asyncio.run(run(args))
    res.update({"bench": "assist_latency", "hidden": args.hidden,
                "goal": {"assist_p50_us": 20, "assist_p99_us": 200}})
    emit(res, args.json)


if __name__ == "__main__":
    main()
