"""The one dtype table: NumPy dtype → C++ type name used in kernel templates and cuBLAS data types.

Kernels are C++ templates instantiated from this table (``name_expressions``); nothing else spells a
per-dtype kernel. bfloat16 is available where ``ml_dtypes`` is installed (CuPy needs it for bf16 arrays).
"""

from __future__ import annotations

import numpy

from ._errors import ConvTypeError

__all__ = ["CTYPES", "SUPPORTED", "ctype_of", "check_float_dtype", "bfloat16", "by_name"]

try:  # optional: NumPy has no bfloat16 of its own
    from ml_dtypes import bfloat16 as _bf16

    bfloat16 = numpy.dtype(_bf16)
except ImportError:  # pragma: no cover - depends on the environment
    bfloat16 = None

CTYPES = {
    numpy.dtype(numpy.float16): "__half",
    numpy.dtype(numpy.float32): "float",
    numpy.dtype(numpy.float64): "double",
}
if bfloat16 is not None:
    CTYPES[bfloat16] = "__nv_bfloat16"

SUPPORTED = tuple(CTYPES)

# Every C++ type a kernel template is instantiated for, whether or not this process can make such
# arrays (the compile check in CI builds all of them).
ALL_CTYPE_NAMES = ("__half", "__nv_bfloat16", "float", "double")


def by_name(name: str):
    """The dtype called ``name`` ("float32", "bfloat16", ...); None for bfloat16 without ml_dtypes."""
    return bfloat16 if name == "bfloat16" else numpy.dtype(name)


def ctype_of(dtype) -> str:
    return CTYPES[numpy.dtype(dtype)]


def check_float_dtype(dtype, what: str = "input") -> numpy.dtype:
    """Refuse dtypes no path computes in, before any kernel lookup."""
    dtype = numpy.dtype(dtype)
    if dtype not in CTYPES:
        names = ", ".join(str(d) for d in SUPPORTED)
        # (a TypeError and a RuntimeError: torch refuses a dtype its convolution has no kernel for with the latter)
        raise ConvTypeError(f"cuconv: {what} dtype {dtype} is not supported; expected one of {names}")
    return dtype
