"""The prepared check for a GPU box, one command for one device call: prints one JSON object
and exits 0 only if every part passed.

    python bench/gpu_check.py [--json-out FILE] [--no-kernels] [--no-serve] [--no-decode]
                              [--decode-args '...'] [-- extra pytest args for tests/cuda]

Parts, each bounded in time so that all of them fit one 600 s call (the first H200 run took
275 s for the first four):
- ``device``/``host``: torch, CUDA and the GPU; the host CPU's model and ISA paths (AMX?),
  its DRAM streaming read on 1, 4, 8 and all threads, and page-locked upload/download
  bandwidth (the host link the simulator's hardware files describe);
- ``tests``: tests/cuda (a skip fails the check: on a GPU box nothing may skip), with
  tests/kernels beside it (CPU-bound; a GPU box's CPU may have paths CI has not, AMX);
- ``serve``: ``dualpace serve`` on the demo model on the GPU, one SSE stream and a loadgen
  run; the GPU must have generated the tokens and nothing gone Prefill-to-CPU (on an idle
  GPU with room; the first H200 run served everything from the CPU tier, a bug no test had
  caught, found by exactly this);
- ``gpu_decode``: bench/gpu_decode.py's decode and prefill figures against the rooflines.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
TESTS_TIMEOUT_S = 240  # the first H200 run: tests/cuda 152 s, tests/kernels beside it 145 s


def _device() -> dict:
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available()}
    if info["cuda_available"]:
        p = torch.cuda.get_device_properties(0)
        info.update(name=p.name, memory_gib=round(p.total_memory / (1 << 30), 1),
                    capability=f"{p.major}.{p.minor}")
    return info


def _host(cuda: bool) -> dict:
    """The host: CPU model, the C kernels' ISA paths, DRAM read bandwidth by threads and,
    with CUDA, a 1 GiB page-locked copy each way (median of 5)."""
    import torch
    from common import cpu_model, dram_read_bandwidth

    from dualpace.kernels import cpu

    out = {"cpu_model": cpu_model(), "cores": len(os.sched_getaffinity(0))}
    if cpu.available():
        out["isa_paths"] = cpu.supported_isas()
        out["default_isa"] = cpu.resolve_isa(None)
        threads = sorted({t for t in (1, 4, 8, out["cores"]) if t <= out["cores"]})
        out["dram_read_gbps"] = {str(t): round(dram_read_bandwidth(t, mib=1024) / 1e9, 1)
                                 for t in threads}
    if cuda:
        n = 1 << 30
        h = torch.empty(n, dtype=torch.uint8).pin_memory()
        d = torch.empty(n, dtype=torch.uint8, device="cuda")
        for name, copy in (("upload", lambda: d.copy_(h, non_blocking=True)),
                           ("download", lambda: h.copy_(d, non_blocking=True))):
            copy()
            torch.cuda.synchronize()
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                copy()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            out[f"pinned_{name}_gbps"] = round(n / sorted(times)[2] / 1e9, 1)
    return out


def _start_pytest(path: str, extra: list[str], xml: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "--tb=short", f"--junitxml={xml}", path, *extra], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _pytest_result(proc: subprocess.Popen, xml: Path, deadline: float, what: str) -> dict:
    """pass/fail/skip counts and the problems of one pytest run, killed at ``deadline``."""
    try:
        stdout, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, _ = proc.communicate()
        return {"rc": -1, "passed": 0, "failed": 0, "skipped": 0,
                "problems": [f"{what} did not finish within {TESTS_TIMEOUT_S} s",
                             (stdout or "")[-2000:]]}
    out = {"rc": proc.returncode, "passed": 0, "failed": 0, "skipped": 0, "problems": [],
           "tail": (stdout or "").strip().splitlines()[-1:]}
    if not xml.exists():
        out["problems"].append((stdout or "")[-2000:])
        return out
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            out["failed"] += 1
            out["problems"].append({"test": name, "message": (bad.get("message") or "")[:500]})
        elif case.find("skipped") is not None:
            out["skipped"] += 1
            out["problems"].append({"test": name,
                                    "skipped": case.find("skipped").get("message", "")})
        else:
            out["passed"] += 1
    return out


def _run_tests(extra: list[str], kernels: bool) -> dict:
    """tests/cuda, and tests/kernels beside it (CPU-bound while the other waits on the GPU)."""
    with tempfile.TemporaryDirectory() as tmp:
        deadline = time.monotonic() + TESTS_TIMEOUT_S
        runs = {"cuda": _start_pytest("tests/cuda", extra, Path(tmp) / "cuda.xml")}
        if kernels:
            runs["kernels"] = _start_pytest("tests/kernels", [], Path(tmp) / "kernels.xml")
        return {name: _pytest_result(proc, Path(tmp) / f"{name}.xml", deadline,
                                     f"tests/{name}")
                for name, proc in runs.items()}


def _sse_stream(url: str, prompt: str, max_tokens: int) -> dict:
    """One streamed completion: how many chunks carried text and how it finished."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    chunks, finish, done, first = 0, None, False, None
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            choice = json.loads(line[6:])["choices"][0]
            if first is None:
                first = time.perf_counter() - t0
            chunks += bool(choice.get("text"))
            finish = choice.get("finish_reason") or finish
    # The server's first request: on the H200 its TTFT was 717 ms against a 17 ms median
    # (Triton compiling a kernel variant the start-up had not?); kept to see it again.
    return {"text_chunks": chunks, "finish_reason": finish, "done": done,
            "first_chunk_ms": None if first is None else round(first * 1e3, 1)}


