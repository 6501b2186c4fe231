"""Python twin of ``kernels_cu/implicit_gemm/wgmma.cu``: the packed GEMM on warpgroup MMAs, cp.async-fed
(``WgmmaTile``)."""

from __future__ import annotations

from .tiles import TILES, WgmmaTile, _TENSOR_CORE_TYPES

STEM = "implicit_gemm/wgmma"
NAME_EXPRESSIONS = tuple(t.kernel_name(c) for c in _TENSOR_CORE_TYPES for t in TILES.values()
                         if type(t) is WgmmaTile)
