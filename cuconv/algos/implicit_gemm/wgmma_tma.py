"""Python twin of ``kernels_cu/implicit_gemm/wgmma_tma.cu``: the TMA-fed forward GEMMs (``WgmmaTmaTile``,
``WgmmaTmaRowsTile``): their tiles, reasons, tensor maps, the persistent tiles' blocks and the grouped forward
through a block-diagonal weight."""

from __future__ import annotations

import functools

import numpy

from ... import _dtypes, _loader, _plan, _tma
from ...spec import ConvSpec
from .tiles import (
    Plan, TMA_ROWS_TILES, TMA_TILES, _INT_MAX, _rows_band)
from .launch import GEMM_POINTERS, NAME, _fn, _gemm_geometry, epilogue_struct
from .pack import BLOCK_DIAGONAL_DTYPE

STEM = "implicit_gemm/wgmma_tma"
NAME_EXPRESSIONS = tuple(
    [t.kernel_name(c, phases, store) for c in ("__half", "__nv_bfloat16") for t in TMA_TILES.values()
     for phases, store in (((False, True),) if t.persistent else ((False, False), (True, False), (False, True)))]
    + [t.kernel_name(c, store) for c in ("__half", "__nv_bfloat16") for t in TMA_ROWS_TILES.values()
       for store in (False, True)])


