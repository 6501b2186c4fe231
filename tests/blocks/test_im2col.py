"""im2col is an exact gather: im2col_cpu compared with atol=0 to a nested-loop reference on ``arange`` input;
on the GPU, im2col_gpu equals im2col_cpu in both of its layouts, zeros past each row.
"""

import numpy
import pytest

import cuconv
from cases import GATHER_GEOMETRIES, noncontiguous, row_ranges
from cuconv.blocks.im2col import im2col_cpu


def im2col_loops(x_nchw, spec, p0, rows):
    """col[n, (c, r, s), (p, q)] = x[n, c, (p0+p)*sh - pt + r*dh, q*sw - pl + s*dw], zero in the padding."""
    nb, c, h, w = x_nchw.shape
    (sh, sw), (dh, dw), (pt, _, pl, _) = spec.stride, spec.dilation, spec.pad
    col_crs_pq = numpy.zeros((nb, c * spec.r * spec.s, rows * spec.q), dtype=x_nchw.dtype)
    for n in range(nb):
        for ci in range(c):
            for r in range(spec.r):
                for s in range(spec.s):
                    for p in range(rows):
                        for q in range(spec.q):
                            hi = (p0 + p) * sh - pt + r * dh
                            wi = q * sw - pl + s * dw
                            if 0 <= hi < h and 0 <= wi < w:
                                col_crs_pq[n, (ci * spec.r + r) * spec.s + s, p * spec.q + q] = x_nchw[n, ci, hi, wi]
    return col_crs_pq


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32, numpy.float16], ids=lambda d: numpy.dtype(d).name)
@pytest.mark.parametrize("spec", GATHER_GEOMETRIES)
def test_im2col_cpu_exact(spec, dtype):
    # arange + 1: every gathered value is distinct and non-zero, so a tap taken from the padding
    # (zero) or from the wrong place cannot go unnoticed. float16 holds these integers exactly (< 2048).
    x = (numpy.arange(numpy.prod(spec.input_shape)) + 1).reshape(spec.input_shape).astype(dtype)
    for p0, rows in row_ranges(spec.p):
        col = im2col_cpu(x, spec, p0, rows)
        assert col.shape == (spec.n, spec.crs, rows * spec.q)
        assert col.dtype == dtype
        numpy.testing.assert_array_equal(col, im2col_loops(x, spec, p0, rows), err_msg=f"p0={p0} rows={rows}")


@pytest.mark.parametrize("spec", [p for p in GATHER_GEOMETRIES if p.id in ("k3x3_pad1_batch3", "k3x4_s2x3_d2x1_asym_pad")])
def test_im2col_cpu_sample_slice_and_noncontiguous(spec):
    # The chunked forward passes x[n0:n0 + nb]; a non-contiguous input must gather the same values.
    x = (numpy.arange(numpy.prod(spec.input_shape)) + 1.0).reshape(spec.input_shape)
    expected = im2col_loops(x, spec, 0, spec.p)
    numpy.testing.assert_array_equal(im2col_cpu(noncontiguous(x), spec, 0, spec.p), expected)
    numpy.testing.assert_array_equal(im2col_cpu(x[1:2], spec, 1, spec.p - 1),
                                     expected[1:2].reshape(1, spec.crs, spec.p, spec.q)[..., 1:, :]
                                     .reshape(1, spec.crs, (spec.p - 1) * spec.q))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float16", "float32", "float64"])
@pytest.mark.parametrize("kwargs", [{}, dict(stride=(2, 3), padding=(1, 2), dilation=(2, 1)),
                                    dict(padding=(2, 4), dilation=(2, 3)), dict(padding=(0, 3))],
                         ids=["plain", "stride_pad_dil", "pad_dil", "pad_w_only"])
def test_im2col_kernel_is_an_exact_gather(dtype_name, kwargs):
    import cupy

    from cuconv.blocks.im2col import im2col_cpu, im2col_gpu, row_pitch

    dtype = numpy.dtype(dtype_name)
    # arange values are exact in every dtype below 2048; widths give aligned and unaligned row lengths
    for w_in in (13, 16, 19):
        x = (numpy.arange(2 * 3 * 11 * w_in) % 2039).astype(dtype).reshape(2, 3, 11, w_in)
        spec = cuconv.ConvSpec.from_args(x.shape, (4, 3, 3, 4), **kwargs)
        for p0, rows in ((0, spec.p), (1, max(1, spec.p - 2))):
            length = rows * spec.q
            pitch = row_pitch(length, dtype.itemsize)
            expected = numpy.zeros((2, spec.crs, pitch), dtype)  # (zeros past the row's length)
            expected[..., :length] = im2col_cpu(x, spec, p0, rows)
            col = cupy.full((2, spec.crs, pitch), numpy.nan, dtype=dtype)
            im2col_gpu(cupy.asarray(x), spec, p0, rows, col)
            numpy.testing.assert_array_equal(cupy.asnumpy(col), expected)
            col = cupy.full((spec.crs, 2, pitch), numpy.nan, dtype=dtype)  # samples interleaved row by row
            im2col_gpu(cupy.asarray(x), spec, p0, rows, col, interleaved=True)
            numpy.testing.assert_array_equal(cupy.asnumpy(col), expected.transpose(1, 0, 2))

