"""The two doors, ``cuconv.conv2d`` on CuPy arrays and ``cuconv.nn.functional.conv2d`` on torch tensors, on the
same problem choose the same algorithm and prepare the same launches (one selector, one plan per problem), NCHW
and channels-last, in each dtype (GPU)."""

from __future__ import annotations

import numpy
import pytest

torch = pytest.importorskip("torch")

import cuconv  # noqa: E402

pytestmark = pytest.mark.gpu

# (input, weight, keywords): the classes of layers real networks run
_GEOMETRIES = [
    pytest.param((2, 64, 28, 28), (64, 64, 3, 3), dict(padding=1), id="3x3"),
    pytest.param((2, 128, 28, 28), (256, 128, 3, 3), dict(stride=2, padding=1), id="3x3_s2"),
    pytest.param((2, 256, 14, 14), (64, 256, 1, 1), {}, id="1x1_narrowing"),
    pytest.param((2, 64, 28, 28), (256, 64, 1, 1), {}, id="1x1_widening"),
    pytest.param((2, 128, 28, 28), (256, 128, 1, 1), dict(stride=2), id="1x1_s2"),
    pytest.param((2, 96, 28, 28), (96, 1, 3, 3), dict(padding=1, groups=96), id="depthwise"),
    pytest.param((2, 128, 14, 14), (128, 16, 3, 3), dict(padding=1, groups=8), id="grouped"),
    pytest.param((2, 3, 64, 64), (32, 3, 7, 7), dict(stride=2, padding=3), id="stem"),
    pytest.param((2, 512, 7, 7), (512, 512, 3, 3), dict(padding=1), id="7x7_plane"),
    pytest.param((2, 240, 1, 1), (64, 240, 1, 1), {}, id="squeeze_excitation"),
]


def _steps(plan) -> list:
    return [getattr(getattr(s, "kernel", None), "name", None) or type(s).__name__ for s in plan.steps]


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("x_shape,w_shape,kwargs", _GEOMETRIES)
def test_both_doors_choose_the_same_plan(x_shape, w_shape, kwargs, dtype_name, layout, monkeypatch):
    import cupy

    from cuconv import _dtypes, conv, dispatch
    from cuconv.nn import functional as F

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # (the torch door's float32: IEEE, as asked below)
    dtype = _dtypes.by_name(dtype_name)
    rng = numpy.random.default_rng(11)
    x = cupy.asarray(rng.standard_normal(x_shape).astype(dtype))
    if layout == "channels_last":
        x = cupy.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    w = cupy.asarray(rng.standard_normal(w_shape).astype(dtype))
    b = cupy.asarray(rng.standard_normal(w_shape[0]).astype(dtype))
    y = cuconv.conv2d(x, w, b, precision="ieee", **kwargs)
    key = dispatch.call_key(conv._operands(x, w, b, None), kwargs.get("stride", 1), kwargs.get("padding", 0), 1,
                            kwargs.get("groups", 1), "auto",
                            ("ieee", cuconv.config.precision, cuconv.config.workspace_limit, None))
    ours = conv._plans[key].gpu
    xt, wt, bt = (torch.from_dlpack(a) for a in (x, w, b))
    with torch.no_grad():
        found = F.plain_layer(xt, wt, bt, kwargs.get("stride", 1), kwargs.get("padding", 0), 1,
                              kwargs.get("groups", 1), "auto")
        assert found is not None
        layer = found[0]
        yt = F.run_layer(*found)
    theirs = layer.fprop
    assert (ours.algo, _steps(ours)) == (theirs.algo, _steps(theirs))
    numpy.testing.assert_array_equal(cupy.asnumpy(y).astype(numpy.float64),
                                     yt.double().cpu().numpy())  # (one plan, one result, bit for bit)
