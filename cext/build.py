"""Build the DualPace C kernels with the system C compiler through cffi.

    python cext/build.py        (make install runs it)

Produces dualpace/kernels/_dualpace_cext*.so. No -march=native: the AVX2 and AVX-512 paths are
compiled per file with target pragmas and chosen at run time, so one build runs on any x86-64.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCES = ["isa.c", "attention.c", "attention_scalar.c", "attention_avx2.c",
           "attention_avx512.c", "attention_avx512bf16.c", "attention_amx.c",
           "linear.c", "linear_amx.c", "gemm.c",
           "prefill_attention.c", "layer.c", "decode_layers.c", "kv_copy.c", "futex.c",
           "sampling.c", "argmax.c", "team.c"]
MODULE = "dualpace.kernels._dualpace_cext"


def cdef_text() -> str:
    """The header without preprocessor lines: cffi parses plain declarations."""
    lines = (HERE / "dp_cext.h").read_text().splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("#"))


def find_compiler() -> str:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    exe = cc.split()[0]
    if shutil.which(exe) is None:
        sys.exit(
            f"cext/build.py: no C compiler found (tried {exe!r}). Install gcc "
            "(Debian/Ubuntu: apt-get install gcc) and run `make install` again."
        )
    return exe


def main() -> None:
    find_compiler()
    from cffi import FFI

    ffi = FFI()
    ffi.cdef(cdef_text())
    ffi.set_source(
        MODULE,
        '#include "dp_cext.h"',
        sources=[str(HERE / s) for s in SOURCES],
        include_dirs=[str(HERE)],
        # -fno-wrapv undoes the -fwrapv of Python's own CFLAGS, which cffi passes first:
        # with signed overflow defined the compiler keeps every int index 32-bit and
        # sign-extends it at each use, and a G = 8 attention call ran 1.3-1.5x slower.
        extra_compile_args=["-O3", "-fno-wrapv", "-pthread", "-std=gnu11", "-Wall",
                            "-Wno-unused-function"],
        # no OpenMP: every parallel kernel runs on the thread team of team.c
        extra_link_args=["-pthread"],
        libraries=["m"],
    )
    tmp = ROOT / "build" / "cext"
    built = Path(ffi.compile(tmpdir=str(tmp), verbose=False))
    dest = ROOT / "dualpace" / "kernels" / built.name
    for old in dest.parent.glob("_dualpace_cext*"):
        old.unlink()
    shutil.copy2(built, dest)
    print(f"built {dest.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
