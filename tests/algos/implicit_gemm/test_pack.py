"""The packs of kernels_cu/implicit_gemm/pack.cu on the GPU: the NHWC pack with its zero channels."""

from __future__ import annotations

import numpy
import pytest

import cuconv
from cuconv import _dtypes
from cases import to_gpu
from cuconv.select import implicit_gemm as choice

pytestmark = pytest.mark.gpu



@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("c", [1, 3, 8, 16, 20, 33, 64, 72, 136])
@pytest.mark.parametrize("image", [(3, 13, 11), (1, 190, 180)], ids=["odd", "more-tiles-than-the-grid"])
def test_implicit_gemm_pack_is_nhwc_with_zero_channels(image, c, dtype_name):
    """Both pack kernels (pixels up to 256 bytes one thread per vector, 32 x 64 transposes above): NHWC with
    the channels padded to cp with zeros, TF32-rounded for float32, over several samples and an odd image
    size (and one of more than 512 tiles, which the grid walks); and the weight, packed by the same launch,
    (kp, w_row) with k index (r·S + s)·cp + c and zeros elsewhere."""
    import cupy

    from cuconv.algos import implicit_gemm

    dtype = _dtypes.by_name(dtype_name)
    n, h, w_ = image
    spec = cuconv.ConvSpec.from_args((n, c, h, w_), (5, c, 3, 2))
    pl = implicit_gemm.plan(spec, dtype, choice.choose_tile(spec, dtype, nchw=False),  # a packing tile
                            cuconv.config.workspace_limit)
    rng = numpy.random.default_rng(c)
    x = rng.integers(-8, 9, (n, c, h, w_)).astype(dtype)
    w = rng.integers(-8, 9, (5, c, 3, 2)).astype(dtype)
    packed_x = cupy.full(n * h * w_ * pl.cp, numpy.nan, dtype=dtype)
    packed_w = cupy.full(pl.kp * pl.w_row, numpy.nan, dtype=dtype)
    implicit_gemm.pack_operands(to_gpu(x, dtype), to_gpu(w, dtype), spec, pl, packed_x, packed_w)
    want_x = numpy.zeros((n, h, w_, pl.cp), dtype)
    want_x[..., :c] = x.transpose(0, 2, 3, 1)
    want_w = numpy.zeros((pl.kp, pl.w_row), dtype)
    for tap in range(3 * 2):
        want_w[:5, tap * pl.cp:tap * pl.cp + c] = w[:, :, tap // 2, tap % 2]
    for got, want in ((packed_x, want_x), (packed_w, want_w)):
        numpy.testing.assert_array_equal(cupy.asnumpy(got).reshape(want.shape).astype(numpy.float64),
                                         want.astype(numpy.float64))
    packed_x.fill(numpy.nan)  # without a weight: the input alone
    implicit_gemm.pack_operands(to_gpu(x, dtype), None, spec, pl, packed_x)
    numpy.testing.assert_array_equal(cupy.asnumpy(packed_x).reshape(want_x.shape).astype(numpy.float64),
                                     want_x.astype(numpy.float64))
