"""The prepared check for a GPU box: runs the CUDA test suite (tests/cuda) and
bench/gpu_decode.py, and prints one JSON object: the device, torch and CUDA versions, the
tests' outcome and the decode/prefill figures. Exit status 0 only if CUDA is usable and
every CUDA test passed (a skip fails it: on a GPU box nothing may skip).

    python bench/gpu_check.py [--json-out FILE] [-- extra pytest args]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS_TIMEOUT_S = 360  # leaves gpu_decode room inside one 600 s device call


def _device() -> dict:
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available()}
    if info["cuda_available"]:
        p = torch.cuda.get_device_properties(0)
        info.update(name=p.name, memory_gib=round(p.total_memory / (1 << 30), 1),
                    capability=f"{p.major}.{p.minor}")
    return info


def _run_tests(extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p",
                                   "no:cacheprovider", f"--junitxml={xml}", "tests/cuda",
                                   *extra], cwd=ROOT, capture_output=True, text=True,
                                  timeout=TESTS_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            return {"rc": -1, "passed": 0, "failed": 0, "skipped": 0,
                    "problems": [f"tests/cuda did not finish within {TESTS_TIMEOUT_S} s",
                                 (e.stdout or b"")[-2000:].decode(errors="replace")
                                 if isinstance(e.stdout, bytes) else (e.stdout or "")[-2000:]],
                    "tail": []}
        out = {"rc": proc.returncode, "passed": 0, "failed": 0, "skipped": 0, "problems": [],
               "tail": proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []}
        if not xml.exists():
            out["problems"].append(proc.stderr[-2000:])
            return out
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if bad is not None:
                out["failed"] += 1
                out["problems"].append({"test": name, "message": (bad.get("message") or "")[:500]})
            elif case.find("skipped") is not None:
                out["skipped"] += 1
                out["problems"].append({"test": name, "skipped": case.find("skipped").get(
                    "message", "")})
            else:
                out["passed"] += 1
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json-out", default="")
    ap.add_argument("--no-decode", action="store_true", help="skip bench/gpu_decode.py")
    ap.add_argument("--decode-args", default="",
                    help="extra gpu_decode.py arguments, e.g. '--batches 1,64 --repeats 3'")
    ap.add_argument("--decode-timeout", type=float, default=300.0,
                    help="seconds gpu_decode.py may take (a device call is 600 s at most)")
    ap.add_argument("pytest_args", nargs="*")
    args = ap.parse_args()
    report = {"bench": "gpu_check", "device": _device()}
    if report["device"]["cuda_available"]:
        report["tests"] = _run_tests(args.pytest_args)
        if not args.no_decode:
            report["gpu_decode"] = _gpu_decode(args.decode_args.split(),
                                               args.decode_timeout)
    ok = (report["device"]["cuda_available"] and report["tests"]["rc"] == 0
          and report["tests"]["skipped"] == 0 and report["tests"]["passed"] > 0)
    report["ok"] = bool(ok)
    text = json.dumps(report)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
