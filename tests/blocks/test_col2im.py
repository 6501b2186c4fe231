"""col2im, the exact adjoint of im2col (dgrad's scatter of the column matrix): on the CPU against im2col on
integers, chunked by rows; on the GPU the kernel against im2col's, exactly, with a row sub-range and
accumulation."""

import numpy
import pytest

import cuconv
from cases import GATHER_GEOMETRIES, row_ranges
from cuconv.blocks.col2im import col2im_cpu
from cuconv.blocks.im2col import im2col_cpu


def _ints(rng, shape, dtype):
    return rng.integers(-4, 5, size=shape).astype(dtype)


def _col2im(col, spec, p0, rows, dx):
    col2im_cpu(col, spec, p0, rows, dx)
    return dx


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32], ids=lambda d: numpy.dtype(d).name)
@pytest.mark.parametrize("spec", GATHER_GEOMETRIES)
def test_col2im_is_adjoint_of_im2col(spec, dtype):
    # <im2col(x), y> == <x, col2im(y)> for every x and y; small integers make both sides exact.
    rng = numpy.random.default_rng(7)
    x_nchw = _ints(rng, spec.input_shape, dtype)
    for p0, rows in row_ranges(spec.p):
        col_crs_pq = _ints(rng, (spec.n, spec.crs, rows * spec.q), dtype)
        dx = _col2im(col_crs_pq, spec, p0, rows, numpy.zeros(spec.input_shape, dtype=dtype))
        lhs = numpy.sum(im2col_cpu(x_nchw, spec, p0, rows).astype(numpy.float64) * col_crs_pq)
        rhs = numpy.sum(x_nchw.astype(numpy.float64) * dx)
        assert lhs == rhs, f"p0={p0} rows={rows}"


@pytest.mark.parametrize("spec", GATHER_GEOMETRIES)
def test_col2im_adds_and_row_chunks_sum_to_whole(spec):
    # col2im adds into dx; the row chunks of one column matrix, added one after another, give the whole.
    rng = numpy.random.default_rng(8)
    col = _ints(rng, (spec.n, spec.crs, spec.p, spec.q), numpy.float64)
    whole = _col2im(col.reshape(spec.n, spec.crs, -1), spec, 0, spec.p, numpy.zeros(spec.input_shape))
    start = _ints(rng, spec.input_shape, numpy.float64)
    dx = start.copy()
    for p0 in range(0, spec.p, 2):
        rows = min(2, spec.p - p0)
        _col2im(numpy.ascontiguousarray(col[:, :, p0:p0 + rows]).reshape(spec.n, spec.crs, -1), spec, p0, rows, dx)
    numpy.testing.assert_array_equal(dx - start, whole)


@pytest.mark.gpu
def test_col2im_kernel_is_the_adjoint_of_im2col():
    """<im2col(x), c> == <x, col2im(c)> exactly on integers, with a row sub-range and accumulation."""
    import cupy

    from cuconv.blocks.col2im import col2im_gpu
    from cuconv.blocks.im2col import im2col_gpu, row_pitch

    rng = numpy.random.default_rng(15)
    x = rng.integers(-3, 4, size=(2, 3, 13, 11)).astype(numpy.float64)
    for kwargs in ({}, dict(stride=(2, 3), padding=(1, 2), dilation=(2, 1)), dict(padding=(2, 4), dilation=(2, 3))):
        spec = cuconv.ConvSpec.from_args(x.shape, (4, 3, 3, 4), **kwargs)
        for p0, rows in ((0, spec.p), (1, max(1, spec.p - 2))):
            pitch = row_pitch(rows * spec.q, 8)
            col = cupy.empty((2, spec.crs, pitch))
            im2col_gpu(cupy.asarray(x), spec, p0, rows, col)
            c = rng.integers(-3, 4, size=col.shape).astype(numpy.float64)
            c[..., rows * spec.q:] = 0
            dx = cupy.zeros(x.shape)
            col2im_gpu(cupy.asarray(c), spec, p0, rows, dx, accumulate=True)
            lhs = float((cupy.asnumpy(col)[..., :rows * spec.q] * c[..., :rows * spec.q]).sum())
            assert lhs == float((x * cupy.asnumpy(dx)).sum())
