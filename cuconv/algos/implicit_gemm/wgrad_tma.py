"""Python twin of ``kernels_cu/implicit_gemm/wgrad_tma.cu``: wgrad on channels-last tensors fed by the TMA,
no pack (``WgradTmaTile``)."""

from __future__ import annotations

import functools

import numpy

from ... import _dtypes, _plan, _tma
from ...spec import ConvSpec
from .tiles import WGRAD_TMA_TILES, WgradTmaTile, _INT_MAX, _MAX_GRID_Y
from .launch import NAME, WgradLaunches, _fn, choice
from .pack import _sum_kernel
from .wgmma_tma import _im2col_map_reason, _tma_corners

STEM = "implicit_gemm/wgrad_tma"
NAME_EXPRESSIONS = tuple(
    [t.kernel_name(c) for c in ("__half", "__nv_bfloat16") for t in WGRAD_TMA_TILES.values()]
    + [WGRAD_TMA_TILES["wt64x64"].kernel_name(c, groups=True) for c in ("__half", "__nv_bfloat16")])


# ----------------------------------------------------------------------------------------------------------
# wgrad on channels-last activations fed by the TMA (``implicit_gemm_wgrad_tma``, kernels_cu/implicit_gemm/wgrad_tma.cu): per
# tap of the kernel a GEMM of dyᵀ by the tap's im2col columns, reducing over the output pixels, both operands
# copied from x and dy where they lie (no pack of either, no column matrix), split over pixel ranges into fp32
# partial sums that sum_splits adds in a fixed order.
# ----------------------------------------------------------------------------------------------------------
WGRAD_TMA_GEOMETRY_DTYPE = numpy.dtype([(f, numpy.int32) for f in (
    "p", "q", "s", "stride_h", "stride_w", "pad_h", "pad_w", "dil_h", "dil_w", "k", "c", "c_tiles", "k_tiles",
    "split_tiles", "group_width", "unused")] + [(f, numpy.int64) for f in ("out_k", "out_c", "out_r", "out_s",
                                                                           "split_stride")], align=True)
# Groups the TMA wgrad serves: channels and filters a group (64 of them a block, the diagonal blocks of its product
# kept: 64 / width times the group's products, and its operands' bytes once)
_WGRAD_TMA_GROUP_WIDTHS = (16, 32, 64)
_WGRAD_TMA_PIXELS = 64  # a k tile's output pixels
_WGRAD_TMA_MIN_WIDTH = 32  # filters and channels: below, most of a 64-wide box would be zeros


