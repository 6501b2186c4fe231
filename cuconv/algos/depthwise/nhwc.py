"""Depthwise on channels-last activations, every pass: Python twin of ``kernels_cu/depthwise/nhwc.cu``
(``reason_unsupported_nhwc``: what it serves; ``_nhwc_prepare``: the plans)."""

from __future__ import annotations

import functools

import numpy

from ... import _dtypes, _loader, _plan
from ...blocks import dgrad_forward
from ...blocks.epilogue import NO_EPILOGUE, epilogue_args
from ...spec import ConvSpec
from .shared import (ALGORITHM_NAME, _MAX_GRID_Y, _THREADS, _is_depthwise, epilogue_instances, fused_instance,
                     with_epilogue_flag)

STEM = "depthwise/nhwc"
# depthwise_nhwc_fwd's square kernels with unrolled tap loops (0: R x S read at run time)
_NHWC_KERNELS = (3, 5, 7, 0)


# depthwise_nhwc_wgrad's kernel widths with an input-window path (at column stride 1 or 2; others at run time)
_NHWC_WGRAD_WIDTHS = (3, 5, 7)


# depthwise_nhwc_fwd_q: output pixels a thread per square kernel (its registers: a row's KR + QT - 1 input
# vectors and QT accumulator vectors); auto takes it where ``cuconv.select.depthwise.nhwc_kernel`` says.
_NHWC_Q_PIXELS = {3: 4, 5: 4, 7: 2}
# depthwise_nhwc_fwd_tile's instances (KR, SR, QT): square kernels at stride 1 or 2, QT output pixels a thread
# (tiles of 8 rows x 2·QT columns: QT = 4 on planes of 8 columns or fewer, and for 7x7 at stride 2, whose
# staged window would pass static shared memory's 48 KB at QT = 8; else 8). ``auto`` takes it for the 16-bit types
# wherever it applies (``_nhwc_tile``); prepare(..., kernel="nhwc_tile") forces it there.
_NHWC_TILE_INSTANCES = tuple((kr, sr, qt) for kr in (3, 5, 7) for sr in (1, 2) for qt in (4, 8)
                             if not (kr == 7 and sr == 2 and qt == 8))
_NHWC_TILE_ROWS, _NHWC_TILE_CHANNELS = 8, 32  # kDwTileRows, kDwTileChannels


NAME_EXPRESSIONS = tuple(
    [f"depthwise_nhwc_weight<{t}>" for t in _dtypes.ALL_CTYPE_NAMES]
    + epilogue_instances(
        [f"depthwise_nhwc_fwd<{t},{r},{i}>" for t in _dtypes.ALL_CTYPE_NAMES for r in _NHWC_KERNELS
         for i in ("int", "long long")]
        + [f"depthwise_nhwc_fwd_q<{t},{r},{qt},{u},{i}>" for t in _dtypes.ALL_CTYPE_NAMES
           for r, qt in _NHWC_Q_PIXELS.items() for u in ("true", "false") for i in ("int", "long long")]
        + [f"depthwise_nhwc_fwd_tile<{t},{kr},{sr},{qt}>" for t in ("__half", "__nv_bfloat16")
           for kr, sr, qt in _NHWC_TILE_INSTANCES])
    + [f"depthwise_nhwc_dgrad<{t},{i}>" for t in _dtypes.ALL_CTYPE_NAMES for i in ("int", "long long")]
    + [f"depthwise_nhwc_wgrad<{t},{r},{sw}>" for t in _dtypes.ALL_CTYPE_NAMES
       for r, sw in [(r, sw) for r in _NHWC_WGRAD_WIDTHS for sw in (1, 2)] + [(0, 0)]]
    + [f"depthwise_nhwc_wgrad_reduce<{t}>" for t in _dtypes.ALL_CTYPE_NAMES])


