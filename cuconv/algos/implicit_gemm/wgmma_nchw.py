"""Python twin of ``kernels_cu/implicit_gemm/wgmma_nchw.cu``: the GEMM that gathers NCHW itself (``NchwTile``),
and where it serves."""

from __future__ import annotations

import numpy

from ...spec import ConvSpec
from .tiles import NchwTile, TILES, WgmmaTile, _TENSOR_CORE_TYPES

STEM = "implicit_gemm/wgmma_nchw"
NAME_EXPRESSIONS = tuple(t.kernel_name(c) for c in _TENSOR_CORE_TYPES for t in TILES.values()
                         if type(t) is NchwTile)


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


# An NchwTile's k table (8 bytes per k in shared memory) up to this many k: reductions up to C·R·S = 2048
# (16 KB), past which the pack is a small part of the time anyway; and kernels of up to 31 taps (one bit each
# in a 32-bit word per pixel)
_NCHW_MAX_K = 2048
_NCHW_MAX_TAPS = 31


def nchw_fits(spec: ConvSpec, dtype) -> bool:
    """Whether an ``NchwTile`` can serve this problem: one group, its k table fits (``_NCHW_MAX_K``) and the
    kernel's taps fit a 32-bit word (``_NCHW_MAX_TAPS``)."""
    tile_k = WgmmaTile.kbytes // numpy.dtype(dtype).itemsize
    return (spec.groups == 1 and -(-spec.crs_per_group // tile_k) * tile_k <= _NCHW_MAX_K
            and spec.r * spec.s <= _NCHW_MAX_TAPS)
