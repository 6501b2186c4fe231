"""implicit_gemm's dgrad at a stride above 1: one forward convolution of dy per phase of the stride
(``phase_specs``), all phases in one launch."""

from __future__ import annotations

import dataclasses
import functools

import numpy

from ... import _dtypes, _loader, _plan, _tma
from ...blocks import elementwise
from ...spec import ConvSpec
from .tiles import Plan, Tile, _INT_MAX, _MAX_GRID_Z, _MAX_SIDE, _padded_channels, _tf32
from .launch import NAME, _fn, _gemm_geometry, _kernel, choice
from .pack import PHASE_WEIGHTS_DTYPE, _pack_launch
from .mma_sync import PHASE_GEMMS_DTYPE
from .wgmma_tma import _tma_gemm_maps, _twin, tma_reason
from .forward import _arithmetic_reason, _gemm_launch


# ----------------------------------------------------------------------------------------------------------
# dgrad where no single forward convolution of dy gives dx (a stride above 1, or padding wider than the dilated
# kernel), at dilation 1: dx's pixels of phase (ph, pw), rows h ≡ ph (mod stride_h) and columns w ≡ pw, take
# only the taps r ≡ ph + pad_h (mod stride_h) and s likewise; over those, the phase is the forward convolution
# of dy at stride 1 by them flipped (``phase_specs``). One pack of dy to NHWC, one launch packing every
# phase's weight (``pack_dgrad_phases``), then a GEMM per phase writing every stride-th pixel of dx (where a
# phase has no taps, a fill of dx with zeros first). No column matrix, no scatter.
# ----------------------------------------------------------------------------------------------------------
_MAX_PHASES = 16


