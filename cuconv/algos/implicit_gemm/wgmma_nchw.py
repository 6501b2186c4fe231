"""Python twin of ``kernels_cu/implicit_gemm/wgmma_nchw.cu``: the GEMM that gathers NCHW itself (``NchwTile``),
and where it serves."""

from __future__ import annotations

import numpy

from ...spec import ConvSpec
from .tiles import NchwTile, TILES, WgmmaTile, _TENSOR_CORE_TYPES

STEM = "implicit_gemm/wgmma_nchw"
NAME_EXPRESSIONS = tuple(t.kernel_name(c) for c in _TENSOR_CORE_TYPES for t in TILES.values()
                         if type(t) is NchwTile)


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
