"""The plans' elementwise launches (``elementwise``): fill, cast and the fixed-order sum of partial results,
against NumPy, past one grid of blocks (the grid-stride loop) and for every storage type they are built for."""

import numpy
import pytest

from cases import EXACT_DTYPES
from cuconv import _dtypes
from cuconv.blocks import elementwise

pytestmark = pytest.mark.gpu

_N = (1, 1000, (1 << 16) * 256 + 77)  # one element, a partial block, past 65536 blocks of 256


def _stream():
    import cupy

    return cupy.cuda.get_current_stream().ptr


@pytest.mark.parametrize("n", _N)
@pytest.mark.parametrize("dtype_name", EXACT_DTYPES)
def test_fill_writes_the_value_everywhere(dtype_name, n):
    import cupy

    dtype = _dtypes.by_name(dtype_name)
    out = cupy.full(n + 1, numpy.nan, dtype=dtype)
    elementwise.fill(dtype, n, -2.5)(_stream(), out.data.ptr)
    host = cupy.asnumpy(out).astype(numpy.float64)
    assert (host[:n] == -2.5).all() and numpy.isnan(host[n])


@pytest.mark.parametrize("dst_name", [d for d in EXACT_DTYPES if d in ("float16", "bfloat16")])
def test_cast_rounds_once_as_numpy(dst_name):
    import cupy

    dst = _dtypes.by_name(dst_name)
    src = numpy.random.default_rng(1).standard_normal(5000).astype(numpy.float32)
    out = cupy.empty(src.size, dtype=dst)
    src_d = cupy.asarray(src)  # referenced until the launch has run
    elementwise.cast(numpy.float32, dst, src.size)(_stream(), src_d.data.ptr, out.data.ptr)
    numpy.testing.assert_array_equal(cupy.asnumpy(out), src.astype(dst))


@pytest.mark.parametrize("acc_name,dst_name", [(a, d) for a, d in (("float32", "float32"), ("float32", "float16"),
                                                                    ("float32", "bfloat16"), ("float64", "float64"))
                                               if d in EXACT_DTYPES])
@pytest.mark.parametrize("with_acc", [False, True])
def test_sum_partials_in_a_fixed_order(acc_name, dst_name, with_acc):
    """dst = acc + Σ_j partials[j], summed in order j = 0, 1, ... in the accumulation type, rounded once."""
    import cupy

    acc_t, dst_t = _dtypes.by_name(acc_name), _dtypes.by_name(dst_name)
    rng = numpy.random.default_rng(2)
    n, parts = 3001, 5
    partials = rng.standard_normal((parts, n)).astype(acc_t)
    acc = rng.standard_normal(n).astype(acc_t) if with_acc else None
    want = numpy.zeros(n, dtype=acc_t) if acc is None else acc.copy()
    for j in range(parts):
        want = (want + partials[j]).astype(acc_t)
    out = cupy.full(n, numpy.nan, dtype=dst_t)
    # The device copies stay referenced until the launch has run: a freed one's memory goes back to the pool.
    partials_d = cupy.asarray(partials)
    acc_d = None if acc is None else cupy.asarray(acc)
    elementwise.sum_partials(acc_t, dst_t, n, parts)(_stream(), partials_d.data.ptr,
                                                      0 if acc_d is None else acc_d.data.ptr, out.data.ptr)
    numpy.testing.assert_array_equal(cupy.asnumpy(out), want.astype(dst_t))


@pytest.mark.parametrize("dtype_name", EXACT_DTYPES)
@pytest.mark.parametrize("a,b,length", [(1, 1, 1), (32, 784, 49), (3, 5, 7), (7, 2, 1)])
def test_swap_planes_moves_rows_whole(a, b, length, dtype_name):
    """dst (b, a, length) = src (a, b, length) with its first two axes swapped, into a NaN-poisoned buffer."""
    import cupy

    dtype = _dtypes.by_name(dtype_name)
    src = numpy.random.default_rng(3).integers(-50, 50, size=(a, b, length)).astype(dtype)
    src_d = cupy.asarray(src)  # referenced until the launch has run
    out = cupy.full((b, a, length), numpy.nan, dtype=dtype)
    elementwise.swap_planes(dtype, a, b, length)(_stream(), src_d.data.ptr, out.data.ptr)
    numpy.testing.assert_array_equal(cupy.asnumpy(out), src.transpose(1, 0, 2))
