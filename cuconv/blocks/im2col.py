"""Python twin of ``kernels_cu/im2col.cu``: the GPU gather's launcher and the NumPy gather of the CPU path.

Both produce the column matrix of a chunk of samples and output rows::

    col[n, (c, r, s), (p, q)] = x_padded[n, c, p*sh + r*dh, q*sw + s*dw]   for p in [p0, p0 + rows)

of ``L = rows*Q`` columns; taps that fall in the padding are zero. On the GPU each row is padded with zeros
to ``row_pitch(L, itemsize) >= L`` elements (16-byte aligned rows, whole-vector stores), and the samples'
matrices follow one another, ``(nb, C*R*S, pitch)``, or are interleaved row by row, ``(C*R*S, nb, pitch)``
(``interleaved``: one GEMM then reduces over samples and positions together); on the CPU rows are dense.
"""

from __future__ import annotations

import numpy

from .. import _dtypes, _loader
from ..spec import ConvSpec

__all__ = ["im2col_launch", "im2col_gpu", "im2col_cpu", "row_pitch", "im2col_nhwc_launch", "pixel_units",
           "PIXEL_UNITS", "NAME_EXPRESSIONS", "STEM"]

STEM = "blocks/im2col"
_ITEMS = 4  # vectors per thread per segment: kItems in im2col.cu
_MAX_GRID_Y = 65535
# In-row positions are 32-bit in the kernel; a segment may run 2^16 past the row end before the check.
MAX_ROW_PITCH = 2**31 - 2**16

# im2col_nhwc's (and col2im_pixels_nhwc's) copy units: C++ type by bytes
PIXEL_UNITS = {16: "uint4", 8: "uint2", 4: "unsigned int", 2: "unsigned short"}
NAME_EXPRESSIONS = tuple([f"im2col<{t}>" for t in _dtypes.ALL_CTYPE_NAMES]
                         + [f"im2col_nhwc<{u},{i},{m}>" for u in PIXEL_UNITS.values() for i in ("int", "long long")
                            for m in ("false", "true")])


