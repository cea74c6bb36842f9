"""Two builds of the server, one stream at a time, interleaved: which one is faster a token.

    python bench/serve_ab.py --a /path/to/tree-a --b /path/to/tree-b --json

Starts ``dualpace serve`` from each source tree (its own ``dualpace/`` and C module, this
venv's Python; build each tree's module first with ``cext/build.py``) on the same model,
then alternates single-stream greedy requests between them, A B, B A, ... ``--pairs`` times.
Per request: the time a token (first to last streamed token) and the server process's CPU
time a token (the engine and front end, from /proc; workers excluded). Reported: medians
per side and the median of the per-pair ratios A / B, the only comparison these shared VMs
allow (a server's single-stream speed moves by 25-40% within minutes; runs one after the
other compare the box's states). Extra ``serve`` flags per side: ``--a-args``/``--b-args``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from common import emit, free_port, wait_healthy


def summarize(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> dict:
    """(seconds a token, engine CPU seconds a token) per request of each side, in pair
    order -> medians (ms) and the median of the per-pair ratios A / B."""
    if not a or len(a) != len(b):
        raise ValueError("need as many requests on each side, at least one")
    ratio = [x[0] / y[0] for x, y in zip(a, b)]
    cpu_ratio = [x[1] / y[1] for x, y in zip(a, b) if y[1] > 0]
    return {
        "pairs": len(a),
        "a_ms_per_token": round(1e3 * statistics.median(x[0] for x in a), 3),
        "b_ms_per_token": round(1e3 * statistics.median(x[0] for x in b), 3),
        "a_engine_cpu_ms_per_token": round(1e3 * statistics.median(x[1] for x in a), 3),
        "b_engine_cpu_ms_per_token": round(1e3 * statistics.median(x[1] for x in b), 3),
        "a_over_b": round(statistics.median(ratio), 3),
        "a_over_b_engine_cpu": round(statistics.median(cpu_ratio), 3) if cpu_ratio else None,
        "a_faster_in": sum(r < 1 for r in ratio),
    }


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _one(url: str, pid: int, tokens: int) -> tuple[float, float]:
    body = {"prompt": "The quick brown fox", "max_tokens": tokens, "stream": True,
            "ignore_eos": True, "temperature": 0}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    stamps = []
    cpu0 = _cpu_seconds(pid)
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if line.startswith(b"data: {"):
                stamps.append(time.perf_counter())
    cpu = _cpu_seconds(pid) - cpu0
    if len(stamps) < 3:
        raise RuntimeError(f"{url}: {len(stamps)} chunks streamed, expected {tokens}")
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1), cpu / len(stamps)


def _start(tree: Path, model: str, extra: str):
    port = free_port()
    cmd = [sys.executable, "-m", "dualpace", "serve", "--model", model, "--port", str(port),
           "--gpu-device", "cpu", "--log-level", "warning", *extra.split()]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="source tree A (a checkout with its module)")
    ap.add_argument("--b", required=True, help="source tree B")
    ap.add_argument("--a-args", default="", help="extra serve flags for A")
    ap.add_argument("--b-args", default="", help="extra serve flags for B")
    ap.add_argument("--model", default=None, help="checkpoint (default: the peers' model)")
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.pairs < 1 or args.tokens < 3:
        ap.error("--pairs must be >= 1 and --tokens >= 3")
    trees = [Path(args.a).resolve(), Path(args.b).resolve()]
    for t in trees:
        if not (t / "dualpace" / "__init__.py").is_file():
            ap.error(f"{t}: not a DualPace source tree")
    if args.model is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
        from compare_peers import peer_checkpoint

        args.model = str(peer_checkpoint(None))
    servers = [_start(trees[0], args.model, args.a_args),
               _start(trees[1], args.model, args.b_args)]
    try:
        for proc, url in servers:
            wait_healthy(url, proc, timeout=300)
            _one(url, proc.pid, 32)  # warm-up
        runs: list[list[tuple[float, float]]] = [[], []]
        for i in range(args.pairs):
            for side in ((0, 1) if i % 2 == 0 else (1, 0)):
                proc, url = servers[side]
                runs[side].append(_one(url, proc.pid, args.tokens))
        out = {"bench": "serve_ab", "a": str(trees[0]), "b": str(trees[1]),
               "a_args": args.a_args, "b_args": args.b_args, "tokens": args.tokens,
               **summarize(runs[0], runs[1])}
    finally:
        for proc, _ in servers:
            proc.terminate()
        for proc, _ in servers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    emit(out, args.json)


if __name__ == "__main__":
    main()