def reason_unsupported_nhwc(spec: ConvSpec, dtype, pass_: str = "fprop", precision: str = "ieee", limits=None):
    """Why ``depthwise`` cannot run ``pass_`` on channels-last activations in place, or None: a multiplier of 1
    whose channels fill whole 16-byte vectors; the forward (``depthwise_nhwc_fwd``), the dgrad (at stride 1 the
    forward of dy with the kernel flipped, else a gather per dx pixel: ``depthwise_nhwc_dgrad``) and wgrad for
    kernels of up to ``_NHWC_WGRAD_MAX_S`` columns and 256 rows (``depthwise_nhwc_wgrad``)."""
    if not _is_depthwise(spec):
        return "not a depthwise convolution"
    if spec.k != spec.c:
        return "on channels-last tensors it runs a channel multiplier of 1 only"
    if spec.c * numpy.dtype(dtype).itemsize % 16:
        return "on channels-last tensors it needs channels in whole 16-byte vectors"
    if pass_ == "wgrad" and spec.s > _NHWC_WGRAD_MAX_S:
        return f"on channels-last tensors its wgrad keeps a kernel row's taps in registers: at most " \
               f"{_NHWC_WGRAD_MAX_S} columns"
    if pass_ == "wgrad" and spec.r > _THREADS:
        return f"on channels-last tensors its wgrad block holds every kernel row of its channels: at most " \
               f"{_THREADS} rows"
    if pass_ != "fprop" and max(*spec.stride, *spec.dilation, *spec.pad, spec.w * spec.c, spec.q * spec.c) >= 2**31:
        return "its channels-last backward kernels hold strides, dilations, paddings and a row's offsets in 32 bits"
    return None


_NHWC_WGRAD_MAX_S = 8  # kDwNhwcMaxS in depthwise/nhwc.cu


def _nhwc_index(spec: ConvSpec, dtype) -> str:
    """The index type of the channels-last gathers: int where every count fits 31 bits with room for the grid
    stride."""
    vectors = spec.n * max(spec.p * spec.q, spec.h * spec.w) * spec.c // (16 // numpy.dtype(dtype).itemsize)
    counts = (vectors, spec.n * spec.h * spec.w * spec.c, spec.n * spec.p * spec.q * spec.c)
    return "int" if max(counts) < 2**31 - 2**28 else "long long"


