"""Python twin of ``kernels_cu/bias.cu``: broadcast a per-channel bias into an NCHW output.

Algorithms whose GEMM accumulates onto its output (cuBLAS with beta = 1) fill the output with the bias
first, so the bias is added in the GEMM's arithmetic and the result is rounded once.
"""

from __future__ import annotations

import numpy

from . import _dtypes, _loader

__all__ = ["bias_fill_gpu", "NAME_EXPRESSIONS", "STEM"]

STEM = "bias"
_THREADS = 256
_MAX_GRID_Y = 65535

NAME_EXPRESSIONS = tuple(f"bias_fill<{t}>" for t in _dtypes.ALL_CTYPE_NAMES)


def bias_fill_gpu(out, bias) -> None:
    """``out[n, k] = bias[k]`` for a C-contiguous CuPy ``out`` of shape (N, K, P, Q)."""
    n, k, p, q = out.shape
    planes, pq = n * k, p * q
    if planes == 0 or pq == 0:
        return
    name = f"bias_fill<{_dtypes.ctype_of(out.dtype)}>"
    fn = _loader.get_function(STEM, NAME_EXPRESSIONS, name)
    grid = (planes, min(_MAX_GRID_Y, -(-pq // _THREADS)), 1)
    block = (_THREADS, 1, 1)
    _loader.launch(fn, name, grid, block, (out, bias, numpy.int64(k), numpy.int64(pq)))
