"""im2col_cpu is an exact gather: compared with atol=0 to a nested-loop reference on ``arange`` input.

(The GPU gather, im2col_gpu, is tested against the same reference in the GPU test file.)
"""

import numpy
import pytest

from cases import noncontiguous
from cuconv.im2col import im2col_cpu
from cuconv.spec import ConvSpec


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


def _geometry(id_, n, c, h, w, r, s, stride=(1, 1), pad=(0, 0, 0, 0), dilation=(1, 1)):
    # K and groups do not enter the gather.
    return pytest.param(ConvSpec(n, c, h, w, 2, r, s, stride, pad, dilation), id=id_)


GEOMETRIES = [
    _geometry("k3x3", 1, 2, 6, 7, 3, 3),
    _geometry("k3x3_pad1_batch3", 3, 2, 5, 6, 3, 3, pad=(1, 1, 1, 1)),
    _geometry("k5x2_rect", 2, 1, 9, 5, 5, 2),
    _geometry("k3x4_s2x3_d2x1_asym_pad", 2, 3, 11, 13, 3, 4, stride=(2, 3), pad=(2, 0, 1, 3), dilation=(2, 1)),
    _geometry("k2x3_d3x2_same_even", 2, 2, 8, 7, 2, 3, pad=(1, 2, 2, 2), dilation=(3, 2)),
    _geometry("k3x3_s2_d2_pad3", 2, 2, 9, 8, 3, 3, stride=(2, 2), pad=(3, 3, 3, 3), dilation=(2, 2)),
    _geometry("k1x1", 2, 3, 4, 5, 1, 1),
    _geometry("k1x1_s2_pad1", 2, 3, 5, 5, 1, 1, stride=(2, 2), pad=(1, 1, 1, 1)),
    _geometry("kernel_equals_input", 2, 2, 4, 3, 4, 3),
    _geometry("pad_only_bottom_right", 1, 2, 5, 5, 3, 3, pad=(0, 2, 0, 2)),
]


def _row_ranges(p):
    """(p0, rows): the whole output, the first row, the last row, a tail, and a band touching neither end."""
    ranges = {(0, p), (p - 1, 1)}
    if p > 1:
        ranges |= {(0, 1), (1, p - 1)}
    if p > 2:
        ranges.add((1, p - 2))
    return sorted(ranges)


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32, numpy.float16], ids=lambda d: numpy.dtype(d).name)
@pytest.mark.parametrize("spec", GEOMETRIES)
def test_im2col_cpu_exact(spec, dtype):
    # arange + 1: every gathered value is distinct and non-zero, so a tap taken from the padding
    # (zero) or from the wrong place cannot go unnoticed. float16 holds these integers exactly (< 2048).
    x = (numpy.arange(numpy.prod(spec.input_shape)) + 1).reshape(spec.input_shape).astype(dtype)
    for p0, rows in _row_ranges(spec.p):
        col = im2col_cpu(x, spec, p0, rows)
        assert col.shape == (spec.n, spec.crs, rows * spec.q)
        assert col.dtype == dtype
        numpy.testing.assert_array_equal(col, im2col_loops(x, spec, p0, rows), err_msg=f"p0={p0} rows={rows}")


@pytest.mark.parametrize("spec", [p for p in GEOMETRIES if p.id in ("k3x3_pad1_batch3", "k3x4_s2x3_d2x1_asym_pad")])
def test_im2col_cpu_sample_slice_and_noncontiguous(spec):
    # The chunked forward passes x[n0:n0 + nb]; a non-contiguous input must gather the same values.
    x = (numpy.arange(numpy.prod(spec.input_shape)) + 1.0).reshape(spec.input_shape)
    expected = im2col_loops(x, spec, 0, spec.p)
    numpy.testing.assert_array_equal(im2col_cpu(noncontiguous(x), spec, 0, spec.p), expected)
    numpy.testing.assert_array_equal(im2col_cpu(x[1:2], spec, 1, spec.p - 1),
                                     expected[1:2].reshape(1, spec.crs, spec.p, spec.q)[..., 1:, :]
                                     .reshape(1, spec.crs, (spec.p - 1) * spec.q))
