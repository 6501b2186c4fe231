"""Python twin of ``kernels_cu/implicit_gemm/mma_sync.cu``: the mma.sync GEMM (any sm_80+ device) and its
phases instance."""

from __future__ import annotations

import numpy

from .tiles import TILES, Tile, _TENSOR_CORE_TYPES
from .launch import GEOMETRY_DTYPE

STEM = "implicit_gemm/mma_sync"
NAME_EXPRESSIONS = tuple(
    [t.kernel_name(c, phases) for phases in (False, True) for c in _TENSOR_CORE_TYPES for t in TILES.values()
     if type(t) is Tile])


PHASE_GEMMS_DTYPE = numpy.dtype([("g", GEOMETRY_DTYPE, (4,)), ("y_offset", numpy.int64, (4,)),
                                 ("w_offset", numpy.int64, (4,))], align=True)
