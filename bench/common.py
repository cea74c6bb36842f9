"""Helpers shared by the benchmarks: timing medians, DRAM bandwidth, the reference model."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def turns(fns: list[Callable[[], object]], repeats: int) -> list[list[float]]:
    """Seconds of each fn, called in turns ``repeats`` times after one warm-up turn, so
    that every fn meets the same states of a shared host."""
    for f in fns:
        f()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for f, ts in zip(fns, times):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
    return times


def dram_read_bandwidth(threads: int | None = None, mib: int = 512, repeats: int = 5) -> float:
    """Bytes/s a C/OpenMP streaming read reaches with ``threads`` threads (same as kernels)."""
    from dualpace.kernels import cpu

    buf = torch.ones(mib * 1024 * 1024 // 4)
    t = median_time(lambda: cpu.stream_read(buf, threads), repeats, warmup=2)
    return buf.numel() * 4 / t


def parse_cache_size(text: str) -> int:
    """A sysfs cache size (``/sys/devices/system/cpu/cpu0/cache/index*/size``: "48K",
    "307200K", "2M") in bytes."""
    t = text.strip()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if t and t[-1].upper() in units:
        return int(t[:-1]) * units[t[-1].upper()]
    return int(t)


def llc_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The largest cache cpu0 reports (the last level), in bytes; None where sysfs says none."""
    sizes = []
    for index in sorted(root.glob("index*")):
        try:
            sizes.append(parse_cache_size((index / "size").read_text()))
        except (OSError, ValueError):
            continue
    return max(sizes) if sizes else None


def l2_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """cpu0's level-2 cache (data or unified), in bytes; None where sysfs says none."""
    for index in sorted(root.glob("index*")):
        try:
            if (int((index / "level").read_text()) == 2
                    and (index / "type").read_text().strip() in ("Data", "Unified")):
                return parse_cache_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
    return None


# The comparison models' vocabulary: the demo tokenizer's 261 entries and rows past them
# (never produced), so that the LM head is a 32k-vocabulary model's.
BENCH_VOCAB = 32000
DEMO_TOKENIZER_VOCAB = 261


def _bench_model_dir(name: str, **shape) -> Path:
    """A random-weight bench checkpoint of this shape, made once under the demo model's
    cache directory."""
    from dualpace.demo_model import DemoSpec, default_demo_dir, make_demo_model

    path = default_demo_dir().parent / name
    if not (path / "model.safetensors").is_file():
        make_demo_model(path, DemoSpec(extra_vocab=BENCH_VOCAB - DEMO_TOKENIZER_VOCAB, **shape))
    return path


def reference_model_dir() -> Path:
    """The llama.cpp comparison shape: hidden 512, 8 layers, vocab 32000, fp32 (~58M params)."""
    return _bench_model_dir("bench-llama-55m", hidden_size=512, num_layers=8, num_heads=8,
                            num_kv_heads=8, intermediate_size=1376)


# The past-the-cache bench model: the comparison model's vocabulary at hidden 1024, 16 heads
# over 8 KV heads, as many layers as its size asks.
PAST_LLC_SHAPE = {"hidden_size": 1024, "num_heads": 16, "num_kv_heads": 8,
                  "intermediate_size": 2752}


def layer_params(hidden_size: int, num_heads: int, num_kv_heads: int,
                 intermediate_size: int) -> int:
    """The params a decode step streams for one Llama layer: q and o, k and v, the MLP's
    three projections, two norms."""
    kv = hidden_size // num_heads * num_kv_heads
    return (2 * hidden_size * hidden_size + 2 * hidden_size * kv
            + 3 * hidden_size * intermediate_size + 2 * hidden_size)


# What a step streams beside the layers: the LM head and the final norm (the embedding only
# gives each row its token's vector).
PAST_LLC_LAYER_PARAMS = layer_params(**PAST_LLC_SHAPE)
PAST_LLC_FIXED_PARAMS = (BENCH_VOCAB + 1) * PAST_LLC_SHAPE["hidden_size"]


def past_llc_layers(min_bytes: int, elem_size: int = 4) -> int:
    """Layers of the past-the-cache bench model whose streamed weights (what
    ``iter_weight_bytes`` counts) reach ``min_bytes``."""
    need = -(-min_bytes // elem_size) - PAST_LLC_FIXED_PARAMS
    return max(1, -(-need // PAST_LLC_LAYER_PARAMS))


def past_llc_model_dir(min_bytes: int) -> Path:
    """A random-weight checkpoint of at least ``min_bytes`` of fp32 weights, made once:
    decode at batch 1 then streams its weights from DRAM, not from a last-level cache that
    holds them (the 55M comparison model's 167 MB sit in a 300 MiB L3)."""
    layers = past_llc_layers(min_bytes)
    return _bench_model_dir(f"bench-llama-h1024-{layers}l", num_layers=layers,
                            **PAST_LLC_SHAPE)


# Llama-3-8B's layer shape with the comparison model's vocabulary: its projections as a
# real 8B model streams them (gate/up 28672 x 4096, down 4096 x 14336) in a few layers.
LLAMA3_8B_SHAPE = {"hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8,
                   "intermediate_size": 14336}


def llama3_8b_model_dir(layers: int) -> Path:
    """A random-weight checkpoint of ``layers`` Llama-3-8B-shaped layers, made once (2
    layers: 2.3 GB of fp32 weights, 1.1 GB read a bf16 decode step)."""
    return _bench_model_dir(f"bench-llama-8b-{layers}l", num_layers=layers, **LLAMA3_8B_SHAPE)


def emit(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))


@functools.cache
def frozen_server_env() -> dict[str, str]:
    """The environment for the ``python -m dualpace serve`` processes of a long benchmark: a
    copy of the package as it was when the benchmark first asked (its built kernels
    included) ahead of the editable install on PYTHONPATH, removed at exit. A sweep starts
    its servers afresh for every point, minutes apart, and an edit of the tree meanwhile
    had them import code that the built kernels did not match (a 4-sweep validation died
    that way half an hour in)."""
    snapshot = Path(tempfile.mkdtemp(prefix="dualpace-bench-"))
    atexit.register(shutil.rmtree, snapshot, ignore_errors=True)
    shutil.copytree(REPO / "dualpace", snapshot / "dualpace",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(snapshot), env.get("PYTHONPATH")) if p)
    return env


def cpu_model() -> str:
    """The host CPU's model name from /proc/cpuinfo ("" where there is none): what a
    benchmark's JSON names its machine by (platform.processor() is empty on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), "")
    except OSError:
        return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape_metrics(url: str) -> dict[str, float]:
    """A server's /metrics as {sample name with labels: value}."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out


def wait_healthy(url: str, proc, timeout: float = 120.0) -> None:
    """Until GET /health answers 200; fails if the server process exits first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server at {url} did not become healthy") from None
            time.sleep(0.2)


def host_cpu_times() -> list[int] | None:
    """The aggregate CPU line of /proc/stat (user, nice, system, idle, iowait, irq, softirq,
    steal, ...) in clock ticks; None where there is none (not Linux)."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def steal_fraction(before: list[int] | None, after: list[int] | None) -> float | None:
    """The share of CPU time the hypervisor gave to other guests between two
    ``host_cpu_times`` readings (the "st" of vmstat): on a shared cloud box, a sweep whose
    share is high ran on less machine than its neighbours and says so in its JSON."""
    if before is None or after is None or len(before) < 8 or len(after) < 8:
        return None
    delta = [a - b for a, b in zip(after, before)]
    total = sum(delta[:8])  # guest time (fields 9-10) is already counted in user
    return round(delta[7] / total, 4) if total > 0 else None
