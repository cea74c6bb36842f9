"""Compile every Triton kernel launch of model/attention_triton.py for real NVIDIA targets,
on a machine without a GPU (run as a script, with TRITON_INTERPRET unset).

Triton's interpreter runs the kernels on CPU tensors but checks none of the rules its GPU
compiler enforces: on the first H200 run the decode kernel failed to compile for 4-token
blocks (tl.dot's inner dimension under 16) although every interpreted test passed. Here
each launch the attention functions make for a case is recorded instead of run (its
arguments bound to the kernel's parameters), then compiled through Triton's whole pipeline
(TTIR, TTGIR, LLVM IR, PTX and ptxas's cubin) for each target's compute capability.

    python -m tests.model.triton_aot CASES_JSON   ->  one JSON list of results on stdout
"""

from __future__ import annotations

import inspect
import json
import os
import sys

import torch

DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
          torch.int32: "i32", torch.int64: "i64"}


def _signature(kernel, args: tuple, kwargs: dict) -> tuple[dict, dict]:
    """(signature, constexprs) of one launch, as triton.compiler.ASTSource takes them."""
    bound = inspect.signature(kernel.fn).bind(*args, **kwargs)
    constexpr = {p.name for p in kernel.params if p.is_constexpr}
    sig, consts = {}, {}
    for name, value in bound.arguments.items():
        if name in constexpr:
            sig[name], consts[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            sig[name] = "*" + DTYPES[value.dtype]
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            sig[name] = "i32" if -(1 << 31) <= value < (1 << 31) else "i64"
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"{kernel.fn.__name__}: argument {name}={value!r}")
    return sig, consts


def record_launches(case: dict) -> list[tuple]:
    """The (kernel, signature, constexprs) of every launch one decode and one prefill call
    make for ``case`` (keys: hq, hkv, d, bs, dtype, lens), nothing run."""
    from triton.runtime.jit import JITFunction

    from dualpace.model import attention_triton as at

    launches = []

    def record(self, *args, grid, warmup, **kwargs):
        launches.append((self, *_signature(self, args, kwargs)))

    JITFunction.run = record
    dtype = getattr(torch, case["dtype"])
    hq, hkv, d, bs, lens = case["hq"], case["hkv"], case["d"], case["bs"], case["lens"]
    width = max(-(-n // bs) for n in lens)
    pool = torch.zeros(len(lens) * width + 1, hkv, bs, d, dtype=dtype)
    tables = torch.arange(len(lens) * width, dtype=torch.int32).view(len(lens), width)
    q = torch.zeros(len(lens), hq, d, dtype=dtype)
    at.paged_decode_attention(q, pool, pool, tables, torch.tensor(lens, dtype=torch.int32),
                              d ** -0.5, splits=case.get("splits"))
    qlens = [min(n, 33) for n in lens]
    at.paged_prefill_attention(torch.zeros(sum(qlens), hq, d, dtype=dtype), pool, pool, tables,
                               qlens, lens, d ** -0.5)
    return launches


def compile_all(cases: list[dict], capabilities: list[int]) -> list[dict]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    results, seen = [], set()
    for case in cases:
        for kernel, sig, consts in record_launches(case):
            for cc in capabilities:
                key = (kernel.fn.__name__, cc, json.dumps([sig, consts], sort_keys=True))
                if key in seen:
                    continue
                seen.add(key)
                row = {"kernel": kernel.fn.__name__, "sm": cc, "case": case,
                       "constexprs": consts}
                try:
                    compiled = triton.compile(ASTSource(fn=kernel, signature=sig,
                                                        constexprs=consts),
                                              target=GPUTarget("cuda", cc, 32))
                    row["ok"] = bool(compiled.asm.get("cubin"))
                except Exception as e:  # the compiler's message is the result
                    row.update(ok=False, error=f"{type(e).__name__}: {str(e)[-600:]}")
                results.append(row)
    return results


def main() -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("triton_aot: unset TRITON_INTERPRET (the kernels must be JIT functions)")
    spec = json.loads(sys.argv[1])
    print(json.dumps(compile_all(spec["cases"], spec["capabilities"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
