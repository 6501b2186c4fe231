"""Python twin of ``kernels_cu/gemm_ptrs.cu``: device-side pointer arrays for a (sample, group) batched GEMM."""

from __future__ import annotations

import numpy

from .. import _loader

__all__ = ["pointers_launch", "NAME_EXPRESSIONS", "STEM"]

STEM = "blocks/gemm_ptrs"
NAME_EXPRESSIONS = ("batched_pointers",)


def pointers_launch(samples: int, groups: int, a_sample: int, a_group: int, b_group: int, c_sample: int,
                    c_group: int) -> "_loader.PreparedLaunch":
    """A launch filling three uint64 arrays of ``samples · groups`` entries (A, B, C: the first three pointers)
    from three bases (the next three): entry ``n·groups + g`` = base + n·sample stride + g·group stride (bytes)."""
    count = samples * groups
    grid = (_loader.blocks(count, 1024), 1, 1)
    i64 = numpy.int64
    return _loader.prepare(STEM, NAME_EXPRESSIONS, "batched_pointers", grid, (_loader.THREADS, 1, 1), 6,
                           (i64(count), i64(groups), i64(a_sample), i64(a_group), i64(b_group), i64(c_sample),
                            i64(c_group)))
