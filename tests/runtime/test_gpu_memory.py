"""GPU KV pool sizing (runtime/gpu_memory.py): vLLM's rule, the profiling forward, and how a
CUDA worker's measured size becomes the configuration."""

from __future__ import annotations

import msgspec
import pytest
import torch

from dualpace.config import EngineConfig
from dualpace.model.config import load_model_config
from dualpace.model.stages import StagedModel
from dualpace.model.weights import Shard, load_weights
from dualpace.resolved import DEFAULT_GPU_KV_BYTES, resolve
from dualpace.runtime.gpu_memory import kv_blocks_for_memory, profile_forward
from dualpace.runtime.gpu_worker import StagingKV
from dualpace.runtime.supervisor import Runtime

GIB = 1 << 30


def test_kv_blocks_literal_cases():
    # 100 GiB card, 90% allowed, nothing outside torch, 20 GiB peak: 70 GiB of 1 MiB blocks.
    assert kv_blocks_for_memory(100 * GIB, 80 * GIB, 20 * GIB, 20 * GIB, 0.9, 1 << 20) \
        == 70 * 1024
    # 2 GiB used outside torch (context, another process): it comes off the KV share.
    assert kv_blocks_for_memory(100 * GIB, 78 * GIB, 20 * GIB, 20 * GIB, 0.9, 1 << 20) \
        == 68 * 1024
    # torch reserves more than it peaked at: the cache is torch's, not "outside".
    assert kv_blocks_for_memory(100 * GIB, 70 * GIB, 20 * GIB, 30 * GIB, 0.9, 1 << 20) \
        == 70 * 1024
    # Whole blocks only.
    assert kv_blocks_for_memory(10 * GIB, 10 * GIB, 0, 0, 0.5, 3 * GIB) == 1


def test_no_room_for_kv_is_a_clear_error():
    with pytest.raises(ValueError, match=r"no GPU memory left for the KV cache.*"
                                          r"--gpu-memory-utilization"):
        kv_blocks_for_memory(24 * GIB, 8 * GIB, 16 * GIB, 16 * GIB, 0.5, 1 << 20)


def test_profiling_forward_fills_the_staging_area(llama_checkpoint):
    """The largest step: the token budget as sequences of at most max_len, written into the
    staging area (which is sized for it), and the LM head over max_num_seqs rows."""
    path, _ = llama_checkpoint
    cfg = load_model_config(str(path))
    model = StagedModel(cfg, load_weights(str(path), cfg, torch.float32, "cpu", Shard(0, 1)),
                        64)
    staging = StagingKV(cfg.num_layers, 40, cfg.num_kv_heads, 4, cfg.head_dim, torch.float32,
                        torch.device("cpu"))
    profile_forward(model, staging, num_tokens=150, num_rows=8, max_len=64)
    written = (staging.k[0].abs().sum(dim=(1, 2, 3)) > 0).sum().item()
    assert written == 16 + 16 + 6  # 64 + 64 + 22 tokens in blocks of 4


def test_cuda_pool_is_left_to_the_worker_and_flags_win(llama_checkpoint):
    path = str(llama_checkpoint[0])
    rc = resolve(EngineConfig(model=path, gpu_device="cuda"))
    assert rc.gpu_kv_blocks == 0 and rc.gpu_memory_utilization == 0.9
    assert resolve(EngineConfig(model=path, gpu_device="cuda", gpu_kv_blocks=77)).gpu_kv_blocks \
        == 77
    cpu = resolve(EngineConfig(model=path, gpu_device="cpu"))
    mc = load_model_config(path)
    per_block = 2 * mc.num_layers * mc.num_kv_heads * 16 * mc.head_dim * 4
    wanted = 64 * -(-cpu.max_model_len // 16)
    assert cpu.gpu_kv_blocks == min(wanted, DEFAULT_GPU_KV_BYTES // per_block)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(model=path, gpu_memory_utilization=1.5)


def test_the_smallest_rank_report_becomes_the_configuration(llama_checkpoint):
    path = str(llama_checkpoint[0])
    rc = msgspec.structs.replace(resolve(EngineConfig(model=path, gpu_device="cpu")),
                                 gpu_kv_blocks=0, gpu_tp=2)
    rt = Runtime(rc)
    rt._kv_blocks = {0: 900, 1: 870}
    rt._settle_gpu_kv_blocks()
    assert rt.config.gpu_kv_blocks == 870
    rt._kv_blocks = {0: 870, 1: 870}
    rt._settle_gpu_kv_blocks()  # a restart: the workers were told 870 and report it
    rt._kv_blocks = {0: 870, 1: 500}
    with pytest.raises(RuntimeError, match=r"report \[870, 500\] KV blocks"):
        rt._settle_gpu_kv_blocks()
    fresh = Runtime(rc)
    fresh._kv_blocks = {0: 10}
    with pytest.raises(RuntimeError, match="no KV pool size"):
        fresh._settle_gpu_kv_blocks()
