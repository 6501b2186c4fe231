"""depthwise on channels-last activations (``cuconv.algos.depthwise.nhwc``): what it serves in place (CPU), and on
the GPU every pass bit for bit against the CPU path on integers, through each forward kernel."""

import numpy
import pytest

import cuconv
from cases import EXACT_DTYPES
from cuconv import _dtypes
from cuconv.algos import depthwise
from cuconv.spec import ConvSpec

_THREADS = 256


# ---- channels-last activations (depthwise_nhwc_*) -----------------------------------------------------------
# (x shape, kernel, conv2d keywords): unrolled 3x3/5x5/7x7 and run-time R x S taps, strides, dilation, asymmetric
# and wide padding, batch 1, 16 to 48 channels (2 to 6 vectors of 16 bytes in halves, 8 to 24 in double), a bias
_NHWC_CASES = [
    pytest.param((2, 16, 9, 11), (3, 3), dict(padding=1), id="3x3"),
    pytest.param((1, 16, 13, 10), (5, 5), dict(padding=2, stride=2), id="5x5_s2_n1"),
    pytest.param((2, 32, 12, 12), (7, 7), dict(padding=3), id="7x7"),
    pytest.param((2, 16, 11, 9), (3, 3), dict(padding=(2, 1), dilation=2), id="3x3_dil2"),
    pytest.param((2, 16, 8, 15), (1, 3), dict(padding=(0, 2), stride=(1, 2)), id="1x3_runtime_taps"),
    pytest.param((3, 48, 7, 7), (3, 3), dict(padding=0), id="valid_7x7_plane"),
    pytest.param((2, 16, 10, 10), (5, 5), dict(padding=(1, 3)), id="5x5_asym_pad"),
    pytest.param((2, 24, 15, 14), (3, 3), dict(padding=1, stride=2), id="3x3_s2_odd"),
    pytest.param((1, 16, 12, 13), (7, 7), dict(padding=3, stride=2), id="7x7_s2"),
    pytest.param((2, 16, 11, 12), (3, 3), dict(padding=(0, 1), stride=(2, 3), dilation=(2, 1)), id="3x3_s2x3_dil"),
    pytest.param((3, 16, 9, 9), (5, 5), dict(padding=4), id="5x5_pad_wider_than_kernel"),
    pytest.param((2, 16, 8, 9), (2, 4), dict(padding=(1, 2), stride=(2, 1)), id="2x4_runtime_width_s2"),
    pytest.param((1, 16, 7, 12), (3, 1), dict(padding=(1, 0)), id="3x1_runtime_width"),
    pytest.param((2, 16, 6, 11), (1, 8), dict(padding=(0, 3)), id="1x8_widest_wgrad"),
    pytest.param((4, 80, 17, 23), (5, 5), dict(padding=2), id="5x5_partial_channel_block_many_rows"),
    pytest.param((3, 16, 9, 21), (3, 3), dict(padding=(1, 0), stride=2), id="3x3_s2_unread_last_column"),
    # several tiles of depthwise_nhwc_fwd_tile (8 rows x 16 or 8 columns, 32 channels) and partial ones
    pytest.param((2, 40, 23, 37), (3, 3), dict(padding=1), id="3x3_tiles_c40"),
    pytest.param((1, 64, 19, 30), (7, 7), dict(padding=3), id="7x7_tiles_c64"),
    pytest.param((2, 72, 29, 31), (5, 5), dict(padding=2, stride=2), id="5x5_s2_tiles_c72"),
    pytest.param((2, 96, 17, 18), (7, 7), dict(padding=(3, 2), stride=2), id="7x7_s2_tiles_asym"),
]


def test_nhwc_reasons():
    """Channels-last in place: multiplier 1, channels in whole 16-byte vectors, every pass (wgrad for kernels of
    up to 8 columns); everything else refused with its reason (the bridge runs it on NCHW copies)."""
    f16, f32 = numpy.dtype(numpy.float16), numpy.dtype(numpy.float32)
    spec = ConvSpec.from_args((2, 16, 9, 9), (16, 1, 3, 3), groups=16, padding=1)
    for pass_ in ("fprop", "dgrad", "wgrad"):
        assert depthwise.reason_unsupported_nhwc(spec, f16, pass_) is None
    assert "columns" in depthwise.reason_unsupported_nhwc(
        ConvSpec.from_args((2, 16, 9, 19), (16, 1, 1, 9), groups=16), f16, "wgrad")
    assert "16-byte" in depthwise.reason_unsupported_nhwc(
        ConvSpec.from_args((2, 12, 9, 9), (12, 1, 3, 3), groups=12, padding=1), f16)
    assert depthwise.reason_unsupported_nhwc(
        ConvSpec.from_args((2, 12, 9, 9), (12, 1, 3, 3), groups=12, padding=1), f32) is None
    assert "multiplier" in depthwise.reason_unsupported_nhwc(
        ConvSpec.from_args((2, 16, 9, 9), (32, 1, 3, 3), groups=16, padding=1), f16)
    strided = ConvSpec.from_args((2, 16, 9, 9), (16, 1, 3, 3), groups=16, padding=1, stride=2)
    for pass_ in ("fprop", "dgrad", "wgrad"):
        assert depthwise.reason_unsupported_nhwc(strided, f16, pass_) is None


