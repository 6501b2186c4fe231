"""Python twin of ``kernels_cu/implicit_gemm/pack.cu``: the packing launches (input to NHWC, weight rows, wgrad's
swaps, a strided dgrad's phase weights, the block-diagonal weight) and split-K's sum."""

from __future__ import annotations

import numpy

from ... import _dtypes, _loader
from ...spec import ConvSpec
from .tiles import Plan, _TENSOR_CORE_TYPES, _tf32
from .launch import NO_EPILOGUE, _fn, _kernel, epilogue_struct

STEM = "implicit_gemm/pack"
NAME_EXPRESSIONS = tuple(
    [f"{k}<{c},{_tf32(c)}>" for k in ("pack_nhwc", "pack_nhwc_narrow", "pack_dgrad_phases", "pack_swap")
     for c in _TENSOR_CORE_TYPES]
    + [f"sum_splits<{c}>" for c in _TENSOR_CORE_TYPES]
    + [f"pack_block_diagonal<{c}>" for c in ("__half", "__nv_bfloat16")])


# The kernels' structs, passed by value: one argument instead of 9 or 17 (host time per launch).
PACK_SHAPE_DTYPE = numpy.dtype([(f, numpy.int32) for f in ("c", "cp", "hw", "units", "in_blocks", "k_valid", "rs",
                                                             "w_c", "w_cp", "w_kp", "w_flip", "w_krsc")]
                               + [(f, numpy.int64) for f in ("w_row", "w_total", "src_sample", "src_channel",
                                                             "dst_sample", "src_pixel")], align=True)
PHASE_WEIGHTS_DTYPE = numpy.dtype([(f, numpy.int32) for f in ("groups", "kg", "cg", "kp", "cp", "r", "s", "stride_h",
                                                                "stride_w", "pad_h", "pad_w", "krsc")]
                                  + [(f, numpy.int64) for f in ("w_row", "rows")], align=True)

# pack_nhwc_narrow up to this many bytes per packed pixel: as fast as pack_nhwc or faster on every benchmark
# layer (H200: 64-256 bytes, e.g. fp16 rect_5x7 96 against 117 us, fp32 square_5x9 151 against 177 us)
_NARROW_PIXEL_BYTES = 256
_WEIGHT_BLOCKS = 1024     # at most this many blocks of 256 threads pack the weight (one row each)


def _pack_kernel(spec: ConvSpec, dtype, cp: int, samples: int, weight: "Plan" = None,
                 flip: bool = False, nhwc: bool = False, krsc: bool = False) -> "_loader.PreparedLaunch":
    """One launch packing ``samples`` samples (C, H, W) -> (H, W, cp), channels zero-padded (``cp`` the pixel
    stride: all groups' channels), and with a ``weight`` plan also the weight, KCRS -> (groups, kp, w_row)
    zero-padded with k index (r·S + s)·cp + c; float32 rounded to TF32 on the way; with ``flip`` the weight
    given is the layer's whose dgrad ``spec`` is the forward of (``dgrad_forward.forward_weight`` of it is
    packed); ``nhwc``: the samples are channels-last in memory, (H, W, C); ``krsc``: so is the weight (the
    layer's). Pointers: x, packed x, w, packed w (ignored without a weight)."""
    hw = spec.h * spec.w
    if nhwc:
        return _pack_launch(dtype, spec.c, cp, hw, samples, spec.c * hw, 1, hw * cp, weight, spec.k_per_group,
                            spec.r * spec.s, spec.c_per_group, flip, src_pixel=spec.c, krsc=krsc)
    return _pack_launch(dtype, spec.c, cp, hw, samples, spec.c * hw, hw, hw * cp, weight, spec.k_per_group,
                        spec.r * spec.s, spec.c_per_group, flip, krsc=krsc)


