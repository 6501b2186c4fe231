"""What every engine's launches share: the kernel of a name, fetched from the ``kernels_cu/implicit_gemm/`` file
that holds it, and the GEMM kernels' ``Geometry``."""

from __future__ import annotations

import dataclasses
import importlib

import numpy

from ... import _loader
from ...blocks.epilogue import NO_EPILOGUE
from ...spec import ConvSpec
from .tiles import Plan


NAME = "implicit_gemm"  # the algorithm's name, its plans' ``algo``

# The file of kernels_cu/implicit_gemm/ that holds each kernel, by its template's name: the kernel is compiled from
# that file alone, as one of its twin's NAME_EXPRESSIONS.
_KERNEL_STEMS = {
    **dict.fromkeys(("pack_nhwc", "pack_nhwc_narrow", "pack_swap", "pack_block_diagonal", "pack_dgrad_phases",
                     "sum_splits"), "implicit_gemm/pack"),
    **dict.fromkeys(("implicit_gemm_fprop", "implicit_gemm_fprop_phases"), "implicit_gemm/mma_sync"),
    "implicit_gemm_wgmma": "implicit_gemm/wgmma",
    **dict.fromkeys(("implicit_gemm_wgmma_tma", "implicit_gemm_wgmma_tma_st", "implicit_gemm_wgmma_tma_pst",
                     "implicit_gemm_wgmma_tma_phases", "implicit_gemm_wgmma_tma_rows",
                     "implicit_gemm_wgmma_tma_rows_st"), "implicit_gemm/wgmma_tma"),
    "implicit_gemm_wgrad_tma": "implicit_gemm/wgrad_tma",
    "implicit_gemm_wgmma_nchw": "implicit_gemm/wgmma_nchw",
}


def choice():
    """``cuconv.select.implicit_gemm``, the rules that choose the tiles and splits auto runs: asked where a plan or a
    check depends on that choice (a plan given no tile, the workspace a reason counts, a GEMM's split). Imported on
    first use, since the selector imports the algorithms."""
    from ...select import implicit_gemm

    return implicit_gemm


def kernel_stem(name: str) -> str:
    """The stem of the ``.cu`` that holds kernel ``name`` (a template instance, ``kernel<args>``)."""
    return _KERNEL_STEMS[name.partition("<")[0]]


def _fn(name: str):
    stem = kernel_stem(name)
    # (the twin is imported with this package: a lookup, at planning time only)
    return _loader.get_function(stem, importlib.import_module(_loader.twin_module(stem)).NAME_EXPRESSIONS, name)


def _kernel(name: str, grid: tuple, block: tuple, scalars: tuple, smem: int = 0,
            pointers: int = 4) -> "_loader.PreparedLaunch":
    """One launch but its ``pointers`` pointer arguments (a pack's: source, packed, weight, packed weight; a
    GEMM's five: x, w or packed operands, bias, output, residual): built once per problem (``_launches``),
    called with raw pointers, so that a layer called again spends no host time planning or marshalling
    arguments."""
    return _loader.PreparedLaunch(_fn(name), name, grid, block, pointers, scalars, smem)


# The GEMM kernels' pointers: x (or packed x), w (or packed w), bias, y, residual (igemm.cuh's CUCONV_IGEMM_PARAMS).
GEMM_POINTERS = 5
# igemm.cuh's Epilogue: the activation's code (blocks.epilogue.ACT_CODES), where the residual is added (0 none, 1
# before the activation, 2 after it), leaky_relu's slope.
EPILOGUE_DTYPE = numpy.dtype([("act", numpy.int32), ("res", numpy.int32), ("alpha", numpy.float32),
                              ("unused", numpy.int32)], align=True)


def epilogue_struct(codes: tuple = NO_EPILOGUE):
    """``EPILOGUE_DTYPE`` of ``epilogue_codes``."""
    return numpy.array((*codes, 0), dtype=EPILOGUE_DTYPE)[()]


# The kernels' structs, passed by value: one argument instead of 9 or 17 (host time per launch).
_GEOMETRY_FIELDS = ("h", "w", "cp", "k", "p", "q", "r", "s", "stride_h", "stride_w", "pad_h", "pad_w", "dil_h",
                    "dil_w", "m", "k_tiles")
GEOMETRY_DTYPE = numpy.dtype([(f, numpy.int32) for f in _GEOMETRY_FIELDS]
                             + [(f, numpy.int64) for f in ("w_row", "out_img", "out_k", "split_stride")]
                             + [(f, numpy.int32) for f in ("split_tiles", "pix", "kp", "grp_a", "w_rows", "out_row",
                                                           "out_col", "block_diag")], align=True)


def _gemm_geometry(spec: ConvSpec, pl: Plan, m: int, filters: int, groups: int, grp_a: int, w_rows: int,
                   out_strides: tuple, splits: int, split_tiles: int, out_pixel: tuple = None, pix: int = None,
                   block_diag: int = 0):
    """The GEMM kernels' ``Geometry`` (GEOMETRY_DTYPE) of ``_gemm_launch``'s arguments; ``pix`` the input's pixel
    pitch where it is not the plan's (a block-diagonal forward reads the layer's C channels), ``block_diag`` the
    width of its groups."""
    split_stride = 0 if splits == 1 else m * filters * groups
    out_row, out_col = out_pixel or (spec.q, 1)
    return numpy.array((spec.h, spec.w, pl.cp, filters, spec.p, spec.q, spec.r, spec.s, spec.stride[0],
                        spec.stride[1], spec.pad[0], spec.pad[2], spec.dilation[0], spec.dilation[1], m,
                        pl.k_tiles, pl.w_row, *out_strides, split_stride, split_tiles, pix or pl.pix, pl.kp, grp_a,
                        w_rows, out_row, out_col, block_diag), dtype=GEOMETRY_DTYPE)[()]


@dataclasses.dataclass(frozen=True)
class WgradLaunches:
    """A wgrad's launches (pointers: source, packed, null, null for the packs; packed x, packed dy, null, dW or
    the partial sums, null for the GEMM; partial sums, null, dW, null for ``sums``) and workspace bytes of each
    part."""

    pack_x: "_loader.PreparedLaunch"
    pack_dy: "_loader.PreparedLaunch"
    gemm: "_loader.PreparedLaunch"
    sums: "_loader.PreparedLaunch"  # None: one split, the GEMM writes dW
    x_bytes: int
    dy_bytes: int
    partial_bytes: int
