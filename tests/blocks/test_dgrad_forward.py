"""dgrad as a forward convolution of dy (``dgrad_forward``): which dgrads have one, the NumPy twin of the flipped
weight against its definition and against the convolution it must give, and ``flip_weight`` on the GPU equal to
the twin bit for bit (groups, channel multipliers, tails of its 32 x 32 tiles, every dtype)."""

import numpy
import pytest

import cuconv
from cases import EXACT_DTYPES
from cuconv.blocks import dgrad_forward


@pytest.mark.parametrize("kwargs,has_forward", [
    ({}, True), (dict(padding=1), True), (dict(padding=(1, 2), dilation=(1, 2)), True),
    (dict(stride=2, padding=1), False), (dict(padding=3), False),
], ids=["valid", "same", "dilated", "stride2", "padding_past_the_kernel"])
def test_forward_spec_exists_at_stride_one_within_the_kernel(kwargs, has_forward):
    """Stride 1 and padding no wider than the dilated kernel: the forward spec maps dy's shape to x's."""
    spec = cuconv.ConvSpec.from_args((2, 4, 9, 11), (6, 4, 3, 3), **kwargs)
    fspec = dgrad_forward.forward_spec(spec)
    assert (fspec is not None) == has_forward
    if fspec is not None:
        assert fspec.input_shape == spec.output_shape and fspec.output_shape == spec.input_shape


@pytest.mark.parametrize("groups,k,c", [(1, 6, 4), (2, 6, 4), (4, 8, 4), (3, 9, 3)])
def test_forward_weight_is_the_flipped_transpose_and_gives_dgrad(groups, k, c):
    """w'[g·C/g + c, k, r, s] = w[g·K/g + k, c, R-1-r, S-1-s]; conv2d(dy, w') = conv2d_input(dy, w) exactly
    on integers."""
    rng = numpy.random.default_rng(3)
    spec = cuconv.ConvSpec.from_args((2, c, 7, 8), (k, c // groups, 3, 2), padding=(1, 1), groups=groups)
    w = rng.integers(-3, 4, size=spec.weight_shape).astype(numpy.float64)
    wf = dgrad_forward.forward_weight(w, spec)
    kg, cg = spec.k_per_group, spec.c_per_group
    for g in range(groups):
        for ci in range(cg):
            for ki in range(kg):
                numpy.testing.assert_array_equal(wf[g * cg + ci, ki], w[g * kg + ki, ci, ::-1, ::-1])
    dy = rng.integers(-3, 4, size=spec.output_shape).astype(numpy.float64)
    fspec = dgrad_forward.forward_spec(spec)
    via_forward = cuconv.conv2d(dy, wf, padding=(fspec.pad[0], fspec.pad[2]), groups=groups)
    numpy.testing.assert_array_equal(via_forward, cuconv.conv2d_input(spec.input_shape, w, dy, padding=(1, 1),
                                                                      groups=groups))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", EXACT_DTYPES)
@pytest.mark.parametrize("w_shape,groups", [((6, 4, 3, 3), 1), ((70, 33, 3, 2), 1), ((64, 1, 5, 5), 32),
                                            ((96, 24, 1, 1), 2), ((40, 36, 7, 7), 1), ((960, 1, 5, 5), 960),
                                            ((300, 40, 3, 3), 10)],
                         ids=["small", "tile_tails", "depthwise_mult2", "grouped_1x1", "7x7", "depthwise_960",
                              "narrow_groups"])
def test_flip_weight_equals_its_twin(w_shape, groups, dtype_name):
    """The kernel's w' (32 x 32 tiles, or a thread per element for groups narrower than a tile) equals
    ``forward_weight`` bit for bit, into a NaN-poisoned buffer."""
    import cupy

    from cuconv import _dtypes

    dtype = _dtypes.by_name(dtype_name)
    spec = cuconv.ConvSpec.from_args((1, w_shape[1] * groups, 9, 9), w_shape, groups=groups)
    w = numpy.random.default_rng(5).integers(-9, 10, size=w_shape).astype(dtype)
    wg = cupy.asarray(w)
    out = cupy.full((spec.c, spec.k_per_group, spec.r, spec.s), numpy.nan, dtype=dtype)
    dgrad_forward.flip_launch(spec, dtype)(cupy.cuda.get_current_stream().ptr, wg.data.ptr, out.data.ptr)
    numpy.testing.assert_array_equal(cupy.asnumpy(out).astype(numpy.float64),
                                     dgrad_forward.forward_weight(w, spec).astype(numpy.float64))
