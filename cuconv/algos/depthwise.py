"""Algorithm ``depthwise``: Python twin of ``kernels_cu/depthwise.cu`` (forward, dgrad and wgrad).

Serves ``groups == C`` with one input channel per group (``K = m·C``, channel multiplier ``m``), any kernel,
stride, padding and dilation, every dtype. These convolutions do ~R·S multiply-adds per element moved, so
they are memory-bound: im2col + GEMM would write and re-read R·S copies of the input and run one tiny GEMM
per group. Forward at stride = dilation = 1 (and so dgrad of such a layer at multiplier 1, the same
convolution with the flipped kernel), by preference:

- ``depthwise_fwd_rows`` (``rows_layout``, ``rows_strips``) for 3×3 (and 5×5 summing in float) with the
  kernel's centred padding left and right, rows of whole 16-byte vectors and 16-byte aligned tensors: each
  thread owns one 16-byte vector of a strip of rows (its halo from the neighbouring lanes by shuffles), its
  window in registers, the next step's rows loaded a step early in the 16-bit types, else prefetched into
  L2 (near the time of a same-size copy; docs/perf-notes.md);
- ``depthwise_fwd_plane`` (``plane_plan``) for 3×3 (and 5×5 summing in float) where a padded plane fits in
  shared memory and rows are 16-byte aligned: a persistent grid stages whole input planes by 16-byte
  ``cp.async`` copies, several buffers deep, and walks column strips of output rows from shared memory
  (depthwise_3x3 fp32: 68 µs of GPU time, 3.0 TB/s, against 87 µs for the strips);
- ``depthwise_fwd_strips`` (``strips_plan``) for 3×3, 5×5 and 7×7: a thread walks a column strip of output
  rows with its input rows in registers, reading through L1, no shared memory (small planes: the strips of
  all planes packed into the blocks);
- otherwise 32×64 output tiles, whose input window (``forward_smem``) opts into more than 48 KB of shared
  memory when a large or dilated kernel needs it.

The launch of each problem (kernel, grid, scalar arguments) is memoized per device: host time matters as
much as the kernel's at this size.
"""

from __future__ import annotations

import functools

import numpy

from .. import _dtypes, _loader, _plan
from ..blocks import dgrad_forward
from ..spec import ConvSpec
from ..problem import PASSES, Problem
from .base import Algorithm

__all__ = ["ALGORITHM", "Depthwise", "prepare", "forward_gpu", "dgrad_gpu", "wgrad_gpu", "reason_unsupported", "reason_unsupported_nhwc",
           "forward_smem", "rows_layout",
           "rows_strips", "plane_plan", "strips_plan", "wgrad_strips_plan", "forward_kernels", "FORWARD_KERNELS",
           "DW_GEOMETRY_DTYPE", "NAME_EXPRESSIONS", "STEM"]

STEM = "depthwise"
# Kernel sizes of depthwise_fwd_plane, for double and for float sums: its window and weights live in
# registers, and larger ones spill (7x7 in float, 5x5 in double) or leave one block per SM.
_PLANE_KERNELS = {False: ((3, 3),), True: ((3, 3), (5, 5))}
# Kernel sizes of depthwise_fwd_rows: the same limits (5x5 in double needs ~185 registers and spills at 128).
_ROWS_KERNELS = _PLANE_KERNELS
_THREADS = _loader.THREADS  # its kernels' block: the residency arithmetic below reads it
# depthwise_nhwc_fwd's square kernels with unrolled tap loops (0: R x S read at run time)
_NHWC_KERNELS = (3, 5, 7, 0)
# depthwise_nhwc_wgrad's kernel widths with an input-window path (at column stride 1 or 2; others at run time)
_NHWC_WGRAD_WIDTHS = (3, 5, 7)
# depthwise_nhwc_fwd_q: output pixels a thread per square kernel (its registers: a row's KR + QT - 1 input
# vectors and QT accumulator vectors). ``auto`` takes it for 5x5 kernels at unit stride and dilation only
# (_nhwc_fwd_tiled), where it measured faster than depthwise_nhwc_fwd; prepare(..., kernel="nhwc_q") forces it.
_NHWC_Q_PIXELS = {3: 4, 5: 4, 7: 2}
_NHWC_Q_AUTO = (5,)
# depthwise_nhwc_fwd_tile's instances (KR, SR, QT): square kernels at stride 1 or 2, QT output pixels a thread
# (tiles of 8 rows x 2·QT columns: QT = 4 on planes of 8 columns or fewer, and for 7x7 at stride 2, whose
# staged window would pass static shared memory's 48 KB at QT = 8; else 8). ``auto`` takes it for the 16-bit types
# wherever it applies (``_nhwc_tile``); prepare(..., kernel="nhwc_tile") forces it there.
_NHWC_TILE_INSTANCES = tuple((kr, sr, qt) for kr in (3, 5, 7) for sr in (1, 2) for qt in (4, 8)
                             if not (kr == 7 and sr == 2 and qt == 8))
