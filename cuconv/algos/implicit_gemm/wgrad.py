"""implicit_gemm's wgrad: the forward convolution of x by dy with samples and channels swapped
(``transposed_spec``), packed; on channels-last tensors the TMA wgrad (``wgrad_tma``) where it serves."""

from __future__ import annotations

import dataclasses
import functools

import numpy

from ... import _plan
from ...spec import ConvSpec
from .tiles import WgradTmaTile, _INT_MAX, _MAX_GRID_Z, _MAX_SIDE
from .launch import NAME, WgradLaunches, choice
from .pack import _pack_launch, _sum_kernel, _swap_launch
from .wgrad_tma import _wgrad_tma_prepare
from .forward import _arithmetic_reason, _gemm_launch, plan


# ----------------------------------------------------------------------------------------------------------
# wgrad: dW (K, C/groups, R, S) = Σ over n, p, q of dy[n, k, p, q] · x[n, c, p·stride + r·dilation - pad, ...] is
# the forward convolution of x with its samples and channels swapped (C images of N channels) by dy likewise (K
# filters of N channels with P x Q taps, dilated by the stride), at a stride of the dilation, whose R x S
# output images (one per input channel c) the GEMM writes as dW's columns. Its M is C·R·S, its N the filters
# and its reduction N·P·Q: the same kernels as the forward, both operands packed by the forward's pack (the
# strides of PackShape), no column matrix. Groups pair a group's filters with its own images only: one GEMM
# of (C/groups)·R·S rows by K/groups filters per group, all in one launch (``Geometry``: grp_a, w_rows), the
# reduction whole in each (any C/groups: the packed channels are the samples). Reductions are long and the
# GEMMs often small: split over k (``wgrad_splits``) into fp32 partial sums added in a fixed order
# (deterministic).
# ----------------------------------------------------------------------------------------------------------
def transposed_spec(spec: ConvSpec) -> ConvSpec:
    """The forward convolution whose output images are dW's (c, r, s) columns (see above), as one group: every
    filter over every image (a grouped wgrad runs the pairs of each group). Its bottom and right padding
    (negative where the last input rows are not read) make its output exactly R x S."""
    (sh, sw), (dh, dw) = spec.stride, spec.dilation
    pt, pl = spec.pad[0], spec.pad[2]
    pb = (spec.r - 1) * dh + sh * (spec.p - 1) + 1 - spec.h - pt
    pr = (spec.s - 1) * dw + sw * (spec.q - 1) + 1 - spec.w - pl
    return ConvSpec(spec.c, spec.n, spec.h, spec.w, spec.k, spec.p, spec.q, (dh, dw), (pt, pb, pl, pr), (sh, sw))


_UNCHUNKED = 1 << 62  # wgrad's plan has one chunk: the whole transposed batch (its samples are x's channels)


