"""The engine configuration: one immutable object built at start-up and passed down.

Field names are the CLI flag names with underscores (``--gpu-kv-blocks`` -> gpu_kv_blocks), so
``LLM(model_dir, **options)`` and ``dualpace serve --flags`` share one vocabulary.

This is what the operator asked for, validated; nothing here probes the machine. Probing
and sizing happen once, in ``dualpace/resolved.py``, before any process starts. No torch,
no kernels, no runtime: a config can be built and checked anywhere.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

_DTYPES = ("bfloat16", "float16", "float32")
DEFAULT_CPU_BATCH_LIMIT = 256  # C without a flag or profile: the paper's (Fig. 7b, §6.4)


def parse_thresholds(text: str) -> tuple[int, int]:
    """``"P,F"`` -> (P, F). Legal: (0, 0) or 0 <= F < P (Eq. 5)."""
    try:
        p_str, f_str = text.split(",")
        p, f = int(p_str), int(f_str)
    except ValueError:
        raise ValueError(
            f"assist_thresholds: expected 'P,F' (two integers), got {text!r}") from None
    check_thresholds(p, f)
    return p, f


def check_thresholds(p: int, f: int) -> None:
    if not ((p, f) == (0, 0) or 0 <= f < p):
        raise ValueError(f"assist_thresholds: need (P, F) = (0, 0) or 0 <= F < P, got ({p}, {f})")


FLAG_HELP = {
    "gpu_device": "auto | cpu | cuda[:N]: where the GPU worker runs",
    "dtype": "GPU-worker compute dtype: auto | float32 | bfloat16 | float16",
    "block_size": "KV block size in tokens",
    "gpu_kv_blocks": "KV blocks in the GPU-side pool (0: sized automatically: on CUDA from "
                     "--gpu-memory-utilization after a profiling forward, else 512 MiB)",
    "gpu_memory_utilization": "fraction of the GPU's memory this instance may use (weights, "
                              "activations and KV; CUDA only)",
    "max_model_len": "longest prompt + output (0: the checkpoint's limit)",
    "max_num_seqs": "most requests in a GPU batch / owned by the CPU tier",
    "enforce_eager": "no CUDA graphs: decode steps launch their kernels one by one",
    "attention_backend": "GPU worker's paged attention: auto (on CUDA flashinfer when "
                         "importable, else triton when importable and block_size >= 16, "
                         "else torch) | triton | flashinfer | torch",
    "async_scheduling": "submit a GPU decode step before the previous step's result is "
                        "applied while the next round is known to be the same decodes (a "
                        "prompt arriving meanwhile waits a step more)",
    "policy": "dualpace | gated (NEO-style baseline) | gpu-only (vLLM-style baseline)",
    "cpu_batch_limit": "CPU decode batch limit C (0: the profile's, else 256)",
    "cpu_kv_gib": "host (CPU-tier) KV pool size in GiB",
    "cpu_dtype": "CPU-worker compute dtype: auto (bfloat16 with AMX, else float32)",
    "max_num_batched_tokens": "GPU batched-token limit (chunked prefill, staging size)",
    "assist_thresholds": "'P,F' post-attention routing (Eq. 5): Full-CPU b<=F, Split-Final "
                         "F<b<=P, Fused-Assist b>P; 0,0 = always Fused-Assist; default: the "
                         "profile's, else none (F = C, Dense Assist off)",
    "gpu_cores": "cores of the GPU worker(s), e.g. 0-1 (default: a quarter of the allowed)",
    "cpu_cores": "cores of the CPU worker(s), e.g. 2-15 (default: the rest)",
    "gpu_tp": "tensor-parallel ranks of the GPU worker group",
    "cpu_tp": "tensor-parallel ranks of the CPU worker group",
    "startup_timeout": "seconds for the workers to load and say hello",
    "max_restarts": "worker-group restarts before the server gives up",
    "profile": "profile JSON (assist thresholds, batch limits, CPU dtype); flags win",
}


@dataclass(frozen=True)
class EngineConfig:
    model: str
    gpu_device: str = "auto"  # "auto": cuda when available, else cpu
    dtype: str = "auto"  # "auto": bfloat16 on CUDA, float32 on CPU
    block_size: int = 16
    gpu_kv_blocks: int = 0  # 0: CUDA: from gpu_memory_utilization; else up to 512 MiB
    gpu_memory_utilization: float = 0.90  # vLLM's default
    max_model_len: int = 0  # 0: the checkpoint's max_position_embeddings
    max_num_seqs: int = 64  # rows of a GPU batch (not a bound on the CPU tier)
    attention_backend: str = "auto"  # the GPU worker's: auto | triton | flashinfer | torch
    enforce_eager: bool = False  # no CUDA graphs for decode
    async_scheduling: bool = False  # GPU decode steps ahead of their predecessor's result
    # --- the dual-engine runtime ----------------------------------------------------------
    policy: str = "dualpace"  # dualpace | gated (NEO-style) | gpu-only (vLLM-style)
    cpu_batch_limit: int = 0  # C, the CPU decode batch limit (0: the profile's, else 256)
    cpu_kv_gib: float = 2.0  # host (CPU-tier) KV pool
    cpu_dtype: str = "auto"  # CPU worker compute dtype: "auto" = bfloat16 with AMX, else fp32
    max_num_batched_tokens: int = 2048  # GPU batched-token limit (also the staging size)
    assist_thresholds: str = ""  # "P,F" (Eq. 5); empty = from --profile, else no assist
    gpu_cores: str = ""  # e.g. "0-3"; empty = split the allowed cores
    cpu_cores: str = ""
    gpu_tp: int = 1  # tensor-parallel ranks (processes) of the GPU worker group
    cpu_tp: int = 1  # ... and of the CPU worker group
    startup_timeout: float = 120.0  # seconds for every worker to load and say hello
    max_restarts: int = 3  # worker-group restarts before the runtime gives up
    profile: str = ""  # a `dualpace profile` JSON: thresholds and limits (flags win)

    def __post_init__(self):
        if self.gpu_device not in ("auto", "cpu") and not self.gpu_device.startswith("cuda"):
            raise ValueError(f"gpu_device: expected auto, cpu or cuda[:N], got {self.gpu_device!r}")
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(
                f"dtype: expected auto or one of {sorted(_DTYPES)}, got {self.dtype!r}"
            )
        if self.block_size not in (8, 16, 32, 64, 128):
            raise ValueError(f"block_size: expected 8, 16, 32, 64 or 128, got {self.block_size}")
        for name in ("gpu_kv_blocks", "max_model_len"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization: must be in (0, 1], got "
                             f"{self.gpu_memory_utilization}")
        if self.attention_backend not in ("auto", "triton", "flashinfer", "torch"):
            raise ValueError("attention_backend: expected auto, triton, flashinfer or torch, "
                             f"got {self.attention_backend!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs: must be >= 1, got {self.max_num_seqs}")
        if self.policy not in ("dualpace", "gated", "gpu-only"):
            raise ValueError(f"policy: expected dualpace, gated or gpu-only, got {self.policy!r}")
        if self.cpu_batch_limit < 0:
            raise ValueError(f"cpu_batch_limit: must be >= 0, got {self.cpu_batch_limit}")
        if self.cpu_kv_gib <= 0:
            raise ValueError(f"cpu_kv_gib: must be > 0, got {self.cpu_kv_gib}")
        if self.cpu_dtype != "auto" and self.cpu_dtype not in _DTYPES:
            raise ValueError(f"cpu_dtype: expected auto or one of {sorted(_DTYPES)}, "
                             f"got {self.cpu_dtype!r}")
        if self.max_num_batched_tokens < self.block_size:
            raise ValueError("max_num_batched_tokens: must be >= block_size, got "
                             f"{self.max_num_batched_tokens}")
        if self.assist_thresholds:
            parse_thresholds(self.assist_thresholds)
        if self.gpu_tp < 1 or self.cpu_tp < 1:
            raise ValueError(f"gpu_tp/cpu_tp: must be >= 1, got {self.gpu_tp}/{self.cpu_tp}")
        if self.startup_timeout <= 0 or self.max_restarts < 0:
            raise ValueError("startup_timeout must be > 0 and max_restarts >= 0")

    @classmethod
    def from_options(cls, model: str, **options) -> EngineConfig:
        known = {f.name for f in dataclasses.fields(cls)} - {"model"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown option(s) {unknown}; known: {sorted(known)}")
        return cls(model=model, **options)
