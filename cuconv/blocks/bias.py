"""Python twin of ``kernels_cu/bias.cu``: a convolution's bias, broadcast (forward) and summed (backward).

Algorithms whose GEMM accumulates onto its output (cuBLAS with beta = 1) fill the output with the bias
first, so the bias is added in the GEMM's arithmetic and the result is rounded once. The bias gradient of
``cuconv.nn`` is ``bias_grad``: Σ of grad_output over (N, P, Q), in fp32 for the half types.
"""

from __future__ import annotations

import numpy

from .. import _dtypes, _loader
from ..spec import ConvSpec

__all__ = ["fill_launch", "grad_launch", "grad_launch_nhwc", "NhwcGrad", "NAME_EXPRESSIONS", "STEM"]

STEM = "blocks/bias"
_MAX_GRID_Y = 65535

_VECTOR_BYTES = (16, 8, 4)  # widest first
_ITEMSIZE = {"__half": 2, "__nv_bfloat16": 2, "float": 4, "double": 8}
NAME_EXPRESSIONS = tuple(f"{k}<{t}>" for k in ("bias_fill", "bias_grad", "bias_fill_flat", "bias_grad_warps",
                                                "bias_grad_nhwc_part", "bias_grad_nhwc_sum")
                         for t in _dtypes.ALL_CTYPE_NAMES) + tuple(
    f"bias_fill_vec<{t}, {v}>" for t in _dtypes.ALL_CTYPE_NAMES for v in _VECTOR_BYTES if v >= _ITEMSIZE[t])
# Planes of fewer pixels than a block take the flat fill and the warp-per-channel gradient.
_SMALL_PLANE = _loader.THREADS


def fill_launch(dtype, n: int, k: int, pq: int, *, aligned: bool) -> "_loader.PreparedLaunch":
    """A launch setting ``out[n, k] = bias[k]`` over a C-contiguous (n, K, P, Q) ``out``: where ``out`` is
    256-byte ``aligned`` and a plane is whole 16, 8 or 4-byte vectors, a thread per (widest) vector; else a block
    per plane, or a thread per element on planes smaller than a block; pointers: out, bias. None where the
    output is empty."""
    dtype = numpy.dtype(dtype)
    planes = n * k
    if planes == 0 or pq == 0:
        return None
    total = planes * pq
    plane_bytes = pq * dtype.itemsize
    width = next((v for v in _VECTOR_BYTES if v >= dtype.itemsize and plane_bytes % v == 0), None) if aligned else None
    if width is not None and total * dtype.itemsize // width < 2**30:  # 32-bit, as the flat fill
        vecs = total * dtype.itemsize // width
        name = f"bias_fill_vec<{_dtypes.ctype_of(dtype)}, {width}>"
        return _loader.prepare(STEM, NAME_EXPRESSIONS, name, (_loader.blocks(vecs), 1, 1), (_loader.THREADS, 1, 1),
                               2, (numpy.int64(k), numpy.int64(plane_bytes // width), numpy.int64(vecs)))
    if pq < _SMALL_PLANE and total < 2**30:  # 32-bit: an index plus the grid stride (< 2^24) below 2^31
        name = f"bias_fill_flat<{_dtypes.ctype_of(dtype)}>"
        return _loader.prepare(STEM, NAME_EXPRESSIONS, name, (_loader.blocks(total), 1, 1), (_loader.THREADS, 1, 1),
                               2, (numpy.int64(k), numpy.int64(pq), numpy.int64(total)))
    name = f"bias_fill<{_dtypes.ctype_of(dtype)}>"
    grid = (planes, _loader.blocks(pq, _MAX_GRID_Y), 1)
    return _loader.prepare(STEM, NAME_EXPRESSIONS, name, grid, (_loader.THREADS, 1, 1), 2,
                           (numpy.int64(k), numpy.int64(pq)))


def grad_launch(spec: ConvSpec, dtype) -> "_loader.PreparedLaunch":
    """A launch writing ``db[k] = Σ dy[:, k]`` for grad_output ``dy`` (N, K, P, Q) of ``spec``: a block per
    channel, or a warp per channel on planes smaller than a block; pointers: dy, db. None where there is no
    channel."""
    if spec.k == 0:
        return None
    i64 = numpy.int64
    scalars = (i64(spec.n), i64(spec.k), i64(spec.p * spec.q))
    if spec.p * spec.q < _SMALL_PLANE:
        name = f"bias_grad_warps<{_dtypes.ctype_of(dtype)}>"
        return _loader.prepare(STEM, NAME_EXPRESSIONS, name, (-(-spec.k // 8), 1, 1), (_loader.THREADS, 1, 1), 2,
                               scalars)
    name = f"bias_grad<{_dtypes.ctype_of(dtype)}>"
    return _loader.prepare(STEM, NAME_EXPRESSIONS, name, (spec.k, 1, 1), (_loader.THREADS, 1, 1), 2, scalars)


# The channels-last bias gradient's slices of rows: about this many blocks over the device (the sums of a slice
# then run beside the others), each slice at least _MIN_SLICE_ROWS rows (8 per row lane of a block).
_NHWC_GRAD_BLOCKS = 1024
_MIN_SLICE_ROWS = 64


class NhwcGrad:
    """The bias gradient of a channels-last grad_output of ``rows`` pixels (N·P·Q) of ``k`` channels: ``part``
    (pointers: dy, partials) sums slices of rows into ``partial_bytes`` of partial sums in the arithmetic type,
    ``sum`` (pointers: partials, db) adds them in order."""

    __slots__ = ("part", "sum", "partial_bytes")

    def __init__(self, dtype, rows: int, k: int):
        dtype = numpy.dtype(dtype)
        ctype = _dtypes.ctype_of(dtype)
        tiles = -(-k // 32)
        slices = max(1, min(-(-rows // _MIN_SLICE_ROWS), _NHWC_GRAD_BLOCKS // tiles, 65535))
        slice_rows = -(-rows // slices)
        slices = -(-rows // slice_rows)  # (no empty slice)
        i64 = numpy.int64
        self.part = _loader.prepare(STEM, NAME_EXPRESSIONS, f"bias_grad_nhwc_part<{ctype}>", (tiles, slices, 1),
                                    (32, 8, 1), 2, (i64(rows), i64(k), i64(slice_rows)))
        self.sum = _loader.prepare(STEM, NAME_EXPRESSIONS, f"bias_grad_nhwc_sum<{ctype}>", (-(-k // 8), 1, 1),
                                   (_loader.THREADS, 1, 1), 2, (i64(slices), i64(k)))
        self.partial_bytes = slices * k * (8 if dtype.itemsize == 8 else 4)

    def __call__(self, stream: int, dy: int, db: int, partials: int) -> None:
        self.part(stream, dy, partials)
        self.sum(stream, partials, db)


def grad_launch_nhwc(spec: ConvSpec, dtype) -> "NhwcGrad":
    """``grad_launch`` for a channels-last grad_output (N, P, Q, K in memory): two launches and a workspace of
    partial sums (``NhwcGrad``); None where there is no channel or no pixel."""
    rows = spec.n * spec.p * spec.q
    return NhwcGrad(dtype, rows, spec.k) if spec.k and rows else None
