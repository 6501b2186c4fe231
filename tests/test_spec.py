"""ConvSpec and the one output-size formula: properties, torch's shapes, normalisation, derived sizes."""

import dataclasses
import itertools

import numpy
import pytest
import torch

from cuconv.spec import ConvSpec, output_size

# torch notes that 'same' with an even kernel may copy the input; irrelevant to shapes.
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")


def _windows(in_size, kernel, stride, pad_lo, pad_hi, dilation):
    """Count the window positions that fit, one by one: the definition the formula must agree with."""
    padded = in_size + pad_lo + pad_hi
    count, start = 0, 0
    while start + dilation * (kernel - 1) < padded:  # last tap of the window inside the padded input
        count += 1
        start += stride
    return count


def test_output_size_counts_every_window_position():
    for in_size, kernel, stride, pad_lo, pad_hi, dilation in itertools.product(
            range(1, 9), range(1, 5), range(1, 4), range(3), range(3), range(1, 4)):
        got = output_size(in_size, kernel, stride, pad_lo, pad_hi, dilation)
        expected = _windows(in_size, kernel, stride, pad_lo, pad_hi, dilation)
        if expected == 0:
            # The kernel does not fit; from_args refuses these before the formula is used.
            assert got <= 0, (in_size, kernel, stride, pad_lo, pad_hi, dilation)
        else:
            assert got == expected, (in_size, kernel, stride, pad_lo, pad_hi, dilation)


@pytest.mark.parametrize("kernel,dilation", [(1, 1), (3, 1), (3, 2), (2, 3), (5, 4), (4, 2)],
                         ids=lambda v: str(v))
def test_dilated_extent_is_d_times_k_minus_1_plus_1(kernel, dilation):
    # The smallest input that fits one window is the dilated extent, not d*k.
    extent = dilation * (kernel - 1) + 1
    assert output_size(extent, kernel, 1, 0, 0, dilation) == 1
    assert output_size(extent - 1, kernel, 1, 0, 0, dilation) <= 0
    assert output_size(extent + 2, kernel, 1, 0, 0, dilation) == 3


def test_spec_shapes_match_torch():
    """Random geometries, asymmetric padding included, against the shape torch actually produces."""
    rng = numpy.random.default_rng(1234)
    checked = 0
    while checked < 150:
        h, w = (int(v) for v in rng.integers(1, 14, size=2))
        r, s = (int(v) for v in rng.integers(1, 5, size=2))
        stride = tuple(int(v) for v in rng.integers(1, 4, size=2))
        dilation = tuple(int(v) for v in rng.integers(1, 4, size=2))
        pad = tuple(int(v) for v in rng.integers(0, 4, size=4))  # (top, bottom, left, right)
        spec = ConvSpec(1, 2, h, w, 3, r, s, stride, pad, dilation)
        if h + pad[0] + pad[1] < dilation[0] * (r - 1) + 1 or w + pad[2] + pad[3] < dilation[1] * (s - 1) + 1:
            continue
        x = torch.from_numpy(rng.standard_normal(spec.input_shape))
        wt = torch.from_numpy(rng.standard_normal(spec.weight_shape))
        x_padded = torch.nn.functional.pad(x, (pad[2], pad[3], pad[0], pad[1]))  # (left, right, top, bottom)
        y = torch.nn.functional.conv2d(x_padded, wt, stride=stride, dilation=dilation)
        assert spec.output_shape == tuple(y.shape), spec
        checked += 1


@pytest.mark.parametrize("x_shape,w_shape,kwargs", [
    pytest.param((2, 3, 17, 11), (4, 3, 5, 7), {}, id="k5x7"),
    pytest.param((1, 2, 23, 37), (3, 2, 5, 9), dict(padding=(2, 4), dilation=(2, 3)), id="k5x9_d2x3_p2x4"),
    pytest.param((2, 4, 19, 23), (2, 4, 3, 4), dict(stride=(2, 3), padding=(1, 2)), id="k3x4_s2x3_p1x2"),
    pytest.param((1, 2, 21, 20), (2, 2, 3, 3), dict(stride=2, dilation=2, padding=3), id="s2_d2_p3"),
    pytest.param((1, 2, 12, 11), (2, 2, 2, 4), dict(padding="same", dilation=(3, 1)), id="same_k2x4_d3x1"),
    pytest.param((1, 2, 10, 9), (2, 2, 4, 2), dict(padding="same"), id="same_k4x2"),
    pytest.param((1, 2, 9, 8), (2, 2, 3, 2), dict(padding="same", dilation=2), id="same_k3x2_d2"),
    pytest.param((1, 2, 7, 6), (2, 2, 2, 3), dict(padding="valid"), id="valid"),
    pytest.param((1, 6, 9, 10), (4, 3, 3, 3), dict(groups=2, padding=1), id="groups2"),
    pytest.param((1, 3, 5, 4), (2, 3, 5, 4), {}, id="kernel_equals_input"),
])
def test_from_args_output_shape_matches_torch(x_shape, w_shape, kwargs):
    rng = numpy.random.default_rng(7)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    y = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), **kwargs)
    assert ConvSpec.from_args(x_shape, w_shape, **kwargs).output_shape == tuple(y.shape)


