"""The CPU path of every pass: im2col_gemm's structure in NumPy, the GEMMs through a ``matmul`` the caller passes.

For each sample n and group g (row-major shapes)::

    fprop:  out[n, g] (K/g, P·Q) = W[g] (K/g, CRS/g) @ col[n, g] (CRS/g, P·Q)
    dgrad:  col[n, g] (CRS/g, P·Q) = W[g]ᵀ (CRS/g, K/g) @ dY[n, g] (K/g, P·Q),  then col2im → dx
    wgrad:  dW[g] (K/g, CRS/g)    = dY[g] (K/g, N·P·Q) @ col[g] (N·P·Q, CRS/g), samples interleaved

The column matrix is bounded by the ``workspace_limit`` the call passes, chunked as im2col_gemm chunks it
(``plan_chunks``). Half precisions compute in float32, float32 and float64 in themselves (float32 is always IEEE
here: ``precision`` has no effect on the CPU), with one rounding into the result.

``matmul(a, b)`` must act as ``numpy.matmul`` on float32/float64 arrays (broadcast batch dimensions included):
NumPy's for arrays, torch's for the torch bridge's CPU tensors (NumPy's BLAS threads and torch's thread pool, each
spinning after its work, would take turns starving each other on the same cores: docs/perf-notes.md).
"""

from __future__ import annotations

import numpy

from ..algos.im2col_gemm import chunk_bytes, plan_chunks
from ..blocks.col2im import col2im_cpu
from ..blocks.im2col import im2col_cpu
from ..spec import ConvSpec

__all__ = ["forward", "dgrad", "wgrad"]


def _compute_dtype(dtype: numpy.dtype) -> numpy.dtype:
    # Half precisions accumulate in float32, as on the GPU; float32 and float64 compute in themselves.
    return numpy.dtype(numpy.float64) if dtype == numpy.float64 else numpy.dtype(numpy.float32)


def _samples_matmul(matmul, w: numpy.ndarray, x: numpy.ndarray) -> numpy.ndarray:
    """(nb, g, M, L) = w (g, M, D) @ x (nb, g, D, L). Where M > L (deep layers, small planes) the samples are
    folded into one GEMM per group, (g, M, D) @ (g, D, nb·L): broadcasting w over the samples would copy it
    nb times (torch's matmul does) for GEMMs of L columns each; the fold copies x and the result instead,
    which are the smaller ones there."""
    nb, g, d, length = x.shape
    m = w.shape[1]
    if nb > 1 and m > length:
        folded = matmul(w, x.transpose(1, 2, 0, 3).reshape(g, d, nb * length))
        return folded.reshape(g, m, nb, length).transpose(2, 0, 1, 3)
    return matmul(w, x)


def _chunks(spec: ConvSpec, cdt: numpy.dtype, workspace_limit: int, overlap: bool):
    """(first sample, samples, first output row, rows) of each chunk whose column matrix in ``cdt`` stays within
    ``workspace_limit`` (im2col_gemm's ``plan_chunks``; ``overlap``: the forward's chunking), one output row at
    least: the limit bounds GPU memory, and the host path refuses no problem for it."""
    limit = max(workspace_limit, chunk_bytes(spec, 1, 1, cdt.itemsize))
    return plan_chunks(spec, cdt.itemsize, limit, overlap).chunks(spec)


def _zero_if_degenerate(spec: ConvSpec, grad: numpy.ndarray) -> bool:
    """Whether the pass has no multiply-adds at all (empty batch, no channels or no filters), ``grad`` then zeroed:
    every gradient is zero."""
    if spec.n == 0 or spec.k == 0 or spec.crs_per_group == 0:
        grad.fill(0)
        return True
    return False


