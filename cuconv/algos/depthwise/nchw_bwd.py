"""Depthwise dgrad (where it is not the forward of dy) and wgrad on NCHW activations: Python twin of
``kernels_cu/depthwise/nchw_bwd.cu``. dgrad: a thread per 2x2 quad of dx at stride 2 (``depthwise_dgrad_s2``),
else a gather per dx element (``depthwise_dgrad``); wgrad: per-block partial sums of every tap
(``depthwise_wgrad_strips`` where ``wgrad_strips_plan`` applies, else ``depthwise_wgrad_partial``), then an ordered
sum (``depthwise_wgrad_reduce``): deterministic, no atomics."""

from __future__ import annotations

import numpy

from ... import _dtypes, _loader
from ...spec import ConvSpec
from .shared import (_FIXED_KERNELS, _MAX_GRID_Y, _THREADS, _dw_geometry, _fits_int, _geometry, _index_type,
                     _wgrad_threads)

STEM = "depthwise/nchw_bwd"
NAME_EXPRESSIONS = tuple(
    [f"depthwise_dgrad_s2<{t},{r},{r}>" for t in _dtypes.ALL_CTYPE_NAMES for r in (3, 5, 7)]
    + [f"depthwise_dgrad<{t},{u},{i}>" for t in _dtypes.ALL_CTYPE_NAMES for u in ("true", "false")
       for i in ("int", "long long")]
    + [f"depthwise_wgrad_strips<{t},{r},{r},{sh}>" for t in _dtypes.ALL_CTYPE_NAMES for r in (3, 5, 7)
       for sh in (1, 2)]
    + [f"depthwise_wgrad_partial<{t},{i}>" for t in _dtypes.ALL_CTYPE_NAMES for i in ("int", "long long")]
    + [f"depthwise_wgrad_reduce<{t}>" for t in _dtypes.ALL_CTYPE_NAMES])


def _fn(name: str):
    return _loader.get_function(STEM, NAME_EXPRESSIONS, name)


def _dgrad_launch(spec: ConvSpec, dtype) -> "_loader.PreparedLaunch":
    """``depthwise_dgrad_s2`` at stride 2x2 and dilation 1 with a 3x3, 5x5 or 7x7 kernel (a thread per 2x2
    quad of dx), else ``depthwise_dgrad`` (a thread per dx element gathering its taps); pointers dy, w, dx."""
    if (spec.stride == (2, 2) and spec.dilation == (1, 1) and (spec.r, spec.s) in _FIXED_KERNELS
            and spec.r == spec.s and _fits_int(spec)):
        quads = spec.n * spec.c * -(-spec.h // 2) * -(-spec.w // 2)
        name = f"depthwise_dgrad_s2<{_dtypes.ctype_of(dtype)},{spec.r},{spec.s}>"
        return _loader.PreparedLaunch(_fn(name), name, (_loader.blocks(quads, 1 << 20), 1, 1), (_THREADS, 1, 1), 3,
                                      (_dw_geometry(spec, quads),))
    total = spec.n * spec.c * spec.h * spec.w
    unit = "true" if spec.stride == (1, 1) else "false"
    name = f"depthwise_dgrad<{_dtypes.ctype_of(dtype)},{unit},{_index_type(total)}>"
    grid = (_loader.blocks(total, 1 << 20), 1, 1)
    return _loader.PreparedLaunch(_fn(name), name, grid, (_THREADS, 1, 1), 3, _geometry(spec, total=total))


_WGRAD_STRIP_ROWS = 16  # depthwise_wgrad_strips: output rows per strip at most (fewer: planes split evenly)


def wgrad_strips_plan(spec: ConvSpec, sm_count: int):
    """(rows per strip, strips per plane, items per block, blocks per channel) of ``depthwise_wgrad_strips``,
    or None where it does not apply: it needs a 3x3, 5x5 or 7x7 kernel, dilation 1, a row stride of 1 or 2,
    and 32-bit indices (``_fits_int``). Items (sample, strip, column) of a channel are cut into blocks of whole
    passes of 256 threads, about eight blocks per SM over all channels, at least two items per thread where there
    are enough."""
    if ((spec.r, spec.s) not in _FIXED_KERNELS or spec.r != spec.s or spec.dilation != (1, 1)
            or spec.stride[0] not in (1, 2) or not _fits_int(spec)):
        return None
    strips = -(-spec.p // _WGRAD_STRIP_ROWS)
    rows = -(-spec.p // strips)
    items = spec.n * strips * spec.q
    passes = -(-items // _THREADS)
    blocks = max(1, min(-(-passes // 2), -(-8 * sm_count // spec.k)))
    chunk = -(-passes // blocks) * _THREADS
    blocks = -(-items // chunk)
    if items + chunk >= 2**31 or spec.k * blocks >= 2**31:
        return None
    return rows, strips, chunk, blocks


def _wgrad_launches(spec: ConvSpec, dtype, sm_count: int):
    """(bytes of the partial sums, the partial launch with pointers x, dy, partial, the reduce launch with
    pointers partial, dw): per-block partial sums of every tap (``depthwise_wgrad_strips`` where
    ``wgrad_strips_plan`` applies, else ``depthwise_wgrad_partial``), then an ordered sum over the blocks."""
    acc_dtype = numpy.dtype(numpy.float64 if dtype == numpy.float64 else numpy.float32)
    taps = spec.r * spec.s
    t = _dtypes.ctype_of(dtype)
    i64 = numpy.int64
    plan = wgrad_strips_plan(spec, sm_count)
    if plan is not None:
        rows, strips, chunk, chunks = plan
        name = f"depthwise_wgrad_strips<{t},{spec.r},{spec.s},{spec.stride[0]}>"
        partial = _loader.PreparedLaunch(_fn(name), name, (spec.k * chunks, 1, 1), (_THREADS, 1, 1), 3,
                                         (_dw_geometry(spec, spec.n * strips * spec.q, rows, strips, chunk),))
    else:
        threads = _wgrad_threads(spec, acc_dtype.itemsize)
        total = spec.n * spec.p * spec.q
        chunks = max(1, min(-(-total // (8 * threads)), -(-4 * sm_count // spec.k), _MAX_GRID_Y))
        chunk = -(-total // chunks)
        chunks = -(-total // chunk)
        name = f"depthwise_wgrad_partial<{t},{_index_type(total)}>"
        partial = _loader.PreparedLaunch(_fn(name), name, (spec.k, chunks, 1), (threads, 1, 1), 3,
                                         _geometry(spec, total=total, chunk=chunk),
                                         smem=taps * threads * acc_dtype.itemsize)
    name = f"depthwise_wgrad_reduce<{t}>"
    reduce = _loader.PreparedLaunch(_fn(name), name, (_loader.blocks(spec.k * taps), 1, 1),
                                    (_THREADS, 1, 1), 2, (i64(spec.k), i64(taps), i64(chunks)))
    return spec.k * chunks * taps * acc_dtype.itemsize, partial, reduce
