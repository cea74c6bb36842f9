"""The scheduler modules import no torch and no transport (the wire protocol, msgspec,
ZeroMQ): they are built and tested with fake workers, and reach workers only through
runtime/translator.py. The configuration imports neither torch, the kernels nor the
runtime: it is resolved (dualpace/resolved.py) before any process starts."""

from __future__ import annotations

import subprocess
import sys

SCHEDULER_MODULES = ["dualpace.engine.state", "dualpace.engine.gpu_round",
                     "dualpace.engine.cpu_round", "dualpace.engine.request",
                     "dualpace.engine.policy", "dualpace.engine.metrics",
                     "dualpace.engine.cost_model", "dualpace.engine.stall",
                     "dualpace.runtime.routing", "dualpace.kv.block_pool"]


FORBIDDEN = ["torch", "msgspec", "zmq", "dualpace.runtime.protocol", "dualpace.kernels",
             "dualpace.runtime.supervisor"]


def _imported(modules: list[str]) -> list[str]:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + f"print(','.join(m for m in {FORBIDDEN!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return [m for m in out.stdout.strip().split(",") if m]


def test_scheduler_imports_no_torch_and_no_transport():
    assert _imported(SCHEDULER_MODULES) == []


def test_config_imports_no_torch_kernels_or_runtime():
    assert _imported(["dualpace.config", "dualpace.profile_file"]) == []
