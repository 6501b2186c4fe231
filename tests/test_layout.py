"""Memory formats (``cuconv._layout``): torch's channels-last test of strides, on tensors and NumPy arrays."""

import itertools

import numpy
import pytest

torch = pytest.importorskip("torch")
prims = pytest.importorskip("torch._prims_common")

from cuconv._layout import is_channels_last, result_channels_last, strides_like_channels_last  # noqa: E402


def _views():
    """4-D views of every axis order, with size-0 and size-1 axes, strided and sliced: the ambiguous cases
    torch resolves towards NCHW included."""
    for sizes in itertools.product((0, 1, 2, 3), repeat=4):
        for perm in ((0, 1, 2, 3), (0, 2, 3, 1), (1, 0, 2, 3), (3, 2, 1, 0), (0, 3, 1, 2), (2, 3, 0, 1)):
            base = torch.empty([sizes[p] for p in perm])
            view = base.permute(*[perm.index(i) for i in range(4)])
            yield view
            if view.shape[3] > 1:
                yield view[:, :, :, ::2]
            if view.shape[1] > 1:
                yield view[:, :1]


def test_tensors_agree_with_torch():
    """Every view: the same answer as torch's suggest_memory_format (its Python mirror, which eager agrees with)."""
    for view in _views():
        want = prims.suggest_memory_format(view) == torch.channels_last
        assert is_channels_last(view) == want, (list(view.shape), view.stride())


def test_numpy_arrays_by_their_element_strides():
    nhwc = numpy.zeros((2, 5, 6, 3), numpy.float32).transpose(0, 3, 1, 2)
    assert is_channels_last(nhwc) and not is_channels_last(numpy.zeros((2, 3, 5, 6)))
    assert not is_channels_last(numpy.zeros((3, 5, 6)))  # unbatched: no channels-last format
    odd = numpy.lib.stride_tricks.as_strided(numpy.zeros(400, numpy.uint8), (2, 3, 4, 4), (96, 1, 24, 6))
    assert is_channels_last(odd)  # (one-byte elements: every stride divides)
    assert not is_channels_last(numpy.zeros((2, 3, 4, 4), numpy.float32)[:, :, :, ::2])  # a sliced NCHW view
    assert is_channels_last(numpy.zeros((2, 4, 4, 3), numpy.float32)[:, :, ::2].transpose(0, 3, 1, 2))


def test_results_are_channels_last_where_input_or_weight_is():
    """torch's rule for a convolution's output, checked against torch's own CPU convolution."""
    x = torch.randn(2, 3, 6, 7)
    w = torch.randn(4, 3, 3, 3)
    cl = torch.channels_last
    for xi, wi in itertools.product((x, x.contiguous(memory_format=cl)), (w, w.contiguous(memory_format=cl))):
        y = torch.nn.functional.conv2d(xi, wi)
        assert result_channels_last(xi, wi) == y.is_contiguous(memory_format=cl) != y.is_contiguous()


def test_zero_channel_stride_is_nchw():
    assert not strides_like_channels_last((2, 3, 4, 5), (60, 0, 5, 1))
    assert strides_like_channels_last((2, 3, 4, 5), (60, 1, 15, 3))
