"""Hardware descriptions for the roofline cost model: public spec figures (each file names
its sources) plus efficiency factors and fixed overheads, which are assumptions, not specs.

A file is JSON: {"name", "gpu": {...}, "cpu": {...}, "host_kv_gib", "sources": {...}} with
the fields of ``GpuSpec`` and ``CpuSpec``. The shipped setups (``setups/``) are the paper's
three boxes and one H200 box; ``--hardware NAME`` finds them by file stem.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

SETUPS = Path(__file__).parent / "setups"


@dataclass(frozen=True)
class GpuSpec:
    count: int  # GPUs in the tensor-parallel group
    hbm_gib: float  # per GPU
    hbm_gbps: float  # per GPU
    bf16_tflops: float  # dense tensor-core BF16 (FP32 accumulate), per GPU
    link_gbps: float  # host link (PCIe), per direction, per GPU
    interconnect_gbps: float = 0.0  # GPU-GPU (NVLink) per direction; 0 with one GPU
    eff_mem: float = 0.8
    eff_flops: float = 0.6
    eff_link: float = 0.8
    step_overhead_s: float = 2e-3  # launch + scheduling + the worker round trip per step
    assist_overhead_s: float = 1e-4  # a Dense Assist call's launch and finalisation
    allreduce_latency_s: float = 1e-5
    memory_utilization: float = 0.9  # the share of HBM the runtime may use
    activation_reserve_gib: float = 2.0  # per GPU, outside weights and KV


@dataclass(frozen=True)
class CpuSpec:
    cores: int
    dram_gbps: float  # the NUMA node's DRAM bandwidth
    amx: bool
    amx_tflops_per_core: float = 0.36  # BF16 AMX, achieved (LIA: 20 TFLOPS / 56 cores)
    avx512_tflops_per_core: float = 0.08  # BF16 AVX-512 (LIA: AMX is up to 4.5x this)
    per_core_gbps: float = 15.0  # what one core can stream (assumption)
    eff_mem: float = 0.7
    eff_flops: float = 0.6
    step_overhead_s: float = 1e-3


@dataclass(frozen=True)
class Hardware:
    name: str
    gpu: GpuSpec
    cpu: CpuSpec
    host_kv_gib: float = 120.0
    sources: dict = dataclasses.field(default_factory=dict)

    def gpu_kv_blocks(self, weight_bytes: int, block_bytes: int) -> int:
        """HBM left for KV over the group: utilisation x memory - weights - activations."""
        g = self.gpu
        free = g.count * ((g.hbm_gib * g.memory_utilization - g.activation_reserve_gib)
                          * 2**30) - weight_bytes
        return max(int(free // block_bytes), 0)

    def host_kv_blocks(self, block_bytes: int, gib: float | None = None) -> int:
        return int((self.host_kv_gib if gib is None else gib) * 2**30 // block_bytes)


def _spec(cls, raw: dict, where: str):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ValueError(f"hardware: {where}: unknown field(s) {', '.join(unknown)}")
    try:
        return cls(**raw)
    except TypeError as e:
        raise ValueError(f"hardware: {where}: {e}") from None


def load_hardware(name_or_path: str) -> Hardware:
    """A hardware JSON by path, or a shipped setup by name (``setups/<name>.json``)."""
    p = Path(name_or_path)
    if not p.exists():
        p = SETUPS / f"{name_or_path}.json"
    if not p.exists():
        known = ", ".join(sorted(q.stem for q in SETUPS.glob("*.json")))
        raise ValueError(f"hardware: {name_or_path} is neither a file nor a shipped setup "
                         f"({known})")
    try:
        raw = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"hardware: {p} is not valid JSON ({e})") from None
    for key in ("gpu", "cpu"):
        if not isinstance(raw.get(key), dict):
            raise ValueError(f"hardware: {p}: '{key}' must be an object")
    return Hardware(name=raw.get("name", p.stem), gpu=_spec(GpuSpec, raw["gpu"], f"{p} gpu"),
                    cpu=_spec(CpuSpec, raw["cpu"], f"{p} cpu"),
                    host_kv_gib=float(raw.get("host_kv_gib", 120.0)),
                    sources=raw.get("sources", {}))


def shipped_setups() -> list[str]:
    return sorted(q.stem for q in SETUPS.glob("*.json"))
