"""A convolution's epilogue (``blocks.epilogue``): every activation with the residual before, after or absent,
against torch's formulas in float64, on the CPU path (``conv2d(..., activation=, residual=)`` on NumPy arrays) and on
the GPU (the kernel past one grid of blocks, NCHW and channels-last results, ``out``, NaN-poisoned outputs, NaN
inputs kept); the door's checks in torch's wording, before anything runs."""

from __future__ import annotations

import numpy
import pytest

import cuconv
from cases import TOLERANCE, rel_err
from cuconv import _dtypes
from cuconv.blocks import epilogue
from cuconv.problem import ACTIVATIONS

torch = pytest.importorskip("torch")
_F = torch.nn.functional
_SLOPE = 0.2
_TORCH = {
    "relu": torch.relu, "relu6": _F.relu6, "leaky_relu": lambda t: _F.leaky_relu(t, _SLOPE), "silu": _F.silu,
    "gelu": _F.gelu, "gelu_tanh": lambda t: _F.gelu(t, approximate="tanh"), "hardswish": _F.hardswish,
    "hardsigmoid": _F.hardsigmoid, "sigmoid": torch.sigmoid, None: lambda t: t,
}
_DTYPES = ["float64", "float32", "float16"] + (["bfloat16"] if _dtypes.bfloat16 is not None else [])


def _want(y, r, activation, position):
    y, r = torch.from_numpy(numpy.asarray(y, numpy.float64)), None if r is None else torch.from_numpy(
        numpy.asarray(r, numpy.float64))
    f = _TORCH[activation]
    if position == "before":
        return f(y + r).numpy()
    return (f(y) + r).numpy() if position == "after" else f(y).numpy()


def _problem(seed=0, shape=(2, 4, 9, 7), k=6):
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal(shape)
    w = rng.standard_normal((k, shape[1], 3, 3))
    b = rng.standard_normal(k)
    y = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), padding=1).numpy()
    r = rng.standard_normal(y.shape) * 3
    return x, w, b, y, r


def test_every_activation_has_a_code_and_every_type_an_instance():
    assert set(epilogue.ACT_CODES) == {None, *ACTIVATIONS} and epilogue.ACT_CODES[None] == 0
    assert sorted(epilogue.ACT_CODES.values()) == list(range(len(ACTIVATIONS) + 1))
    assert set(epilogue.NAME_EXPRESSIONS) == {f"epilogue<{t}>" for t in _dtypes.ALL_CTYPE_NAMES}


@pytest.mark.parametrize("position", [None, "before", "after"])
@pytest.mark.parametrize("activation", [*ACTIVATIONS, None])
def test_cpu_epilogue_matches_torch(activation, position):
    if activation is None and position is None:
        pytest.skip("no epilogue")
    x, w, b, y, r = _problem()
    got = cuconv.conv2d(x, w, b, padding=1, activation=activation, negative_slope=_SLOPE,
                        residual=None if position is None else r, residual_position=position or "before")
    assert rel_err(got, _want(y, None if position is None else r, activation, position)) <= TOLERANCE["float64"]


@pytest.mark.parametrize("dtype_name", ["float32", "float16"])
def test_cpu_epilogue_rounds_once_in_the_storage_type(dtype_name):
    x, w, b, y, r = _problem(1)
    dtype = _dtypes.by_name(dtype_name)
    out = numpy.full(y.shape, numpy.nan, dtype=dtype)
    got = cuconv.conv2d(x.astype(dtype), w.astype(dtype), b.astype(dtype), padding=1, activation="silu",
                        residual=r.astype(dtype), out=out)
    assert got is out and got.dtype == dtype
    want = _want(cuconv.conv2d(x.astype(dtype), w.astype(dtype), b.astype(dtype), padding=1).astype(numpy.float64),
                 r.astype(dtype), "silu", "before")
    assert rel_err(got.astype(numpy.float64), want) <= TOLERANCE[dtype_name]