_NHWC_TILE_ROWS, _NHWC_TILE_CHANNELS = 8, 32  # kDwTileRows, kDwTileChannels
_SMEM_LIMIT = _loader.SMEM_DEFAULT  # wgrad's per-thread accumulators stay within the default
_MAX_GRID_Y = 65535


NAME_EXPRESSIONS = tuple(
    [f"depthwise_fwd<{t},{r},{s},{u}>" for t in _dtypes.ALL_CTYPE_NAMES
     for r, s, u in [(r, s, u) for r, s in ((3, 3), (5, 5), (7, 7)) for u in ("true", "false")] + [(0, 0, "false")]]
    + [f"depthwise_fwd_strips<{t},{r},{s},{f}>" for t in _dtypes.ALL_CTYPE_NAMES for r, s in ((3, 3), (5, 5), (7, 7))
       for f in ("false", "true")]
    + [f"depthwise_fwd_plane<{t},{r},{s}>" for t in _dtypes.ALL_CTYPE_NAMES for r, s in _PLANE_KERNELS[t != "double"]]
    + [f"depthwise_fwd_rows<{t},{r},{s},{seg},{vb}>" for t in _dtypes.ALL_CTYPE_NAMES
       for r, s in _ROWS_KERNELS[t != "double"] for seg in ("false", "true")
       for vb in ((16, 8) if t in ("__half", "__nv_bfloat16") else (16,))]
    + [f"depthwise_fwd_gather<{t},{r},{r}>" for t in _dtypes.ALL_CTYPE_NAMES for r in (3, 5, 7)]
    + [f"depthwise_fwd_gather2<{t},{r},{r},{sw}>" for t in _dtypes.ALL_CTYPE_NAMES for r in (3, 5, 7) for sw in (1, 2)]
    + [f"depthwise_dgrad_s2<{t},{r},{r}>" for t in _dtypes.ALL_CTYPE_NAMES for r in (3, 5, 7)]
    + [f"depthwise_dgrad<{t},{u},{i}>" for t in _dtypes.ALL_CTYPE_NAMES for u in ("true", "false")
       for i in ("int", "long long")]
    + [f"depthwise_wgrad_strips<{t},{r},{r},{sh}>" for t in _dtypes.ALL_CTYPE_NAMES for r in (3, 5, 7)
       for sh in (1, 2)]
    + [f"depthwise_wgrad_partial<{t},{i}>" for t in _dtypes.ALL_CTYPE_NAMES for i in ("int", "long long")]
    + [f"depthwise_wgrad_reduce<{t}>" for t in _dtypes.ALL_CTYPE_NAMES]
    + [f"depthwise_nhwc_weight<{t}>" for t in _dtypes.ALL_CTYPE_NAMES]
    + [f"depthwise_nhwc_fwd<{t},{r},{i}>" for t in _dtypes.ALL_CTYPE_NAMES for r in _NHWC_KERNELS
       for i in ("int", "long long")]
    + [f"depthwise_nhwc_fwd_q<{t},{r},{qt},{u},{i}>" for t in _dtypes.ALL_CTYPE_NAMES
       for r, qt in _NHWC_Q_PIXELS.items() for u in ("true", "false") for i in ("int", "long long")]
    + [f"depthwise_nhwc_fwd_tile<{t},{kr},{sr},{qt}>" for t in ("__half", "__nv_bfloat16")
       for kr, sr, qt in _NHWC_TILE_INSTANCES]
    + [f"depthwise_nhwc_dgrad<{t},{i}>" for t in _dtypes.ALL_CTYPE_NAMES for i in ("int", "long long")]
    + [f"depthwise_nhwc_wgrad<{t},{r},{sw}>" for t in _dtypes.ALL_CTYPE_NAMES
       for r, sw in [(r, sw) for r in _NHWC_WGRAD_WIDTHS for sw in (1, 2)] + [(0, 0)]]
    + [f"depthwise_nhwc_wgrad_reduce<{t}>" for t in _dtypes.ALL_CTYPE_NAMES])


# DwGeometry in depthwise.cu: the gather kernels' one struct argument.
DW_GEOMETRY_DTYPE = numpy.dtype([(f, numpy.int32) for f in (
    "n", "c", "h", "w", "k", "p", "q", "mult", "stride_h", "stride_w", "pad_top", "pad_left", "dil_h", "dil_w",
    "total", "rows", "strips", "chunk", "flip")])


def _dw_geometry(spec: ConvSpec, total: int, rows: int = 0, strips: int = 0, chunk: int = 0):
    """The ``DwGeometry`` of ``spec`` for ``total`` work items (wgrad's strips: ``rows`` per strip, ``strips``
    per plane, ``chunk`` items per block)."""
    return numpy.array((spec.n, spec.c, spec.h, spec.w, spec.k, spec.p, spec.q, spec.k // spec.c, spec.stride[0],
                        spec.stride[1], spec.pad[0], spec.pad[2], spec.dilation[0], spec.dilation[1], total, rows,
                        strips, chunk, 0), dtype=DW_GEOMETRY_DTYPE)[()]


