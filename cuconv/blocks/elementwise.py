"""Python twin of ``kernels_cu/elementwise.cu``: prepared fills, casts and sums of partial results for the plans
(``_plan``)."""

from __future__ import annotations

import numpy

from .. import _dtypes, _loader

__all__ = ["fill", "cast", "sum_partials", "swap_planes", "NAME_EXPRESSIONS", "STEM"]

STEM = "blocks/elementwise"
_MAX_BLOCKS = 1 << 16  # the grid-stride loop covers the rest

# Casts from the sums kept in float (or double) to the storage types that round them.
_CASTS = (("float", "__half"), ("float", "__nv_bfloat16"))
# Sums of partial results: kept in float (double for double), written as the sum or as the storage type.
_SUMS = (("float", "float"), ("float", "__half"), ("float", "__nv_bfloat16"), ("double", "double"))
NAME_EXPRESSIONS = tuple([f"fill<{t}>" for t in _dtypes.ALL_CTYPE_NAMES] + [f"cast<{s},{d}>" for s, d in _CASTS]
                         + [f"sum_partials<{a},{t}>" for a, t in _SUMS]
                         + [f"swap_planes<{t}>" for t in _dtypes.ALL_CTYPE_NAMES])


def _grid(n: int) -> tuple:
    return (_loader.blocks(n, _MAX_BLOCKS), 1, 1)


def fill(dtype, n: int, value: float = 0.0) -> "_loader.PreparedLaunch":
    """A launch writing ``value`` to ``n`` elements of ``dtype``; pointer: the destination."""
    name = f"fill<{_dtypes.ctype_of(dtype)}>"
    # a thread a 16-byte vector (the kernel stores vectors where dst is aligned; elsewhere its grid-stride loop
    # walks the elements): a grid of a thread an element idled most of its blocks, at a third of the bandwidth
    vectors = -(-n * numpy.dtype(dtype).itemsize // 16)
    return _loader.prepare(STEM, NAME_EXPRESSIONS, name, _grid(vectors), (_loader.THREADS, 1, 1), 1,
                           (numpy.int64(n), numpy.float64(value)))


def cast(src_dtype, dst_dtype, n: int) -> "_loader.PreparedLaunch":
    """A launch converting ``n`` elements of ``src_dtype`` to ``dst_dtype``; pointers: source, destination."""
    name = f"cast<{_dtypes.ctype_of(src_dtype)},{_dtypes.ctype_of(dst_dtype)}>"
    return _loader.prepare(STEM, NAME_EXPRESSIONS, name, _grid(n), (_loader.THREADS, 1, 1), 2, (numpy.int64(n),))


def sum_partials(acc_dtype, dst_dtype, n: int, parts: int) -> "_loader.PreparedLaunch":
    """A launch writing ``dst[i] = acc[i] + Σ_j partials[j·n + i]`` (acc may be 0: none; or dst itself), summed in
    ``acc_dtype`` in a fixed order and rounded to ``dst_dtype`` once; pointers: partials, acc, dst."""
    name = f"sum_partials<{_dtypes.ctype_of(acc_dtype)},{_dtypes.ctype_of(dst_dtype)}>"
    return _loader.prepare(STEM, NAME_EXPRESSIONS, name, _grid(n), (_loader.THREADS, 1, 1), 3,
                           (numpy.int64(n), numpy.int64(parts)))


def swap_planes(dtype, a: int, b: int, length: int) -> "_loader.PreparedLaunch":
    """A launch writing dst (b, a, length) = src (a, b, length) with the first two axes swapped (rows of
    ``length`` elements moved whole); pointers: source, destination. Needs a·b·length < 2^30 (32-bit indices
    plus the grid stride)."""
    name = f"swap_planes<{_dtypes.ctype_of(dtype)}>"
    return _loader.prepare(STEM, NAME_EXPRESSIONS, name, _grid(a * b * length), (_loader.THREADS, 1, 1), 2,
                           (numpy.int64(a), numpy.int64(b), numpy.int64(length)))
