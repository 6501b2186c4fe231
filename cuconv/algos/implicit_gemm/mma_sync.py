"""Python twin of ``kernels_cu/implicit_gemm/mma_sync.cu``: the mma.sync GEMM (any sm_80+ device) and its
phases instance."""

from __future__ import annotations

import numpy

from ...spec import ConvSpec
from .tiles import TILES, Tile, _TENSOR_CORE_TYPES
from .launch import GEOMETRY_DTYPE

STEM = "implicit_gemm/mma_sync"
NAME_EXPRESSIONS = tuple(
    [t.kernel_name(c, phases) for phases in (False, True) for c in _TENSOR_CORE_TYPES for t in TILES.values()
     if type(t) is Tile])


def narrow_group_tile(spec: ConvSpec):
    """For several groups of up to 32 filters each, the mma.sync tile of 16 or 32 filters a block (any
    device): the wgmma tiles' 64 filters a warpgroup would compute zeros for the rest. None otherwise."""
    if spec.groups == 1 or spec.k_per_group > 32:
        return None
    return TILES["128x16" if spec.k_per_group <= 16 else "128x32"]
PHASE_GEMMS_DTYPE = numpy.dtype([("g", GEOMETRY_DTYPE, (4,)), ("y_offset", numpy.int64, (4,)),
                                 ("w_offset", numpy.int64, (4,))], align=True)