def _fits_int(spec: ConvSpec) -> bool:
    """The gather kernels decode and index in 32 bits: every tensor below 2^30 elements (an index plus a grid
    stride, below 2^28, stays below 2^31)."""
    return max(spec.n * spec.c * spec.h * spec.w, spec.n * spec.k * spec.p * spec.q) < 2**30


def _is_depthwise(spec: ConvSpec) -> bool:
    return spec.groups == spec.c and spec.c_per_group == 1


def _acc_size(dtype) -> int:
    return 8 if numpy.dtype(dtype) == numpy.float64 else 4


_TILE_P, _TILE_Q = 32, 64  # kTileP, kTileQ in depthwise.cu
_FIXED_KERNELS = ((3, 3), (5, 5), (7, 7))  # compiled with unrolled tap loops
_STRIP_ROWS = (4, 16)  # output rows per thread in depthwise_fwd_strips and _plane, shortest and longest
_PLANE_STAGES = (2, 4)  # depthwise_fwd_plane's plane buffers per block, fewest and most
_PLANE_BLOCK_SMEM = 48 << 10  # buffers beyond two stay within this (four blocks per SM)
_PLANE_SMEM = 96 << 10  # two buffers at most this: planes up to 48 KB, two blocks per SM
_PLANE_BLOCKS_PER_SM = {True: 4, False: 2}  # plane_min_blocks in the kernel: 3x3 summing in float, others