def _pack_launch(dtype, c: int, cp: int, hw: int, samples: int, src_sample: int, src_channel: int, dst_sample: int,
                 weight: "Plan" = None, k_valid: int = 0, rs: int = 0, w_c: int = 0,
                 flip: bool = False, src_pixel: int = 1, krsc: bool = False) -> "_loader.PreparedLaunch":
    """The packing launch: ``samples`` samples of ``c`` channels of ``hw`` pixels, ``src_sample`` and
    ``src_channel`` elements apart (pixels ``src_pixel`` apart: 1 for NCHW, C for channels-last), to (hw, cp)
    each, ``dst_sample`` elements apart, and with a ``weight`` plan the KCRS weight of ``k_valid`` filters per
    group, ``w_c`` channels and ``rs`` taps too (``flip``: read transposed and flipped from a dgrad's layer
    weight, see ``_pack_kernel``; ``krsc``: the weight channels-last). Pixels of up to 256 bytes, and
    channels-last inputs, take one thread per
    16-byte output vector (``pack_nhwc_narrow``: 2-10x faster than pack_nhwc below 64 bytes, where its
    32-channel tiles idle, and up to 20% at 128-256; on a channels-last input its loads are contiguous), wider
    NCHW ones 32 x 64 transposes in shared memory; the weight takes extra blocks of the same launch, one per
    row."""
    dtype = numpy.dtype(dtype)
    ctype = _dtypes.ctype_of(dtype)
    w_total = 0 if weight is None else weight.groups * weight.kp * weight.w_row
    w_row = 0 if weight is None else weight.w_row
    w_kp = 1 if weight is None else weight.kp
    w_cp = 1 if weight is None else weight.cp
    w_blocks = min(_WEIGHT_BLOCKS, w_total // w_row if w_row else 0)  # a block per row

    def shape(units: int, in_blocks: int = 0):
        return numpy.array((c, cp, hw, units, in_blocks, k_valid, rs, w_c, w_cp, w_kp, flip, krsc, w_row, w_total,
                            src_sample, src_channel, dst_sample, src_pixel), dtype=PACK_SHAPE_DTYPE)[()]

    if cp * dtype.itemsize <= _NARROW_PIXEL_BYTES or src_pixel != 1:
        vecs = samples * hw * cp * dtype.itemsize // 16
        blocks = _loader.blocks(vecs, None)  # one vector a thread (a capped grid walking them was up to 11% slower)
        return _kernel(f"pack_nhwc_narrow<{ctype},{_tf32(ctype)}>", (blocks + w_blocks, 1, 1), (_loader.THREADS, 1, 1),
                       (shape(vecs, blocks),))
    tiles = -(-hw // 64)  # pack_nhwc's tiles: 32 channels x 64 pixels
    # the weight's z slice has gx x gy blocks: at least w_blocks (the input's extra blocks find no tile)
    gx, gy = min(tiles, 512), -(-cp // 32)
    gx = max(gx, -(-w_blocks // gy))
    return _kernel(f"pack_nhwc<{ctype},{_tf32(ctype)}>", (gx, gy, samples + (w_total > 0)), (32, 8, 1), (shape(tiles),))


SPLIT_SUM_DTYPE = numpy.dtype([("n", numpy.int64), ("splits", numpy.int32), ("pq", numpy.int32), ("k", numpy.int32),
                                ("unused", numpy.int32)], align=True)


def _sum_kernel(dtype, n: int, splits: int, pq: int, k: int, sm_count: int,
                codes: tuple = NO_EPILOGUE) -> "_loader.PreparedLaunch":
    """Split-K's last launch (pointers: partial sums, bias or null, output, residual or null): ``n`` outputs of
    filter (i / pq) % k, the epilogue ``codes`` (``launch.epilogue_codes``) applied."""
    name = f"sum_splits<{_dtypes.ctype_of(dtype)}>"
    scalars = numpy.array((n, splits, pq, k, 0), dtype=SPLIT_SUM_DTYPE)[()]
    return _loader.PreparedLaunch(_fn(name), name, (_loader.blocks(n, 8 * sm_count), 1, 1), (_loader.THREADS, 1, 1),
                                  4, (scalars, epilogue_struct(codes)))


def pack_operands(x, w, spec: ConvSpec, pl: Plan, packed_x, packed_w=None) -> None:
    """Pack x (n, C, H, W) into ``packed_x`` (n, H, W, cp) and, given ``packed_w`` (kp · w_row elements), the
    weight too, in one launch (``_pack_kernel``) on CuPy's current stream."""
    import cupy

    kernel = _pack_kernel(spec, x.dtype, pl.pix, x.shape[0], None if packed_w is None else pl)
    kernel(cupy.cuda.get_current_stream().ptr, x.data.ptr, packed_x.data.ptr, 0 if packed_w is None else w.data.ptr,
           0 if packed_w is None else packed_w.data.ptr)


SWAP_SHAPE_DTYPE = numpy.dtype([(f, numpy.int32) for f in ("a", "b", "c", "ap")]
                                + [(f, numpy.int64) for f in ("src_a", "l", "dst_c", "c_magic")]
                                + [(f, numpy.int32) for f in ("c_shift", "unused")], align=True)


def division_magic(d: int) -> tuple:
    """(m, p) with n // d == (n · m) >> p for every 0 <= n < 2^31 (d >= 1): p = 31 + ceil(log2 d), m = ceil(2^p /
    d), whose error m·d - 2^p < d keeps n·m / 2^p below the next integer; m < 2^33, so the product fits 64 bits."""
    p = 31 + (d - 1).bit_length()
    return -(-(1 << p) // d), p
_SWAP_MAX_COLUMN_BLOCKS = 4096  # pack_swap's blocks along a sample's run: more tiles are walked


def _swap_launch(dtype, a: int, b: int, c: int, ap: int, dst_c: int) -> "_loader.PreparedLaunch":
    """``pack_swap``: a channels-last (a, b, c) array (samples, pixels, channels) to (c, b, ap), samples
    zero-padded to ``ap``, each c ``dst_c`` elements after the previous (pointers: source, packed)."""
    ctype = _dtypes.ctype_of(dtype)
    name = f"pack_swap<{ctype},{_tf32(ctype)}>"
    shape = numpy.array((a, b, c, ap, b * c, b * c, dst_c, *division_magic(c), 0), dtype=SWAP_SHAPE_DTYPE)[()]
    columns = min(max(1, -(-b * c // 64)), _SWAP_MAX_COLUMN_BLOCKS)
    return _loader.PreparedLaunch(_fn(name), name, (columns, -(-ap // 32), 1), (32, 8, 1), 2, (shape,))
BLOCK_DIAGONAL_DTYPE = numpy.dtype([("total", numpy.int64)] + [(f, numpy.int32) for f in (
    "k", "gw", "taps", "bw", "krsc", "unused")], align=True)
