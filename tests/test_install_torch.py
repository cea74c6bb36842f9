"""bin/install-torch's decisions, with a stand-in nvidia-smi on PATH and the pip commands
printed instead of run (DUALPACE_INSTALL_DRY_RUN=1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bin" / "install-torch"


def _run(tmp_path: Path, python: str, cuda: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "DUALPACE_TORCH_INDEX"}
    env["DUALPACE_INSTALL_DRY_RUN"] = "1"
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    if cuda is not None:  # a GPU box whose driver supports CUDA `cuda`
        smi = fake / "nvidia-smi"
        smi.write_text("#!/bin/sh\n"
                       '[ "$1" = "-L" ] && { echo "GPU 0: NVIDIA H200"; exit 0; }\n'
                       f'echo "| NVIDIA-SMI 580.65  Driver Version: 580.65  '
                       f'CUDA Version: {cuda} |"\n')
        smi.chmod(0o755)
    env["PATH"] = f"{fake}:/usr/bin:/bin"
    return subprocess.run(["bash", str(SCRIPT), python], env=env, capture_output=True,
                          text=True, timeout=120)


def _no_torch(tmp_path: Path) -> str:
    """An interpreter in which `import torch` fails."""
    py = tmp_path / "py-without-torch"
    py.write_text("#!/bin/sh\nexit 1\n")
    py.chmod(0o755)
    return str(py)


@pytest.mark.parametrize("cuda,variant", [("13.0", "cu130"), ("13.2", "cu130"),
                                          ("12.9", "cu128"), ("12.8", "cu128"),
                                          ("12.6", "cu126")])
def test_gpu_box_without_torch_gets_the_build_its_driver_runs(tmp_path, cuda, variant):
    r = _run(tmp_path, _no_torch(tmp_path), cuda)
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if x.startswith("would run")]
    assert lines == [
        f"would run: pip install torch==2.13.0 --index-url "
        f"https://download.pytorch.org/whl/{variant}",
        f"would run: pip install -e {ROOT}[gpu]",
    ]


def test_driver_too_old_is_a_clear_error(tmp_path):
    r = _run(tmp_path, _no_torch(tmp_path), "12.4")
    assert r.returncode == 1 and "would run" not in r.stdout
    assert "supports CUDA 12.4" in r.stderr and "needs 12.6 or newer" in r.stderr


def test_cpu_torch_on_a_gpu_box_is_replaced_and_the_gpu_extra_installed(tmp_path):
    r = _run(tmp_path, sys.executable, "13.0")  # this venv: the CPU build
    assert r.returncode == 0, r.stderr
    assert "replacing CPU torch" in r.stdout
    assert "would run: pip install -e" in r.stdout and "[gpu]" in r.stdout


def test_no_gpu_keeps_the_cpu_build_or_installs_it(tmp_path):
    r = _run(tmp_path, sys.executable, None)
    assert r.returncode == 0 and r.stdout == ""  # 2.13.0 CPU already there
    r = _run(tmp_path, _no_torch(tmp_path), None)
    assert r.returncode == 0
    assert r.stdout.splitlines()[-1] == "would run: pip install torch==2.13.0"


def test_an_existing_cuda_torch_is_never_replaced(tmp_path):
    py = tmp_path / "py-with-cuda-torch"  # answers the script's probe as a CUDA build would
    py.write_text('#!/bin/sh\ncat >/dev/null\necho "2.11.0+cu130 cuda"\n')
    py.chmod(0o755)
    r = _run(tmp_path, str(py), "13.0")
    assert r.returncode == 0, r.stderr
    assert "keeping existing CUDA torch 2.11.0+cu130" in r.stdout
    assert [x for x in r.stdout.splitlines() if x.startswith("would run")] == [
        f"would run: pip install -e {ROOT}[gpu]"]