def test_nan_stays_nan_through_every_activation():
    v = numpy.array([numpy.nan, -1.0, 0.5], dtype=numpy.float32)
    for activation in ACTIVATIONS:
        out = numpy.empty_like(v)
        epilogue.apply_numpy(v, None, activation, None, 0.1, out)
        assert numpy.isnan(out[0]), activation


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(activation="tanh"), ValueError, "argument 'activation' must be None or one of"),
    (dict(activation="relu", negative_slope="0.1"), TypeError, "argument 'negative_slope' must be a number"),
    (dict(residual=numpy.zeros((2, 6, 9, 7)), residual_position="middle"), ValueError,
     "argument 'residual_position' must be one of"),
    (dict(residual=numpy.zeros((2, 6, 9, 6))), ValueError, r"expected residual of size \[2, 6, 9, 7\]"),
    (dict(residual=numpy.zeros((2, 6, 9, 7), dtype=numpy.float32)), TypeError,
     "expected residual to have dtype float64"),
    (dict(residual=[[0.0]]), TypeError, "expected residual to be an array of the input's library"),
    (dict(activation="relu", out=numpy.zeros((2, 6, 9, 6))), ValueError, "expected out of size"),
])
def test_epilogue_arguments_are_checked(kwargs, error, match):
    x, w, b, _, _ = _problem()
    with pytest.raises(error, match=match):
        cuconv.conv2d(x, w, b, padding=1, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", _DTYPES)
@pytest.mark.parametrize("position", [None, "before", "after"])
@pytest.mark.parametrize("activation", [*ACTIVATIONS, None])
def test_gpu_epilogue_matches_torch(activation, position, dtype_name):
    import cupy

    if activation is None and position is None:
        pytest.skip("no epilogue")
    x, w, b, _, r = _problem(2)
    dtype = _dtypes.by_name(dtype_name)
    g = [cupy.asarray(a.astype(dtype)) for a in (x, w, b, r)]
    y = cuconv.conv2d(*g[:3], padding=1)  # the convolution alone, rounded as the epilogue's input is
    out = cupy.full(y.shape, numpy.nan, dtype=dtype)
    got = cuconv.conv2d(*g[:3], padding=1, activation=activation, negative_slope=_SLOPE,
                        residual=None if position is None else g[3], residual_position=position or "before", out=out)
    assert got is out
    want = _want(cupy.asnumpy(y).astype(numpy.float64), cupy.asnumpy(g[3]).astype(numpy.float64), activation,
                 position)
    assert rel_err(cupy.asnumpy(got).astype(numpy.float64), want) <= TOLERANCE[dtype_name]


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 1000, (1 << 16) * 256 + 77])  # past 65536 blocks: the grid-stride loop
def test_gpu_epilogue_kernel_covers_every_element_and_keeps_nan(n):
    import cupy

    rng = numpy.random.default_rng(3)
    y = cupy.asarray(rng.standard_normal(n).astype(numpy.float32))
    y[0] = numpy.nan
    r = cupy.asarray(rng.standard_normal(n).astype(numpy.float32))
    out = cupy.full(n + 1, numpy.nan, dtype=numpy.float32)
    epilogue.launch(numpy.float32, n, "relu", "before")(cupy.cuda.get_current_stream().ptr, y.data.ptr, r.data.ptr,
                                                          out.data.ptr)
    host = cupy.asnumpy(out)
    want = numpy.maximum(cupy.asnumpy(y) + cupy.asnumpy(r), 0)
    assert numpy.isnan(host[0]) and numpy.array_equal(host[1:n], want[1:]) and numpy.isnan(host[n])


@pytest.mark.gpu
def test_gpu_epilogue_on_channels_last_results_and_residuals_of_another_layout():
    import cupy

    x, w, b, _, r = _problem(4, shape=(2, 8, 10, 6), k=16)
    xg = cupy.asarray(x.astype(numpy.float16)).transpose(0, 2, 3, 1).copy().transpose(0, 3, 1, 2)  # channels-last
    wg, bg = cupy.asarray(w.astype(numpy.float16)), cupy.asarray(b.astype(numpy.float16))
    rg = cupy.asarray(r.astype(numpy.float16))  # NCHW: copied into the result's layout
    y = cuconv.conv2d(xg, wg, bg, padding=1)
    got = cuconv.conv2d(xg, wg, bg, padding=1, activation="hardswish", residual=rg, residual_position="after")
    assert got.strides == y.strides
    want = _want(cupy.asnumpy(y).astype(numpy.float64), cupy.asnumpy(rg).astype(numpy.float64), "hardswish", "after")
    assert rel_err(cupy.asnumpy(got).astype(numpy.float64), want) <= TOLERANCE["float16"]
    unbatched = cuconv.conv2d(cupy.asarray(x[0]), cupy.asarray(w), cupy.asarray(b), padding=1, activation="relu",
                              residual=cupy.asarray(r[0]))
    assert rel_err(cupy.asnumpy(unbatched), _want(cupy.asnumpy(cuconv.conv2d(
        cupy.asarray(x[0]), cupy.asarray(w), cupy.asarray(b), padding=1)), r[0], "relu", "before")) <= 1e-12