@pytest.mark.parametrize("kwargs,stride,pad,dilation", [
    pytest.param({}, (1, 1), (0, 0, 0, 0), (1, 1), id="defaults"),
    pytest.param(dict(stride=2), (2, 2), (0, 0, 0, 0), (1, 1), id="stride_int"),
    pytest.param(dict(stride=(2, 3)), (2, 3), (0, 0, 0, 0), (1, 1), id="stride_tuple"),
    pytest.param(dict(stride=[3]), (3, 3), (0, 0, 0, 0), (1, 1), id="stride_1list"),
    pytest.param(dict(stride=[2, 1]), (2, 1), (0, 0, 0, 0), (1, 1), id="stride_2list"),
    pytest.param(dict(stride=numpy.int64(2)), (2, 2), (0, 0, 0, 0), (1, 1), id="stride_numpy_int"),
    pytest.param(dict(padding=1), (1, 1), (1, 1, 1, 1), (1, 1), id="padding_int"),
    pytest.param(dict(padding=(1, 2)), (1, 1), (1, 1, 2, 2), (1, 1), id="padding_tuple"),
    pytest.param(dict(padding=[2]), (1, 1), (2, 2, 2, 2), (1, 1), id="padding_1list"),
    pytest.param(dict(dilation=(2, 3)), (1, 1), (0, 0, 0, 0), (2, 3), id="dilation_tuple"),
    pytest.param(dict(dilation=[2]), (1, 1), (0, 0, 0, 0), (2, 2), id="dilation_1list"),
    pytest.param(dict(padding="valid"), (1, 1), (0, 0, 0, 0), (1, 1), id="valid"),
    pytest.param(dict(padding="valid", stride=2), (2, 2), (0, 0, 0, 0), (1, 1), id="valid_strided"),
    # Kernel is 4x3 below: 'same' pads total // 2 before and the rest after, per axis.
    pytest.param(dict(padding="same"), (1, 1), (1, 2, 1, 1), (1, 1), id="same_k4x3"),
    pytest.param(dict(padding="same", dilation=(1, 2)), (1, 1), (1, 2, 2, 2), (1, 2), id="same_k4x3_d1x2"),
    pytest.param(dict(padding="same", dilation=(3, 1)), (1, 1), (4, 5, 1, 1), (3, 1), id="same_k4x3_d3x1"),
    pytest.param(dict(padding="same", dilation=2), (1, 1), (3, 3, 2, 2), (2, 2), id="same_k4x3_d2"),
])
def test_from_args_normalises(kwargs, stride, pad, dilation):
    spec = ConvSpec.from_args((2, 4, 16, 15), (6, 4, 4, 3), **kwargs)
    assert (spec.stride, spec.pad, spec.dilation) == (stride, pad, dilation)
    assert all(type(v) is int for v in spec.stride + spec.pad + spec.dilation)
    if kwargs.get("padding") == "same":
        assert (spec.p, spec.q) == (spec.h, spec.w)


@pytest.mark.parametrize("r,s,dilation", [(1, 1, 1), (2, 2, 1), (3, 4, 1), (4, 5, 2), (2, 3, 3), (5, 2, 2)],
                         ids=lambda v: str(v))
