"""Python twin of ``kernels_cu/col2im.cu``: the adjoint of im2col (dgrad's scatter, written as a gather).

``col`` holds, for output rows ``[p0, p0 + rows)`` of ``nb`` samples, the gradient of every tap; col2im
sums each input pixel's taps into ``dx``. On the GPU ``col`` has a row pitch (see ``im2col.row_pitch``).
"""

from __future__ import annotations

import numpy

from .. import _dtypes, _loader
from ..spec import ConvSpec
from . import im2col

__all__ = ["col2im_launch", "col2im_gpu", "col2im_cpu", "touched_rows", "pixels_nhwc_launch", "COL2IM_CHUNK_DTYPE",
           "NAME_EXPRESSIONS", "STEM"]

STEM = "blocks/col2im"
_MAX_BLOCKS = 1 << 20


def _col_ctype(t: str) -> str:
    return "float" if t in ("__half", "__nv_bfloat16") else t


NAME_EXPRESSIONS = tuple([f"col2im<{_col_ctype(t)},{t},{unit},{index}>" for t in _dtypes.ALL_CTYPE_NAMES
                          for unit in ("true", "false") for index in ("int", "long long")]
                         + [f"col2im_pixels_nhwc<{u},{i}>" for u in im2col.PIXEL_UNITS.values()
                            for i in ("int", "long long")])


def touched_rows(spec: ConvSpec, p0: int, rows: int):
    """(first input row, number of input rows) that output rows [p0, p0 + rows) read."""
    first = max(0, p0 * spec.stride[0] - spec.pad[0])
    last = min(spec.h - 1, (p0 + rows - 1) * spec.stride[0] - spec.pad[0] + (spec.r - 1) * spec.dilation[0])
    return first, max(0, last - first + 1)


# Col2imChunk in col2im.cu: the launch's chunk, the struct argument beside the ConvGeometry.
COL2IM_CHUNK_DTYPE = numpy.dtype([(f, numpy.int64) for f in ("total", "p0", "rows", "ld", "h0", "h_rows")]
                                  + [(f, numpy.int32) for f in ("accumulate", "unused")], align=True)


def col2im_launch(spec: ConvSpec, dtype, col_dtype, nb: int, p0: int, rows: int, pitch: int,
                  accumulate: bool) -> "_loader.PreparedLaunch":
    """A launch summing a chunk's column matrix (``(nb, C*R*S, pitch)`` of ``col_dtype``) into dx
    (C-contiguous ``(nb, C, H, W)`` of ``dtype``); pointers col, dx (the chunk's first sample).
    ``accumulate=False`` writes every row of dx (the chunk must hold all output rows); ``True`` adds into the
    input rows the chunk touches and leaves the others alone. None where there is nothing to write."""
    if accumulate:
        h0, h_rows = touched_rows(spec, p0, rows)
    else:
        h0, h_rows = 0, spec.h
    total = nb * spec.c * h_rows * spec.w
    if total == 0:
        return None
    t = _dtypes.ctype_of(dtype)
    if _dtypes.ctype_of(col_dtype) != _col_ctype(t):
        raise ValueError(f"cuconv: col2im sums {_col_ctype(t)} columns into {t}, not {_dtypes.ctype_of(col_dtype)}")
    unit = "true" if spec.stride == (1, 1) else "false"
    # 32-bit decode and taps where idx + grid stride and every coordinate (h + pad - r·dil) stay below 2^31
    extents = (spec.c, spec.q, *spec.stride, spec.h + spec.pad[0] + spec.r * spec.dilation[0],
               spec.w + spec.pad[2] + spec.s * spec.dilation[1])
    index = "int" if total < 2**30 and max(extents) < 2**30 else "long long"
    name = f"col2im<{_col_ctype(t)},{t},{unit},{index}>"
    grid = (_loader.blocks(total, _MAX_BLOCKS), 1, 1)
    chunk = numpy.array((total, p0, rows, pitch, h0, h_rows, int(accumulate), 0), dtype=COL2IM_CHUNK_DTYPE)[()]
    return _loader.prepare(STEM, NAME_EXPRESSIONS, name, grid, (_loader.THREADS, 1, 1), 2,
                           (_loader.conv_geometry(spec), chunk))


def pixels_nhwc_launch(spec: ConvSpec, dtype, aligned: bool) -> "_loader.PreparedLaunch":
    """A launch writing every element of channels-last dx (N, H, W, C) of an unpadded 1x1 layer at a stride from
    its column matrix (N·P·Q, C) (``col2im_pixels_nhwc``: the pixels no output reads are zeros): pointers col and
    dx; ``aligned``: both start on a 16-byte boundary."""
    unit, per, index = im2col.pixel_units(spec, dtype, aligned)
    total = spec.n * spec.h * spec.w * per
    return _loader.prepare(STEM, NAME_EXPRESSIONS, f"col2im_pixels_nhwc<{im2col.PIXEL_UNITS[unit]},{index}>",
                           (_loader.blocks(total, _MAX_BLOCKS), 1, 1), (_loader.THREADS, 1, 1), 2,
                           (_loader.conv_geometry(spec), numpy.int64(per), numpy.int64(total)))


def col2im_gpu(col, spec: ConvSpec, p0: int, rows: int, dx, accumulate: bool) -> None:
    """Sum ``col`` (CuPy ``(nb, C*R*S, pitch)``) into ``dx`` (C-contiguous ``(nb, C, H, W)``) on CuPy's current
    stream: ``col2im_launch`` on arrays."""
    launch = col2im_launch(spec, dx.dtype, col.dtype, dx.shape[0], p0, rows, col.shape[-1], accumulate)
    if launch is not None:
        import cupy

        launch(cupy.cuda.get_current_stream().ptr, col.data.ptr, dx.data.ptr)


def col2im_cpu(col: numpy.ndarray, spec: ConvSpec, p0: int, rows: int, dx: numpy.ndarray) -> None:
    """Add ``col`` (dense ``(nb, C*R*S, rows*Q)``) into ``dx`` (``(nb, C, H, W)``), tap by tap."""
    nb = dx.shape[0]
    (pt, pb, pl, pr), (sh, sw), (dh, dw) = spec.pad, spec.stride, spec.dilation
    padded = numpy.zeros((nb, spec.c, spec.h + pt + pb, spec.w + pl + pr), dtype=col.dtype)
    taps = col.reshape(nb, spec.c, spec.r, spec.s, rows, spec.q)
    for r in range(spec.r):
        h = p0 * sh + r * dh
        for s in range(spec.s):
            w = s * dw
            padded[:, :, h:h + sh * (rows - 1) + 1:sh, w:w + sw * (spec.q - 1) + 1:sw] += taps[:, :, r, s]
    dx += padded[:, :, pt:pt + spec.h, pl:pl + spec.w].astype(dx.dtype, copy=False)
