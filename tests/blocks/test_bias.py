"""The bias launches (``bias``): the broadcast that GEMM algorithms accumulate onto, and the bias gradient
(Σ of grad_output over N, P, Q, in fp32 for the half types, a fixed order), against NumPy on integers (exact)."""

import numpy
import pytest

import cuconv
from cases import EXACT_DTYPES
from cuconv import _dtypes
from cuconv.blocks import bias

pytestmark = pytest.mark.gpu


def _stream():
    import cupy

    return cupy.cuda.get_current_stream().ptr


def _fill_kernel(itemsize: int, pq: int, aligned: bool) -> str:
    """The fill kernel expected: the widest vector (16, 8, 4 bytes) a plane is whole vectors of, on an aligned
    output; else a block per plane, or a thread per element on planes of fewer than 256 pixels."""
    for width in (16, 8, 4):
        if aligned and width >= itemsize and pq * itemsize % width == 0:
            return f"bias_fill_vec<{width}>"
    return "bias_fill_flat" if pq < 256 else "bias_fill"


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("dtype_name", EXACT_DTYPES)
@pytest.mark.parametrize("n,k,pq", [(1, 1, 1), (3, 5, 70000), (2, 7, 13), (32, 1153, 1), (2, 3, 255), (2, 3, 256),
                                    (3, 5, 3136), (2, 7, 196), (2, 5, 98), (4, 3, 49), (2, 3, 2)])
def test_bias_fill_broadcasts_over_samples_and_pixels(n, k, pq, dtype_name, aligned):
    """Every fill kernel and vector width: out[n, k, :] = bias[k], nothing outside out written."""
    import cupy

    dtype = _dtypes.by_name(dtype_name)
    b = numpy.arange(1, k + 1).astype(dtype)
    total = n * k * pq
    poisoned = cupy.full(total + 64, numpy.nan, dtype=dtype)  # 64 elements past out stay NaN
    out = poisoned[:total].reshape(n, k, pq)
    b_d = cupy.asarray(b)  # referenced until the launch has run
    launch = bias.fill_launch(dtype, n, k, pq, aligned=aligned)
    expected = _fill_kernel(dtype.itemsize, pq, aligned)
    name = launch.name.replace(f"<{_dtypes.ctype_of(dtype)}, ", "<").replace(f"<{_dtypes.ctype_of(dtype)}>", "")
    assert name == expected
    launch(_stream(), out.data.ptr, b_d.data.ptr)
    numpy.testing.assert_array_equal(cupy.asnumpy(out), numpy.broadcast_to(b[None, :, None], (n, k, pq)))
    assert bool(cupy.isnan(poisoned[total:]).all())


@pytest.mark.parametrize("dtype_name", EXACT_DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (4, 6, 15, 17), (2, 3, 100, 100), (32, 1153, 1, 1), (3, 9, 16, 16)])
def test_bias_grad_sums_over_samples_and_pixels(shape, dtype_name):
    """A block per channel, or a warp per channel (eight per block, the last block part empty) on planes of
    fewer than 256 pixels."""
    import cupy

    dtype = _dtypes.by_name(dtype_name)
    n, k, p, q = shape
    dy = numpy.random.default_rng(9).integers(-3, 4, size=shape).astype(dtype)
    db = cupy.full(k, numpy.nan, dtype=dtype)
    spec = cuconv.ConvSpec(n, 0, p, q, k, 1, 1)
    dy_d = cupy.asarray(dy)  # referenced until the launch has run
    launch = bias.grad_launch(spec, dtype)
    assert ("bias_grad_warps<" in launch.name) == (p * q < 256)
    launch(_stream(), dy_d.data.ptr, db.data.ptr)
    # the integer sums are exact in fp32 (and in float64): rounded once to the dtype, as the kernel rounds
    numpy.testing.assert_array_equal(cupy.asnumpy(db), dy.astype(numpy.float64).sum(axis=(0, 2, 3)).astype(dtype))


@pytest.mark.parametrize("dtype_name", EXACT_DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (4, 6, 15, 17), (2, 40, 100, 100), (32, 1153, 1, 1), (3, 33, 7, 9),
                                   (32, 96, 56, 56)])
def test_bias_grad_sums_channels_last_grad_output(shape, dtype_name):
    """grad_output (N, K, P, Q) channels-last in memory: slices of pixels into partial sums, then their ordered
    sum (``NhwcGrad``), channel tails past a warp's 32 and slices past the last pixel included."""
    import cupy

    dtype = _dtypes.by_name(dtype_name)
    n, k, p, q = shape
    dy = numpy.random.default_rng(10).integers(-3, 4, size=shape).astype(dtype)
    db = cupy.full(k, numpy.nan, dtype=dtype)
    dy_d = cupy.asarray(numpy.ascontiguousarray(dy.transpose(0, 2, 3, 1)))
    launch = bias.grad_launch_nhwc(cuconv.ConvSpec(n, 0, p, q, k, 1, 1), dtype)
    partials = cupy.full(launch.partial_bytes, 255, dtype=numpy.uint8)
    launch(_stream(), dy_d.data.ptr, db.data.ptr, partials.data.ptr)
    numpy.testing.assert_array_equal(cupy.asnumpy(db), dy.astype(numpy.float64).sum(axis=(0, 2, 3)).astype(dtype))