def row_pitch(length: int, itemsize: int) -> int:
    """Column-matrix row pitch in elements: ``length`` rounded up to whole 16-byte vectors."""
    vec = 16 // itemsize
    return -(-length // vec) * vec


def im2col_launch(spec: ConvSpec, dtype, nb: int, p0: int, rows: int,
                  interleaved: bool = False) -> "_loader.PreparedLaunch":
    """A launch gathering the column matrix of ``nb`` samples and output rows [p0, p0 + rows): pointers x (the
    chunk's first sample, C-contiguous ``(nb, C, H, W)``) and col, ``(nb, C*R*S, pitch)`` or, ``interleaved``,
    ``(C*R*S, nb, pitch)``, with pitch ``row_pitch(rows*Q, itemsize)`` (columns past ``rows*Q`` are zeros).
    None where the chunk is empty."""
    dtype = numpy.dtype(dtype)
    length = rows * spec.q
    pitch = row_pitch(length, dtype.itemsize)
    if nb == 0 or length == 0 or spec.crs == 0:
        return None
    if pitch > MAX_ROW_PITCH:
        raise NotImplementedError(f"cuconv: im2col row of {pitch} elements exceeds {MAX_ROW_PITCH}")
    ld, ld_n = (nb * pitch, pitch) if interleaved else (pitch, spec.crs * pitch)
    vec = 16 // dtype.itemsize
    name = f"im2col<{_dtypes.ctype_of(dtype)}>"
    grid = (nb * spec.crs, _loader.blocks(length, _MAX_GRID_Y, _loader.THREADS * _ITEMS * vec), 1)
    i64 = numpy.int64
    scalars = (_loader.conv_geometry(spec), i64(p0), i64(length), i64(ld), i64(ld_n))
    return _loader.prepare(STEM, NAME_EXPRESSIONS, name, grid, (_loader.THREADS, 1, 1), 2, scalars)


def pixel_units(spec: ConvSpec, dtype, aligned: bool, channel_major: bool = False) -> tuple:
    """(bytes of a copy unit, units a pixel, index type) of the channels-last pixel copies of ``spec`` (C channels
    of ``dtype`` a pixel): the widest unit dividing a pixel's bytes, at most the element where the operands are not
    known to be 16-byte aligned or ``channel_major`` (a unit a channel); 32-bit indices where every unit offset of
    the tensors and of the column matrix (N·P·Q·R·S pixels) fits with the grid stride."""
    dtype = numpy.dtype(dtype)
    row = spec.c * dtype.itemsize
    unit = next(u for u in PIXEL_UNITS if row % u == 0 and (aligned and not channel_major or u <= dtype.itemsize))
    per = row // unit
    largest = spec.n * max(spec.h * spec.w, spec.p * spec.q * spec.r * spec.s) * per
    return unit, per, "int" if largest < 2**31 - 2**28 else "long long"


def im2col_nhwc_launch(spec: ConvSpec, dtype, aligned: bool, channel_major: bool = False) -> "_loader.PreparedLaunch":
    """A launch gathering the column matrix (N·P·Q, R·S·C) of a one-group layer from channels-last x, a row in
    (r, s, c) order, or with ``channel_major`` in (c, r, s) order (``im2col_nhwc``): pointers x and col;
    ``aligned``: both start on a 16-byte boundary."""
    unit, per, index = pixel_units(spec, dtype, aligned, channel_major)
    total = spec.n * spec.p * spec.q * spec.r * spec.s * per
    name = f"im2col_nhwc<{PIXEL_UNITS[unit]},{index},{str(channel_major).lower()}>"
    grid, block = (_loader.blocks(total, 1 << 20), 1, 1), (_loader.THREADS, 1, 1)
    return _loader.prepare(STEM, NAME_EXPRESSIONS, name, grid, block, 2,
                           (_loader.conv_geometry(spec), numpy.int64(per), numpy.int64(total)))


def im2col_gpu(x, spec: ConvSpec, p0: int, rows: int, col, interleaved: bool = False):
    """Fill ``col`` (CuPy, C-contiguous ``(nb, C*R*S, pitch)``, or ``(C*R*S, nb, pitch)`` where
    ``interleaved``) from ``x`` (C-contiguous ``(nb, C, H, W)``) on CuPy's current stream: ``im2col_launch``
    on arrays."""
    nb = x.shape[0]
    pitch = row_pitch(rows * spec.q, x.dtype.itemsize)
    shape = (spec.crs, nb, pitch) if interleaved else (nb, spec.crs, pitch)
    if col.shape != shape:
        raise ValueError(f"cuconv: column buffer of shape {col.shape} does not fit {shape}")
    launch = im2col_launch(spec, x.dtype, nb, p0, rows, interleaved)
    if launch is not None:
        import cupy

        launch(cupy.cuda.get_current_stream().ptr, x.data.ptr, col.data.ptr)
    return col


def im2col_cpu(x: numpy.ndarray, spec: ConvSpec, p0: int, rows: int) -> numpy.ndarray:
    """NumPy gather with the contract of :func:`im2col_gpu` and dense rows; returns a new array."""
    nb, c = x.shape[:2]
    (pt, pb, pl, pr), (sh, sw), (dh, dw) = spec.pad, spec.stride, spec.dilation
    xp = numpy.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    # Window view (nb, C, R, S, rows, Q): element = xp[n, c, (p0+p)*sh + r*dh, q*sw + s*dw].
    s_n, s_c, s_h, s_w = xp.strides
    start = xp[:, :, p0 * sh:, :]
    shape = (nb, c, spec.r, spec.s, rows, spec.q)
    strides = (s_n, s_c, dh * s_h, dw * s_w, sh * s_h, sw * s_w)
    # an axis of one position never steps: its stride is 0 (a huge stride or dilation would overflow the view's)
    view = numpy.lib.stride_tricks.as_strided(
        start, shape=shape, strides=tuple(0 if n == 1 else st for n, st in zip(shape, strides)), writeable=False)
    return view.reshape(nb, spec.crs, rows * spec.q)
