"""Python twin of ``kernels_cu/bias.cu``: a convolution's bias, broadcast (forward) and summed (backward).

Algorithms whose GEMM accumulates onto its output (cuBLAS with beta = 1) fill the output with the bias
first, so the bias is added in the GEMM's arithmetic and the result is rounded once. The bias gradient of
``cuconv.nn`` is ``bias_grad``: Σ of grad_output over (N, P, Q), in fp32 for the half types.
"""

from __future__ import annotations

import numpy

from .. import _dtypes, _loader
from ..spec import ConvSpec

__all__ = ["fill_launch", "grad_launch", "NAME_EXPRESSIONS", "STEM"]

STEM = "bias"
_MAX_GRID_Y = 65535

NAME_EXPRESSIONS = tuple(f"{k}<{t}>" for k in ("bias_fill", "bias_grad") for t in _dtypes.ALL_CTYPE_NAMES)


def fill_launch(dtype, n: int, k: int, pq: int) -> "_loader.PreparedLaunch":
    """A launch setting ``out[n, k] = bias[k]`` over a C-contiguous (n, K, P, Q) ``out``; pointers: out, bias.
    None where the output is empty."""
    planes = n * k
    if planes == 0 or pq == 0:
        return None
    name = f"bias_fill<{_dtypes.ctype_of(dtype)}>"
    grid = (planes, _loader.blocks(pq, _MAX_GRID_Y), 1)
    return _loader.prepare(STEM, NAME_EXPRESSIONS, name, grid, (_loader.THREADS, 1, 1), 2,
                           (numpy.int64(k), numpy.int64(pq)))


def grad_launch(spec: ConvSpec, dtype) -> "_loader.PreparedLaunch":
    """A launch writing ``db[k] = Σ dy[:, k]`` for grad_output ``dy`` (N, K, P, Q) of ``spec``; pointers: dy, db.
    None where there is no channel."""
    if spec.k == 0:
        return None
    name = f"bias_grad<{_dtypes.ctype_of(dtype)}>"
    i64 = numpy.int64
    return _loader.prepare(STEM, NAME_EXPRESSIONS, name, (spec.k, 1, 1), (_loader.THREADS, 1, 1), 2,
                           (i64(spec.n), i64(spec.k), i64(spec.p * spec.q)))
