"""implicit_gemm's knobs: which tile (engine and shape) runs a problem, and over how many k ranges a GEMM is split.

The algorithm (``cuconv.algos.implicit_gemm``) says which tiles can run a problem and builds the plan of the one
it is given; the choice is made here, by named rules whose thresholds were drawn between measured points
(docs/perf-notes.md, "Why auto chooses what it chooses"). ``knobs(problem, env)`` is the selector's entry
(``cuconv.select.knobs``): the tile ``auto`` runs; ``tile_for`` the same for a caller that forces the splits.
The algorithm asks this module for what auto would run where its own checks depend on it (the workspace its
reasons count, the split of a GEMM it plans).
"""

from __future__ import annotations

import numpy

from .._plan import Env
from ..algos.implicit_gemm.tiles import (
    Plan, TILES, TMA_ROWS_TILES, TMA_TILES, WGRAD_TMA_TILES, WgmmaTile, WgradTmaTile, _packed_k_tiles, _padded_channels,
    resident_blocks, wgmma_available)
from ..algos.implicit_gemm.wgmma_nchw import nchw_fits
from ..algos.implicit_gemm.wgmma_tma import (
    _TMA_STORE, _persistent_per_sm, block_diagonal_bytes, block_diagonal_tile, tma_reason)
from ..algos.implicit_gemm.wgrad_tma import _WGRAD_TMA_PIXELS, _wgrad_tma_c_tiles, wgrad_tma_reason
from ..algos.implicit_gemm.forward import nhwc_in_place, plan
from ..algos.implicit_gemm.wgrad import _wgrad_sizes, transposed_spec
from ..algos.implicit_gemm.dgrad_phases import _phase_plan, phase_specs
from ..blocks import dgrad_forward
from ..problem import Problem
from ..spec import ConvSpec

__all__ = ["knobs", "tile_for", "choose_tile", "tma_tile", "persistent_tile", "phase_tile", "wgrad_tile",
           "wgrad_tma_tile", "narrow_group_tile", "prefers_nchw", "splits_for", "wgrad_splits", "wgrad_tma_splits"]


def knobs(problem: Problem, env: Env) -> dict:
    """The selector's rule (``cuconv.select.knobs``): ``{"tile": the tile auto runs problem on env}``; the GEMMs'
    splits are left to the plan (``splits_for`` of its chunks' sizes)."""
    return {"tile": tile_for(problem.pass_, problem.spec, problem.dtype, problem.layout == "nhwc", env)}


def tile_for(pass_: str, spec: ConvSpec, dtype, nhwc: bool, env: Env, splits: int = None):
    """The tile auto runs ``pass_`` of ``spec`` on (``nhwc``: channels-last activations) on ``env``, the GEMM split
    over ``splits`` k ranges (None: as ``splits_for`` will have it; a row-band tile reduces every tap in its block
    and is taken only then). wgrad: on channels-last operands at 256-byte boundaries on a wgmma device the TMA
    wgrad's tile where it serves (``wgrad_tma_tile``), else ``wgrad_tile``. A dgrad at a stride above 1: the
    phases' ``phase_tile``. The forward, and the stride-1 dgrad as the forward of dy: ``choose_tile``; on
    channels-last activations, a packed tile, a grouped forward through a block-diagonal weight on a wgmma device
    (``block_diagonal_tile``, its weight within the workspace limit), and where the GEMM reads its input in place
    and stores a dense output through the TMA the persistent tile where one pays (``persistent_tile``). An NCHW
    stride-1 dgrad takes a packed tile where an NchwTile's flipped copy of the weight would not fit the workspace
    limit."""
    dtype = numpy.dtype(dtype)
    if pass_ == "wgrad":
        tile = wgrad_tma_tile(spec, dtype) if nhwc and env.wgmma and env.aligned else None
        return tile or wgrad_tile(spec, dtype, env.wgmma)
    fspec = spec if pass_ == "fprop" else dgrad_forward.forward_spec(spec)
    if fspec is None:
        return phase_tile(spec, dtype, env.wgmma)
    rows = splits is None or splits == 1
    if not nhwc:
        tile = choose_tile(fspec, dtype, env.wgmma, rows=rows)
        if tile.nchw and pass_ == "dgrad" and dgrad_forward.flipped_bytes(spec, dtype) > env.workspace_limit:
            tile = choose_tile(fspec, dtype, env.wgmma, nchw=False, rows=rows)  # (the flipped copy would not fit)
        return tile
    if pass_ == "fprop" and spec.groups != 1 and env.wgmma:
        diagonal = block_diagonal_tile(spec, dtype)
        if diagonal is not None and block_diagonal_bytes(spec, dtype) <= env.workspace_limit:
            return diagonal
    tile = choose_tile(fspec, dtype, env.wgmma, nchw=False, rows=rows)
    if nhwc_in_place(fspec, dtype) and _TMA_STORE and fspec.k % 8 == 0 and env.aligned:
        tile = persistent_tile(fspec, dtype, env) or tile
    return tile