def rows_reason(spec: ConvSpec, dtype, pl: Plan):
    """Why ``implicit_gemm_wgmma_tma_rows`` cannot run ``pl`` on ``spec`` (None: it can): stride 1, a k tile is one
    tap's channels exactly (a group's padded channels are the tile's ``cp``), a band of at most 512 pixels (two
    boxes), output rows and pixels within the grid and 32-bit offsets."""
    t = pl.tile
    if spec.stride != (1, 1):
        return "its bands are input rows read at stride 1"
    if pl.cp != t.cp:
        return f"its k tile is one tap's {t.cp} channels: the layer's padded channels are {pl.cp}"
    if _rows_band(t.bm, spec.s, spec.dilation[1]) > 512:
        return "its band of input pixels is copied in at most two boxes of 256"
    if spec.n * spec.p * -(-spec.q // t.bm) > _INT_MAX or spec.n * spec.p * spec.q * spec.k >= _INT_MAX:
        return "its grid of output-row segments and its output offsets are 32-bit"
    return None


def tma_reason(spec: ConvSpec, dtype, pl: Plan):
    """Why ``implicit_gemm_wgmma_tma`` (or, for a rows tile, ``implicit_gemm_wgmma_tma_rows``: ``rows_reason``)
    cannot run ``pl`` on ``spec`` (None: it can): a k tile is ``kbytes`` of one tap's channels of one group's 16-bit
    input, and the im2col map's limits (``_tma``) hold."""
    if numpy.dtype(dtype).itemsize != 2:
        return "its TMA tiles move 16-bit elements"
    if pl.groups != 1:
        return "its TMA tiles read one group"
    if getattr(pl.tile, "rows", False):
        return rows_reason(spec, dtype, pl)
    if pl.cp % (pl.tile.kbytes // 2):
        return f"its TMA tile takes whole taps of {pl.tile.kbytes // 2} channels a k tile"
    return _im2col_map_reason(spec)


def _im2col_map_reason(spec: ConvSpec):
    """Why an im2col map over ``spec``'s input (the TMA forward's and wgrad's) cannot be encoded, or None: the
    driver's limits (``_tma``) on its bounding box corners, traversal strides and copies' tap offsets."""
    lower, upper = _tma_corners(spec)
    lo, hi = _tma.CORNER_RANGE
    if not all(lo <= v <= hi for v in lower + upper):
        return f"its im2col map's bounding box corners {lower}, {upper} are outside [{lo}, {hi}]"
    if max(spec.stride) > _tma.MAX_STRIDE:
        return f"its im2col map walks strides up to {_tma.MAX_STRIDE}"
    if max((spec.r - 1) * spec.dilation[0], (spec.s - 1) * spec.dilation[1]) >= _tma.MAX_OFFSET:
        return "its copies' tap offsets are 16-bit"
    return None


def _tma_corners(spec: ConvSpec) -> tuple:
    """The im2col map's bounding box of window origins, (h, w) from the image's top-left pixel and from its
    bottom-right one: from -padding to the last output pixel's origin, so that a column wraps to the next row
    after Q origins and to the next image after P rows."""
    lower = (-spec.pad[0], -spec.pad[2])
    upper = ((spec.p - 1) * spec.stride[0] - spec.pad[0] - (spec.h - 1),
             (spec.q - 1) * spec.stride[1] - spec.pad[2] - (spec.w - 1))
    return lower, upper


def _persistent_blocks(tile, pl: Plan, m: int, env: "_plan.Env") -> int:
    """The blocks a persistent ``tile`` runs ``pl``'s GEMM of ``m`` pixels on (``implicit_gemm_wgmma_tma_pst``):
    as many as the SMs hold at once (by its shared memory with the weight resident, at most its ``min_blocks`` an
    SM, what its registers were fitted to), a multiple of the blocks of filters, none idle; 0 where its weight and
    ring do not fit a block's shared memory, or for another tile."""
    per_sm = _persistent_per_sm(tile, pl.k_tiles, env) if getattr(tile, "persistent", False) else 0
    if not per_sm:
        return 0
    n_blocks = pl.groups * pl.kp // tile.bn
    return n_blocks * max(1, min(-(-m // tile.bm), env.sm_count * per_sm // n_blocks))


def _persistent_per_sm(tile, k_tiles: int, env: "_plan.Env") -> int:
    """Blocks of a persistent ``tile`` an SM holds on a reduction of ``k_tiles`` k tiles (its weight resident), at
    most its ``min_blocks`` (what its registers were fitted to); 0 where one does not fit a block's shared memory."""
    smem = tile.resident_smem(k_tiles)
    return 0 if smem > env.smem_limit else min(tile.min_blocks, env.smem_per_sm // (smem + 1024))


def _twin(tile):
    """A persistent tile's twin: the TMA tile of its shape that runs where the output is not stored through the
    TMA (an NCHW output, a split reduction, a strided dgrad's phases); any other tile itself."""
    if not getattr(tile, "persistent", False):
        return tile
    return next(t for t in TMA_TILES.values()
                if not t.persistent and (t.bn, t.bm, t.kbytes) == (tile.bn, tile.bm, tile.kbytes))


def _check_tma_store(spec: ConvSpec, splits: int, groups: int, out_strides: tuple, filters: int) -> None:
    """A TMA store's output: one k range of one group into a dense channels-last output of whole 16-byte pixels."""
    if splits != 1 or groups != 1 or out_strides != (spec.p * spec.q * filters, 1) or filters % 8:
        raise ValueError("implicit_gemm: a TMA store takes one k range of one group into a dense channels-last "
                         "output of whole 16-byte pixels")


def _tma_gemm_maps(spec: ConvSpec, pl: Plan, samples: int, weight_rows: int, pix: int = None) -> tuple:
    """implicit_gemm_wgmma_tma's maps: the input's im2col map (pointer 0; pixels ``pix`` apart, default the
    plan's), the packed weight's ``weight_rows`` rows (pointer 1)."""
    lower, upper = _tma_corners(spec)
    return ((0, _tma.im2col_map(samples, spec.h, spec.w, pix or pl.pix, lower, upper, spec.stride,
                                pl.tile.kbytes // 2, pl.tile.bm)),
            _weight_map(pl, weight_rows))


def _weight_map(pl: Plan, weight_rows: int) -> tuple:
    """A TMA forward's map of its packed weight (pointer 1): ``weight_rows`` rows of ``pl.w_row``, a k tile's
    columns by the tile's filters a copy."""
    return (1, _tma.tiled_map(pl.w_row, weight_rows, pl.tile.kbytes // 2, pl.tile.bn))


# The in-place channels-last forward's TMA tiles store their output through the TMA (implicit_gemm_wgmma_tma_st,
# implicit_gemm_wgmma_tma_rows_st) where it is a dense matrix of whole 16-byte pixels on 256-byte boundaries: the
# epilogue's instructions bound the layers of few channels and many pixels (square_3x3_1024; docs/perf-notes.md)
_TMA_STORE = True


# ----------------------------------------------------------------------------------------------------------
# Grouped forwards on channels-last tensors through a block-diagonal weight (the TMA tile, Geometry.block_diag):
# groups of 16, 32 or 64 channels and as many filters; a block's 64 filters against the 64 input channels of their
# groups, the weight packed dense with zeros between groups (pack_block_diagonal), so that one dense GEMM tile
# computes 64 / width groups at once (64 / width times their MACs: RegNet's 16-channel groups have few) from the
# input where it lies.
# ----------------------------------------------------------------------------------------------------------
_BLOCK_DIAGONAL_WIDTHS = (16, 32, 64)
_BLOCK_DIAGONAL_TILE = "tma64x128"  # 64 filters: a block of the weight's diagonal


def block_diagonal_tile(spec: ConvSpec, dtype):
    """The TMA tile of ``spec``'s channels-last forward through a block-diagonal weight, or None: the 16-bit types,
    groups of 16, 32 or 64 channels and as many filters, channels in whole 16-byte vectors, the im2col map's limits
    (``tma_reason``) and 32-bit offsets."""
    if numpy.dtype(dtype).itemsize != 2 or spec.groups == 1 or spec.c % 8:
        return None
    if spec.c_per_group != spec.k_per_group or spec.c_per_group not in _BLOCK_DIAGONAL_WIDTHS:
        return None
    if spec.n * spec.p * spec.q * spec.k >= _INT_MAX or spec.n * spec.h * spec.w * spec.c >= _INT_MAX:
        return None
    t = TMA_TILES[_BLOCK_DIAGONAL_TILE]
    taps = spec.r * spec.s
    pl = Plan(t, t.bn, taps, taps * t.bn, -(-spec.k // t.bn) * t.bn, spec.n)
    return t if tma_reason(spec, dtype, pl) is None else None


def block_diagonal_bytes(spec: ConvSpec, dtype) -> int:
    """The workspace of the block-diagonal weight: whole blocks of 64 filters, each row a tap's 64 channels."""
    bw = TMA_TILES[_BLOCK_DIAGONAL_TILE].bn
    return -(-spec.k // bw) * bw * spec.r * spec.s * bw * numpy.dtype(dtype).itemsize


@functools.lru_cache(maxsize=1024)
def _block_diagonal_launches(spec: ConvSpec, dtype, krsc: bool, device: int) -> tuple:
    """(packed weight bytes, the weight's pack (pointers: w, packed), the GEMM (x, packed weight, bias, out)) of a
    grouped channels-last forward through a block-diagonal weight; memoized per problem and device."""
    t = TMA_TILES[_BLOCK_DIAGONAL_TILE]
    ctype = _dtypes.ctype_of(dtype)
    bw, taps = t.bn, spec.r * spec.s
    kp, w_row = -(-spec.k // bw) * bw, taps * bw
    total = kp * w_row
    name = f"pack_block_diagonal<{ctype}>"
    pack = _loader.PreparedLaunch(_fn(name), name, (_loader.blocks(total), 1, 1), (_loader.THREADS, 1, 1), 2,
                                  (numpy.array((total, spec.k, spec.c_per_group, taps, bw, krsc, 0),
                                               dtype=BLOCK_DIAGONAL_DTYPE)[()],))
    m = spec.n * spec.p * spec.q
    pl = Plan(t, bw, taps, w_row, kp, spec.n)  # (a block's 64 channels a tap: one k tile)
    geometry = _gemm_geometry(spec, pl, m, spec.k, 1, bw, kp, (spec.p * spec.q * spec.k, 1), 1, taps,
                              (spec.q * spec.k, spec.k), pix=spec.c, block_diag=spec.c_per_group)
    maps = _tma_gemm_maps(spec, pl, spec.n, kp, pix=spec.c)
    name = t.kernel_name(ctype)
    gemm = _tma.TmaLaunch(_fn(name), name, (-(-m // t.bm), kp // t.bn, 1), (t.threads, 1, 1), GEMM_POINTERS,
                          (geometry, epilogue_struct()), maps,
                          smem=t.smem_bytes)
    return total * numpy.dtype(dtype).itemsize, pack, gemm


def _block_diagonal_plan(spec: ConvSpec, dtype, env: "_plan.Env", bias: bool, krsc: bool) -> "_plan.Plan":
    """A grouped forward on channels-last tensors: the block-diagonal weight's pack, then one TMA GEMM over every
    pixel, the input read where it lies. Groups of a whole block's width (64) on a channels-last weight, or a 1x1
    weight in either layout (one order in memory), of whole blocks are their own pack (a filter's row its taps' 64
    channels): no pack launch."""
    if not env.wgmma:
        raise ValueError("implicit_gemm: the block-diagonal grouped forward needs compute capability 9.0 (TMA)")
    b = _plan.Builder("fprop", env)
    weight_bytes, pack, gemm = _block_diagonal_launches(spec, numpy.dtype(dtype), krsc, env.device)
    bw = TMA_TILES[_BLOCK_DIAGONAL_TILE].bn
    if (krsc or spec.r * spec.s == 1) and spec.c_per_group == bw and spec.k % bw == 0 and b.base_aligned(b.ref("w")):
        packed_w = b.ref("w")
    else:
        packed_w = b.take(weight_bytes)
        b.launch(pack, b.ref("w"), packed_w)
    b.launch(gemm, b.ref("x"), packed_w, b.ref("bias") if bias else _plan.NULL, b.ref("out"), _plan.NULL)
    return b.plan(NAME)