def forward_smem(spec: ConvSpec, itemsize: int, acc_size: int = 4) -> int:
    """Dynamic shared memory of one forward block: the R·S weights and the input tile with its halo."""
    rows = (_TILE_P - 1) * spec.stride[0] + (spec.r - 1) * spec.dilation[0] + 1
    cols = (_TILE_Q - 1) * spec.stride[1] + (spec.s - 1) * spec.dilation[1] + 1
    return -(-spec.r * spec.s * acc_size // 16) * 16 + rows * cols * itemsize


def _wgrad_threads(spec: ConvSpec, acc_size: int) -> int:
    """Largest power-of-two block whose per-thread tap accumulators fit in 48 KB (0: none fits)."""
    for threads in (256, 128, 64, 32):
        if spec.r * spec.s * threads * acc_size <= _SMEM_LIMIT:
            return threads
    return 0


def reason_unsupported(spec: ConvSpec, dtype, pass_: str = "fprop", precision: str = "ieee",
                       limits: "_plan.Limits" = None):
    """Why ``depthwise`` cannot run this case under ``limits`` (default: the current device's), or None."""
    if not _is_depthwise(spec):
        return (f"not a depthwise convolution (needs groups == C with one input channel per group; got "
                f"groups={spec.groups}, C={spec.c})")
    acc = _acc_size(dtype)
    if pass_ == "fprop":
        smem = forward_smem(spec, numpy.dtype(dtype).itemsize, acc)
        limit = (limits or _plan.current_limits()).smem_limit
        if smem > limit:
            return f"a 32x64 output tile's input window needs {smem} bytes of shared memory (> {limit})"
    if pass_ == "wgrad" and _wgrad_threads(spec, acc) == 0:
        return f"{spec.r}x{spec.s} taps do not fit per-thread accumulators in {_SMEM_LIMIT} bytes"
    return None


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


_NHWC_WGRAD_MAX_S = 8  # kDwNhwcMaxS in depthwise.cu


def _nhwc_index(spec: ConvSpec, dtype) -> str:
    """The index type of the channels-last gathers: int where every count fits 31 bits with room for the grid
    stride."""
    vectors = spec.n * max(spec.p * spec.q, spec.h * spec.w) * spec.c // (16 // numpy.dtype(dtype).itemsize)
    counts = (vectors, spec.n * spec.h * spec.w * spec.c, spec.n * spec.p * spec.q * spec.c)
    return "int" if max(counts) < 2**31 - 2**28 else "long long"


def _nhwc_fwd_tiled(spec: ConvSpec) -> bool:
    """Whether ``auto`` runs ``depthwise_nhwc_fwd_q`` for this forward (or stride-1 dgrad's forward of dy)."""
    return (spec.r == spec.s and spec.r in _NHWC_Q_AUTO and spec.stride == (1, 1)
            and spec.dilation == (1, 1))


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


def _nhwc_launches(spec: ConvSpec, dtype, flip: bool, tiled: bool = False, tile=None):
    """(weight bytes, the weight's (R·S, C) launch, the forward launch) of ``depthwise_nhwc_fwd`` on ``spec``
    (``tiled``: ``depthwise_nhwc_fwd_q``, where the kernel is square and of ``_NHWC_Q_PIXELS``; ``tile``: the
    (KR, SR, QT) of ``depthwise_nhwc_fwd_tile``, ``_nhwc_tile``); ``flip``: the weight transposed with its taps
    reversed (dgrad of the layer whose dgrad ``spec`` is the forward of)."""
    ctype = _dtypes.ctype_of(dtype)
    weight = _nhwc_weight(spec, dtype, flip)
    vec = 16 // numpy.dtype(dtype).itemsize
    index = _nhwc_index(spec, dtype)
    if tile is not None:
        kr, sr, qt = tile
        grid = (-(-spec.p // _NHWC_TILE_ROWS) * -(-spec.q // (2 * qt)), -(-spec.c // _NHWC_TILE_CHANNELS), spec.n)
        forward = _loader.prepare(STEM, NAME_EXPRESSIONS, f"depthwise_nhwc_fwd_tile<{ctype},{kr},{sr},{qt}>", grid,
                                  (_THREADS, 1, 1), 4, (_loader.conv_geometry(spec),))
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
    forward = _loader.prepare(STEM, NAME_EXPRESSIONS, name, (_loader.blocks(total, 1 << 20), 1, 1), (_THREADS, 1, 1),
                              4, (_loader.conv_geometry(spec), numpy.int64(total)))
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
                  kernel: str = None) -> "_plan.Plan":
    """A pass on channels-last activations: the weight as (R·S, C) into the workspace, then
    ``depthwise_nhwc_fwd`` over the forward (x into out) or, for dgrad at stride 1, over the forward of dy with
    the kernel flipped (into dx); a strided dgrad gathers (``depthwise_nhwc_dgrad``); wgrad sums slices of dy's
    rows into partial sums, then adds them in order (``depthwise_nhwc_wgrad``). The forward and the stride-1
    dgrad run ``depthwise_nhwc_fwd_tile`` where it applies (``_nhwc_tile``), else ``depthwise_nhwc_fwd_q`` for
    5x5 kernels at unit stride, else ``depthwise_nhwc_fwd``; ``kernel`` forces one of them where it applies
    (``"nhwc_tile"``, ``"nhwc_q"``: ``_NHWC_Q_PIXELS``; elsewhere ``depthwise_nhwc_fwd``), ``"nhwc"`` the last."""
    if kernel not in (None, "nhwc", "nhwc_q", "nhwc_tile"):
        raise ValueError(f"depthwise: kernel {kernel!r} on channels-last tensors; expected 'nhwc', 'nhwc_q' or "
                         "'nhwc_tile'")
    reason = reason_unsupported_nhwc(spec, dtype, pass_)
    if reason is not None:
        raise NotImplementedError(f"cuconv: depthwise cannot run this {pass_} on channels-last tensors: {reason}")
    b = _plan.Builder(pass_, env)
    if spec.n * spec.k * spec.p * spec.q == 0:
        return b.plan(STEM)
    if spec.c * spec.r * spec.s == 0:  # no taps: the output is the bias (or zeros)
        raise NotImplementedError("cuconv: depthwise's channels-last kernels need at least one tap")
    if pass_ == "wgrad":
        partial_bytes, partial, reduce = _nhwc_wgrad_launches(spec, dtype, env.sm_count)
        buffer = b.take(partial_bytes)
        b.launch(partial, b.ref("x"), b.ref("dy"), buffer)
        b.launch(reduce, buffer, b.ref("dw"))
        return b.plan(STEM)
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
        return b.plan(STEM)
    tile = _nhwc_tile(fspec, dtype) if kernel in (None, "nhwc_tile") else None
    tiled = _nhwc_fwd_tiled(fspec) if kernel is None else kernel == "nhwc_q"
    weight_bytes, weight, forward = _nhwc_launches(fspec, dtype, pass_ == "dgrad", tiled, tile)
    wt = b.take(weight_bytes)
    b.launch(weight, b.ref("w"), wt)
    if pass_ == "fprop":
        b.launch(forward, b.ref("x"), wt, b.ref("bias") if bias else _plan.NULL, b.ref("out"))
    else:
        b.launch(forward, b.ref("dy"), wt, _plan.NULL, b.ref("dx"))
    return b.plan(STEM)


def _index_type(total: int) -> str:
    """C++ index type for an element count: 32-bit decodes when they cannot overflow."""
    return "int" if total < 2**30 else "long long"  # idx plus a grid stride (< 2^28) stays below 2^31


def _fn(name: str):
    return _loader.get_function(STEM, NAME_EXPRESSIONS, name)


# DwWork in depthwise.cu: what the 64-bit-indexed kernels take besides the cuconv::ConvGeometry.
DW_WORK_DTYPE = numpy.dtype([(f, numpy.int64) for f in (
    "mult", "total", "tiles_q", "rows", "strips", "items", "slots", "segs", "seg_lanes", "lead", "pitch", "stages",
    "chunk", "flip")])


def _geometry(spec: ConvSpec, **work) -> tuple:
    """The (ConvGeometry, DwWork) arguments of a 64-bit-indexed kernel: ``mult`` and the DwWork fields ``work``
    names, the others zero."""
    values = numpy.zeros((), dtype=DW_WORK_DTYPE)
    values["mult"] = spec.k // spec.c
    for name, value in work.items():
        values[name] = value
    return _loader.conv_geometry(spec), values[()]


def _strips(spec: ConvSpec):
    """(rows per strip, strips per plane, passes of 256 threads over them) of the column-strip kernels: the
    strip length, 4 to 16 rows, that wastes the fewest thread-rows in the last pass; ties go to longer
    strips (fewer reloaded window rows)."""
    best = None
    for rows in range(_STRIP_ROWS[1], _STRIP_ROWS[0] - 1, -1):
        strips = -(-spec.p // rows)
        passes = -(-strips * spec.q // _THREADS)
        slots = passes * _THREADS * rows
        if best is None or slots < best[0]:
            best = (slots, rows, strips, passes)
    return best[1:]


def strips_plan(spec: ConvSpec):
    """(rows per strip, strips per plane) for ``depthwise_fwd_strips`` (``_strips``), or None where that kernel
    does not apply (it needs stride = dilation = 1, a 3×3, 5×5 or 7×7 kernel, and fewer than 2^31 items:
    (plane, strip, column) triples, a thread each, and at most 65535 blocks of them a plane)."""
    if spec.stride != (1, 1) or spec.dilation != (1, 1) or (spec.r, spec.s) not in _FIXED_KERNELS:
        return None
    rows, strips, _ = _strips(spec)
    if spec.n * spec.k * strips * spec.q >= 2**31 - _THREADS or -(-strips * spec.q // _THREADS) > _MAX_GRID_Y:
        return None
    return rows, strips


def plane_plan(spec: ConvSpec, dtype):
    """(rows per strip, strips per plane, lead, pitch, buffers, shared-memory bytes) for
    ``depthwise_fwd_plane``, or None where it does not apply: it needs stride = dilation = 1, a kernel of
    ``_PLANE_KERNELS`` (3×3, and 5×5 where sums are in float), rows of a multiple of 16 bytes (its copies;
    without them the strips kernel is as fast) and two padded input planes within
    ``_PLANE_SMEM`` and the device's limit. The input's base address must be 16-byte aligned too (the
    launcher's check).

    A staged plane has P + R - 1 rows of ``pitch`` elements; image column 0 sits at ``lead``, the left
    padding rounded up to 16 bytes, so that 16-byte copies land aligned; ``pitch`` covers the right
    padding, rounded to 16 bytes. Buffers: as many as fit ``_PLANE_BLOCK_SMEM`` (two to four), so that
    several planes per block are in flight while one is convolved. The strip length, 4 to 16 rows, wastes
    the fewest thread-rows over the block's passes of 256 threads; ties go to longer strips (fewer reloaded
    window rows)."""
    if spec.stride != (1, 1) or spec.dilation != (1, 1):
        return None
    if (spec.r, spec.s) not in _PLANE_KERNELS[_acc_size(dtype) == 4]:
        return None
    itemsize = numpy.dtype(dtype).itemsize
    per_vector = 16 // itemsize
    if spec.w % per_vector:
        return None
    lead = -(-spec.pad[2] // per_vector) * per_vector
    pitch = -(-(lead + spec.w + spec.pad[3]) // per_vector) * per_vector
    plane_bytes = (spec.p + spec.r - 1) * pitch * itemsize
    if _PLANE_STAGES[0] * plane_bytes > min(_PLANE_SMEM, _loader.smem_limit()):
        return None
    stages = max(_PLANE_STAGES[0], min(_PLANE_STAGES[1], _PLANE_BLOCK_SMEM // plane_bytes))
    rows, strips, _ = _strips(spec)
    return rows, strips, lead, pitch, stages, stages * plane_bytes


def _plane_grid(spec: ConvSpec, dtype, smem: int) -> int:
    """Persistent grid of ``depthwise_fwd_plane``: the blocks that are resident at once (registers: four per
    SM for 3×3 summing in float, else two, as ``plane_min_blocks`` in the kernel; shared memory), at most
    one per input plane."""
    import cupy

    device = cupy.cuda.runtime.getDevice()
    by_regs = _PLANE_BLOCKS_PER_SM[spec.r <= 3 and _acc_size(dtype) == 4]
    by_smem = _smem_per_sm(device) // (smem + 1024)  # 1 KB per block is reserved
    return max(1, min(spec.n * spec.c, _sm_count(device) * max(1, min(by_regs, by_smem))))


def rows_vector_bytes(spec: ConvSpec, dtype):
    """The bytes of ``depthwise_fwd_rows``' row vectors for rows of ``spec.w`` elements: 16 where a row is a
    multiple of 16 bytes; in the 16-bit types 8 where it is a multiple of 8 (rows of 28 or 20 halves, which
    16-byte vectors miss: without them those layers took the strips kernel at twice float32's time); else
    None."""
    row_bytes = spec.w * numpy.dtype(dtype).itemsize
    if row_bytes % 16 == 0:
        return 16
    if numpy.dtype(dtype).itemsize == 2 and row_bytes % 8 == 0:
        return 8
    return None


def rows_layout(spec: ConvSpec, dtype):
    """(segments per row, lanes per segment, slots per warp) of ``depthwise_fwd_rows``, or None where it does
    not apply: it needs stride = dilation = 1, a kernel of ``_ROWS_KERNELS`` with its centred padding left
    and right (so Q == W: output rows are input rows' width, vector for vector) and rows of whole vectors
    (``rows_vector_bytes``). The input and output base addresses must be 16-byte aligned too (the
    launcher's check).

    A thread owns V = vector bytes / itemsize consecutive columns (one load and one store per row). A row's
    G = W / V vectors are cut into segments of at most 32 lanes, as even as they go; a warp serves
    32 // lanes slots side by side, a slot being one segment of one strip of output rows of one plane."""
    if spec.stride != (1, 1) or spec.dilation != (1, 1):
        return None
    if (spec.r, spec.s) not in _ROWS_KERNELS[_acc_size(dtype) == 4]:
        return None
    if spec.pad[2] != (spec.s - 1) // 2 or spec.pad[3] != spec.s - 1 - spec.pad[2]:
        return None
    vector_bytes = rows_vector_bytes(spec, dtype)
    if vector_bytes is None:
        return None
    vectors = spec.w // (vector_bytes // numpy.dtype(dtype).itemsize)
    segs = -(-vectors // 32)
    lanes = -(-vectors // segs)
    if spec.n * spec.k * segs * spec.p >= 2**31:  # slot indices are 32-bit (at most P strips per plane)
        return None
    return segs, lanes, 32 // lanes


_ROWS_SLOT_ROWS = 2  # a slot's fixed cost (decode, taps, the first KR - 1 rows' latency), in output rows


def rows_strips(spec: ConvSpec, segs: int, per_warp: int, resident_warps: int):
    """(rows per strip, strips per plane) of ``depthwise_fwd_rows`` for a persistent grid of
    ``resident_warps`` warps. Strips are a multiple of R rows long (the kernel steps R rows at a time; the
    last strip of a plane computes past P and stores only its rows). The length is the one whose rounds
    over the grid cost the fewest rows, a round costing its strips' rows plus the R - 1 rows above them and
    ``_ROWS_SLOT_ROWS``; for each strip count, the shortest length that gives it."""
    best = None
    resident = resident_warps * per_warp
    planes = spec.n * spec.k
    last = None
    for steps in range(1, -(-spec.p // spec.r) + 1):
        rows = steps * spec.r
        strips = -(-spec.p // rows)
        if strips == last:
            continue
        last = strips
        rounds = -(-planes * strips * segs // resident)
        cost = rounds * (rows + spec.r - 1 + _ROWS_SLOT_ROWS)
        if best is None or cost < best[0]:
            best = (cost, rows, strips)
    return best[1:]


def _rows_launch(spec: ConvSpec, dtype, layout, device: int):
    """(kernel, grid, scalar arguments) of ``depthwise_fwd_rows``: a persistent grid of the blocks that are
    resident at once (the kernel's registers decide), strips cut for it (``rows_strips``)."""
    segs, lanes, per_warp = layout
    name = (f"depthwise_fwd_rows<{_dtypes.ctype_of(dtype)},{spec.r},{spec.s},{'true' if segs > 1 else 'false'},"
            f"{rows_vector_bytes(spec, dtype)}>")
    regs = -(-max(1, _fn(name).num_regs) // 8) * 8
    blocks_per_sm = max(1, min(2048 // _THREADS, 65536 // (regs * _THREADS)))
    resident_warps = _sm_count(device) * blocks_per_sm * (_THREADS // 32)
    rows, strips = rows_strips(spec, segs, per_warp, resident_warps)
    slots = spec.n * spec.k * strips * segs
    blocks = min(-(-slots // (per_warp * (_THREADS // 32))), _sm_count(device) * blocks_per_sm)
    return name, (blocks, 1, 1), _geometry(spec, slots=slots, strips=strips, segs=segs, seg_lanes=lanes, rows=rows)


FORWARD_KERNELS = ("gather", "rows", "plane", "strips", "tiles")
# depthwise_fwd_strips packs the strips of planes up to this many output pixels flat into its blocks: a block
# per plane would hold a few busy threads (a 7x7 plane: 7 of 256), and the SM's limit of resident blocks would
# leave it nearly idle. On larger planes a block per plane is as fast or faster (5x5, 7x7 kernels on 56x56: 1.3-
# 1.9x).
_FLAT_STRIPS_MAX_PIXELS = 14 * 14


def forward_gpu(x, w, bias, spec: ConvSpec, out, precision: str, kernel: str = None) -> None:
    """out = depthwise conv(x, w) + bias on C-contiguous CuPy arrays (precision: FFMA, none to choose).
    ``kernel`` (one of ``FORWARD_KERNELS``, for tests) forces one forward kernel; it raises
    NotImplementedError where that kernel cannot serve."""
    import cupy

    launch = _forward_prepared(spec, x.dtype, x.data.ptr % 16 == 0, out.data.ptr % 16 == 0, _loader.smem_limit(),
                               cupy.cuda.runtime.getDevice(), kernel)
    launch(cupy.cuda.get_current_stream().ptr, x.data.ptr, w.data.ptr, 0 if bias is None else bias.data.ptr,
           out.data.ptr)


def prepare(pass_: str, spec: ConvSpec, dtype, precision: str, env: "_plan.Env", bias: bool = False,
            kernel: str = None, layout: str = "nchw") -> "_plan.Plan":
    """The plan of ``pass_`` (see ``cuconv._plan``): the forward is one launch (``kernel`` forces one of
    ``FORWARD_KERNELS``); dgrad one launch of the forward kernel on dy reading the weight flipped where that is
    the same convolution (stride 1, multiplier 1), else a gather per dx element (no atomics); wgrad per-chunk
    partial sums in the workspace, then an ordered sum. ``layout="nhwc"``: channels-last activations, every
    pass (``reason_unsupported_nhwc``, ``_nhwc_prepare``)."""
    dtype = numpy.dtype(dtype)
    if layout == "nhwc":
        return _nhwc_prepare(pass_, spec, dtype, env, bias, kernel)
    b = _plan.Builder(pass_, env)
    if pass_ == "fprop":
        launch = _forward_prepared(spec, dtype, env.aligned, env.aligned, env.smem_limit, env.device, kernel)
        b.launch(launch, b.ref("x"), b.ref("w"), b.ref("bias"), b.ref("out"))
    elif pass_ == "dgrad":
        transposed = dgrad_forward.forward_spec(spec)
        if transposed is not None and reason_unsupported(transposed, dtype, limits=env) is None:
            # (multiplier 1: the transposed convolution's weight is the layer's, flipped, which the forward
            # kernels read in place: one launch, no flipped copy)
            launch = _forward_prepared(transposed, dtype, env.aligned, env.aligned, env.smem_limit, env.device,
                                       None, True)
            b.launch(launch, b.ref("dy"), b.ref("w"), _plan.NULL, b.ref("dx"))
        else:
            b.launch(_dgrad_launch(spec, dtype), b.ref("dy"), b.ref("w"), b.ref("dx"))
    else:
        partial_bytes, partial, reduce = _wgrad_launches(spec, dtype, env.sm_count)
        buffer = b.take(partial_bytes)
        b.launch(partial, b.ref("x"), b.ref("dy"), buffer)
        b.launch(reduce, buffer, b.ref("dw"))
    return b.plan(STEM)


@functools.lru_cache(maxsize=1024)
def _forward_prepared(spec: ConvSpec, dtype, x_aligned: bool, out_aligned: bool, smem_limit: int, device: int,
                      kernel: str = None, flip: bool = False) -> "_loader.PreparedLaunch":
    """``_forward_launch`` prepared (``_loader.PreparedLaunch``): a call passes four pointers to one driver
    call instead of CuPy marshalling sixteen arguments (~8 µs of host time on a 0.06 ms layer). ``flip``: the
    kernel reads the weight flipped in both axes (dgrad at stride 1 as this forward of dy)."""
    name, grid, block, smem, geometry = _forward_launch(spec, dtype, x_aligned, out_aligned, smem_limit, device,
                                                        kernel)
    if flip:
        geometry = tuple(_flipped(g) for g in geometry)
    return _loader.PreparedLaunch(_fn(name), name, grid, block, 4, geometry, smem)


def _flipped(struct):
    """A copy of a kernel's struct argument with its ``flip`` field set (structs without one as they are)."""
    if "flip" not in (struct.dtype.names or ()):
        return struct
    copy = numpy.array(struct, dtype=struct.dtype)
    copy["flip"] = 1
    return copy[()]


def forward_kernels(spec: ConvSpec, dtype, x_aligned: bool = True, out_aligned: bool = True) -> tuple:
    """The forward kernels of ``FORWARD_KERNELS`` that can serve this depthwise convolution, by preference:
    ``gather`` first at a stride or dilation above 1, then ``rows`` (``rows_layout``; 16-byte aligned input and
    output), ``plane`` (``plane_plan``; aligned input), ``strips`` (``strips_plan``), ``gather`` (3x3, 5x5,
    7x7, tensors below 2^31 elements), ``tiles`` (any geometry whose tiles fit the grid)."""
    gather = (spec.r, spec.s) in _FIXED_KERNELS and spec.r == spec.s and _fits_int(spec)
    gather_first = gather and (spec.stride != (1, 1) or spec.dilation != (1, 1))
    out = ["gather"] if gather_first else []
    if rows_layout(spec, dtype) is not None and x_aligned and out_aligned:
        out.append("rows")
    if plane_plan(spec, dtype) is not None and x_aligned:
        out.append("plane")
    if strips_plan(spec) is not None:
        out.append("strips")
    if gather and not gather_first:
        out.append("gather")
    if -(-spec.p // _TILE_P) * -(-spec.q // _TILE_Q) <= _MAX_GRID_Y:
        out.append("tiles")
    return tuple(out)


def _forward_launch(spec: ConvSpec, dtype, x_aligned: bool, out_aligned: bool, smem_limit: int, device: int,
                    kernel: str = None):
    """(kernel, grid, block, shared memory, scalar arguments) of the forward: the first of
    ``forward_kernels`` (or ``kernel``, forced). Planned once per problem, alignment and device: its one
    caller, ``_forward_prepared``, is memoized."""
    ctype = _dtypes.ctype_of(dtype)
    if kernel not in (None,) + FORWARD_KERNELS:
        raise ValueError(f"cuconv: unknown depthwise forward kernel {kernel!r}; expected one of {FORWARD_KERNELS}")
    usable = forward_kernels(spec, dtype, x_aligned, out_aligned)
    if kernel is None:
        if not usable:
            raise NotImplementedError(f"cuconv: depthwise needs more than {_MAX_GRID_Y} tiles per output plane")
        kernel = usable[0]
    elif kernel not in usable:
        raise NotImplementedError(f"cuconv: depthwise's {kernel} forward kernel cannot serve this convolution")
    if kernel == "gather":  # two outputs a thread where their windows share columns (dilation 1, stride_w <= 2)
        if spec.dilation == (1, 1) and spec.stride[1] in (1, 2):
            total = spec.n * spec.k * spec.p * -(-spec.q // 2)
            name = f"depthwise_fwd_gather2<{ctype},{spec.r},{spec.s},{spec.stride[1]}>"
        else:
            total = spec.n * spec.k * spec.p * spec.q
            name = f"depthwise_fwd_gather<{ctype},{spec.r},{spec.s}>"
        return name, (_loader.blocks(total, 1 << 20), 1, 1), (_THREADS, 1, 1), 0, (_dw_geometry(spec, total),)
    if kernel == "rows":
        name, grid, geometry = _rows_launch(spec, dtype, rows_layout(spec, dtype), device)
        return name, grid, (_THREADS, 1, 1), 0, geometry
    if kernel == "plane":
        rows, count, lead, pitch, stages, smem = plane_plan(spec, dtype)
        geometry = _geometry(spec, rows=rows, strips=count, lead=lead, pitch=pitch, stages=stages)
        return (f"depthwise_fwd_plane<{ctype},{spec.r},{spec.s}>", (_plane_grid(spec, dtype, smem), 1, 1),
                (_THREADS, 1, 1), smem, geometry)
    if kernel == "strips":
        rows, count = strips_plan(spec)
        items = spec.n * spec.k * count * spec.q
        geometry = _geometry(spec, rows=rows, strips=count, items=items)
        flat = spec.p * spec.q <= _FLAT_STRIPS_MAX_PIXELS
        grid = (_loader.blocks(items, None), 1, 1) if flat else (spec.n * spec.k, _loader.blocks(count * spec.q), 1)
        return (f"depthwise_fwd_strips<{ctype},{spec.r},{spec.s},{'true' if flat else 'false'}>", grid,
                (_THREADS, 1, 1), 0, geometry)
    smem = forward_smem(spec, dtype.itemsize, _acc_size(dtype))
    tiles_q = -(-spec.q // _TILE_Q)
    tiles = -(-spec.p // _TILE_P) * tiles_q
    kr, ks = (spec.r, spec.s) if (spec.r, spec.s) in _FIXED_KERNELS else (0, 0)
    unit = "true" if kr and spec.stride == (1, 1) and spec.dilation == (1, 1) else "false"
    return (f"depthwise_fwd<{ctype},{kr},{ks},{unit}>", (spec.n * spec.k, tiles, 1), (32, 8, 1), smem,
            _geometry(spec, tiles_q=tiles_q))


def dgrad_gpu(dy, w, spec: ConvSpec, dx, precision: str) -> None:
    """dx = conv2d_input for a depthwise convolution on C-contiguous CuPy arrays (``prepare``)."""
    _plan.run_on_arrays(prepare, "dgrad", spec, precision, dy, w, dx)


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


@functools.lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    import cupy

    return cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]


@functools.lru_cache(maxsize=None)
def _smem_per_sm(device: int) -> int:
    import cupy

    return cupy.cuda.runtime.getDeviceProperties(device)["sharedMemPerMultiprocessor"]


def wgrad_gpu(x, dy, spec: ConvSpec, dw, precision: str) -> None:
    """dw = conv2d_weight for a depthwise convolution on C-contiguous CuPy arrays (``prepare``)."""
    _plan.run_on_arrays(prepare, "wgrad", spec, precision, x, dy, dw)


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


def _reason(p: "Problem", limits: "_plan.Limits"):
    """On channels-last activations the NCHW limits apply too, after their own."""
    if p.layout == "nhwc":
        reason = reason_unsupported_nhwc(p.spec, p.dtype, p.pass_, p.precision, limits)
        if reason is not None:
            return reason
    return reason_unsupported(p.spec, p.dtype, p.pass_, p.precision, limits)


class Depthwise(Algorithm):
    """``depthwise`` behind the algorithm contract (``cuconv.algos.base``)."""

    name = "depthwise"
    passes = PASSES
    layouts = ("nchw", "nhwc")
    weight_layouts = ("kcrs",)

    def reason(self, p: Problem, limits: "_plan.Limits"):
        return _reason(p, limits)

    def build(self, p: Problem, env: "_plan.Env", **knobs) -> "_plan.Plan":
        return prepare(p.pass_, p.spec, p.dtype, p.precision, env, p.bias, layout=p.layout, **knobs)


ALGORITHM = Depthwise()