def _wgrad_sizes(spec: ConvSpec, dtype, tile, splits: int):
    """(plan of ``transposed_spec`` with a group's filters in ``kp``, packed x bytes, packed dy bytes,
    partial-sum bytes). Packed dy holds K rows and, after them, the rows the last group's tile reads past its
    filters (their products land in columns no one stores)."""
    t = transposed_spec(spec)
    pl = plan(t, dtype, tile, workspace_limit=_UNCHUNKED)
    pl = dataclasses.replace(pl, kp=-(-spec.k_per_group // pl.tile.bn) * pl.tile.bn)
    item = numpy.dtype(dtype).itemsize
    partials = 0 if splits == 1 else splits * spec.k * spec.crs_per_group * 4
    dy_rows = spec.k + pl.kp - spec.k_per_group
    return pl, spec.c * spec.h * spec.w * pl.cp * item, dy_rows * pl.w_row * item, partials


@functools.lru_cache(maxsize=1024)
def _wgrad_launches(spec: ConvSpec, dtype, tile, splits: int, device: int, sm_count: int,
                    nhwc: bool = False, krsc: bool = False) -> WgradLaunches:
    """Memoized per problem, tile, splits, device and SMs (a layer called again plans nothing). ``nhwc``: x and
    dy channels-last in memory (``pack_swap`` packs them); ``krsc``: dW written channels-last, (K, R, S, C/groups)
    in memory (the GEMM's images, x's channels, then 1 apart; its R x S pixels S·C/groups and C/groups)."""
    t = transposed_spec(spec)
    pl, x_bytes, dy_bytes, partial_bytes = _wgrad_sizes(spec, dtype, tile, splits)
    hw, pq, rs = spec.h * spec.w, spec.p * spec.q, spec.r * spec.s
    # x as C images of N channels (n·C·H·W + c·H·W + pixel), dy as K filters of N channels and P·Q taps
    if nhwc:
        pack_x = _swap_launch(dtype, spec.n, hw, spec.c, pl.cp, hw * pl.cp)
        pack_dy = _swap_launch(dtype, spec.n, pq, spec.k, pl.cp, pl.w_row)
    else:
        pack_x = _pack_launch(dtype, spec.n, pl.cp, hw, spec.c, hw, spec.c * hw, hw * pl.cp)
        pack_dy = _pack_launch(dtype, spec.n, pl.cp, pq, spec.k, pq, spec.k * pq, pl.w_row)
    split_tiles = -(-pl.k_tiles // splits)
    splits = -(-pl.k_tiles // split_tiles)  # (no empty range)
    cg, kg = spec.c_per_group, spec.k_per_group
    if krsc:
        gemm = _gemm_launch(t, dtype, pl, cg * rs, kg, spec.groups, cg * hw * pl.cp, kg, (1, cg * rs), splits,
                            split_tiles, (spec.s * cg, cg))
    else:
        gemm = _gemm_launch(t, dtype, pl, cg * rs, kg, spec.groups, cg * hw * pl.cp, kg, (rs, cg * rs), splits,
                            split_tiles)
    sums = None if splits == 1 else _sum_kernel(dtype, spec.k * cg * rs, splits, 1, 1, sm_count)
    return WgradLaunches(pack_x, pack_dy, gemm, sums, x_bytes, dy_bytes, partial_bytes)


def _wgrad_reason(spec: ConvSpec, dtype, precision: str, limits: "_plan.Limits", tile=None):
    """Why the packed wgrad of ``spec`` cannot run on ``tile`` (None: the one auto takes) under ``limits``, or None."""
    dtype = numpy.dtype(dtype)
    reason = _arithmetic_reason(dtype, precision)
    if reason is not None:
        return reason
    t = transposed_spec(spec)
    if max(*spec.stride, *spec.dilation, *spec.pad, spec.p, spec.q) > _INT_MAX:
        return "its geometry struct holds strides, dilations, paddings and output sizes in 32 bits"
    if max(spec.h + max(t.pad[0], 0) + max(t.pad[1], 0), spec.w + max(t.pad[2], 0) + max(t.pad[3], 0)) > _MAX_SIDE:
        return "its padded image exceeds the kernel's 16-bit pixel coordinates"
    if max(spec.c, spec.k) > _MAX_GRID_Z:
        return f"its packing runs one input channel or filter per grid z (at most {_MAX_GRID_Z})"
    tile = tile or choice().wgrad_tile(spec, dtype, limits.wgmma)
    pl, x_bytes, dy_bytes, _ = _wgrad_sizes(spec, dtype, tile, 1)
    if max(x_bytes // dtype.itemsize, dy_bytes // dtype.itemsize, spec.k * spec.crs_per_group) > _INT_MAX:
        return "x or grad_output packed with channels and samples swapped, or dW, holds 2^31 elements or more " \
               "(32-bit offsets)"
    if x_bytes + dy_bytes > limits.workspace_limit:
        return (f"x and grad_output packed need {x_bytes + dy_bytes} bytes, more than "
                f"cuconv.config.workspace_limit ({limits.workspace_limit})")
    return None


def _wgrad_prepare(spec: ConvSpec, dtype, env: "_plan.Env", tile=None, splits: int = None,
                   nhwc: bool = False, krsc: bool = False) -> "_plan.Plan":
    """wgrad's plan: on channels-last operands at 256-byte boundaries the TMA wgrad where it serves
    (``wgrad_tma_tile``); else pack x and dy (two launches; ``nhwc``: from channels-last ones), the GEMM
    (``krsc``: into a channels-last dW), and where split the sum of its partial sums (in dW's layout)."""
    tile = tile or choice().tile_for("wgrad", spec, dtype, nhwc, env)
    if isinstance(tile, WgradTmaTile):
        if not nhwc:
            raise ValueError(f"implicit_gemm: tile {tile} reads channels-last x and dy")
        return _wgrad_tma_prepare(spec, dtype, env, tile, splits, krsc)
    b = _plan.Builder("wgrad", env)
    if tile.nchw:
        raise ValueError(f"implicit_gemm: wgrad reads packed operands; {tile} gathers NCHW ones")
    if tile.tma:
        raise ValueError(f"implicit_gemm: tile {tile} runs the forward GEMMs (fprop and dgrad), not wgrad's")
    if tile.wgmma and not env.wgmma:
        raise ValueError(f"implicit_gemm: tile {tile} needs a device of compute capability 9.0 (wgmma)")
    splits = splits or choice().wgrad_splits(spec, dtype, tile, env.sm_count, env.smem_per_sm, env.workspace_limit)
    ls = _wgrad_launches(spec, dtype, tile, splits, env.device, env.sm_count, nhwc, krsc)
    packed_x, packed_dy = b.take(ls.x_bytes), b.take(ls.dy_bytes)
    weightless = () if nhwc else (_plan.NULL, _plan.NULL)  # (pack_nhwc's weight pointers; pack_swap has none)
    b.launch(ls.pack_x, b.ref("x"), packed_x, *weightless)
    b.launch(ls.pack_dy, b.ref("dy"), packed_dy, *weightless)
    if ls.sums is None:
        b.launch(ls.gemm, packed_x, packed_dy, _plan.NULL, b.ref("dw"), _plan.NULL)
    else:
        partials = b.take(ls.partial_bytes)
        b.launch(ls.gemm, packed_x, packed_dy, _plan.NULL, partials, _plan.NULL)
        b.launch(ls.sums, partials, _plan.NULL, b.ref("dw"), _plan.NULL)
    return b.plan(NAME)
