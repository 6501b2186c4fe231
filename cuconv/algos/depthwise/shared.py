"""What the depthwise engines (``nchw_fwd``, ``nchw_bwd``, ``nhwc``) share: the structs their kernels take by
value (``DwGeometry`` and ``DwWork`` in ``kernels_cu/depthwise/depthwise.cuh``), the tests of a geometry, the block
and the grid's limits."""

from __future__ import annotations

import numpy

from ... import _dtypes, _loader
from ...blocks.epilogue import NO_EPILOGUE
from ...spec import ConvSpec

ALGORITHM_NAME = "depthwise"  # its plans' name (Plan.algo)
_THREADS = _loader.THREADS  # its kernels' block: the residency arithmetic below reads it


_SMEM_LIMIT = _loader.SMEM_DEFAULT  # wgrad's per-thread accumulators stay within the default


_MAX_GRID_Y = 65535
_FIXED_KERNELS = ((3, 3), (5, 5), (7, 7))  # compiled with unrolled tap loops


# DwGeometry in depthwise/depthwise.cuh: the gather kernels' one struct argument.
DW_GEOMETRY_DTYPE = numpy.dtype([(f, numpy.int32) for f in (
    "n", "c", "h", "w", "k", "p", "q", "mult", "stride_h", "stride_w", "pad_top", "pad_left", "dil_h", "dil_w",
    "total", "rows", "strips", "chunk", "flip")])


# The forward kernels' last template parameter, kEpi: their instances that apply the epilogue where they store, for
# the types networks run in (float64 runs the plain instance, its epilogue a pass after: cuconv.algos.base).
EPILOGUE_CTYPES = ("__half", "__nv_bfloat16", "float")
EPILOGUE_DTYPES = tuple(d for d in _dtypes.SUPPORTED if _dtypes.ctype_of(d) in EPILOGUE_CTYPES)  # (this process's)


def with_epilogue_flag(name: str, fused: bool) -> str:
    """``name`` (a forward kernel's instance without its last template argument) with kEpi = ``fused``."""
    return f"{name[:-1]},{'true' if fused else 'false'}>"


def fused_instance(codes: tuple, dtype) -> bool:
    """Whether a forward of ``dtype`` with the epilogue ``codes`` (``blocks.epilogue.epilogue_codes``) runs a kEpi
    instance; ValueError for an epilogue in a type without one (the algorithm's ``epilogue_dtypes`` keep it from
    being asked)."""
    fused = codes != NO_EPILOGUE
    if fused and _dtypes.ctype_of(dtype) not in EPILOGUE_CTYPES:
        raise ValueError(f"cuconv: depthwise applies no epilogue in its {numpy.dtype(dtype)} kernels")
    return fused


def epilogue_instances(names) -> list:
    """Every forward kernel instance of ``names`` (without kEpi): the plain one, and the fused one where its type is
    of ``EPILOGUE_CTYPES``."""
    out = []
    for name in names:
        ctype = name.split("<", 1)[1].split(",", 1)[0]
        out += [with_epilogue_flag(name, fused) for fused in (False, True) if not fused or ctype in EPILOGUE_CTYPES]
    return out


def _dw_geometry(spec: ConvSpec, total: int, rows: int = 0, strips: int = 0, chunk: int = 0):
    """The ``DwGeometry`` of ``spec`` for ``total`` work items (wgrad's strips: ``rows`` per strip, ``strips``
    per plane, ``chunk`` items per block)."""
    return numpy.array((spec.n, spec.c, spec.h, spec.w, spec.k, spec.p, spec.q, spec.k // spec.c, spec.stride[0],
                        spec.stride[1], spec.pad[0], spec.pad[2], spec.dilation[0], spec.dilation[1], total, rows,
                        strips, chunk, 0), dtype=DW_GEOMETRY_DTYPE)[()]


# DwWork in depthwise/depthwise.cuh: what the 64-bit-indexed kernels take besides the cuconv::ConvGeometry.
DW_WORK_DTYPE = numpy.dtype([(f, numpy.int64) for f in (
    "mult", "total", "tiles_q", "rows", "strips", "items", "slots", "segs", "seg_lanes", "lead", "pitch", "stages",
    "chunk", "flip")])


def _geometry(spec: ConvSpec, **work) -> tuple:
    """The (ConvGeometry, DwWork) arguments of a 64-bit-indexed kernel: ``mult`` and the DwWork fields ``work``
    names, the others zero."""
    values = numpy.zeros((), dtype=DW_WORK_DTYPE)
    values["mult"] = spec.k // spec.c
    for name, value in work.items():
        values[name] = value
    return _loader.conv_geometry(spec), values[()]


def _fits_int(spec: ConvSpec) -> bool:
    """The gather kernels decode and index in 32 bits: every tensor below 2^30 elements (an index plus a grid
    stride, below 2^28, stays below 2^31)."""
    return max(spec.n * spec.c * spec.h * spec.w, spec.n * spec.k * spec.p * spec.q) < 2**30


def _is_depthwise(spec: ConvSpec) -> bool:
    return spec.groups == spec.c and spec.c_per_group == 1


def _acc_size(dtype) -> int:
    return 8 if numpy.dtype(dtype) == numpy.float64 else 4


def _index_type(total: int) -> str:
    """C++ index type for an element count: 32-bit decodes when they cannot overflow."""
    return "int" if total < 2**30 else "long long"  # idx plus a grid stride (< 2^28) stays below 2^31


def _wgrad_threads(spec: ConvSpec, acc_size: int) -> int:
    """Largest power-of-two block whose per-thread tap accumulators fit in 48 KB (0: none fits)."""
    for threads in (256, 128, 64, 32):
        if spec.r * spec.s * threads * acc_size <= _SMEM_LIMIT:
            return threads
    return 0
