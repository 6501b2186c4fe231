"""The LayerNorm rows kernel (``layer_norm``): rows of every width an instance serves (one lane's share up to 32
values, partial warps of a row), every input/output type pair, against float64 and the NumPy twin, into a
NaN-poisoned output; and what it refuses."""

import numpy
import pytest

from cuconv import _dtypes
from cuconv.blocks import layer_norm

_PAIRS = [("float32", "float16"), ("float32", "bfloat16"), ("float16", "float16"), ("bfloat16", "bfloat16")]


def _pairs():
    return [p for p in _PAIRS if _dtypes.by_name(p[1]) is not None]


def test_the_numpy_twin_normalizes_each_row():
    x = numpy.random.default_rng(0).standard_normal((7, 96)).astype(numpy.float32) * 3 + 5
    y = layer_norm.apply_numpy(x, 1e-6, numpy.float32).astype(numpy.float64)
    numpy.testing.assert_allclose(y.mean(axis=1), 0, atol=1e-5)
    numpy.testing.assert_allclose(y.var(axis=1), 1, rtol=1e-4)


def test_rows_too_wide_or_types_without_an_instance_are_refused():
    assert layer_norm.supports(numpy.float32, numpy.float16, layer_norm.MAX_CHANNELS)
    assert not layer_norm.supports(numpy.float32, numpy.float16, layer_norm.MAX_CHANNELS + 1)
    assert not layer_norm.supports(numpy.float64, numpy.float64, 96)
    assert not layer_norm.supports(numpy.float32, numpy.float32, 96)
    with pytest.raises(ValueError, match="no layer_norm_rows instance"):
        layer_norm.launch(numpy.float64, numpy.float64, 4, 96, 1e-5)  # (before any kernel lookup)


@pytest.mark.gpu
@pytest.mark.parametrize("c", [2, 31, 96, 100, 192, 384, 768, 1000, 1024])
@pytest.mark.parametrize("src_name,dst_name", _pairs())
def test_rows_match_float64_and_the_twin(src_name, dst_name, c):
    import cupy

    src, dst = _dtypes.by_name(src_name), _dtypes.by_name(dst_name)
    rows = 8 * 37 + 5  # (a partial block of rows)
    rng = numpy.random.default_rng(c)
    x = (rng.standard_normal((rows, c)) * rng.uniform(0.1, 10, (rows, 1)) + rng.uniform(-5, 5, (rows, 1)))
    x = x.astype(src)
    out = cupy.full((rows + 1, c), numpy.nan, dtype=dst)
    xd = cupy.asarray(x)
    layer_norm.launch(src, dst, rows, c, 1e-6)(cupy.cuda.get_current_stream().ptr, xd.data.ptr, out.data.ptr)
    got = cupy.asnumpy(out).astype(numpy.float64)
    assert numpy.isnan(got[rows]).all()  # (nothing past the last row written)
    v = x.astype(numpy.float64)
    exact = (v - v.mean(axis=1, keepdims=True)) / numpy.sqrt(v.var(axis=1, keepdims=True) + 1e-6)
    err = numpy.linalg.norm(got[:rows] - exact) / numpy.linalg.norm(exact)
    rounding = numpy.linalg.norm(exact.astype(dst).astype(numpy.float64) - exact) / numpy.linalg.norm(exact)
    assert err <= 1.5 * rounding + 1e-6
    twin = layer_norm.apply_numpy(x, 1e-6, dst).astype(numpy.float64)
    assert numpy.abs(got[:rows] - twin).max() <= 2 * numpy.abs(twin).max() * 2.0 ** -8
