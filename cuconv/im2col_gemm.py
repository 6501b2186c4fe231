"""Algorithm ``im2col_gemm``: gather the column matrix (``kernels_cu/im2col.cu``), multiply with cuBLAS.

For each sample n and group g (row-major shapes)::

    out[n, g] (K/g, P·Q) = W[g] (K/g, C/g·R·S) @ col[n, g] (C/g·R·S, P·Q)

written straight into the NCHW output: no transpose pass. The column buffer is bounded by
``cuconv.config.workspace_limit``: chunks of whole samples when a sample fits, else chunks of output rows
of one sample (``plan_chunks``). A 1x1 stride-1 unpadded convolution needs no gather at all: each sample's
input planes already are its column matrix. The CPU path is the same structure in NumPy.
"""

from __future__ import annotations

import numpy

from ._config import config
from .spec import ConvSpec
from . import im2col as _im2col

__all__ = ["plan_chunks", "forward_gpu", "forward_cpu"]


def plan_chunks(spec: ConvSpec, itemsize: int, limit: int):
    """(samples per chunk, output rows per chunk) so that the column chunk stays ≤ ``limit`` bytes.

    Raises ``ValueError`` when even one output row of one sample needs more than ``limit``.
    """
    row_bytes = spec.crs * spec.q * itemsize  # one output row of one sample
    sample_bytes = row_bytes * spec.p
    if sample_bytes == 0:
        return max(spec.n, 1), max(spec.p, 1)
    if sample_bytes <= limit:
        return max(1, min(spec.n, limit // sample_bytes)), spec.p
    if row_bytes > limit:
        raise ValueError(f"cuconv: workspace_limit={limit} bytes is too small for im2col_gemm: one "
                         f"output row needs {row_bytes} bytes of column buffer; raise "
                         f"cuconv.config.workspace_limit or choose another algorithm")
    return 1, limit // row_bytes


def _chunks(spec: ConvSpec, itemsize: int):
    nb, rows = plan_chunks(spec, itemsize, config.workspace_limit)
    for n0 in range(0, spec.n, nb):
        for p0 in range(0, spec.p, rows):
            yield n0, min(nb, spec.n - n0), p0, min(rows, spec.p - p0)


def forward_gpu(x, w, spec: ConvSpec, out, precision: str) -> None:
    """Write conv(x, w) into ``out``; all CuPy, C-contiguous, on the current device and stream."""
    import cupy

    from . import _cublas

    item = x.dtype.itemsize
    g, kg, crs_g = spec.groups, spec.k_per_group, spec.crs_per_group
    pq = spec.p * spec.q
    identity = spec.is_pointwise_identity
    workspace = None
    if not identity:
        nb, rows = plan_chunks(spec, item, config.workspace_limit)
        workspace = cupy.empty(nb * spec.crs * rows * spec.q, dtype=x.dtype)
    for n0, nb, p0, rows in _chunks(spec, item):
        length = rows * spec.q
        if identity:
            col_ptr = x.data.ptr + n0 * spec.c * pq * item
        else:
            col = workspace[: nb * spec.crs * length].reshape(nb, spec.crs, length)
            _im2col.im2col_gpu(x[n0:n0 + nb], spec, p0, rows, col)
            col_ptr = col.data.ptr
        out_ptr = out.data.ptr + (n0 * spec.k * pq + p0 * spec.q) * item
        # Column-major view: out[n, g]ᵀ (L × K/g, ld P·Q) = col[n, g]ᵀ (L × CRS/g, ld L) @ W[g]ᵀ (CRS/g × K/g).
        # Batch over whichever of samples or groups is larger; loop over the other.
        if g <= nb:
            for gi in range(g):
                _cublas.gemm(x.dtype, precision, length, kg, crs_g,
                             col_ptr + gi * crs_g * length * item, length, spec.crs * length,
                             w.data.ptr + gi * kg * crs_g * item, crs_g, 0,
                             out_ptr + gi * kg * pq * item, pq, spec.k * pq, nb)
        else:
            for ni in range(nb):
                _cublas.gemm(x.dtype, precision, length, kg, crs_g,
                             col_ptr + ni * spec.crs * length * item, length, crs_g * length,
                             w.data.ptr, crs_g, kg * crs_g,
                             out_ptr + ni * spec.k * pq * item, pq, kg * pq, g)


def _compute_dtype(dtype: numpy.dtype) -> numpy.dtype:
    # Half precisions accumulate in float32, as on the GPU; float32 and float64 compute in themselves.
    return numpy.dtype(numpy.float64) if dtype == numpy.float64 else numpy.dtype(numpy.float32)


def forward_cpu(x: numpy.ndarray, w: numpy.ndarray, spec: ConvSpec, out: numpy.ndarray) -> None:
    """NumPy twin of :func:`forward_gpu` (``precision`` has no effect: float32 is always IEEE here)."""
    cdt = _compute_dtype(x.dtype)
    g, kg, crs_g = spec.groups, spec.k_per_group, spec.crs_per_group
    w_g = w.reshape(g, kg, crs_g).astype(cdt, copy=False)
    out_v = out.reshape(spec.n, g, kg, spec.p, spec.q)
    for n0, nb, p0, rows in _chunks(spec, numpy.dtype(cdt).itemsize):
        col = _im2col.im2col_cpu(x[n0:n0 + nb], spec, p0, rows).astype(cdt, copy=False)
        col = col.reshape(nb, g, crs_g, rows * spec.q)
        # (nb, g, K/g, L) = (g, K/g, CRS/g) @ (nb, g, CRS/g, L)
        res = numpy.matmul(w_g, col)
        out_v[n0:n0 + nb, :, :, p0:p0 + rows, :] = res.reshape(nb, g, kg, rows, spec.q)
