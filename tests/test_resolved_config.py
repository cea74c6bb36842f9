"""The configuration is resolved once, before any process starts, and the workers get the
very object the engine uses (typed, inside their spec)."""

from __future__ import annotations

import json

import msgspec
import pytest

from dualpace.config import EngineConfig
from dualpace.kernels import cpu
from dualpace.resolved import ResolvedConfig, resolve
from dualpace.runtime import protocol as P


@pytest.fixture(scope="module")
def ckpt(llama_checkpoint):
    return llama_checkpoint[0]


def test_defaults_resolve_to_concrete_values(ckpt):
    rc = resolve(EngineConfig(model=str(ckpt), gpu_device="auto"))
    assert rc.gpu_device in ("cpu", "cuda") and rc.gpu_dtype != "auto"
    assert rc.cpu_dtype in ("float32", "bfloat16")
    assert rc.cpu_batch_limit == 256 and rc.thresholds == (257, 256)  # no assist: F = C
    assert not rc.serves_boundaries()
    mc = json.loads((ckpt / "config.json").read_text())
    assert rc.max_model_len == mc["max_position_embeddings"]
    # staging: one layer of max(batched tokens, longest prompt), plus a block per row
    assert rc.staging_blocks == -(-max(2048, rc.max_model_len) // 16) + 64
    assert rc.assist.max_rows == 256 and rc.host_kv.num_blocks >= 1


def test_flags_shape_the_resolution(ckpt):
    rc = resolve(EngineConfig(model=str(ckpt), gpu_device="cpu", cpu_batch_limit=40,
                              assist_thresholds="8,4", max_model_len=64))
    assert rc.thresholds == (8, 4) and rc.cpu_batch_limit == 40 and rc.serves_boundaries()
    assert rc.gpu_dtype == "float32" and rc.max_model_len == 64
    assert resolve(EngineConfig(model=str(ckpt), gpu_device="cpu",
                                cpu_batch_limit=40)).thresholds == (41, 40)
    gated = resolve(EngineConfig(model=str(ckpt), gpu_device="cpu",
                                 policy="gated"))
    # the gated baseline's forced route needs the GPU's stage boundaries whatever (P, F)
    assert gated.policy_object.forced_route == "neo-pipeline" and gated.serves_boundaries()


def test_profile_is_applied_in_resolution(ckpt, tmp_path):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"format": 2, "assist_thresholds": [0, 0],
                                "cpu_batch_limit": 32}))
    rc = resolve(EngineConfig(model=str(ckpt), gpu_device="cpu",
                              profile=str(prof)))
    assert rc.thresholds == (0, 0) and rc.cpu_batch_limit == 32 and rc.assist.max_rows == 32


def test_bad_isa_fails_in_resolution(ckpt, monkeypatch):
    if not cpu.available():
        pytest.skip("the C extension is not built")
    monkeypatch.setenv("DUALPACE_CPU_ISA", "sse9")
    with pytest.raises(ValueError, match="unknown ISA 'sse9'"):
        resolve(EngineConfig(model=str(ckpt), gpu_device="cpu"))
    monkeypatch.setenv("DUALPACE_CPU_ISA", "scalar")
    assert resolve(EngineConfig(model=str(ckpt), gpu_device="cpu")).cpu_isa == (
        "scalar")
    monkeypatch.delenv("DUALPACE_CPU_ISA")
    monkeypatch.setenv("DUALPACE_PREFILL_GEMM", "fastest")
    with pytest.raises(ValueError, match="DUALPACE_PREFILL_GEMM: expected auto, cext or torch"):
        resolve(EngineConfig(model=str(ckpt), gpu_device="cpu"))


def test_worker_spec_carries_the_typed_config(ckpt):
    rc = resolve(EngineConfig(model=str(ckpt), gpu_device="cpu"))
    spec = P.WorkerSpec(kind="cpu", rank=0, tp_size=1, parent_pid=1, config=rc, cores=[0],
                        control="ipc://x", runtime_dir="/tmp", shm={}, ring_in_offset=0,
                        ring_out_offset=0, ring_capacity=1, num_workers=2, wake_index=1,
                        gpu_wake_index=0, follower_wake_indices=[], eventfd=3,
                        num_host_regions=1)
    back = msgspec.json.decode(msgspec.json.encode(spec), type=P.WorkerSpec)
    assert isinstance(back.config, ResolvedConfig) and back.config == rc
    raw = json.loads(msgspec.json.encode(spec))
    raw["config"]["gpu_kv_blocks"] = "many"
    with pytest.raises(msgspec.ValidationError, match="gpu_kv_blocks"):
        msgspec.json.decode(json.dumps(raw).encode(), type=P.WorkerSpec)


def _flashinfer_importable(monkeypatch, yes: bool) -> None:
    import importlib.machinery
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name, *a, **k):
        if name == "flashinfer":
            return importlib.machinery.ModuleSpec("flashinfer", None) if yes else None
        return real(name, *a, **k)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_auto_prefers_flashinfer_on_cuda_when_it_imports(ckpt, monkeypatch):
    path = str(ckpt)
    _flashinfer_importable(monkeypatch, True)
    rc = resolve(EngineConfig(model=path, gpu_device="cuda"))
    assert rc.attention_backend == "flashinfer" and rc.cuda_graphs
    assert resolve(EngineConfig(model=path, gpu_device="cuda", block_size=8)
                   ).attention_backend == "flashinfer"  # any block size: no Triton tiles
    assert resolve(EngineConfig(model=path, gpu_device="cpu")).attention_backend == "torch"
    assert not resolve(EngineConfig(model=path, gpu_device="cuda", enforce_eager=True)
                       ).cuda_graphs


def test_attention_backend_resolution(ckpt, monkeypatch):
    path = str(ckpt)
    _flashinfer_importable(monkeypatch, False)
    assert resolve(EngineConfig(model=path, gpu_device="cpu")).attention_backend == "torch"
    # auto on CUDA without FlashInfer: Triton (installed with the dev extra) when the block
    # size suits it.
    assert resolve(EngineConfig(model=path, gpu_device="cuda")).attention_backend == "triton"
    assert resolve(EngineConfig(model=path, gpu_device="cuda", block_size=8)
                   ).attention_backend == "torch"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="triton needs a CUDA GPU worker"):
        resolve(EngineConfig(model=path, gpu_device="cpu", attention_backend="triton"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve(EngineConfig(model=path, gpu_device="cpu", attention_backend="triton")
                   ).attention_backend == "triton"
    with pytest.raises(ValueError, match="block_size >= 16"):
        resolve(EngineConfig(model=path, gpu_device="cuda", attention_backend="triton",
                             block_size=8))
    with pytest.raises(ValueError, match="flashinfer needs a CUDA GPU worker"):
        resolve(EngineConfig(model=path, gpu_device="cpu", attention_backend="flashinfer"))
    with pytest.raises(ValueError, match="attention_backend: expected auto, triton, flashinfer"):
        EngineConfig(model=path, attention_backend="xformers")


def test_cuda_graphs_follow_device_backend_and_enforce_eager(ckpt, monkeypatch):
    path = str(ckpt)
    _flashinfer_importable(monkeypatch, False)
    assert resolve(EngineConfig(model=path, gpu_device="cuda")).cuda_graphs
    assert not resolve(EngineConfig(model=path, gpu_device="cuda", enforce_eager=True)
                       ).cuda_graphs
    assert not resolve(EngineConfig(model=path, gpu_device="cuda", attention_backend="torch")
                       ).cuda_graphs
    assert not resolve(EngineConfig(model=path, gpu_device="cpu")).cuda_graphs
