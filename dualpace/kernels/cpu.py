"""CPU kernels: paged decode attention over the HND KV pool, KV append/copy (cext, §5).

Every argument is validated here before it reaches C, and C re-checks the indices it
dereferences, so no input can make the kernel read or write out of bounds.
"""

from __future__ import annotations

import functools
import math
import os
import time

import torch

from dualpace.kernels import _lib
from dualpace.kernels._lib import require

DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
ISAS = {"scalar": 0, "avx2": 1, "avx512": 2, "avx512_bf16": 3, "amx": 4}
_FEAT_AVX2, _FEAT_FMA, _FEAT_F16C, _FEAT_AVX512 = 1, 2, 4, 8
_FEAT_AVX512_BF16, _FEAT_AMX_BF16 = 16, 32


def available() -> bool:
    try:
        require()
    except RuntimeError:
        return False
    return True


@functools.cache
def cpu_features() -> dict[str, bool]:
    """What the CPU and OS support (CPUID is slow under virtualisation: read it once)."""
    _, lib = require()
    f = lib.dp_cpu_features()
    return {
        "avx2": bool(f & _FEAT_AVX2) and bool(f & _FEAT_FMA) and bool(f & _FEAT_F16C),
        "avx512": bool(f & _FEAT_AVX512),
        "avx512_bf16": bool(f & _FEAT_AVX512_BF16),
        "amx_bf16": bool(f & _FEAT_AMX_BF16),
    }


@functools.cache
def supported_isas() -> list[str]:
    """The ISA paths this process can run, least to most capable. ``amx`` is avx512_bf16
    plus AMX tiles for the dense projections of bf16 weights (cext/linear_amx.c): offered
    where the CPU has them and Linux grants this process the tile state."""
    feats = cpu_features()
    isas = ["scalar"] + [name for name in ("avx2", "avx512", "avx512_bf16") if feats[name]]
    if feats["amx_bf16"] and "avx512_bf16" in isas and require()[1].dp_amx_enable():
        isas.append("amx")
    return isas


@functools.cache
def _validated_isa(name: str) -> str:
    if name not in ISAS:
        raise ValueError(f"DUALPACE_CPU_ISA / isa: unknown ISA {name!r}; expected one of "
                         f"{sorted(ISAS)}")
    if name not in supported_isas():
        raise ValueError(f"isa: this CPU does not support {name!r} "
                         f"(supported: {', '.join(supported_isas())})")
    return name


_default_isa: str | None = None  # a worker's, from its resolved config


def set_default_isa(name: str) -> None:
    """The path every call without ``isa`` takes in this process (workers set the one the
    supervisor resolved, so all ranks agree whatever their environment)."""
    global _default_isa
    _default_isa = _validated_isa(name)


def resolve_isa(name: str | None = None) -> str:
    """The ISA path to use: ``name``, else this process's default, else $DUALPACE_CPU_ISA,
    else the best the CPU has."""
    return _validated_isa(name or _default_isa or os.environ.get("DUALPACE_CPU_ISA")
                          or supported_isas()[-1])


_threads_override = 0


def set_num_threads(n: int) -> None:
    """Threads of the kernels' calls from now on (their thread team, cext/team.c; 0: the
    pinned cores)."""
    global _threads_override
    _threads_override = max(0, int(n))


def num_threads() -> int:
    """Threads = the cores this process is pinned to, unless set_num_threads said otherwise
    (runtime/thread_share.py: cores shared between the two tiers)."""
    return _threads_override or len(os.sched_getaffinity(0))


def _check_tensor(t, name: str, ndim: int, dtypes) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name}: must be a CPU tensor, got device {t.device}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name}: dtype {t.dtype} not supported (expected one of "
                         f"{', '.join(str(d) for d in dtypes)})")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")


