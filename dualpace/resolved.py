"""The configuration resolved once, before any process starts (DESIGN.md §Processes).

``EngineConfig`` (config.py) is what the operator asked for; ``ResolvedConfig`` is what runs:
the profile applied (flags win), the GPU device and both compute dtypes probed, the CPU
kernel ISA chosen ($DUALPACE_CPU_ISA validated here, so a bad value fails in the supervisor
with one clear error, not in every worker), the KV pools sized, the Eq. 5 thresholds and the
CPU batch limit C settled, the cores split. ``ServingEngine``, ``Runtime`` and every worker
consume this one immutable object; the workers get it typed inside their ``WorkerSpec``.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

import msgspec

from dualpace.config import DEFAULT_CPU_BATCH_LIMIT, EngineConfig, parse_thresholds
from dualpace.engine.policy import Policy, policy_named
from dualpace.kv.block_pool import blocks_for_tokens
from dualpace.runtime.layouts import DTYPES, AssistLayout, HostKVLayout
from dualpace.runtime.routing import no_assist

log = logging.getLogger("dualpace")

# Default GPU-side pool of a CPU "GPU" when --gpu-kv-blocks is not given (a CUDA worker sizes
# its pool from --gpu-memory-utilization: runtime/gpu_memory.py).
DEFAULT_GPU_KV_BYTES = 512 << 20


class ResolvedConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    model: str
    policy: str
    gpu_device: str  # "cpu", "cuda" or "cuda:N": never "auto"
    gpu_dtype: str  # never "auto"
    cpu_dtype: str
    cpu_isa: str  # the CPU kernels' path: scalar | avx2 | avx512; "" without the extension
    block_size: int
    gpu_kv_blocks: int  # 0 until a CUDA GPU worker sized its pool (the Runtime fills it in)
    gpu_memory_utilization: float
    attention_backend: str  # the GPU worker's: "triton" | "flashinfer" | "torch"; not "auto"
    cuda_graphs: bool  # decode replays captured graphs (CUDA, triton/flashinfer, not eager)
    async_scheduling: bool  # GPU decode steps submitted ahead (engine/lookahead.py)
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    cpu_batch_limit: int  # C
    thresholds: tuple[int, int]  # (P, F) of Eq. 5
    staging_blocks: int
    gpu_tp: int
    cpu_tp: int
    gpu_cores: tuple[int, ...]
    cpu_cores: tuple[int, ...]
    # No GPU and no core flags: both workers may use every allowed core, their thread counts
    # following the other tier's occupancy (runtime/thread_share.py); the two core lists are
    # then each worker's share while the other is busy.
    shared_cores: bool
    startup_timeout: float
    max_restarts: int
    host_kv: HostKVLayout  # one CPU rank's region of the host KV pool
    assist: AssistLayout  # one Dense Assist channel
    profile: str = ""  # the profile file that was applied, if any

    @property
    def policy_object(self) -> Policy:
        return policy_named(self.policy)

    @property
    def host_kv_blocks(self) -> int:
        return self.host_kv.num_blocks

    def serves_boundaries(self) -> bool:
        """Whether the GPU worker checks for assists at stage boundaries: the engine's
        policy and thresholds decide it, the same for the engine and the workers."""
        return self.policy_object.serves_boundaries(self.cpu_batch_limit, *self.thresholds)


def _gpu_device(name: str) -> str:
    """``auto``: CUDA when torch can use it. An NVIDIA GPU that torch cannot use (a CPU build,
    a CUDA build newer than the driver) is said loudly: the "GPU" worker then runs on CPU."""
    if name != "auto":
        return name
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if shutil.which("nvidia-smi") and subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True).returncode == 0:
        log.warning("an NVIDIA GPU is present but torch %s cannot use it (torch.version.cuda "
                    "= %s): the GPU worker runs on CPU; see README, Install on a GPU box",
                    torch.__version__, torch.version.cuda)
    return "cpu"


GRAPH_BACKENDS = ("triton", "flashinfer")  # attention that decode CUDA graphs can capture


def _attention_backend(requested: str, device: str, block_size: int) -> str:
    """``auto`` (issue 12): on CUDA, FlashInfer when it imports (the ``gpu`` extra), else
    Triton when it imports and the block size suits its tiles (>= 16), else the torch
    reference; off CUDA the torch reference. The GPU worker then checks the choice on its
    device (model/attention_check.py) and falls back along the same order. ``triton`` off
    CUDA runs only under Triton's interpreter (TRITON_INTERPRET=1: tests); anywhere else it
    is an error, as is a block size < 16."""
    import importlib.util

    have = importlib.util.find_spec("triton") is not None
    if requested == "auto":
        cuda = device.startswith("cuda")
        if cuda and importlib.util.find_spec("flashinfer") is not None:
            backend = "flashinfer"
        elif cuda and have and block_size >= 16:
            backend = "triton"
        else:
            backend = "torch"
        log.info("attention backend: %s (auto, on %s)", backend, device)
        return backend
    if requested == "flashinfer":
        if not device.startswith("cuda"):
            raise ValueError("attention_backend: flashinfer needs a CUDA GPU worker")
        if importlib.util.find_spec("flashinfer") is None:
            raise ValueError("attention_backend: flashinfer is not installed (the gpu extra: "
                             "pip install -e '.[gpu]')")
    if requested == "triton":
        if not have:
            raise ValueError("attention_backend: triton is not installed")
        if not device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("attention_backend: triton needs a CUDA GPU worker (or "
                             "TRITON_INTERPRET=1, Triton's CPU interpreter, for tests)")
        if block_size < 16:
            raise ValueError(f"attention_backend: triton needs block_size >= 16, got "
                             f"{block_size}")
    return requested


def _cpu_dtype_and_isa(requested: str) -> tuple[str, str]:
    """BF16 where the CPU has AMX, else FP32 (DESIGN.md). With AMX the CPU worker's
    decode stages run natively on bf16 weights (half the bytes of fp32; AMX tiles from 4
    rows, cext/linear_amx.c) and prefill chunks on oneDNN's AMX GEMMs; without it bf16
    halves the weight bytes but torch's bf16 linear (prefill chunks) is several times
    slower than fp32."""
    from dualpace.kernels import cpu

    have = cpu.available()
    isa = cpu.resolve_isa() if have else ""
    if have:
        cpu.prefill_gemm_isa()  # $DUALPACE_PREFILL_GEMM validated here too, as the ISA is
    if requested != "auto":
        return requested, isa
    amx = have and cpu.cpu_features()["amx_bf16"]
    return ("bfloat16" if amx else "float32"), isa


def resolve(config: EngineConfig) -> ResolvedConfig:
    """Everything a run needs, from the operator's config, the profile, the checkpoint and
    this machine; raises ValueError with the offending option named."""
    from dualpace.model.config import load_model_config
    from dualpace.profile_file import apply_profile
    from dualpace.runtime.placement import split_cores

    config = apply_profile(config)
    mc = load_model_config(config.model)
    max_len = config.max_model_len or mc.max_position_embeddings
    device = _gpu_device(config.gpu_device)
    gpu_dtype = config.dtype if config.dtype != "auto" else (
        "bfloat16" if device.startswith("cuda") else "float32")
    bs = config.block_size
    kv_row = 2 * mc.num_layers * mc.num_kv_heads * bs * mc.head_dim
    gpu_blocks = config.gpu_kv_blocks
    if not gpu_blocks and not device.startswith("cuda"):
        wanted = config.max_num_seqs * blocks_for_tokens(max_len, bs)
        per_block = kv_row * DTYPES[gpu_dtype].itemsize
        gpu_blocks = max(1, min(wanted, DEFAULT_GPU_KV_BYTES // per_block))
    mc.shard(config.gpu_tp)  # divisibility of heads / MLP, with a clear error
    mc.shard(config.cpu_tp)
    cpu_dtype, isa = _cpu_dtype_and_isa(config.cpu_dtype)
    per_host_block = kv_row * DTYPES[cpu_dtype].itemsize
    host_blocks = int(config.cpu_kv_gib * (1 << 30)) // per_host_block
    if host_blocks < 1:
        raise ValueError(f"cpu_kv_gib: {config.cpu_kv_gib} GiB holds no KV block "
                         f"({per_host_block} bytes each)")
    limit = config.cpu_batch_limit or DEFAULT_CPU_BATCH_LIMIT
    # With no thresholds configured, F = C: every batch the tier can form is Full-CPU and
    # the GPU runs whole forwards (§4.2).
    thresholds = (parse_thresholds(config.assist_thresholds) if config.assist_thresholds
                  else no_assist(limit))
    # Staging for Prefill-to-CPU (gpu_worker.StagingKV holds two such buffers): one layer of
    # a full batched-token budget, or of the longest prompt (one past the batched-token limit
    # goes alone in its round), plus one block per row for the rounding of each prompt's last
    # block.
    staging = (blocks_for_tokens(max(config.max_num_batched_tokens, max_len), bs)
               + config.max_num_seqs)
    backend = _attention_backend(config.attention_backend, device, bs)
    allowed = sorted(os.sched_getaffinity(0))
    gpu_cores, cpu_cores = split_cores(allowed, config.gpu_cores, config.cpu_cores)
    shared = (device == "cpu" and not config.gpu_cores and not config.cpu_cores
              and len(allowed) >= 2 and config.gpu_tp == 1 and config.cpu_tp == 1)
    return ResolvedConfig(
        model=config.model, policy=config.policy, gpu_device=device, gpu_dtype=gpu_dtype,
        cpu_dtype=cpu_dtype, cpu_isa=isa, block_size=bs, gpu_kv_blocks=gpu_blocks,
        gpu_memory_utilization=config.gpu_memory_utilization,
        attention_backend=backend,
        cuda_graphs=(device.startswith("cuda") and backend in GRAPH_BACKENDS
                     and not config.enforce_eager),
        async_scheduling=config.async_scheduling, max_model_len=max_len,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens, cpu_batch_limit=limit,
        thresholds=thresholds, staging_blocks=staging, gpu_tp=config.gpu_tp,
        cpu_tp=config.cpu_tp, gpu_cores=tuple(gpu_cores), cpu_cores=tuple(cpu_cores),
        shared_cores=shared,
        startup_timeout=config.startup_timeout, max_restarts=config.max_restarts,
        host_kv=HostKVLayout(mc.num_layers, host_blocks, mc.num_kv_heads // config.cpu_tp, bs,
                             mc.head_dim, cpu_dtype),
        assist=AssistLayout(max_rows=limit, hidden=mc.hidden_size, kv_dim=mc.kv_size,
                            attn_dim=mc.q_size),
        profile=config.profile,
    )
