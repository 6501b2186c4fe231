"""Python twin of ``kernels_cu/gemm_ptrs.cu``: device-side pointer arrays for a (sample, group) batched GEMM."""

from __future__ import annotations

import numpy

from . import _loader

__all__ = ["batched_pointers", "NAME_EXPRESSIONS", "STEM"]

STEM = "gemm_ptrs"
NAME_EXPRESSIONS = ("batched_pointers",)
_THREADS = 256


def batched_pointers(samples: int, groups: int, a0: int, a_sample: int, a_group: int, b0: int, b_group: int,
                     c0: int, c_sample: int, c_group: int):
    """(A, B, C) uint64 device arrays; entry ``n·groups + g`` = base + n·sample stride + g·group stride."""
    import cupy

    count = samples * groups
    ptrs = cupy.empty((3, count), dtype=numpy.uint64)
    fn = _loader.get_function(STEM, NAME_EXPRESSIONS, "batched_pointers")
    grid = (max(1, min(1024, -(-count // _THREADS))), 1, 1)
    block = (_THREADS, 1, 1)
    u64, i64 = numpy.uint64, numpy.int64
    _loader.launch(fn, "batched_pointers", grid, block,
                   (ptrs[0], ptrs[1], ptrs[2], i64(count), i64(groups), u64(a0), i64(a_sample), i64(a_group),
                    u64(b0), i64(b_group), u64(c0), i64(c_sample), i64(c_group)))
    return ptrs