def _nhwc(a):
    import cupy

    return cupy.ascontiguousarray(cupy.asarray(a).transpose(0, 2, 3, 1))


@pytest.mark.gpu
@pytest.mark.parametrize("fwd_kernel", ["nhwc", "nhwc_q", "nhwc_tile"])
@pytest.mark.parametrize("dtype_name", EXACT_DTYPES)
@pytest.mark.parametrize("x_shape,kernel,kwargs", _NHWC_CASES)
def test_nhwc_passes_equal_cpu_exactly_on_integers(x_shape, kernel, kwargs, dtype_name, fwd_kernel):
    """x, out, dy and dx channels-last in memory: the forward (with a bias), the dgrad (at stride 1 the forward of
    dy with the weight transposed and flipped, else the gather) and wgrad (slices of dy's rows, then their ordered
    sum) bit for bit the CPU path's on integers, into NaN-poisoned outputs; the forward and stride-1 dgrad through
    each forward kernel (``nhwc_q``: several output pixels a thread, for square 3x3, 5x5 and 7x7 kernels;
    ``nhwc_tile``: a tile's input window staged in shared memory, the 16-bit types' square kernels at stride 1
    or 2)."""
    import cupy

    from cuconv import _plan

    dtype = _dtypes.by_name(dtype_name)
    c = x_shape[1]
    rng = numpy.random.default_rng(51)
    x = rng.integers(-3, 4, x_shape).astype(dtype)
    w = rng.integers(-3, 4, (c, 1) + kernel).astype(dtype)
    b = rng.integers(-3, 4, c).astype(dtype)
    spec = ConvSpec.from_args(x.shape, w.shape, groups=c, **kwargs)
    assert depthwise.reason_unsupported_nhwc(spec, dtype, "fprop") is None
    want = cuconv.conv2d(x, w, b, groups=c, **kwargs)
    xg, wg, bg = _nhwc(x), cupy.asarray(w), cupy.asarray(b)
    out = cupy.full((spec.n, spec.p, spec.q, spec.k), numpy.nan, dtype=dtype)
    plan = depthwise.prepare("fprop", spec, dtype, "ieee", _plan.current_env(xg, wg, bg, out), True, kernel=fwd_kernel,
                             layout="nhwc")
    _plan.run_arrays(plan, xg, wg, bg, out)
    numpy.testing.assert_array_equal(cupy.asnumpy(out.transpose(0, 3, 1, 2)).astype(numpy.float64),
                                     want.astype(numpy.float64))
    dy = rng.integers(-3, 4, spec.output_shape).astype(dtype)
    want = cuconv.conv2d_input(x.shape, w, dy, groups=c, **kwargs)
    dyg = _nhwc(dy)
    dx = cupy.full((spec.n, spec.h, spec.w, spec.c), numpy.nan, dtype=dtype)
    plan = depthwise.prepare("dgrad", spec, dtype, "ieee", _plan.current_env(dyg, wg, dx), kernel=fwd_kernel,
                             layout="nhwc")
    _plan.run_arrays(plan, dyg, wg, dx)
    numpy.testing.assert_array_equal(cupy.asnumpy(dx.transpose(0, 3, 1, 2)).astype(numpy.float64),
                                     want.astype(numpy.float64))
    want = cuconv.conv2d_weight(x, w.shape, dy, groups=c, **kwargs)
    dw = cupy.full(w.shape, numpy.nan, dtype=dtype)
    plan = depthwise.prepare("wgrad", spec, dtype, "ieee", _plan.current_env(xg, dyg, dw), layout="nhwc")
    _plan.run_arrays(plan, xg, dyg, dw)
    numpy.testing.assert_array_equal(cupy.asnumpy(dw).astype(numpy.float64), want.astype(numpy.float64))
