"""``gemm_ptrs``: the device-side pointer arrays of a (sample, group) batched GEMM, entry n·groups + g = base +
n·(sample stride) + g·(group stride), for A, B and C, past one block of entries."""

import numpy
import pytest

from cuconv.blocks import gemm_ptrs

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("samples,groups", [(1, 1), (3, 4), (300, 3)])
def test_batched_pointers(samples, groups):
    import cupy

    strides = dict(a_sample=1 << 20, a_group=4096, b_group=512, c_sample=1 << 18, c_group=64)
    bases = (1 << 40, 2 << 40, 3 << 40)
    out = [cupy.zeros(samples * groups, dtype=numpy.uint64) for _ in range(3)]
    launch = gemm_ptrs.pointers_launch(samples, groups, **strides)
    launch(cupy.cuda.get_current_stream().ptr, *(o.data.ptr for o in out), *bases)
    n, g = numpy.divmod(numpy.arange(samples * groups), groups)
    want = (bases[0] + n * strides["a_sample"] + g * strides["a_group"], bases[1] + g * strides["b_group"],
            bases[2] + n * strides["c_sample"] + g * strides["c_group"])
    for got, expected in zip(out, want):
        numpy.testing.assert_array_equal(cupy.asnumpy(got), numpy.asarray(expected, dtype=numpy.uint64))