ATTENTION_ERRORS = {
    -3: ("seq_lens", "every length must be in [1, max_blocks * block_size]"),
    -4: ("block_tables", "a block id in use is outside [0, num_blocks)"),
}


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    isa: str | None = None,
) -> torch.Tensor:
    """One decode query per sequence over its paged KV history.

    q [B, Hq, D]; k_cache, v_cache [num_blocks, Hkv, block_size, D] (one layer, HND);
    block_tables int32 [B, max_blocks]; seq_lens int32 [B]. Returns out [B, Hq, D] in q's
    dtype. fp32 accumulation; fp32, bf16 or fp16 q and KV; any GQA ratio.
    """
    require()  # "not built" before any argument error
    fp = tuple(DTYPE_CODES)
    _check_tensor(q, "q", 3, fp)
    _check_tensor(k_cache, "k_cache", 4, fp)
    _check_tensor(v_cache, "v_cache", 4, fp)
    _check_tensor(block_tables, "block_tables", 2, (torch.int32,))
    _check_tensor(seq_lens, "seq_lens", 1, (torch.int32,))
    B, Hq, D = q.shape
    nb, Hkv, bs, Dk = k_cache.shape
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"v_cache: shape/dtype {tuple(v_cache.shape)}/{v_cache.dtype} differs "
                         f"from k_cache {tuple(k_cache.shape)}/{k_cache.dtype}")
    if Dk != D:
        raise ValueError(f"k_cache: head_dim {Dk} differs from q's {D}")
    if D % 16 or not 16 <= D <= 512:
        raise ValueError(f"q: head_dim must be a multiple of 16 in [16, 512], got {D}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"q: {Hq} query heads are not a multiple of {Hkv} KV heads")
    if B == 0 or nb == 0 or bs == 0:
        raise ValueError(f"q/k_cache: empty batch or pool (B={B}, num_blocks={nb}, "
                         f"block_size={bs})")
    if block_tables.shape[0] != B or block_tables.shape[1] == 0:
        raise ValueError(f"block_tables: shape {tuple(block_tables.shape)} for batch {B}")
    if seq_lens.shape[0] != B:
        raise ValueError(f"seq_lens: {seq_lens.shape[0]} lengths for batch {B}")
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale: must be a finite number, got {scale!r}")
    return paged_decode_attention_checked(q, k_cache, v_cache, block_tables, seq_lens, scale,
                                          isa=isa)


def paged_decode_attention_checked(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float, *,
    isa: str | None = None,
) -> torch.Tensor:
    """``paged_decode_attention`` for arguments whose types, shapes and layouts the caller
    has checked (the native stages, per layer: the full validation is 20 of a call's 50 us
    at batch 1). The C kernel still checks every length and block id it dereferences."""
    ffi, lib = require()
    B, Hq, D = q.shape
    nb, Hkv, bs, _ = k_cache.shape
    isa_code = ISAS[resolve_isa(isa)]
    out = torch.empty_like(q)
    rc = lib.dp_paged_decode_attention(
        ffi.cast("void *", q.data_ptr()), DTYPE_CODES[q.dtype],
        ffi.cast("void *", k_cache.data_ptr()), ffi.cast("void *", v_cache.data_ptr()),
        DTYPE_CODES[k_cache.dtype],
        ffi.cast("int32_t *", block_tables.data_ptr()), block_tables.shape[1],
        ffi.cast("int32_t *", seq_lens.data_ptr()), ffi.cast("void *", out.data_ptr()),
        B, Hq, Hkv, D, bs, nb, float(scale), isa_code, num_threads(),
    )
    if rc != 0:
        name, why = ATTENTION_ERRORS.get(rc, ("kernel", f"failed with code {rc}"))
        if rc == -5:
            raise MemoryError("paged_decode_attention: out of memory for scratch")
        raise ValueError(f"{name}: {why}")
    return out


def attention_uses_amx(q_dtype: torch.dtype, kv_dtype: torch.dtype, group: int,
                       head_dim: int, block_size: int, *, isa: str | None = None) -> bool:
    """Whether ``paged_decode_attention`` on the ISA path ``isa`` (resolved as there) runs on
    AMX tiles (cext/attention_amx.c): the ``amx`` path, bf16 KV, GQA groups of 8 or more
    (16 at most, 8 at most for an fp32 q, which goes in as two bf16 parts), head dims a
    multiple of 16, block sizes a multiple of 16, and the OS granting the tile state."""
    _, lib = require()
    if resolve_isa(isa) != "amx" or q_dtype not in DTYPE_CODES or kv_dtype not in DTYPE_CODES:
        return False
    return bool(lib.dp_attn_amx_applies(DTYPE_CODES[q_dtype], DTYPE_CODES[kv_dtype], group,
                                        head_dim, block_size))


def attention_uses_bf16_dot(q_dtype: torch.dtype, kv_dtype: torch.dtype, group: int,
                            head_dim: int, *, isa: str | None = None,
                            block_size: int = 16) -> bool:
    """Whether ``paged_decode_attention`` on the ISA path ``isa`` (resolved as there) takes
    bf16 dot products for these dtypes and shape (the AVX512_BF16 path, where they measured
    faster than the fp32 route: bf16 q and KV, GQA groups of 8 or more, head dims a multiple
    of 32, and a CPU whose dot products pay, set_bf16_dot; cext/attention_avx512bf16.c), and
    on the AMX path the same where the tiles do not apply (attention_uses_amx)."""
    _, lib = require()
    if resolve_isa(isa) not in ("avx512_bf16", "amx") or q_dtype not in DTYPE_CODES \
            or kv_dtype not in DTYPE_CODES:
        return False
    if attention_uses_amx(q_dtype, kv_dtype, group, head_dim, block_size, isa=isa):
        return False
    return bool(lib.dp_attn_bf16_dot(DTYPE_CODES[q_dtype], DTYPE_CODES[kv_dtype], group,
                                     head_dim))


def kv_append(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Write T tokens' K/V [T, Hkv, D] at flat slots (block * block_size + offset)."""
    ffi, lib = require()
    fp = tuple(DTYPE_CODES)
    _check_tensor(k_cache, "k_cache", 4, fp)
    _check_tensor(v_cache, "v_cache", 4, fp)
    _check_tensor(k, "k", 3, (k_cache.dtype,))
    _check_tensor(v, "v", 3, (k_cache.dtype,))
    _check_tensor(slots, "slots", 1, (torch.int64,))
    nb, Hkv, bs, D = k_cache.shape
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
        raise ValueError("v_cache: shape/dtype differs from k_cache")
    T = k.shape[0]
    if tuple(k.shape) != (T, Hkv, D) or tuple(v.shape) != (T, Hkv, D):
        raise ValueError(f"k/v: expected shape ({T}, {Hkv}, {D}), got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if slots.shape[0] != T:
        raise ValueError(f"slots: {slots.shape[0]} slots for {T} tokens")
    rc = lib.dp_kv_append(
        ffi.cast("void *", k_cache.data_ptr()), ffi.cast("void *", v_cache.data_ptr()),
        ffi.cast("void *", k.data_ptr()), ffi.cast("void *", v.data_ptr()),
        ffi.cast("int64_t *", slots.data_ptr()), T, Hkv, bs, D, k_cache.element_size(), nb,
    )
    if rc != 0:
        raise ValueError(f"slots: a slot is outside [0, {nb * bs})")


def copy_blocks(
    src: torch.Tensor, dst: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor
) -> None:
    """dst[dst_ids[i]] = src[src_ids[i]] for whole blocks of two pools of the same block shape."""
    ffi, lib = require()
    fp = tuple(DTYPE_CODES)
    _check_tensor(src, "src", 4, fp)
    _check_tensor(dst, "dst", 4, (src.dtype,))
    _check_tensor(src_ids, "src_ids", 1, (torch.int64,))
    _check_tensor(dst_ids, "dst_ids", 1, (torch.int64,))
    if src.shape[1:] != dst.shape[1:]:
        raise ValueError(f"dst: block shape {tuple(dst.shape[1:])} differs from src's "
                         f"{tuple(src.shape[1:])}")
    if src_ids.shape != dst_ids.shape:
        raise ValueError(f"dst_ids: {dst_ids.shape[0]} ids for {src_ids.shape[0]} source ids")
    block_bytes = src[0].numel() * src.element_size() if src.shape[0] else 0
    rc = lib.dp_copy_blocks(
        ffi.cast("void *", src.data_ptr()), ffi.cast("void *", dst.data_ptr()),
        ffi.cast("int64_t *", src_ids.data_ptr()), ffi.cast("int64_t *", dst_ids.data_ptr()),
        src_ids.shape[0], block_bytes, src.shape[0], dst.shape[0], num_threads(),
    )
    if rc != 0:
        raise ValueError(f"src_ids/dst_ids: a block id is outside [0, {src.shape[0]}) / "
                         f"[0, {dst.shape[0]})")


def stream_read(buf: torch.Tensor, threads: int | None = None) -> float:
    """Sum a float32 buffer on the kernels' threads (DRAM read-bandwidth probe for benches)."""
    ffi, lib = require()
    _check_tensor(buf, "buf", 1, (torch.float32,))
    return lib.dp_stream_read(ffi.cast("float *", buf.data_ptr()), buf.numel(),
                              threads or num_threads())


def _probe_rate(run, seconds: float, repeats: int) -> float:
    """Instructions per second of ``run(iters)`` (which returns how many it issued): a trial
    grown until it is long enough to time, scaled to about ``seconds``, best of ``repeats``."""
    iters = 1 << 14
    while True:
        t0 = time.perf_counter()
        run(iters)
        dt = time.perf_counter() - t0
        if dt >= 1e-3:
            break
        iters *= 4
    iters, best = max(1, int(iters * seconds / dt)), 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        n = run(iters)
        best = max(best, n / (time.perf_counter() - t0))
    return best


def fma_rate(isa: str | None = None, seconds: float = 0.05, repeats: int = 3
             ) -> tuple[float, int]:
    """(vector FMA instructions per second on the calling thread's core, their lanes): the
    compute ceiling of a kernel built from ``isa``'s FMAs (benches; best of ``repeats``
    timed runs of about ``seconds`` each). ValueError for the scalar path."""
    ffi, lib = require()
    code = ISAS[resolve_isa(isa)]
    lanes, sink = ffi.new("int *"), ffi.new("double *")
    if lib.dp_fma_probe(code, 1, lanes, sink) < 0:
        raise ValueError(f"isa: {resolve_isa(isa)!r} has no vector FMAs to measure")
    return _probe_rate(lambda n: lib.dp_fma_probe(code, n, lanes, sink), seconds,
                       repeats), lanes[0]


def bf16_dot_rate(seconds: float = 0.05, repeats: int = 3) -> float:
    """512-bit bf16 dot-product instructions (vdpbf16ps, 32 products each) per second on the
    calling thread's core. ValueError where the CPU has no AVX512_BF16."""
    ffi, lib = require()
    sink = ffi.new("double *")
    if lib.dp_bf16_dot_probe(1, sink) < 0:
        raise ValueError("bf16_dot_rate: this CPU has no AVX512_BF16")
    return _probe_rate(lambda n: lib.dp_bf16_dot_probe(n, sink), seconds, repeats)


# The bf16-dot route of decode attention (cext/attention_avx512bf16.c) halves the
# instructions of the FMA route only where vdpbf16ps issues about as fast as a 512-bit FMA.
# Measured at GQA 8 from DRAM against the FMA route: a Zen 5 (dot products at the FMA rate)
# 1.05-1.31x faster; an Intel Xeon with AMX (2-core VM, 2026-12-05) 0.75-0.90x, where the
# probe measured 1.9 G dot products a second against 7.7 G FMAs (0.25): fewer products a
# cycle than the FMAs, plus the probabilities' conversion. The route is taken where the
# probe's ratio is at least this, halfway between the two kinds of core.
BF16_DOT_MIN_RATIO = 0.75


def bf16_dot_pays(dot_per_s: float, fma_per_s: float) -> bool:
    """Whether bf16 dot products at ``dot_per_s`` instructions a second pay against 512-bit
    FMAs at ``fma_per_s``: dot_per_s >= BF16_DOT_MIN_RATIO * fma_per_s."""
    if dot_per_s < 0 or fma_per_s <= 0:
        raise ValueError(f"bf16_dot_pays: rates must be positive, got {dot_per_s}, {fma_per_s}")
    return dot_per_s >= BF16_DOT_MIN_RATIO * fma_per_s


def bf16_dot_enabled() -> bool:
    """Whether this process's switch for the bf16-dot route is on (set_bf16_dot)."""
    return bool(require()[1].dp_get_bf16_dot())


def set_bf16_dot(enabled: bool | None = None) -> bool:
    """Turn decode attention's bf16-dot route on or off for this process (and the workers it
    forks afterwards); returns the state. None: DUALPACE_BF16_DOT ("0" or "1") where set,
    else the probes (bf16_dot_pays on this core's measured rates, ~30 ms). Where the CPU has
    no AVX512_BF16 the route is never taken, whatever this says."""
    _, lib = require()
    if enabled is None:
        env = os.environ.get("DUALPACE_BF16_DOT")
        if env is not None and env not in ("0", "1"):
            raise ValueError(f"DUALPACE_BF16_DOT: expected 0 or 1, got {env!r}")
        if env is not None:
            enabled = env == "1"
        elif not cpu_features()["avx512_bf16"]:
            enabled = False
        else:
            enabled = bf16_dot_pays(bf16_dot_rate(0.005), fma_rate("avx512", 0.005)[0])
    lib.dp_set_bf16_dot(int(bool(enabled)))
    return bool(enabled)


def linear_uses_amx(w_dtype: torch.dtype, rows: int, k: int, *, isa: str | None = None
                    ) -> bool:
    """Whether ``linear`` on the ISA path ``isa`` (resolved as there) runs ``rows`` rows of
    x over a weight of ``w_dtype`` and in-features ``k`` as AMX tile products rather than
    vector FMAs (cext/dp_internal.h dp_use_amx)."""
    _, lib = require()
    if w_dtype not in DTYPE_CODES:
        return False
    return bool(lib.dp_linear_uses_amx(ISAS[resolve_isa(isa)], DTYPE_CODES[w_dtype], rows, k))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           *, isa: str | None = None) -> torch.Tensor:
    """x [M, K] fp32 @ weight [N, K]^T (+ bias [N] fp32) -> [M, N] fp32.

    Weight-streaming kernel for decode-sized M: reads W once per 4 rows of x, fp32/bf16/fp16
    weights converted in registers. K must be a multiple of 16.
    """
    ffi, lib = require()
    _check_tensor(x, "x", 2, (torch.float32,))
    _check_tensor(weight, "weight", 2, tuple(DTYPE_CODES))
    M, K = x.shape
    N, Kw = weight.shape
    if Kw != K:
        raise ValueError(f"weight: in-features {Kw} differ from x's {K}")
    if K % 16 or M == 0 or N == 0:
        raise ValueError(f"x/weight: need M, N > 0 and K a multiple of 16 (M={M}, N={N}, K={K})")
    if bias is not None:
        _check_tensor(bias, "bias", 1, (torch.float32,))
        if bias.shape[0] != N:
            raise ValueError(f"bias: {bias.shape[0]} entries for {N} outputs")
    out = torch.empty(M, N, dtype=torch.float32)
    rc = lib.dp_linear(
        ffi.cast("float *", x.data_ptr()), M, K, ffi.cast("void *", weight.data_ptr()),
        DTYPE_CODES[weight.dtype], N,
        ffi.cast("float *", bias.data_ptr()) if bias is not None else ffi.NULL,
        ffi.cast("float *", out.data_ptr()), ISAS[resolve_isa(isa)], num_threads(),
    )
    if rc != 0:  # the checks above make this unreachable; never return unwritten rows
        raise ValueError(f"linear: the kernel refused its arguments (code {rc})")
    return out


def gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         add: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
         isa: str | None = None) -> torch.Tensor:
    """``add + x @ weight.T + bias`` for prefill-sized x (cext/gemm.c), fp32: x [M, K],
    weight [N, K] (fp32, or bf16 / fp16 with K a multiple of 16: widened exactly and
    multiplied in fp32), bias [N], add [M, N] (``add`` may be ``out``: the residual updated
    in place). Bound by FMAs, not by reading the weight (that is ``linear``, for few rows).
    Only the vector paths have it: ``isa`` (default: this process's) must be avx2 or one of
    the AVX-512 paths."""
    ffi, lib = require()
    _check_tensor(x, "x", 2, (torch.float32,))
    _check_tensor(weight, "weight", 2, tuple(DTYPE_CODES))
    M, K = x.shape
    N, Kw = weight.shape
    if Kw != K:
        raise ValueError(f"weight: in-features {Kw} differ from x's {K}")
    if M == 0 or N == 0 or K == 0:
        raise ValueError(f"x/weight: need M, N, K > 0 (M={M}, N={N}, K={K})")
    if weight.dtype != torch.float32 and K % 16:
        raise ValueError(f"weight: a {weight.dtype} weight needs K a multiple of 16 (K={K})")
    if bias is not None:
        _check_tensor(bias, "bias", 1, (torch.float32,))
        if bias.shape[0] != N:
            raise ValueError(f"bias: {bias.shape[0]} entries for {N} outputs")
    for name, t in (("add", add), ("out", out)):
        if t is not None:
            _check_tensor(t, name, 2, (torch.float32,))
            if tuple(t.shape) != (M, N):
                raise ValueError(f"{name}: shape {tuple(t.shape)}, expected {(M, N)}")
    path = resolve_isa(isa)
    if path not in GEMM_ISAS:
        raise ValueError(f"gemm: no {path!r} path (it has {', '.join(GEMM_ISAS)})")
    if out is None:
        out = torch.empty(M, N, dtype=torch.float32)
    elif (any(t is not None and _overlaps(t, out) for t in (x, weight, bias))
          or (add is not None and add is not out and _overlaps(add, out))):
        raise ValueError("out: must not overlap x, weight, bias or a separate add")
    rc = lib.dp_gemm(
        ffi.cast("float *", x.data_ptr()), M, K, ffi.cast("void *", weight.data_ptr()),
        DTYPE_CODES[weight.dtype], N,
        ffi.cast("float *", bias.data_ptr()) if bias is not None else ffi.NULL,
        ffi.cast("float *", add.data_ptr()) if add is not None else ffi.NULL,
        ffi.cast("float *", out.data_ptr()), ISAS[path], num_threads(),
    )
    if rc == -5:
        raise MemoryError("gemm: no memory for the packed rows of x")
    if rc != 0:  # the checks above make the others unreachable; never return unwritten rows
        raise ValueError(f"gemm: the kernel refused its arguments (code {rc})")
    return out


GEMM_ISAS = ("avx2", "avx512", "avx512_bf16", "amx")


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def vendor_from_cpuinfo(lines) -> str:
    """The vendor_id of /proc/cpuinfo's lines (its first processor's), or ""."""
    for line in lines:
        key, sep, value = line.partition(":")
        if sep and key.strip() == "vendor_id":
            return value.strip()
    return ""


@functools.cache
def cpu_vendor() -> str:
    """CPUID's vendor string as Linux reports it (``AuthenticAMD``, ``GenuineIntel``), or
    "" where /proc/cpuinfo does not say."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return vendor_from_cpuinfo(f)
    except OSError:
        return ""


# Where ``auto`` takes the cext GEMM: the paths, and for the AVX-512 ones the vendors, on
# which bench/prefill_gemm.py measured it ahead of torch's (MKL) GEMM. AVX2, AMD Zen 1, 2
# threads: 1.26-1.32x on the comparison model's QKV and gate/up, 1.01-1.03x on O and down.
# AVX-512, AMD Zen 4, 2 threads: 1.02-1.58x (median 1.25x) over the same six shapes, and a
# 256-token prefill of the comparison model 1.21x faster forward for forward. On Intel's
# AVX-512 hosts MKL has not been measured against it, so torch's stays there.
_GEMM_AUTO_AVX512_VENDORS = ("AuthenticAMD",)


def prefill_gemm_isa(weight_dtype: torch.dtype = torch.float32) -> str | None:
    """The ISA path whose GEMM (``gemm``) runs prefill-sized projections of weights in
    ``weight_dtype``, or None: not this GEMM. $DUALPACE_PREFILL_GEMM: ``cext`` (wherever
    the path has one), ``torch``, or ``auto`` (default): for fp32 weights cext on the AVX2
    path, and on the AVX-512 paths of the vendors where it was measured faster
    (``_GEMM_AUTO_AVX512_VENDORS``: AMD), else torch's; for bf16 / fp16 weights cext
    wherever the path has one (the caller asks only where torch's GEMM lacks that dtype's
    arithmetic, native_stages.torch_gemm_lacks_arithmetic: there torch widens every element
    in software, 8x slower than this GEMM on a Zen 3)."""
    flag = os.environ.get("DUALPACE_PREFILL_GEMM", "auto").strip().lower() or "auto"
    if flag not in ("auto", "cext", "torch"):
        raise ValueError(f"DUALPACE_PREFILL_GEMM: expected auto, cext or torch, got {flag!r}")
    if weight_dtype not in DTYPE_CODES:
        raise ValueError(f"prefill_gemm_isa: no GEMM for {weight_dtype} weights")
    if flag == "torch" or not available():
        return None
    path = resolve_isa()
    if path not in GEMM_ISAS:
        return None
    if (flag == "cext" or path == "avx2" or weight_dtype != torch.float32
            or cpu_vendor() in _GEMM_AUTO_AVX512_VENDORS):
        return path
    return None


def argmax_rows(x: torch.Tensor, *, isa: str | None = None) -> torch.Tensor:
    """``x.argmax(dim=-1)`` of fp32 logits [R, V] (cext/argmax.c): the first index of each
    row's maximum, or of its first NaN, as torch gives it. Returns int64 [R]."""
    ffi, lib = require()
    _check_tensor(x, "logits", 2, (torch.float32,))
    R, V = x.shape
    if R == 0 or V == 0 or V >= 1 << 31:
        raise ValueError(f"logits: shape {tuple(x.shape)}; need rows, and 1 to 2^31 - 1 columns")
    out = torch.empty(R, dtype=torch.int64)
    rc = lib.dp_argmax_rows(ffi.cast("float *", x.data_ptr()), R, V,
                            ffi.cast("int64_t *", out.data_ptr()), ISAS[resolve_isa(isa)],
                            num_threads())
    if rc != 0:
        raise MemoryError("argmax_rows: out of memory")
    return out


def exponential_race(probs: torch.Tensor, keys: list[int]) -> torch.Tensor:
    """argmax over v of probs[r, v] / E(keys[r], v), E the SplitMix64 Exp(1) noise of
    sampling/sampler.py: the token ``(probs.double() / exponential_noise(keys)).argmax(-1)``
    picks, computed without materializing the noise (cext/sampling.c). probs: [R, V] fp32;
    keys: R integers in [0, 2^64). Returns int64 [R]."""
    ffi, lib = require()
    _check_tensor(probs, "probs", 2, (torch.float32,))
    R, V = probs.shape
    if len(keys) != R or R == 0 or V == 0:
        raise ValueError(f"probs: {R} rows (of {V}) for {len(keys)} keys; need as many, > 0")
    if any(not 0 <= k < 1 << 64 for k in keys):
        raise ValueError("keys: each must be in [0, 2^64)")
    k = torch.tensor([x - (1 << 64) if x >= 1 << 63 else x for x in keys], dtype=torch.int64)
    out = torch.empty(R, dtype=torch.int64)
    rc = lib.dp_exponential_race(ffi.cast("float *", probs.data_ptr()), R, V,
                                 ffi.cast("int64_t *", k.data_ptr()),
                                 ffi.cast("int64_t *", out.data_ptr()), num_threads())
    if rc != 0:
        raise MemoryError("exponential_race: out of memory")
    return out


if _lib.lib is not None:  # the route for this process, decided once at import
    set_bf16_dot()