def _nhwc_tile(spec: ConvSpec, dtype):
    """(KR, SR, QT) of the ``depthwise_nhwc_fwd_tile`` instance for this forward, or None where it does not apply:
    float16 and bfloat16, a square 3x3, 5x5 or 7x7 kernel at stride 1 or 2 along both axes, dilation 1, a grid's
    samples and channel blocks, a sample's input and output within 31-bit offsets."""
    if numpy.dtype(dtype).itemsize != 2 or spec.r != spec.s or spec.stride not in ((1, 1), (2, 2)):
        return None
    if spec.dilation != (1, 1) or spec.n > _MAX_GRID_Y or -(-spec.c // _NHWC_TILE_CHANNELS) > _MAX_GRID_Y:
        return None
    if max(spec.h * spec.w * spec.c, spec.p * spec.q * spec.c) >= 2**31:
        return None
    kr, sr = spec.r, spec.stride[0]
    qt = 4 if spec.q <= 8 or (kr, sr) == (7, 2) else 8
    return (kr, sr, qt) if (kr, sr, qt) in _NHWC_TILE_INSTANCES else None


def _nhwc_launches(spec: ConvSpec, dtype, flip: bool, tiled: bool = False, tile=None, codes: tuple = NO_EPILOGUE):
    """(weight bytes, the weight's (R·S, C) launch, the forward launch) of ``depthwise_nhwc_fwd`` on ``spec``
    (``tiled``: ``depthwise_nhwc_fwd_q``, where the kernel is square and of ``_NHWC_Q_PIXELS``; ``tile``: the
    (KR, SR, QT) of ``depthwise_nhwc_fwd_tile``, ``_nhwc_tile``); ``flip``: the weight transposed with its taps
    reversed (dgrad of the layer whose dgrad ``spec`` is the forward of); ``codes``: the epilogue the forward's
    stores apply (``blocks.epilogue.epilogue_codes``). The forward's pointers: x, the weight as (R·S, C), bias, out,
    the residual (or 0)."""
    ctype = _dtypes.ctype_of(dtype)
    fused = fused_instance(codes, dtype)
    weight = _nhwc_weight(spec, dtype, flip)
    vec = 16 // numpy.dtype(dtype).itemsize
    index = _nhwc_index(spec, dtype)
    if tile is not None:
        kr, sr, qt = tile
        grid = (-(-spec.p // _NHWC_TILE_ROWS) * -(-spec.q // (2 * qt)), -(-spec.c // _NHWC_TILE_CHANNELS), spec.n)
        name = with_epilogue_flag(f"depthwise_nhwc_fwd_tile<{ctype},{kr},{sr},{qt}>", fused)
        forward = _loader.prepare(STEM, NAME_EXPRESSIONS, name, grid, (_THREADS, 1, 1), 5,
                                  (_loader.conv_geometry(spec), epilogue_args(codes)))
        return spec.r * spec.s * spec.c * numpy.dtype(dtype).itemsize, weight, forward
    if tiled and spec.r == spec.s and spec.r in _NHWC_Q_PIXELS:
        qt = _NHWC_Q_PIXELS[spec.r]
        total = spec.n * spec.p * -(-spec.q // qt) * spec.c // vec
        unit = str(spec.stride[1] == 1 and spec.dilation[1] == 1).lower()
        name = f"depthwise_nhwc_fwd_q<{ctype},{spec.r},{qt},{unit},{index}>"
    else:
        total = spec.n * spec.p * spec.q * spec.c // vec
        kr = spec.r if spec.r == spec.s and spec.r in _NHWC_KERNELS else 0
        name = f"depthwise_nhwc_fwd<{ctype},{kr},{index}>"
    forward = _loader.prepare(STEM, NAME_EXPRESSIONS, with_epilogue_flag(name, fused),
                              (_loader.blocks(total, 1 << 20), 1, 1), (_THREADS, 1, 1), 5,
                              (_loader.conv_geometry(spec), numpy.int64(total), epilogue_args(codes)))
    return spec.r * spec.s * spec.c * numpy.dtype(dtype).itemsize, weight, forward


def _nhwc_weight(spec: ConvSpec, dtype, flip: bool) -> "_loader.PreparedLaunch":
    """The weight (C, 1, R, S) to (R·S, C) (pointers: w, wt), taps reversed with ``flip``."""
    taps = spec.r * spec.s
    return _loader.prepare(STEM, NAME_EXPRESSIONS, f"depthwise_nhwc_weight<{_dtypes.ctype_of(dtype)}>",
                           (_loader.blocks(spec.c * taps), 1, 1), (_THREADS, 1, 1), 2,
                           (numpy.int64(spec.c), numpy.int32(taps), numpy.int32(flip)))


# depthwise_nhwc_wgrad: blocks of 256 threads, about this many resident per SM (its launch bounds), over the
# device once; each of a block's row lanes takes at least _NHWC_WGRAD_MIN_ROWS dy rows, and a block at most
# _NHWC_WGRAD_VECTORS channel vectors (so that every kernel row of them has lanes)
_NHWC_WGRAD_BLOCKS_PER_SM = 2
_NHWC_WGRAD_MIN_ROWS = 2
_NHWC_WGRAD_VECTORS = 8
_NHWC_WGRAD_VECTOR_BYTES = 8  # V = 8 / itemsize channels a thread (kernel's V)


def _nhwc_wgrad_kernel(spec: ConvSpec) -> tuple:
    """(KS, SW) of depthwise_nhwc_wgrad: the input-window kernel where the kernel's width is compiled and the
    columns step 1 or 2 at dilation 1; (0, 0), everything at run time, elsewhere."""
    if spec.s in _NHWC_WGRAD_WIDTHS and spec.stride[1] in (1, 2) and spec.dilation[1] == 1:
        return spec.s, spec.stride[1]
    return 0, 0


@functools.lru_cache(maxsize=1024)
def _nhwc_wgrad_launches(spec: ConvSpec, dtype, sm_count: int):
    """(partial bytes, the partial sums' launch (pointers x, dy, partial), the reduction (partial, dw)) of a
    channels-last wgrad: blocks of ``vpb`` channel vectors times every kernel row times ``lanes`` row lanes,
    slices of dy's N·P rows over the grid's y, so that the device holds its blocks in about one wave."""
    ctype = _dtypes.ctype_of(dtype)
    vectors = spec.c * dtype.itemsize // _NHWC_WGRAD_VECTOR_BYTES
    vpb = max(1, min(vectors, _NHWC_WGRAD_VECTORS, _THREADS // spec.r))
    lanes = _THREADS // (vpb * spec.r)
    blocks_x = -(-vectors // vpb)
    rows = spec.n * spec.p
    slices = max(1, min(-(-_NHWC_WGRAD_BLOCKS_PER_SM * sm_count // blocks_x),
                        -(-rows // (lanes * _NHWC_WGRAD_MIN_ROWS)), 65535))
    rows_per_slice = -(-rows // slices)
    slices = -(-rows // rows_per_slice)  # (no empty slice)
    ks, sw = _nhwc_wgrad_kernel(spec)
    partial = _loader.prepare(STEM, NAME_EXPRESSIONS, f"depthwise_nhwc_wgrad<{ctype},{ks},{sw}>",
                              (blocks_x, slices, 1), (_THREADS, 1, 1), 3,
                              (_loader.conv_geometry(spec), numpy.int64(rows_per_slice), numpy.int32(vpb),
                               numpy.int32(lanes)))
    taps = spec.r * spec.s
    reduce = _loader.prepare(STEM, NAME_EXPRESSIONS, f"depthwise_nhwc_wgrad_reduce<{ctype}>",
                             (-(-spec.c // 32), taps, 1), (32, 8, 1), 2,
                             (numpy.int64(slices), numpy.int64(spec.c), numpy.int64(taps)))
    acc = 8 if dtype.itemsize == 8 else 4
    return slices * taps * spec.c * acc, partial, reduce


def _nhwc_prepare(pass_: str, spec: ConvSpec, dtype, env: "_plan.Env", bias: bool,
                  kernel: str = None, codes: tuple = NO_EPILOGUE) -> "_plan.Plan":
    """A pass on channels-last activations: the weight as (R·S, C) into the workspace, then
    ``depthwise_nhwc_fwd`` over the forward (x into out) or, for dgrad at stride 1, over the forward of dy with
    the kernel flipped (into dx); a strided dgrad gathers (``depthwise_nhwc_dgrad``); wgrad sums slices of dy's
    rows into partial sums, then adds them in order (``depthwise_nhwc_wgrad``). The forward and the stride-1
    dgrad run the kernel ``cuconv.select.depthwise.nhwc_kernel`` picks: ``depthwise_nhwc_fwd_tile`` where it
    applies (``_nhwc_tile``), ``depthwise_nhwc_fwd_q`` or ``depthwise_nhwc_fwd``; ``kernel`` forces one of them where it applies
    (``"nhwc_tile"``, ``"nhwc_q"``: ``_NHWC_Q_PIXELS``; elsewhere ``depthwise_nhwc_fwd``), ``"nhwc"`` the last."""
    if kernel not in (None, "nhwc", "nhwc_q", "nhwc_tile"):
        raise ValueError(f"depthwise: kernel {kernel!r} on channels-last tensors; expected 'nhwc', 'nhwc_q' or "
                         "'nhwc_tile'")
    reason = reason_unsupported_nhwc(spec, dtype, pass_)
    if reason is not None:
        raise NotImplementedError(f"cuconv: depthwise cannot run this {pass_} on channels-last tensors: {reason}")
    b = _plan.Builder(pass_, env)
    if spec.n * spec.k * spec.p * spec.q == 0:
        return b.plan(ALGORITHM_NAME)
    if spec.c * spec.r * spec.s == 0:  # no taps: the output is the bias (or zeros)
        raise NotImplementedError("cuconv: depthwise's channels-last kernels need at least one tap")
    if pass_ == "wgrad":
        partial_bytes, partial, reduce = _nhwc_wgrad_launches(spec, dtype, env.sm_count)
        buffer = b.take(partial_bytes)
        b.launch(partial, b.ref("x"), b.ref("dy"), buffer)
        b.launch(reduce, buffer, b.ref("dw"))
        return b.plan(ALGORITHM_NAME)
    fspec = spec if pass_ == "fprop" else dgrad_forward.forward_spec(spec)
    if fspec is None:  # a strided dgrad: the gather, reading the weight as it is (not flipped)
        wt = b.take(spec.r * spec.s * spec.c * dtype.itemsize)
        b.launch(_nhwc_weight(spec, dtype, False), b.ref("w"), wt)
        total = spec.n * spec.h * spec.w * spec.c // (16 // dtype.itemsize)
        gather = _loader.prepare(STEM, NAME_EXPRESSIONS,
                                 f"depthwise_nhwc_dgrad<{_dtypes.ctype_of(dtype)},{_nhwc_index(spec, dtype)}>",
                                 (_loader.blocks(total, 1 << 20), 1, 1), (_THREADS, 1, 1), 3,
                                 (_loader.conv_geometry(spec), numpy.int64(total)))
        b.launch(gather, b.ref("dy"), wt, b.ref("dx"))
        return b.plan(ALGORITHM_NAME)
    if kernel is None:
        from ...select import depthwise as choice  # (the selector imports the algorithms)

        kernel = choice.nhwc_kernel(fspec, dtype)
    tile = _nhwc_tile(fspec, dtype) if kernel == "nhwc_tile" else None
    tiled = kernel == "nhwc_q"
    weight_bytes, weight, forward = _nhwc_launches(fspec, dtype, pass_ == "dgrad", tiled, tile, codes)
    wt = b.take(weight_bytes)
    b.launch(weight, b.ref("w"), wt)
    if pass_ == "fprop":
        b.launch(forward, b.ref("x"), wt, b.ref("bias") if bias else _plan.NULL, b.ref("out"),
                 b.ref("residual") if codes[1] else _plan.NULL)
    else:
        b.launch(forward, b.ref("dy"), wt, _plan.NULL, b.ref("dx"), _plan.NULL)
    return b.plan(ALGORITHM_NAME)