def serve_smoke(device: str, requests: int = 64, rate: float = 16.0,
                timeout: float = 150.0) -> dict:
    """``dualpace serve`` (the demo model, ``--gpu-device device``): one SSE stream, then
    ``requests`` random 256-token prompts of 64 outputs at ``rate`` req/s through
    bench/loadgen.py; ok when every request finished, the stream ended with [DONE], the GPU
    worker generated the tokens and nothing went Prefill-to-CPU."""
    from common import free_port, scrape_metrics, wait_healthy

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "dualpace", "serve", "--port", str(port),
                             "--gpu-device", device, "--log-level", "warning"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: dict = {"device": device}
    try:
        wait_healthy(url, proc, timeout=timeout / 2)
        out["start_s"] = round(time.monotonic() - t0, 1)
        out["stream"] = _sse_stream(url, "Hello, GPU", 16)
        lg = subprocess.run([sys.executable, str(ROOT / "bench" / "loadgen.py"), "--base-url",
                             url, "--dataset", "random", "--num-requests", str(requests),
                             "--random-input-len", "256", "--random-output-len", "64",
                             "--request-rate", str(rate), "--no-progress", "--json"],
                            capture_output=True, text=True,
                            timeout=max(10.0, timeout - (time.monotonic() - t0)))
        if lg.returncode != 0:
            raise RuntimeError(f"loadgen failed: {lg.stderr[-1500:]}")
        run = json.loads(lg.stdout.strip().splitlines()[-1])
        out["loadgen"] = {k: run.get(k) for k in (
            "completed", "failed", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
            "median_itl_ms", "p99_itl_ms")}
        m = scrape_metrics(url)
        out["tokens"] = {tier: m.get(f'dualpace:generation_tokens_total{{engine="{tier}"}}',
                                     0.0) for tier in ("gpu", "cpu")}
        out["prefill_to_cpu"] = m.get('dualpace:kv_migrations_total{kind="prefill-to-cpu"}',
                                      0.0)
        out["ok"] = (run.get("completed") == requests and not run.get("failed")
                     and out["stream"]["done"] and out["stream"]["text_chunks"] > 0
                     and out["prefill_to_cpu"] == 0
                     and out["tokens"]["gpu"] >= requests * 64)
    except Exception as e:  # the check reports what broke and goes on to the next part
        out.update(ok=False, error=f"{type(e).__name__}: {e}")
    finally:
        proc.terminate()
        try:
            log, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            log, _ = proc.communicate()
        if not out.get("ok"):
            out["server_log_tail"] = (log or "")[-3000:]
    return out


def _gpu_decode(extra: list[str], timeout: float) -> dict:
    """bench/gpu_decode.py's JSON (decode and prefill per backend against the rooflines)."""
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_decode.py"), "--json",
                               *extra], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"gpu_decode.py did not finish within {timeout:.0f} s"}
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _tests_ok(tests: dict) -> bool:
    return all(r["rc"] == 0 and r["skipped"] == 0 and r["passed"] > 0 for r in tests.values()
               ) if tests.get("cuda") is not None else False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json-out", default="")
    ap.add_argument("--no-kernels", action="store_true", help="skip tests/kernels")
    ap.add_argument("--no-serve", action="store_true", help="skip the served smoke run")
    ap.add_argument("--no-decode", action="store_true", help="skip bench/gpu_decode.py")
    ap.add_argument("--decode-args", default="--batches 1,16,64,256 --contexts 1024,8192 "
                    "--prefill 512,2048,8192 --backends triton",
                    help="gpu_decode.py's arguments")
    ap.add_argument("--decode-timeout", type=float, default=120.0,
                    help="seconds gpu_decode.py may take (a device call is 600 s at most)")
    ap.add_argument("pytest_args", nargs="*")
    args = ap.parse_args()
    report = {"bench": "gpu_check", "device": _device()}
    cuda = report["device"]["cuda_available"]
    report["host"] = _host(cuda)
    ok = cuda
    if cuda:
        report["tests"] = _run_tests(args.pytest_args, not args.no_kernels)
        ok = _tests_ok(report["tests"])
        if not args.no_serve:
            report["serve"] = serve_smoke("cuda")
            ok = ok and report["serve"]["ok"]
        if not args.no_decode:
            report["gpu_decode"] = _gpu_decode(args.decode_args.split(), args.decode_timeout)
            ok = ok and "error" not in report["gpu_decode"]
    report["ok"] = bool(ok)
    text = json.dumps(report)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
