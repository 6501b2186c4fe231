"""implicit_gemm_wgmma_nchw (kernels_cu/implicit_gemm/wgmma_nchw.cu) on the GPU: the NCHW tiles read unaligned
weights."""

from __future__ import annotations

import numpy
import pytest

import cuconv
from cuconv import _dtypes
from cases import EXACT_DTYPES

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype_name", [d for d in EXACT_DTYPES if d != "float64"])
@pytest.mark.parametrize("tile", ["nchw64", "nchw128"])
@pytest.mark.parametrize("shape", [((3, 8, 9, 37), (72, 8, 3, 3)), ((2, 24, 17, 19), (40, 24, 1, 1))],
                         ids=["3x3", "1x1"])
def test_implicit_gemm_nchw_tiles_read_an_unaligned_weight(shape, tile, dtype_name):
    """An NchwTile reads the weight as it is: in 16-byte vectors where C·R·S and the pointer allow, element by
    element otherwise; a weight one element into its allocation (C·R·S a whole number of vectors) takes the
    second way, and rows past the last pixel and filter (M and K tails) stay out of the output."""
    import cupy

    from cuconv.algos import implicit_gemm

    if not implicit_gemm.wgmma_available():
        pytest.skip("the NchwTiles run wgmma, which needs compute capability 9.0")
    dtype = _dtypes.by_name(dtype_name)
    (xs, ws), rng = shape, numpy.random.default_rng(7)
    x = rng.integers(-4, 5, xs).astype(dtype)
    w = rng.integers(-4, 5, ws).astype(dtype)
    b = rng.integers(-4, 5, ws[0]).astype(dtype)
    spec = cuconv.ConvSpec.from_args(xs, ws, padding=ws[2] // 2)
    want = cuconv.conv2d(x, w, b, padding=ws[2] // 2)
    wg = cupy.empty(w.size + 1, dtype=dtype)[1:].reshape(ws)
    wg[...] = cupy.asarray(w)
    assert wg.flags.c_contiguous and wg.data.ptr % 16 != 0
    out = cupy.full(spec.output_shape, numpy.nan, dtype=dtype)
    implicit_gemm.forward_gpu(cupy.asarray(x), wg, cupy.asarray(b), spec, out, "tf32", tile=implicit_gemm.TILES[tile])
    numpy.testing.assert_array_equal(cupy.asnumpy(out).astype(numpy.float64), want.astype(numpy.float64))
