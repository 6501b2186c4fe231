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


# ---------------------------------------------------------------------------------------------------------------
# Convolutions on channels-last tensors and arrays: torch's values and torch's memory format
# ---------------------------------------------------------------------------------------------------------------
from cases import bound, reference, rel_err  # noqa: E402
from cuconv import _dtypes  # noqa: E402

CL = torch.channels_last
# (x shape, w shape, conv kwargs): an in-place forward in the half types (3x3, channels in 16-byte vectors), 1x1
# layers (every pass in place), a strided 1x1, few channels, depthwise, batch 1, C = 1 and 1x1 planes (the
# ambiguous strides torch resolves towards NCHW), a strided grouped 3x3 (phases of two groups)
LAYOUT_CASES = [
    ((2, 16, 9, 7), (24, 16, 3, 3), dict(padding=1)),
    ((3, 24, 5, 6), (40, 24, 1, 1), {}),
    ((2, 16, 9, 9), (8, 16, 1, 1), dict(stride=2)),
    ((2, 3, 11, 10), (5, 3, 3, 3), dict(stride=2, padding=1)),
    ((2, 8, 7, 7), (8, 1, 5, 5), dict(padding=2, groups=8)),
    ((1, 16, 6, 5), (8, 16, 3, 3), dict(padding=(1, 0))),
    ((2, 1, 6, 6), (4, 1, 3, 3), {}),
    ((4, 24, 1, 1), (16, 24, 1, 1), {}),
    ((2, 32, 9, 9), (32, 16, 3, 3), dict(stride=2, padding=1, groups=2)),
]
FORMATS = [("nchw", "nchw"), ("cl", "nchw"), ("nchw", "cl"), ("cl", "cl"), ("strided", "nchw")]


def _as_format(t, fmt):
    if fmt == "cl":
        return t.contiguous(memory_format=CL)
    if fmt == "strided":  # neither format: every other pixel of a wider channels-last tensor
        wide = torch.empty(t.shape[:3] + (2 * t.shape[3],), dtype=t.dtype, device=t.device).to(memory_format=CL)
        wide[..., ::2] = t
        return wide[..., ::2]
    return t.contiguous()


def _layout_check(device, dtype, case, formats, tol_precision="ieee"):
    """cuconv.nn.functional.conv2d forward and backward against torch's float64 CPU convolution (values) and
    torch's own convolution in ``dtype`` on ``device`` (memory formats of the output and the input gradient)."""
    import cuconv.nn.functional as F

    x_shape, w_shape, kwargs = case
    gen = torch.Generator().manual_seed(7)
    x64, w64 = torch.randn(x_shape, generator=gen, dtype=torch.float64), torch.randn(w_shape, generator=gen,
                                                                                    dtype=torch.float64)
    b64 = torch.randn(w_shape[0], generator=gen, dtype=torch.float64)
    x = _as_format(x64.to(device, dtype, copy=True), formats[0]).requires_grad_()
    w = _as_format(w64.to(device, dtype, copy=True), formats[1]).requires_grad_()
    b = b64.to(device, dtype, copy=True).requires_grad_()
    y = F.conv2d(x, w, b, **kwargs)
    theirs = torch.nn.functional.conv2d(x.detach(), w.detach(), b.detach(), **kwargs)
    assert y.is_contiguous(memory_format=CL) == theirs.is_contiguous(memory_format=CL)
    assert y.is_contiguous() == theirs.is_contiguous()
    ref = reference(x64.numpy(), w64.numpy(), b64.numpy(), **kwargs)
    numpy_dtype = {torch.float16: numpy.float16, torch.bfloat16: _dtypes.bfloat16 or numpy.float16,
                   torch.float32: numpy.float32, torch.float64: numpy.float64}[dtype]
    assert rel_err(y.detach().double().cpu().numpy(), ref) <= 2 * bound(ref, numpy_dtype, tol_precision)
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), _as_format(dy.to(device, dtype), formats[0]))
    x_ref, w_ref = x64.clone().requires_grad_(), w64.clone().requires_grad_()
    dx_ref, dw_ref = torch.autograd.grad(torch.nn.functional.conv2d(x_ref, w_ref, None, **kwargs), (x_ref, w_ref),
                                         dy)
    for got, want in ((dx, dx_ref), (dw, dw_ref), (db, dy.sum((0, 2, 3)))):
        assert rel_err(got.double().cpu().numpy(), want.numpy()) <= 2 * bound(want.numpy(), numpy_dtype, tol_precision)
    if y.is_contiguous(memory_format=CL) and not y.is_contiguous():
        assert dx.is_contiguous(memory_format=CL)  # the input gradient in the result's format, as torch's


