"""depthwise's dgrad and wgrad kernels on NCHW activations (``cuconv.algos.depthwise.nchw_bwd``): which
strided dgrad takes the quad kernel, how wgrad's strips cover a channel's items (CPU), and on the GPU a
deterministic wgrad over many blocks and chunks."""

import numpy
import pytest

import cuconv
from cases import make_inputs, reference, rel_err, tolerance
from cuconv.algos import depthwise
from cuconv.algos.depthwise import nchw_bwd
from cuconv.spec import ConvSpec

_THREADS = 256


@pytest.mark.parametrize("stride,dilation,kernel,want", [
    (2, 1, 3, "depthwise_dgrad_s2<float,3,3>"), (2, 1, 7, "depthwise_dgrad_s2<float,7,7>"),
    ((2, 1), 1, 3, "depthwise_dgrad<"), (2, 2, 3, "depthwise_dgrad<"), (3, 1, 3, "depthwise_dgrad<"),
    (2, 1, 4, "depthwise_dgrad<")])
def test_strided_dgrad_takes_the_quad_kernel_at_stride_2(stride, dilation, kernel, want, monkeypatch):
    """depthwise_dgrad_s2 (a thread per 2x2 quad of dx) at stride 2x2, dilation 1, 3x3/5x5/7x7; the gather
    per dx element elsewhere. The launch's kernel name, read without a GPU."""
    names = []
    monkeypatch.setattr(nchw_bwd, "_fn", lambda name: None)
    monkeypatch.setattr(nchw_bwd._loader, "PreparedLaunch", lambda fn, name, *args, **kwargs: names.append(name))
    spec = ConvSpec.from_args((2, 4, 20, 31), (4, 1, kernel, kernel), groups=4, padding=1, stride=stride,
                              dilation=dilation)
    nchw_bwd._dgrad_launch(spec, numpy.dtype(numpy.float32))
    assert len(names) == 1 and names[0].startswith(want)


@pytest.mark.parametrize("shape,r,stride", [((32, 960, 7, 7), 5, 1), ((32, 96, 112, 112), 3, 2), ((1, 4, 3, 300), 7, 1),
                                             ((16, 4, 130, 70), 5, 1), ((2, 3, 9, 9), 3, (2, 1))])
def test_wgrad_strips_cover_every_item_once(shape, r, stride):
    """depthwise_wgrad_strips: strips of at most 16 rows cover each plane; blocks of whole passes of 256
    threads cover a channel's (sample, strip, column) items; about eight blocks per SM over the channels."""
    spec = ConvSpec.from_args(shape, (shape[1], 1, r, r), groups=shape[1], padding=r // 2, stride=stride)
    rows, strips, chunk, blocks = depthwise.wgrad_strips_plan(spec, 132)
    assert rows <= 16 and (strips - 1) * rows < spec.p <= strips * rows
    items = spec.n * strips * spec.q
    assert chunk % _THREADS == 0 and (blocks - 1) * chunk < items <= blocks * chunk
    assert spec.k * blocks <= max(spec.k, 8 * 132 + spec.k)


def test_wgrad_strips_only_for_compiled_kernels_dilation_1_and_row_strides_1_2():
    shapes = ((2, 4, 20, 20), (4, 1, 3, 3))
    for kwargs in (dict(dilation=2), dict(stride=3), dict(stride=(3, 1))):
        assert depthwise.wgrad_strips_plan(ConvSpec.from_args(*shapes, groups=4, **kwargs), 132) is None
    assert depthwise.wgrad_strips_plan(ConvSpec.from_args(*shapes, groups=4, stride=(1, 3)), 132) is not None
    assert depthwise.wgrad_strips_plan(ConvSpec.from_args((2, 4, 20, 20), (4, 1, 3, 5), groups=4), 132) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
@pytest.mark.parametrize("shape,r,stride", [((16, 4, 130, 70), 5, 1), ((32, 8, 61, 45), 3, 2),
                                             ((16, 2, 66, 80), 7, 2)])
def test_depthwise_wgrad_strips_over_many_blocks_equal_cpu_and_repeat(shape, r, stride, dtype_name):
    """Several blocks per channel (strips' partial sums, then the ordered reduce): integer inputs give the CPU
    path's sums exactly, and two runs agree bit for bit."""
    import cupy

    dtype = numpy.dtype(dtype_name)
    c = shape[1]
    kwargs = dict(stride=stride, padding=r // 2, groups=c)
    spec = ConvSpec.from_args(shape, (c, 1, r, r), **kwargs)
    assert depthwise.wgrad_strips_plan(spec, 132)[3] > 1
    rng = numpy.random.default_rng(41)
    x = rng.integers(-3, 4, size=shape).astype(dtype)
    dy = rng.integers(-3, 4, size=spec.output_shape).astype(dtype)
    want = cuconv.conv2d_weight(x, spec.weight_shape, dy, **kwargs)
    runs = [cupy.asnumpy(cuconv.conv2d_weight(cupy.asarray(x), spec.weight_shape, cupy.asarray(dy), algo="depthwise",
                                              **kwargs)) for _ in range(2)]
    numpy.testing.assert_array_equal(runs[0], want)
    numpy.testing.assert_array_equal(runs[1], want)


@pytest.mark.gpu
def test_depthwise_wgrad_many_chunks_and_big_taps_is_deterministic():
    """The wgrad partial sums split N·P·Q into many chunks; two runs agree bit for bit, and with the oracle."""
    import cupy

    from cases import Case

    case = Case((6, 4, 40, 37), (8, 1, 7, 5), dict(padding=(3, 2), dilation=(1, 2), groups=4), False)
    x, w, _ = make_inputs(case, seed=31)
    ref_out = reference(x, w, **case.kwargs)
    dy = numpy.random.default_rng(32).standard_normal(ref_out.shape)
    import torch

    xt, wt = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    torch.nn.functional.conv2d(xt, wt, **case.kwargs).backward(torch.from_numpy(dy))
    runs = [cupy.asnumpy(cuconv.conv2d_weight(cupy.asarray(x), w.shape, cupy.asarray(dy), algo="depthwise",
                                              **case.kwargs)) for _ in range(2)]
    numpy.testing.assert_array_equal(runs[0], runs[1])
    assert rel_err(runs[0], wt.grad.numpy()) <= tolerance(numpy.float64)