def wgrad_tma_reason(spec: ConvSpec, dtype, tile: "WgradTmaTile" = None):
    """Why ``implicit_gemm_wgrad_tma`` (with ``tile``, that instance) cannot run the channels-last wgrad of
    ``spec`` (None: it can): 16-bit elements, one group or groups of 16, 32 or 64 channels and as many filters (on
    the 64 × 64 tile), filters and channels in whole 16-byte vectors (the maps' row pitches) and at least
    ``_WGRAD_TMA_MIN_WIDTH`` of each, output pixels to reduce over in 32 bits, and the im2col map's limits."""
    if numpy.dtype(dtype).itemsize != 2:
        return "its TMA tiles move 16-bit elements"
    if spec.groups != 1:
        if spec.c_per_group != spec.k_per_group or spec.c_per_group not in _WGRAD_TMA_GROUP_WIDTHS:
            return f"its groups have as many filters as channels, {_WGRAD_TMA_GROUP_WIDTHS} of each"
        if tile is not None and (tile.bf, tile.bc) != (64, 64):
            return "its groups run on 64 x 64 blocks"
    if spec.c % 8 or spec.k % 8:
        return "its tensor maps take channels and filters in whole 16-byte vectors"
    if -(-spec.k // 64) > _MAX_GRID_Y:
        return f"more than {_MAX_GRID_Y} blocks of 64 filters (a grid dimension)"
    if min(spec.c, spec.k) < _WGRAD_TMA_MIN_WIDTH:
        return f"fewer than {_WGRAD_TMA_MIN_WIDTH} channels or filters fill too little of its 64-wide boxes"
    m = spec.n * spec.p * spec.q
    if m == 0 or m + _WGRAD_TMA_PIXELS >= _INT_MAX:
        return "it reduces over 1 to 2^31 - 65 output pixels"
    return _im2col_map_reason(spec)


def _wgrad_tma_c_tiles(spec: ConvSpec, tile: WgradTmaTile) -> int:
    """Channel blocks a tap: C / bc, or one for groups (a block's channels are its filters' groups')."""
    return 1 if spec.groups != 1 else -(-spec.c // tile.bc)


@functools.lru_cache(maxsize=1024)
def _wgrad_tma_launches(spec: ConvSpec, dtype, tile: WgradTmaTile, splits: int, device: int, sm_count: int,
                        krsc: bool) -> WgradLaunches:
    """The TMA wgrad's GEMM (pointers: x, dy, dW or the partial sums; its maps encoded from x and dy) and, split,
    the sum of its partial sums (partial sums, null, dW); memoized per problem, tile, splits and device."""
    m = spec.n * spec.p * spec.q
    k_tiles = -(-m // _WGRAD_TMA_PIXELS)
    split_tiles = -(-k_tiles // splits)
    splits = -(-k_tiles // split_tiles)  # (no empty range)
    rs, cg = spec.r * spec.s, spec.c_per_group
    strides = (rs * cg, 1, spec.s * cg, cg) if krsc else (cg * rs, rs, spec.s, 1)  # (k, c, r, s)
    dw_elements = spec.k * cg * rs  # (and a split's partial sums, one dW apart)
    c_tiles = _wgrad_tma_c_tiles(spec, tile)
    geometry = numpy.array((spec.p, spec.q, spec.s, *spec.stride, spec.pad[0], spec.pad[2], *spec.dilation, spec.k,
                            spec.c, c_tiles, k_tiles, split_tiles, 0 if spec.groups == 1 else cg, 0, *strides,
                            0 if splits == 1 else dw_elements), dtype=WGRAD_TMA_GEOMETRY_DTYPE)[()]
    lower, upper = _tma_corners(spec)
    maps = ((0, _tma.im2col_map(spec.n, spec.h, spec.w, spec.c, lower, upper, spec.stride, 64, _WGRAD_TMA_PIXELS)),
            (1, _tma.tiled_map(spec.k, m, 64, _WGRAD_TMA_PIXELS)))
    name = tile.kernel_name(_dtypes.ctype_of(dtype), groups=spec.groups != 1)
    grid = (c_tiles * rs, -(-spec.k // tile.bf), splits)
    gemm = _tma.TmaLaunch(_fn(name), name, grid, (tile.threads, 1, 1), 3, (geometry,), maps, smem=tile.smem_bytes)
    sums = None if splits == 1 else _sum_kernel(dtype, dw_elements, splits, 1, 1, sm_count)
    return WgradLaunches(None, None, gemm, sums, 0, 0, 0 if splits == 1 else splits * dw_elements * 4)


def _wgrad_tma_prepare(spec: ConvSpec, dtype, env: "_plan.Env", tile: WgradTmaTile, splits: int = None,
                       krsc: bool = False) -> "_plan.Plan":
    """The TMA wgrad's plan on channels-last x and dy: the GEMM into dW (``krsc``: channels-last), or split into
    partial sums and their sum."""
    if not env.wgmma:
        raise ValueError(f"implicit_gemm: tile {tile} needs a device of compute capability 9.0 (wgmma, TMA)")
    if not env.aligned:
        raise ValueError(f"implicit_gemm: tile {tile} maps x and dy and stores dW in vectors: operands on "
                         f"{_plan.ALIGNMENT}-byte boundaries only")
    reason = wgrad_tma_reason(spec, dtype, tile)
    if reason is not None:
        raise ValueError(f"implicit_gemm: tile {tile} cannot run the wgrad of {spec}: {reason}")
    splits = splits or choice().wgrad_tma_splits(spec, tile, env.sm_count, env.smem_per_sm, env.workspace_limit)
    ls = _wgrad_tma_launches(spec, dtype, tile, splits, env.device, env.sm_count, krsc)
    b = _plan.Builder("wgrad", env)
    if ls.sums is None:
        b.launch(ls.gemm, b.ref("x"), b.ref("dy"), b.ref("dw"))
    else:
        partials = b.take(ls.partial_bytes)
        b.launch(ls.gemm, b.ref("x"), b.ref("dy"), partials)
        b.launch(ls.sums, partials, _plan.NULL, b.ref("dw"), _plan.NULL)
    return b.plan(NAME)