def forward(x: numpy.ndarray, w: numpy.ndarray, bias, spec: ConvSpec, out: numpy.ndarray, matmul,
            workspace_limit: int) -> None:
    """out (N, K, P, Q) = conv2d(x, w) + bias on C-contiguous arrays (bias: (K,) or None)."""
    if not out.size:
        return
    if spec.crs_per_group == 0:  # no input channels: the sum over an empty set is 0, plus bias
        out[...] = 0 if bias is None else bias.reshape(1, -1, 1, 1)
        return
    cdt = _compute_dtype(x.dtype)
    g, kg, crs_g = spec.groups, spec.k_per_group, spec.crs_per_group
    w_g = w.reshape(g, kg, crs_g).astype(cdt, copy=False)
    out_v = out.reshape(spec.n, g, kg, spec.p, spec.q)
    for n0, nb, p0, rows in _chunks(spec, cdt, workspace_limit, True):
        col = im2col_cpu(x[n0:n0 + nb], spec, p0, rows).astype(cdt, copy=False)
        col = col.reshape(nb, g, crs_g, rows * spec.q)
        # (nb, g, K/g, L) = (g, K/g, CRS/g) @ (nb, g, CRS/g, L)
        res = _samples_matmul(matmul, w_g, col)
        if bias is not None:  # added before the one rounding to out.dtype, as on the GPU
            res += bias.astype(cdt).reshape(1, g, kg, 1)
        out_v[n0:n0 + nb, :, :, p0:p0 + rows, :] = res.reshape(nb, g, kg, rows, spec.q)


def dgrad(dy: numpy.ndarray, w: numpy.ndarray, spec: ConvSpec, dx: numpy.ndarray, matmul,
          workspace_limit: int) -> None:
    """dx (N, C, H, W) = conv2d_input(dy, w) on C-contiguous arrays."""
    if _zero_if_degenerate(spec, dx):
        return
    cdt = _compute_dtype(dx.dtype)
    g, kg, crs_g = spec.groups, spec.k_per_group, spec.crs_per_group
    w_t = w.reshape(g, kg, crs_g).transpose(0, 2, 1).astype(cdt, copy=False)  # (g, CRS/g, K/g)
    acc = numpy.zeros(spec.input_shape, dtype=cdt)
    for n0, nb, p0, rows in _chunks(spec, cdt, workspace_limit, False):
        d = dy[n0:n0 + nb, :, p0:p0 + rows, :].astype(cdt).reshape(nb, g, kg, rows * spec.q)
        col = _samples_matmul(matmul, w_t, d)  # (nb, g, CRS/g, L) = (g, CRS/g, K/g) @ (nb, g, K/g, L)
        col2im_cpu(col.reshape(nb, spec.crs, rows * spec.q), spec, p0, rows, acc[n0:n0 + nb])
    dx[...] = acc


def wgrad(x: numpy.ndarray, dy: numpy.ndarray, spec: ConvSpec, dw: numpy.ndarray, matmul,
          workspace_limit: int) -> None:
    """dw (K, C/g, R, S) = conv2d_weight(x, dy) on C-contiguous arrays."""
    if _zero_if_degenerate(spec, dw):
        return
    cdt = _compute_dtype(x.dtype)
    g, kg, crs_g = spec.groups, spec.k_per_group, spec.crs_per_group
    acc = numpy.zeros((g, kg, crs_g), dtype=cdt)
    for n0, nb, p0, rows in _chunks(spec, cdt, workspace_limit, False):
        col = im2col_cpu(x[n0:n0 + nb], spec, p0, rows).astype(cdt, copy=False)
        length = rows * spec.q
        # samples interleaved, as on the GPU: (g, K/g, nb·L) @ (g, nb·L, CRS/g), one GEMM per group reducing over
        # samples and positions together (per-sample GEMMs and a sum were several times slower through torch's
        # batched matmul; einsum contracts without BLAS)
        col = col.reshape(nb, g, crs_g, length).transpose(1, 0, 3, 2).reshape(g, nb * length, crs_g)
        d = dy[n0:n0 + nb, :, p0:p0 + rows, :].astype(cdt).reshape(nb, g, kg, length)
        acc += matmul(d.transpose(1, 2, 0, 3).reshape(g, kg, nb * length), col)
    dw[...] = acc.reshape(dw.shape)
