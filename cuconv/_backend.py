"""Which array library an argument belongs to. CuPy is optional: NumPy arrays run on the CPU path."""

from __future__ import annotations

import functools

import numpy

__all__ = ["cupy_or_none", "is_cupy_array", "gpu_available"]


@functools.lru_cache(maxsize=None)
def cupy_or_none():
    """The ``cupy`` module, or None when it is not installed or cannot load."""
    try:
        import cupy
    except Exception:  # ImportError, or CUDA libraries missing on a CPU-only machine
        return None
    return cupy


def is_cupy_array(a) -> bool:
    cupy = cupy_or_none()
    return cupy is not None and isinstance(a, cupy.ndarray)


def is_numpy_array(a) -> bool:
    return isinstance(a, numpy.ndarray)


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    """True when CuPy is importable and sees at least one CUDA device."""
    cupy = cupy_or_none()
    if cupy is None:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False
