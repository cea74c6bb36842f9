"""Loads the compiled cext module (built by `make install` / `python cext/build.py`)."""

from __future__ import annotations

try:
    from dualpace.kernels._dualpace_cext import ffi, lib  # type: ignore[attr-defined]
except ImportError as e:  # pragma: no cover - exercised only on an unbuilt checkout
    ffi = lib = None
    IMPORT_ERROR: ImportError | None = e
else:
    IMPORT_ERROR = None


def require():
    """The cffi ``(ffi, lib)`` pair, or a clear error saying how to build it."""
    if lib is None:
        raise RuntimeError(
            "DualPace C kernels are not built: run `make install` (or `python cext/build.py`)"
            f" ({IMPORT_ERROR})"
        )
    return ffi, lib