def _phase_axis(size: int, kernel: int, stride: int, pad: int, phase: int, out: int) -> tuple:
    """(outputs, taps, first tap, top padding, bottom padding) of one axis of a phase: dx positions
    phase, phase + stride, ... below ``size``, the kernel taps r0, r0 + stride, ... below ``kernel``, and the
    padding of dy (``out`` long) that makes the stride-1 forward by the flipped taps produce exactly them."""
    outputs = -(-(size - phase) // stride)
    r0 = (phase + pad) % stride
    taps = -(-(kernel - r0) // stride) if r0 < kernel else 0
    top = max(taps, 1) - 1 - (phase + pad - r0) // stride
    return outputs, taps, r0, top, outputs - 1 + max(taps, 1) - out - top


def phase_specs(spec: ConvSpec) -> tuple:
    """((ph, pw), taps, forward spec) per phase of dx with pixels: the forward convolution of dy (N, K, P, Q)
    at stride 1 whose output (N, C, ·, ·) is that phase; ``taps`` th · tw (0: the phase gets zeros; its spec
    then has one tap)."""
    (sh, sw), out = spec.stride, []
    for ph in range(sh):
        ih, th, _, top, bottom = _phase_axis(spec.h, spec.r, sh, spec.pad[0], ph, spec.p)
        for pw in range(sw):
            iw, tw, _, left, right = _phase_axis(spec.w, spec.s, sw, spec.pad[2], pw, spec.q)
            if ih > 0 and iw > 0:
                out.append(((ph, pw), th * tw, ConvSpec(spec.n, spec.k, spec.p, spec.q, spec.c, max(th, 1),
                                                        max(tw, 1), (1, 1), (top, bottom, left, right), (1, 1),
                                                        spec.groups)))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class PhaseLaunches:
    """A phased dgrad's launches (pointers: dy, packed dy, null, null for ``pack_dy``; w, packed weights for
    ``pack_w``; dx for ``zeros``; packed dy, the phase's packed weight, null, dx at the phase's first pixel for
    each GEMM, with the byte offsets of that weight and pixel) and workspace bytes."""

    pack_dy: "_loader.PreparedLaunch"
    pack_w: "_loader.PreparedLaunch"
    zeros: "_loader.PreparedLaunch"  # None, or a fill of dx with zeros (phases without taps)
    gemms: tuple  # (launch, packed weight byte offset, dx byte offset) per phase with taps
    dy_bytes: int
    w_bytes: int




def _phase_plan(spec: ConvSpec, dtype, tile) -> tuple:
    """(padded channels of a group cp, rows per group kp, packed weight row w_row, phases) of a phased dgrad on
    ``tile``."""
    phases = phase_specs(spec)
    itemsize = numpy.dtype(dtype).itemsize
    widest = max(phases, key=lambda ph: ph[1])[2]
    cp = _padded_channels(widest, itemsize)
    tile_k = tile.kbytes // itemsize
    w_row = max(1, -(-widest.r * widest.s * cp // tile_k)) * tile_k
    return cp, -(-spec.c_per_group // tile.bn) * tile.bn, w_row, phases


@functools.lru_cache(maxsize=1024)
def _phase_launches(spec: ConvSpec, dtype, tile, device: int, nhwc: bool = False,
                    krsc: bool = False) -> PhaseLaunches:
    """Memoized per problem, tile and device (a layer called again plans nothing). ``nhwc``: dy and dx
    channels-last in memory; dy read in place where its pixels are the packed ones (``pack_dy`` None: a group's
    filters fill whole vectors, in the half types), else packed from channels-last pixels; ``krsc``: the weight
    channels-last."""
    cp, kp, w_row, phases = _phase_plan(spec, dtype, tile)
    itemsize, g, pq, hw = numpy.dtype(dtype).itemsize, spec.groups, spec.p * spec.q, spec.h * spec.w
    pix = g * cp
    if not nhwc:
        pack_dy = _pack_launch(dtype, spec.k, pix, pq, spec.n, spec.k * pq, pq, pq * pix)
    elif pix == spec.k and itemsize == 2:
        pack_dy = None
    else:
        pack_dy = _pack_launch(dtype, spec.k, pix, pq, spec.n, spec.k * pq, 1, pq * pix, src_pixel=spec.k)
    rows = spec.stride[0] * spec.stride[1] * g * kp  # every phase's rows, in the kernel's order (ph, pw)
    shape = numpy.array((g, spec.k_per_group, spec.c_per_group, kp, cp, spec.r, spec.s, *spec.stride, spec.pad[0],
                         spec.pad[2], krsc, w_row, rows), dtype=PHASE_WEIGHTS_DTYPE)[()]
    ctype = _dtypes.ctype_of(dtype)
    name = f"pack_dgrad_phases<{ctype},{_tf32(ctype)}>"
    pack_w = _loader.PreparedLaunch(_fn(name), name, (-(-spec.c_per_group // 64) * g, -(-cp // 64), spec.r * spec.s),
                                    (32, 8, 1), 2, (shape,))
    gemms, zeros = [], None
    for (ph, pw), taps, fs in phases:
        if taps == 0:
            # pixels no tap reaches: one dense fill of dx, before the GEMMs (a GEMM of no k tiles would write
            # these zeros a stride apart, partial sectors)
            zeros = elementwise.fill(dtype, spec.n * spec.c * hw)
            continue
        k_tiles = -(-taps * cp * itemsize // tile.kbytes)
        pl = Plan(tile, cp, k_tiles, w_row, kp, spec.n, g)
        if nhwc:  # (dx's pixel (h, w) at (h·W + w)·C; a filter of the phase's GEMM is a channel of dx)
            strides, pixel, first = (spec.c * hw, 1), (spec.stride[0] * spec.w * spec.c, spec.stride[1] * spec.c), \
                (ph * spec.w + pw) * spec.c
        else:
            strides, pixel, first = (spec.c * hw, hw), (spec.stride[0] * spec.w, spec.stride[1]), ph * spec.w + pw
        args = (fs, dtype, pl, spec.n * fs.p * fs.q, spec.c_per_group, g, cp, kp, strides, 1, k_tiles, pixel)
        phase = ph * spec.stride[1] + pw
        gemms.append((args, phase * g * kp * w_row * itemsize, first * itemsize))
    if (tile.tma or type(tile) is Tile) and 2 <= len(gemms) <= _FUSED_PHASES:
        gemms = [(_fused_phases_launch(gemms, dtype, tile), 0, 0)]
    else:
        gemms = [(_gemm_launch(*args), w_offset, dx_offset) for args, w_offset, dx_offset in gemms]
    dy_bytes = 0 if nhwc and pack_dy is None else spec.n * pq * pix * itemsize
    return PhaseLaunches(pack_dy, pack_w, zeros, tuple(gemms), dy_bytes, rows * w_row * itemsize)


_FUSED_PHASES = 4  # PhaseGemms' phases (implicit_gemm_wgmma_tma_phases's maps): a stride of 2 x 2 at most


def _fused_phases_launch(gemms: list, dtype, tile) -> "_loader.PreparedLaunch":
    """One ``implicit_gemm_fprop_phases`` or ``implicit_gemm_wgmma_tma_phases`` launch of a phased dgrad's GEMMs
    (``_gemm_launch`` arguments, packed weight and dx byte offsets each): grid z the phase, x the most pixel blocks
    of any phase; pointers packed dy, the phases' packed weights (the first's rows), null, dx."""
    itemsize = numpy.dtype(dtype).itemsize
    table = numpy.zeros((), dtype=PHASE_GEMMS_DTYPE)
    x_maps, w_maps = [], []
    for z, (args, w_offset, dx_offset) in enumerate(gemms):
        fs, _, pl, m, filters, groups, grp_a, w_rows, strides, splits, split_tiles, pixel = args
        table["g"][z] = _gemm_geometry(fs, pl, m, filters, groups, grp_a, w_rows, strides, splits, split_tiles, pixel)
        table["y_offset"][z], table["w_offset"][z] = dx_offset // itemsize, w_offset // itemsize
        if not tile.tma:
            continue
        reason = tma_reason(fs, dtype, pl)
        if reason is not None:
            raise ValueError(f"implicit_gemm: tile {tile} cannot run {fs}: {reason}")
        (_, x_map), (_, w_map) = _tma_gemm_maps(fs, pl, m // (fs.p * fs.q), groups * w_rows)
        x_maps.append(x_map)
        w_maps.append(functools.partial(_encode_at, w_map, w_offset))
    pad = _FUSED_PHASES - len(gemms)  # (the kernel's unused maps: copies, never read)
    maps = tuple((0, e) for e in x_maps + x_maps[:1] * pad) + tuple((1, e) for e in w_maps + w_maps[:1] * pad)
    blocks = max(-(-args[3] // tile.bm) for args, _, _ in gemms)
    pl, tile = gemms[0][0][2], _twin(tile)
    name = tile.kernel_name(_dtypes.ctype_of(dtype), phases=True)
    grid = (blocks, pl.groups * pl.kp // tile.bn, len(gemms))
    if not tile.tma:
        return _kernel(name, grid, (tile.threads, 1, 1), (table[()],), smem=tile.smem_bytes)
    return _tma.TmaLaunch(_fn(name), name, grid, (tile.threads, 1, 1), 4, (table[()],), maps, smem=tile.smem_bytes)


def _encode_at(encode, offset: int, dst: int, address: int) -> None:
    """A map's ``encode`` of the tensor ``offset`` bytes past ``address``."""
    encode(dst, address + offset)


def _phases_reason(spec: ConvSpec, dtype, precision: str, limits: "_plan.Limits", tile=None):
    """Why the phases of ``spec``'s dgrad cannot run on ``tile`` (None: the one auto takes) under ``limits``, or None."""
    dtype = numpy.dtype(dtype)
    reason = _arithmetic_reason(dtype, precision)
    if reason is not None:
        return reason
    if spec.dilation != (1, 1):
        return "its dgrad at a stride above 1 (or padding wider than the kernel) runs phases of dilation 1 only"
    if spec.stride[0] * spec.stride[1] > _MAX_PHASES:
        return f"its dgrad runs a GEMM per phase of the stride: at most {_MAX_PHASES} of them"
    if spec.groups != 1 and spec.k_per_group * dtype.itemsize % 16:
        return (f"a group's filters (K/groups = {spec.k_per_group}) must fill whole 16-byte vectors of the packed "
                f"grad_output (a multiple of {16 // dtype.itemsize} in {dtype})")
    if max(*spec.stride, *spec.pad, spec.h, spec.w) > _INT_MAX:
        return "its geometry struct holds strides, paddings and sizes in 32 bits"
    if max(spec.n, spec.r * spec.s) > _MAX_GRID_Z:
        return f"its packing runs one sample, and one kernel tap, per grid z (at most {_MAX_GRID_Z})"
    if spec.n * spec.c * spec.h * spec.w == 0:
        return None
    cp, kp, w_row, phases = _phase_plan(spec, dtype, tile or choice().phase_tile(spec, dtype, limits.wgmma))
    if max(max(abs(p) for p in fs.pad) + max(spec.p, spec.q) for _, _, fs in phases) > _MAX_SIDE:
        return "its padded grad_output exceeds the kernel's 16-bit pixel coordinates"
    dy_elements = spec.n * spec.p * spec.q * spec.groups * cp
    if max(dy_elements, spec.n * spec.c * spec.h * spec.w, spec.k * spec.crs_per_group) > _INT_MAX:
        return "grad_output packed, grad_input or the weight holds 2^31 elements or more (32-bit offsets)"
    need = (dy_elements + spec.stride[0] * spec.stride[1] * spec.groups * kp * w_row) * dtype.itemsize
    if need > limits.workspace_limit:
        return (f"grad_output packed to NHWC and the phases' weights need {need} bytes, more than "
                f"cuconv.config.workspace_limit ({limits.workspace_limit})")
    return None


def _phases_prepare(spec: ConvSpec, dtype, env: "_plan.Env", tile=None, nhwc: bool = False,
                    krsc: bool = False) -> "_plan.Plan":
    """A phased dgrad's plan: pack dy (``nhwc``: from channels-last pixels, or not at all where they are the
    packed ones), pack the phases' weights (``krsc``: from a channels-last one), a GEMM per phase."""
    b = _plan.Builder("dgrad", env)
    if spec.n * spec.c * spec.h * spec.w == 0:
        return b.plan(NAME)
    if tile is not None and tile.nchw:
        raise ValueError(f"implicit_gemm: a phased dgrad reads packed operands; {tile} gathers NCHW ones")
    tile = tile or choice().phase_tile(spec, dtype, env.wgmma)
    if tile.wgmma and not env.wgmma:
        raise ValueError(f"implicit_gemm: tile {tile} needs a device of compute capability 9.0 (wgmma)")
    ls = _phase_launches(spec, numpy.dtype(dtype), tile, env.device, nhwc, krsc)
    packed_dy = b.take(ls.dy_bytes) if ls.pack_dy is not None else b.ref("dy")
    packed_w = b.take(ls.w_bytes)
    if spec.k:
        if ls.pack_dy is not None:
            b.launch(ls.pack_dy, b.ref("dy"), packed_dy, _plan.NULL, _plan.NULL)
        b.launch(ls.pack_w, b.ref("w"), packed_w)
    b.launch(ls.zeros, b.ref("dx"))
    for gemm, w_offset, dx_offset in ls.gemms:
        b.launch(gemm, packed_dy, (packed_w[0], packed_w[1] + w_offset), _plan.NULL, b.ref("dx", dx_offset),
                 *(_plan.NULL,) * (gemm.n_pointers - 4))  # (a GEMM kernel's residual: none; the phases' take none)
    return b.plan(NAME)
