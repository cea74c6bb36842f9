"""bench/cpu_attention.py --dtypes: torch's names and the short ones, an unknown name refused
with the list before any measurement."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))


@pytest.mark.parametrize("name,dtype", [("bfloat16", torch.bfloat16), ("bf16", torch.bfloat16),
                                        ("BF16", torch.bfloat16), ("float32", torch.float32),
                                        ("fp32", torch.float32), ("f32", torch.float32),
                                        ("float16", torch.float16), ("fp16", torch.float16)])
def test_kv_dtype_names(name, dtype):
    from cpu_attention import kv_dtype

    assert kv_dtype(name) is dtype


def test_an_unknown_dtype_is_a_usage_error_naming_the_choices():
    from cpu_attention import kv_dtype

    with pytest.raises(ValueError, match=r"'bf17'.*bf16, bfloat16"):
        kv_dtype("bf17")
    proc = subprocess.run([sys.executable, str(BENCH / "cpu_attention.py"), "--dtypes",
                           "bf16,int8"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "unknown KV dtype 'int8'" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""