def test_same_padding_keeps_size_and_splits_total(r, s, dilation):
    spec = ConvSpec.from_args((1, 1, 11, 10), (1, 1, r, s), padding="same", dilation=dilation)
    total_h, total_w = dilation * (r - 1), dilation * (s - 1)
    assert spec.pad == (total_h // 2, total_h - total_h // 2, total_w // 2, total_w - total_w // 2)
    assert (spec.p, spec.q) == (11, 10)


def test_derived_sizes():
    spec = ConvSpec.from_args((2, 6, 10, 12), (8, 3, 3, 5), stride=(2, 1), padding=(1, 2), dilation=(1, 2),
                              groups=2)
    # P = (10 + 2 - 3) // 2 + 1, Q = (12 + 4 - (2*4 + 1)) // 1 + 1
    assert (spec.p, spec.q) == (5, 8)
    assert spec.output_shape == (2, 8, 5, 8)
    assert spec.weight_shape == (8, 3, 3, 5)
    assert (spec.c_per_group, spec.k_per_group) == (3, 4)
    assert spec.crs == 6 * 3 * 5
    assert spec.crs_per_group == 3 * 3 * 5
    assert spec.flops == 2 * 2 * 8 * 5 * 8 * 45
    # (M, N, K) of one group's GEMM over the batch, as CUTLASS names them.
    assert spec.implicit_gemm_size("fprop") == (2 * 5 * 8, 4, 45)
    assert spec.implicit_gemm_size() == spec.implicit_gemm_size("fprop")
    assert spec.implicit_gemm_size("dgrad") == (2 * 10 * 12, 3, 4 * 3 * 5)
    assert spec.implicit_gemm_size("wgrad") == (4, 45, 2 * 5 * 8)


@pytest.mark.parametrize("x_shape,w_shape,kwargs", [
    pytest.param((3, 8, 9, 7), (6, 4, 3, 2), dict(groups=2, stride=(2, 1), dilation=(1, 2)), id="groups2"),
    pytest.param((2, 5, 11, 9), (5, 1, 3, 3), dict(groups=5, padding=1), id="depthwise"),
    pytest.param((4, 3, 12, 12), (7, 3, 4, 2), dict(padding="same"), id="same_even"),
])
def test_gemm_sizes_agree_with_flops(x_shape, w_shape, kwargs):
    spec = ConvSpec.from_args(x_shape, w_shape, **kwargs)
    prod = {kind: int(numpy.prod(spec.implicit_gemm_size(kind))) for kind in ("fprop", "dgrad", "wgrad")}
    assert spec.flops == 2 * spec.groups * prod["fprop"]
    assert prod["wgrad"] == prod["fprop"]
    if (spec.p, spec.q) == (spec.h, spec.w):  # dgrad reduces over the same products only then
        assert prod["dgrad"] == prod["fprop"]


def test_implicit_gemm_size_unknown_kind():
    spec = ConvSpec.from_args((1, 2, 5, 5), (3, 2, 3, 3))
    with pytest.raises(ValueError, match=r"unknown GEMM kind 'bprop'; expected 'fprop', 'dgrad' or 'wgrad'"):
        spec.implicit_gemm_size("bprop")


def test_spec_is_frozen_and_hashable():
    a = ConvSpec.from_args((2, 4, 9, 9), (6, 2, 3, 3), stride=[2], padding=[1, 2], dilation=(1, 1), groups=2)
    b = ConvSpec.from_args((2, 4, 9, 9), (6, 2, 3, 3), stride=2, padding=(1, 2), groups=2)
    c = ConvSpec.from_args((2, 4, 9, 9), (6, 2, 3, 3), stride=2, padding=(2, 1), groups=2)
    assert a == b and hash(a) == hash(b)
    assert a != c
    cache = {a: "first"}
    cache[b] = "second"
    cache[c] = "third"
    assert cache == {a: "second", c: "third"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.stride = (1, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.n = 3


def test_from_args_memo_keeps_validation_and_types():
    """Plain arguments are memoized (one spec per signature); booleans, floats and lists still go through
    validation every time, so a memoized (1, 1) never answers for (True, True) or 1.0."""
    args = ((2, 3, 9, 9), (4, 3, 3, 3), (1, 1), 1, (1, 1), 1)
    spec = ConvSpec.from_args(*args)
    assert ConvSpec.from_args(*args) is spec
    assert ConvSpec.from_args((2, 3, 9, 9), (4, 3, 3, 3), [1, 1], 1, [1, 1], 1) == spec
    with pytest.raises(TypeError, match="'stride' must be an int or a tuple of 2 ints"):
        ConvSpec.from_args((2, 3, 9, 9), (4, 3, 3, 3), (True, True), 1, (1, 1), 1)
    with pytest.raises(TypeError, match="'padding' must be an int or a tuple of 2 ints"):
        ConvSpec.from_args((2, 3, 9, 9), (4, 3, 3, 3), (1, 1), 1.0, (1, 1), 1)
    with pytest.raises(ValueError, match="Kernel size can't be greater than actual input size"):
        ConvSpec.from_args((2, 3, 2, 2), (4, 3, 3, 3), 1, 0, 1, 1)
