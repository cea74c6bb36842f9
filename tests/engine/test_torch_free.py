"""The scheduler modules import no torch: they are built and tested with fake workers."""

from __future__ import annotations

import subprocess
import sys

SCHEDULER_MODULES = ["dualpace.engine.state", "dualpace.engine.gpu_round",
                     "dualpace.engine.cpu_round", "dualpace.engine.request",
                     "dualpace.engine.batches", "dualpace.engine.metrics",
                     "dualpace.runtime.routing", "dualpace.kv.block_pool"]


def test_scheduler_imports_no_torch():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in SCHEDULER_MODULES)
            + "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