# ---- the forward's tiles ---------------------------------------------------------------------------------------

# Measured per tile on the layers of five torchvision models (H100, docs/perf-notes.md): an NchwTile reduces
# every k tile in its block (no split-K), so where its reduction is longer than _NCHW_MAX_SHORT_K_TILES tiles
# of 32 k and more than 3/4 of such a tile per block of its grid (7x7 planes with few filters, squeeze-excitation's 1x1)
# the packed tiles, split over k, win (2-3x on squeeze-excitation layers); on one row of pixel blocks 64
# filters a block win. Above 64 filters a wgmma block of 64 filters wins below _WIDE_TILE_MIN_M output pixels
# (more blocks: 10-25% on 14x14 and 7x7 layers) unless the GEMM has _LONG_TILE_MIN_MACS multiply-adds or more:
# there 128 x 256 blocks, one an SM, win by 10-30% (14x14 and 7x7 planes of 512 and 1024 channels, batch 64,
# detection heads' 256 channels at 50x76), and lose by 50% at 7.4 GFLOP (256 channels at 14x14, batch 32).
_NCHW_MAX_SHORT_K_TILES = 4
_WIDE_TILE_MIN_M = 16384
_LONG_TILE_MIN_MACS = 5 * 10**9


def choose_tile(spec: ConvSpec, dtype, wgmma: bool = None, nchw: bool = None, tma: bool = True,
                rows: bool = True):
    """``wgmma`` defaults to whether the current device has it (compute capability 9.0), ``nchw`` to
    ``prefers_nchw`` but for long reductions over few blocks (``_NCHW_MAX_SHORT_K_TILES``). Several
    groups of up to 32 filters take ``narrow_group_tile`` on any device. Else, on a wgmma device: an NchwTile
    where it is preferred and fits (64 filters per block up to 64 filters or on one row of pixel blocks, else
    128); otherwise, where ``tma`` allows, the TMA tile ``tma_tile`` picks (the 16-bit types, one group, channels
    in whole 16s); otherwise 64 filters per block where K/groups <= 64, with four slots for float32 reductions of 16 k
    tiles or more and three (three blocks per SM) otherwise; above 64 filters, 64 x 128 blocks below
    ``_WIDE_TILE_MIN_M`` output pixels (128 x 256 ones where the GEMM has ``_LONG_TILE_MIN_MACS``
    multiply-adds or more), else 128 x 256 blocks for float32 reductions of 32 k tiles or more and 128 x 128 ones
    (two per SM) otherwise. Elsewhere (mma.sync): 128 filters per block where
    K/groups > 64; else 64, with 128-byte k tiles where the reduction (R·S·C/groups bytes) spans at least
    32 of them and 64-byte tiles (more blocks per SM) below."""
    if wgmma is None:
        wgmma = wgmma_available()
    itemsize = numpy.dtype(dtype).itemsize
    narrow = narrow_group_tile(spec)
    if narrow is not None:
        return narrow
    if wgmma:
        m = spec.n * spec.p * spec.q
        m_blocks = -(-m // 128)
        nchw_tile = TILES["nchw64" if spec.k_per_group <= 64 or m_blocks == 1 else "nchw128"]
        if nchw is None:
            k_tiles = -(-spec.crs_per_group // 32)  # float32 k tiles: a gather costs per element, not per byte
            blocks = m_blocks * -(-spec.k_per_group // nchw_tile.bn)
            nchw = prefers_nchw(spec, dtype) and not (k_tiles > _NCHW_MAX_SHORT_K_TILES and 4 * k_tiles > 3 * blocks)
        if nchw and nchw_fits(spec, dtype):
            return nchw_tile
        tma_choice = tma_tile(spec, dtype, rows) if tma else None
        if tma_choice is not None:
            return tma_choice
        k_tiles = _packed_k_tiles(spec, itemsize, WgmmaTile.kbytes)
        long_fp32 = itemsize == 4 and k_tiles >= (16 if spec.k_per_group <= 64 else 32)
        if spec.k_per_group <= 64:
            return TILES["wg64x128" if long_fp32 else "wg64x128s3"]
        if m < _WIDE_TILE_MIN_M:
            long_gemm = m * spec.k_per_group * spec.crs_per_group >= _LONG_TILE_MIN_MACS
            return TILES["wg128x256" if long_gemm else "wg64x128"]
        return TILES["wg128x256" if long_fp32 else "wg128x128r"]
    if spec.k_per_group > 64:
        return TILES["128x128"]
    reduction = spec.r * spec.s * spec.c_per_group * itemsize
    return TILES["128x64"] if reduction >= 4096 else TILES["128x64_k64"]


# An NchwTile instead of packing where the pack costs as much as the gather it saves (docs/perf-notes.md, v6):
# the pack moves the input twice, the GEMM reads it K·R·S / (tile) times more, so the pack weighs most where
# K·R·S is small: 1x1 layers, and float32 up to K·R·S = 576 (one launch and no allocation fewer); float16
# gathers two bytes per load and loses on 3x3.
_NCHW_MAX_FILTER_TAPS_FP32 = 576


def prefers_nchw(spec: ConvSpec, dtype) -> bool:
    """Whether ``choose_tile`` takes an NchwTile (where it fits) on a wgmma device: layers whose windows do not
    overlap (1x1, patchify: the pack would copy what the GEMM reads once), float32 with few filters and taps,
    and inputs of fewer channels than one 16-byte vector (a stem's 3: packed, each pixel would take a whole
    vector)."""
    taps, itemsize = spec.r * spec.s, numpy.dtype(dtype).itemsize
    disjoint = all(st >= d * (k - 1) + 1 for st, d, k in zip(spec.stride, spec.dilation, (spec.r, spec.s)))
    return (taps == 1 or disjoint or (itemsize == 4 and spec.k_per_group * taps <= _NCHW_MAX_FILTER_TAPS_FP32)
            or spec.c_per_group * itemsize < 16)


def narrow_group_tile(spec: ConvSpec):
    """For several groups of up to 32 filters each, the mma.sync tile of 16 or 32 filters a block (any
    device): the wgmma tiles' 64 filters a warpgroup would compute zeros for the rest. None otherwise."""
    if spec.groups == 1 or spec.k_per_group > 32:
        return None
    return TILES["128x16" if spec.k_per_group <= 16 else "128x32"]


# The TMA tiles auto takes (docs/perf-notes.md, "auto takes the TMA tiles"), on the devices with wgmma (H100/H200:
# 132 SMs of 228 KB): the first of a list with blocks for at least _TMA_FILL of the SMs (a 128 x 128 block alone
# on an SM outruns two of 64 x 128: 98 blocks of it beat 196 by 15% on ResNet-50's 256@14², 52 lose to 104 by
# 18% on 512@7²). Over 64 filters: 128 x 256 blocks (one an SM) for reductions of _TMA_LONG_REDUCTION bytes or
# more, but not for a wave and a half of them (their second wave half empty: 128 x 128 ones 7-12% faster); then
# 128 x 128 (two an SM: 10% faster than 128 x 256 on short reductions, whose epilogue one block an SM leaves
# bare), then 64 x 128. Up to 64 filters, or where 128-filter blocks would compute more of them than 64-filter
# ones (192: a third more; 96 takes 128, which computes no more than two of 64 and wins by 30%), 64 x 128
# blocks, or 64 x 256 ones with narrow k tiles where they run _TMA_MANY_WAVES waves or more (the large problems).
_TMA_FILL = 0.55
_TMA_SMS, _TMA_SMEM_PER_SM = 132, 228 << 10
_TMA_LONG_REDUCTION = 4096
_TMA_MANY_WAVES = 8


# The row-band tiles where output rows are long: whole segments of 256 (128) pixels cover 90% of a row or more
# (the large problems' 250- to 1022-pixel rows; the models' rows of 112 and fewer would leave blocks part empty).
_ROWS_MIN_FILL = 0.9


def _rows_tile(spec: ConvSpec, cp: int):
    """The row-band tile for a stride-1 layer of long output rows whose padded channels are one of the tiles' (16,
    32, 64), or None: 64 × 256 up to 64 filters, else 128 × 128."""
    if spec.stride != (1, 1) or cp not in (16, 32, 64):
        return None
    t = TMA_ROWS_TILES[("rows64x256" if spec.k <= 64 else "rows128x128") + f"_k{cp}"]
    return t if spec.q >= t.bm and spec.q / (-(-spec.q // t.bm) * t.bm) >= _ROWS_MIN_FILL else None


def tma_tile(spec: ConvSpec, dtype, rows: bool = True):
    """The TMA tile for ``spec`` in ``dtype`` (see above), or None where none serves it (``tma_reason``): a row-band
    tile where ``rows`` allows and ``_rows_tile`` finds one, else k tiles of 128 bytes where a group's channels are
    whole 64s, else of 64 or 32 bytes (whole 32s, 16s)."""
    itemsize = numpy.dtype(dtype).itemsize
    if itemsize != 2 or spec.groups != 1:
        return None
    cp = _padded_channels(spec, itemsize)
    kbytes = next((kb for kb in (128, 64, 32) if cp * itemsize % kb == 0), None)
    if kbytes is None:
        return None
    band_tile = _rows_tile(spec, cp) if rows else None
    if band_tile is not None and tma_reason(spec, dtype, Plan(band_tile, cp, spec.r * spec.s, 0, 0, spec.n)) is None:
        return band_tile
    if spec.k <= 64 or -(-spec.k // 128) * 128 > -(-spec.k // 64) * 64:
        names = ["64x128"] if kbytes == 128 else ["64x256", "64x128"]
    else:
        long = spec.r * spec.s * cp * itemsize >= _TMA_LONG_REDUCTION
        names = (["128x256"] if long else []) + ["128x128", "64x128"]
    m = spec.n * spec.p * spec.q
    for name in names:
        t = TMA_TILES[f"tma{name}" + ("" if kbytes == 128 else f"_k{kbytes}")]
        blocks = -(-m // t.bm) * -(-spec.k // t.bn)
        wave_and_a_half = name == "128x256" and _TMA_SMS < blocks < 2 * _TMA_SMS
        few_waves = name == "64x256" and blocks < _TMA_MANY_WAVES * _TMA_SMS * resident_blocks(t, _TMA_SMEM_PER_SM)
        if wave_and_a_half or few_waves:
            continue
        if blocks >= _TMA_FILL * _TMA_SMS:
            break
    pl = Plan(t, cp, _packed_k_tiles(spec, itemsize, kbytes), 0, 0, spec.n)
    return t if tma_reason(spec, dtype, pl) is None else None


# auto's persistent tiles (persistent_tile): where a block's filters' weight fits in its shared memory beside the
# ring and the pixels fill this many waves of the blocks the SMs hold (the weight copied once a block, not once a
# tile: square_3x3_1024 3.7 -> 2.0 ms, ResNet-50 64@56² 23.3 -> 20.3 µs; docs/perf-notes.md)
_PERSISTENT = True
_PERSISTENT_MIN_WAVES = 2
_PERSISTENT_MIN_PIXELS = 256  # an SM's blocks' pixels (VGG-11 64@112² -> 128: one 128 x 128 block an SM, 1.14x slower)


def persistent_tile(spec: ConvSpec, dtype, env: Env):
    """The persistent tile (``implicit_gemm_wgmma_tma_pst``) auto runs ``spec``'s channels-last GEMM on, its output
    stored through the TMA, or None: k tiles of 32 bytes where a tap's padded channels are an odd number of 16s,
    else of 64; 64 filters a block up to 64, else 128; of those tiles, one whose block's weight (every k tile) fits
    (``_persistent_per_sm``) and that holds the most pixels an SM (``_PERSISTENT_MIN_PIXELS`` at least), then the
    most blocks; where its tiles fill ``_PERSISTENT_MIN_WAVES`` waves of the blocks it runs."""
    itemsize = numpy.dtype(dtype).itemsize
    if not (_PERSISTENT and env.wgmma) or itemsize != 2 or spec.groups != 1:
        return None
    kbytes = 32 if _padded_channels(spec, itemsize) * itemsize % 64 else 64
    bn, m = 64 if spec.k <= 64 else 128, spec.n * spec.p * spec.q
    best, best_key = None, None
    for t in TMA_TILES.values():
        if not t.persistent or t.kbytes != kbytes or t.bn != bn:
            continue
        pl = plan(spec, dtype, t, env.workspace_limit)  # (its k tiles and filters: the limit does not matter)
        per_sm = _persistent_per_sm(t, pl.k_tiles, env)
        if not per_sm or tma_reason(spec, dtype, pl) is not None:
            continue
        tiles = -(-m // t.bm) * (pl.kp // t.bn)
        key = (per_sm * t.bm, per_sm)
        if (key[0] >= _PERSISTENT_MIN_PIXELS and tiles >= _PERSISTENT_MIN_WAVES * env.sm_count * per_sm
                and (best_key is None or key > best_key)):
            best, best_key = t, key
    return best


# ---- a strided dgrad's phases -------------------------------------------------------------------------------

# A phase's GEMM has a stride² share of dgrad's rows and of its taps: with more than 64 filters, 128 x 128
# blocks (two per SM) where a phase has many rows, else 64 x 128 ones (more blocks: the fastest of the packed
# tiles on the strided layers of five torchvision models, docs/perf-notes.md)
_PHASE_WIDE_TILE_MIN_ROWS = 16384


def phase_tile(spec: ConvSpec, dtype, wgmma: bool):
    """The tile of every phase of a phased dgrad: ``choose_tile``'s for the phase of most taps where that is a TMA
    tile every phase's geometry takes (``tma_reason``); else, where it would take a wgmma tile of 128 filters, the
    64 x 128 one unless a phase has ``_PHASE_WIDE_TILE_MIN_ROWS`` rows."""
    phases = phase_specs(spec)
    widest = max(phases, key=lambda ph: ph[1])[2]
    tile = choose_tile(widest, dtype, wgmma, nchw=False)
    if tile.tma:
        cp, kp, w_row, _ = _phase_plan(spec, dtype, tile)
        if all(tma_reason(fs, dtype, Plan(tile, cp, 1, w_row, kp, spec.n)) is None for _, taps, fs in phases if taps):
            return tile
        tile = choose_tile(widest, dtype, wgmma, nchw=False, tma=False)
    if tile.wgmma and tile.bn > 64:
        rows = max(fs.n * fs.p * fs.q for _, _, fs in phases)
        return TILES["wg128x128r" if rows >= _PHASE_WIDE_TILE_MIN_ROWS else "wg64x128"]
    return tile


# ---- wgrad ------------------------------------------------------------------------------------------------------

# wgrad's GEMMs with wgmma: 128 filters x 256 of dW's columns (one block an SM, split over k to about one block
# an SM) where a group has more than 64 filters and both dW's columns and the reduction are long (3x3 layers of
# 256 channels and more with N·P·Q of 2500 and up: 20-40% faster than 64 x 128 blocks, up to 1.7x on 28x28
# planes; at 1568 slower); 64 x 128 blocks elsewhere (shorter reductions, 1x1 layers, narrow groups:
# docs/perf-notes.md).
_WGRAD_WIDE_MIN = 2048  # dW's columns (C/groups·R·S) and the reduction (N·P·Q)


def wgrad_tile(spec: ConvSpec, dtype, wgmma: bool):
    """wgrad's tile: with wgmma 128 filters x 256 of dW's columns for long GEMMs of more than 64 filters a group
    (``_WGRAD_WIDE_MIN``), else 64 filters x 128 columns, four slots; elsewhere the packed tile ``choose_tile``
    picks for ``transposed_spec`` (an NchwTile would read x and dy as NCHW images; they are not)."""
    if wgmma:
        wide = spec.k_per_group > 64 and min(spec.crs_per_group, spec.n * spec.p * spec.q) >= _WGRAD_WIDE_MIN
        return TILES["wg128x256" if wide else "wg64x128"]
    return choose_tile(transposed_spec(spec), dtype, wgmma, nchw=False)


def wgrad_tma_tile(spec: ConvSpec, dtype):
    """The TMA wgrad tile for ``spec`` (see WGRAD_TMA_TILES), or None where it cannot run (``wgrad_tma_reason``)."""
    if wgrad_tma_reason(spec, dtype) is not None:
        return None
    if spec.c <= 64 or spec.groups != 1:
        return WGRAD_TMA_TILES["wt64x64"]
    return WGRAD_TMA_TILES["wt64x128" if spec.c <= 128 or spec.k <= 64 else "wt128x256"]


def wgrad_tma_splits(spec: ConvSpec, tile: WgradTmaTile, sm_count: int, smem_per_sm: int, room: int) -> int:
    """Pixel ranges the TMA wgrad of ``spec`` is split into: as many as fill the SMs' resident blocks, each at
    least ``_SPLIT_MIN_TILES`` k tiles, their fp32 partial sums within ``room`` bytes."""
    blocks = -(-spec.k // tile.bf) * _wgrad_tma_c_tiles(spec, tile) * spec.r * spec.s
    k_tiles = -(-spec.n * spec.p * spec.q // _WGRAD_TMA_PIXELS)
    splits = min(sm_count * resident_blocks(tile, smem_per_sm) // blocks, k_tiles // _SPLIT_MIN_TILES, _MAX_SPLITS,
                 room // max(1, 4 * spec.k * spec.crs_per_group))
    return splits if splits >= 2 else 1


# ---- split-K -----------------------------------------------------------------------------------------------------

# Split-K: about one block per SM over the device (the measured best from 1 to 16 splits followed SMs / blocks,
# rounded, on every wgrad layer of the sweep in docs/perf-notes.md), each split at least this many k tiles, at
# most this many splits.
_SPLIT_MIN_TILES = 4
_MAX_SPLITS = 128


def splits_for(m: int, filters: int, tile, k_tiles: int, sm_count: int, smem_per_sm: int, room: int,
               groups: int = 1) -> int:
    """How many k ranges a GEMM of ``m`` rows and ``filters`` filters in ``groups`` groups (``k_tiles`` k tiles) on
    ``tile`` is split into on a device of ``sm_count`` SMs of ``smem_per_sm`` bytes of shared memory, with
    ``room`` bytes for the fp32 partial sums of m x filters outputs each; 1 for an NchwTile (its kernel reduces
    every k tile itself). Never more blocks than the SMs hold at once: for a tile of one block an SM, 144
    blocks on 132 SMs would run a second wave as long as the first (1.2x slower than 72 unsplit ones)."""
    if tile.nchw or getattr(tile, "rows", False):
        return 1
    blocks = -(-m // tile.bm) * groups * -(-filters // groups // tile.bn)
    splits = min(round(sm_count / blocks), sm_count * resident_blocks(tile, smem_per_sm) // blocks,
                 k_tiles // _SPLIT_MIN_TILES, _MAX_SPLITS, room // max(1, 4 * m * filters))
    return splits if splits >= 2 else 1


def wgrad_splits(spec: ConvSpec, dtype, tile, sm_count: int, smem_per_sm: int, workspace_limit: int) -> int:
    """How many k ranges the wgrad GEMM of ``spec`` is split into on a device of ``sm_count`` SMs of
    ``smem_per_sm`` bytes of shared memory, the partial sums within what ``workspace_limit`` leaves beside the
    packed operands."""
    pl, x_bytes, dy_bytes, _ = _wgrad_sizes(spec, dtype, tile, 1)
    return splits_for(spec.crs_per_group, spec.k, tile, pl.k_tiles, sm_count, smem_per_sm,
                      workspace_limit - x_bytes - dy_bytes, spec.groups)