@pytest.mark.parametrize("formats", FORMATS, ids="-".join)
@pytest.mark.parametrize("case", LAYOUT_CASES, ids=lambda c: f"{c[0]}x{c[1]}")
def test_nn_conv_on_the_cpu_follows_torchs_memory_format(case, formats):
    _layout_check("cpu", torch.float64, case, formats)


def test_numpy_channels_last_arrays_give_channels_last_results():
    """cuconv.conv2d on an NHWC-strided NumPy array: the values of the NCHW call, a channels-last result, and a
    channels-last ``out=`` written in place."""
    import cuconv

    rng = numpy.random.default_rng(3)
    x = rng.standard_normal((2, 5, 7, 6)).transpose(0, 3, 1, 2)  # (2, 6, 5, 7), NHWC in memory
    w = rng.standard_normal((4, 6, 3, 3))
    y = cuconv.conv2d(x, w, padding=1)
    assert is_channels_last(y) and y.shape == (2, 4, 5, 7)
    numpy.testing.assert_allclose(y, reference(x, w, padding=1), rtol=1e-12, atol=1e-12)
    out = numpy.full((2, 5, 7, 4), numpy.nan).transpose(0, 3, 1, 2)
    assert cuconv.conv2d(x, w, padding=1, out=out) is out
    numpy.testing.assert_allclose(out, y, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("formats", FORMATS, ids="-".join)
@pytest.mark.parametrize("case", LAYOUT_CASES, ids=lambda c: f"{c[0]}x{c[1]}")
def test_nn_conv_on_cuda_follows_torchs_memory_format(case, formats, dtype):
    """CUDA tensors in every dtype (float32 at torch's precision for convolutions, set to IEEE here): values
    against float64, formats as torch's own."""
    allow = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        _layout_check("cuda", dtype, case, formats)
    finally:
        torch.backends.cudnn.allow_tf32 = allow


def _kernels(fn) -> list:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_channels_last_layers_in_place_launch_no_copies(dtype):
    """A small network moved to channels_last (its weights too), as a user would: a 3x3 layer with a bias, a
    strided 3x3 one (dgrad by phases), a grouped one, a depthwise 5x5 with a bias, a strided depthwise, a 1x1 and
    a strided 1x1. Its forward and its backward (every input and parameter gradient) run cuconv's launches alone:
    no copy kernel of torch's between them; each gradient in its parameter's format (the weights' channels-last,
    as torch's, so that autograd keeps them without a copy)."""
    import cuconv.nn

    net = torch.nn.Sequential(
        cuconv.nn.Conv2d(32, 64, 3, padding=1), cuconv.nn.Conv2d(64, 64, 3, stride=2, padding=1, bias=False),
        cuconv.nn.Conv2d(64, 64, 3, padding=1, groups=4, bias=False), cuconv.nn.Conv2d(64, 64, 5, padding=2, groups=64),
        cuconv.nn.Conv2d(64, 64, 3, stride=2, padding=1, groups=64, bias=False), cuconv.nn.Conv2d(64, 48, 1),
        cuconv.nn.Conv2d(48, 32, 1, stride=2, bias=False)).to("cuda", dtype).to(memory_format=CL)
    x = torch.randn(4, 32, 28, 28, device="cuda", dtype=dtype).contiguous(memory_format=CL)
    with torch.no_grad():
        names = _kernels(lambda: net(x))
    assert names and not [n for n in names if "at::native" in n], names
    xg = x.detach().requires_grad_()
    params = [xg] + list(net.parameters())
    grads = []

    def step():
        z = net(xg)
        assert z.is_contiguous(memory_format=CL)
        grads[:] = torch.autograd.grad(z, params, torch.ones_like(z))

    names = _kernels(step)
    copies = [n for n in names if "copy" in n.lower() or "nchwToNhwc" in n or "nhwcToNchw" in n
              or "elementwise" in n and "Fill" not in n]
    assert names and not copies, copies
    for p, g in zip(params, grads):  # (autograd's layout contract: the strides of dimensions of extent > 1)
        assert all(n == 1 or a == b for n, a, b in zip(p.shape, p.stride(), g.stride())), (p.shape, p.stride(),
                                                                                            g.stride())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16", "float32"])
def test_cupy_channels_last_arrays_run_in_place(dtype_name):
    """cuconv.conv2d on NHWC-strided CuPy arrays: a channels-last plan where one serves (a 1x1 layer in every
    dtype, a 3x3 one in the half types), a channels-last result either way, the values of the NCHW call."""
    import cupy

    import cuconv
    from cuconv import _dtypes, conv, dispatch

    dtype = _dtypes.by_name(dtype_name)
    rng = numpy.random.default_rng(5)
    for w_shape, kwargs, in_place in (((24, 16, 1, 1), {}, True), ((24, 16, 3, 3), dict(padding=1),
                                                                    dtype_name != "float32")):
        x = cupy.asarray(rng.standard_normal((3, 9, 8, 16)).astype(dtype)).transpose(0, 3, 1, 2)
        w = cupy.asarray(rng.standard_normal(w_shape).astype(dtype))
        b = cupy.asarray(rng.standard_normal(w_shape[0]).astype(dtype))
        y = cuconv.conv2d(x, w, b, precision="ieee", **kwargs)
        assert is_channels_last(y)
        key = dispatch.call_key(conv._operands(x, w, b, None), 1, kwargs.get("padding", 0), 1, 1, "auto",
                                ("ieee", cuconv.config.precision, cuconv.config.workspace_limit, None))
        assert (conv._plans[key].layout == "nhwc") == in_place
        nchw = cuconv.conv2d(cupy.ascontiguousarray(x), w, b, precision="ieee", **kwargs)
        numpy.testing.assert_allclose(cupy.asnumpy(y).astype(numpy.float64), cupy.asnumpy(nchw).astype(numpy.float64),
                                      rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_cupy_channels_last_weights_are_read_where_they_lie(dtype_name):
    """A dense channels-last 3x3 weight on the CuPy door: the channels-last plan takes it as it lies ("krsc", no
    C-contiguous copy a call), as the torch door does; a C-contiguous one and a 1x1 (both layouts at once) take
    KCRS; every result the NCHW call's."""
    import cupy

    import cuconv
    from cuconv import _dtypes, conv, dispatch

    dtype = _dtypes.by_name(dtype_name)
    rng = numpy.random.default_rng(6)
    x = cupy.asarray(rng.standard_normal((2, 9, 8, 32)).astype(dtype)).transpose(0, 3, 1, 2)
    b = cupy.asarray(rng.standard_normal(64).astype(dtype))
    for w_shape, weights_cl, expected in (((64, 32, 3, 3), True, "krsc"), ((64, 32, 3, 3), False, "kcrs"),
                                          ((64, 32, 1, 1), True, "kcrs")):
        w = rng.standard_normal(w_shape).astype(dtype)
        wg = cupy.asarray(w.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) if weights_cl else cupy.asarray(w)
        padding = w_shape[2] // 2
        y = cuconv.conv2d(x, wg, b, padding=padding)
        key = dispatch.call_key(conv._operands(x, wg, b, None), 1, padding, 1, 1, "auto",
                                (None, cuconv.config.precision, cuconv.config.workspace_limit, None))
        plan = conv._plans[key]
        assert plan.layout == "nhwc" and plan.weights == expected
        nchw = cuconv.conv2d(cupy.ascontiguousarray(x), cupy.ascontiguousarray(wg), b, padding=padding)
        numpy.testing.assert_allclose(cupy.asnumpy(y).astype(numpy.float64), cupy.asnumpy(nchw).astype(numpy.float64),
                                      rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_misaligned_channels_last_operands_are_copied_to_a_16_byte_boundary(dtype_name):
    """Dense channels-last views one element past their allocation (off the 16-byte boundary the in-place
    passes' vectors need): a 3x3 layer (implicit_gemm) and a depthwise one, on CuPy arrays (input and ``out=``)
    and through cuconv.nn (forward and backward), give the values of aligned copies and leave CUDA usable."""
    import cupy

    import cuconv
    import cuconv.nn
    from cuconv import _dtypes

    dtype = _dtypes.by_name(dtype_name)
    rng = numpy.random.default_rng(6)
    for w_shape, groups in (((32, 16, 3, 3), 1), ((16, 1, 3, 3), 16)):
        n, c, h, w = 2, 16, 9, 10
        flat = cupy.asarray(rng.standard_normal(n * h * w * c + 1).astype(dtype))
        x = flat[1:].reshape(n, h, w, c).transpose(0, 3, 1, 2)  # dense NHWC, 2 bytes off
        assert x.data.ptr % 16 and is_channels_last(x)
        wt = cupy.asarray(rng.standard_normal(w_shape).astype(dtype))
        aligned = x.transpose(0, 2, 3, 1).copy().transpose(0, 3, 1, 2)  # the same NHWC values, on a boundary
        assert aligned.data.ptr % 16 == 0
        want = cuconv.conv2d(aligned, wt, padding=1, groups=groups)
        got = cuconv.conv2d(x, wt, padding=1, groups=groups)
        numpy.testing.assert_array_equal(cupy.asnumpy(got), cupy.asnumpy(want))
        k = w_shape[0]
        out_flat = cupy.full(n * h * w * k + 1, numpy.nan, dtype=dtype)
        out = out_flat[1:].reshape(n, h, w, k).transpose(0, 3, 1, 2)
        assert cuconv.conv2d(x, wt, padding=1, groups=groups, out=out) is out
        numpy.testing.assert_array_equal(cupy.asnumpy(out), cupy.asnumpy(want))

        tdtype = torch.float16 if dtype_name == "float16" else torch.bfloat16
        layer = cuconv.nn.Conv2d(c, k, 3, padding=1, groups=groups, bias=False).to("cuda", tdtype)
        layer = layer.to(memory_format=CL)
        base = torch.randn(n * h * w * c + 1, device="cuda", dtype=tdtype)
        xt = base[1:].view(n, h, w, c).permute(0, 3, 1, 2).requires_grad_()  # dense NHWC, 2 bytes off
        assert xt.data_ptr() % 16 and xt.is_contiguous(memory_format=CL)
        xa = xt.detach().clone(memory_format=CL).requires_grad_()
        y, ya = layer(xt), layer(xa)
        torch.testing.assert_close(y, ya, rtol=0, atol=0)
        dy_flat = torch.randn(y.numel() + 1, device="cuda", dtype=tdtype)
        dy = dy_flat[1:].view(n, h, w, k).permute(0, 3, 1, 2)  # grad_output off the boundary too
        gx, = torch.autograd.grad(y, xt, dy)
        ga, = torch.autograd.grad(ya, xa, dy.clone(memory_format=CL))
        torch.testing.assert_close(gx, ga, rtol=0, atol=0)
        torch.cuda.synchronize()


def _gradient_arrays(xp, dtype, rng):
    """x, w, dy for a 3x3 stride-2 layer of 16 channels, each as a C-contiguous array and a channels-last view."""
    x = rng.integers(-3, 4, (2, 16, 9, 8)).astype(dtype)
    w = rng.integers(-3, 4, (24, 16, 3, 3)).astype(dtype)
    dy = rng.integers(-3, 4, (2, 24, 5, 4)).astype(dtype)

    def cl(a):
        return xp.ascontiguousarray(xp.asarray(a).transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)

    return [(xp.asarray(a), cl(a)) for a in (x, w, dy)]


@pytest.mark.parametrize("formats", [("nchw", "nchw"), ("cl", "nchw"), ("nchw", "cl"), ("cl", "cl")], ids="-".join)
def test_numpy_gradients_follow_the_channels_last_operands(formats):
    """conv2d_input on NumPy arrays: channels-last where grad_output or the weight is; conv2d_weight: where x is;
    the values of the C-contiguous calls exactly (integers)."""
    import cuconv

    rng = numpy.random.default_rng(8)
    (x, x_cl), (w, w_cl), (dy, dy_cl) = _gradient_arrays(numpy, numpy.float64, rng)
    act, wf = formats
    dx = cuconv.conv2d_input(x.shape, w_cl if wf == "cl" else w, dy_cl if act == "cl" else dy, stride=2, padding=1)
    assert is_channels_last(dx) == (formats != ("nchw", "nchw"))
    numpy.testing.assert_array_equal(dx, cuconv.conv2d_input(x.shape, w, dy, stride=2, padding=1))
    dw = cuconv.conv2d_weight(x_cl if act == "cl" else x, w.shape, dy_cl if wf == "cl" else dy, stride=2, padding=1)
    assert is_channels_last(dw) == (act == "cl")
    numpy.testing.assert_array_equal(dw, cuconv.conv2d_weight(x, w.shape, dy, stride=2, padding=1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16", "float32", "float64"])
def test_cupy_gradients_on_channels_last_arrays(dtype_name):
    """conv2d_input and conv2d_weight on channels-last CuPy arrays (dgrad by phases, wgrad into a channels-last
    dW where implicit_gemm runs it): channels-last results (float64 stays C-contiguous, as torch's), the values of
    the C-contiguous calls exactly (integers; float32 at TF32 is exact on them too)."""
    import cupy

    import cuconv
    from cuconv import _dtypes

    dtype = _dtypes.by_name(dtype_name)
    rng = numpy.random.default_rng(9)
    (x, x_cl), (w, w_cl), (dy, dy_cl) = _gradient_arrays(cupy, dtype, rng)
    cl = dtype_name != "float64"
    kwargs = dict(stride=2, padding=1, precision="tf32" if dtype_name == "float32" else None)
    for w_given in (w, w_cl):
        dx = cuconv.conv2d_input(x.shape, w_given, dy_cl, **kwargs)
        assert is_channels_last(dx) == cl
        numpy.testing.assert_array_equal(cupy.asnumpy(dx), cupy.asnumpy(cuconv.conv2d_input(x.shape, w, dy, **kwargs)))
    for dy_given in (dy, dy_cl):
        dw = cuconv.conv2d_weight(x_cl, w.shape, dy_given, **kwargs)
        assert is_channels_last(dw) == cl
        numpy.testing.assert_array_equal(cupy.asnumpy(dw), cupy.asnumpy(cuconv.conv2d_weight(x, w.shape, dy, **kwargs)))


@pytest.mark.parametrize("x_shape,w_shape", [((2, 8, 5, 5), (1, 8, 3, 3)), ((2, 8, 3, 3), (4, 8, 3, 3)),
                                             ((1, 8, 5, 6), (4, 8, 3, 3)), ((2, 1, 5, 5), (4, 1, 3, 3))],
                         ids=["one_filter", "one_pixel_out", "batch1", "one_channel"])
def test_custom_ops_fake_strides_are_the_real_ones(x_shape, w_shape):
    """torch.compile's view of the custom ops (their fake implementations) and what they return agree on every
    stride, extent-1 dimensions included, for channels-last operands computed on NCHW copies (the CPU path)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import cuconv.nn.functional  # noqa: F401  (registers the ops)

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(x_shape, generator=gen, dtype=torch.float64).contiguous(memory_format=CL)
    w = torch.randn(w_shape, generator=gen, dtype=torch.float64).contiguous(memory_format=CL)
    geometry = ([1, 1], [0, 0, 0, 0], [1, 1], 1, "auto", "ieee")
    y = torch.ops.cuconv.conv2d(x, w, None, *geometry)
    dx = torch.ops.cuconv.conv2d_input(list(x.shape), w, y, *geometry)
    with FakeTensorMode() as mode:
        fy = torch.ops.cuconv.conv2d(mode.from_tensor(x), mode.from_tensor(w), None, *geometry)
        fdx = torch.ops.cuconv.conv2d_input(list(x.shape), mode.from_tensor(w), mode.from_tensor(y), *geometry)
    assert (fy.shape, fy.stride()) == (y.shape, y.stride())
    assert (fdx.shape, fdx.stride()) == (dx.shape, dx.stride())
    theirs = torch.nn.functional.conv2d(x, w)  # (the format torch gives: channels-last but where C = 1 makes it NCHW)
    assert y.is_contiguous(memory_format=CL) == theirs.is_contiguous(memory_format=CL)
    assert y.is_contiguous() == theirs.is_contiguous()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_grouped_channels_last_layer_reads_its_weight_in_place(dtype):
    """RegNet's stride-1 layers of 16-channel groups, channels-last: the forward (a block-diagonal weight) and the
    dgrad (grouped_mma) both read the channels-last weight where it is, so no pass copies it (a copy kernel a
    step where the dgrad's plan took KCRS weights), and its gradient comes back channels-last."""
    import cuconv.nn
    from cuconv.nn import functional

    net = cuconv.nn.Conv2d(320, 320, 3, padding=1, groups=20, bias=False).to("cuda", dtype).to(memory_format=CL)
    x = torch.randn(32, 320, 14, 14, device="cuda", dtype=dtype).contiguous(memory_format=CL).requires_grad_()
    functional._layers.clear()

    def step():
        z = net(x)
        return torch.autograd.grad(z, [x, net.weight], torch.ones_like(z))
    step()
    layer, = functional._layers.values()
    assert layer.w_format is CL and layer.nhwc["dgrad"] == "grouped_mma", (layer.w_format, layer.nhwc)
    names = _kernels(step)
    assert names and not [n for n in names if "at::native" in n and "fill" not in n.lower()], names  # (ones_like)
    dx, dw = step()
    assert dx.is_contiguous(memory_format=CL) and dw.stride() == net.weight.stride()


@pytest.mark.gpu
def test_warmup_of_a_channels_last_model_plans_its_weights_in_place():
    """cuconv.nn.warmup on a channels-last model makes the layers its calls would: the channels-last weight read
    where it is (no copy a call) and its gradient channels-last."""
    import cuconv.nn
    from cuconv.nn import functional

    net = cuconv.nn.Conv2d(32, 64, 3, padding=1, bias=False).to("cuda", torch.float16).to(memory_format=CL)
    x = torch.randn(4, 32, 14, 14, device="cuda", dtype=torch.float16).contiguous(memory_format=CL)
    functional._layers.clear()
    assert cuconv.nn.warmup(net, x) == 1
    layer, = functional._layers.values()
    assert layer.w_format is CL and layer.krsc["wgrad"]
    net(x).float().sum().backward()
    assert net.weight.grad.stride() == net.weight.stride()
    assert len(functional._layers) == 1  # (the call found the warmed-up layer)
