"""``cuconv.nn`` on CPU tensors: ``functional.conv2d`` (an autograd.Function in eager mode, custom ops with
autograd formulas under ``torch.compile`` and for double backward, forward-mode AD), the ``Conv2d`` drop-in,
``convert`` and ``torch.compile``, all against torch in float64.
"""

import copy

import ml_dtypes
import numpy
import pytest
import torch

import cuconv.backward
import cuconv.nn
import cuconv.nn.functional as F
from cases import CASES, TORCH_ERROR_FACTOR, bound, make_inputs, rel_err, tolerance

# torch notes that 'same' with an even kernel may copy the input; the oracle does not care.
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")

F64_TOL = tolerance(numpy.float64)


def _tensors(case, dtype=torch.float64, seed=0):
    """(x, w, b-or-None) of ``case`` as leaf tensors of ``dtype`` that require grad."""
    return tuple(None if a is None else torch.from_numpy(a).to(dtype).requires_grad_()
                 for a in make_inputs(case, seed=seed))


def _grad_output(y, seed=1):
    return torch.from_numpy(numpy.random.default_rng(seed).standard_normal(tuple(y.shape))).to(y.dtype)


def _forward_and_grads(conv, tensors, kwargs, dy=None):
    """[y, grad of each tensor that requires grad] for ``conv(*tensors, **kwargs)`` and grad_output ``dy``."""
    y = conv(*tensors, **kwargs)
    live = [t for t in tensors if t is not None and t.requires_grad]
    grads = torch.autograd.grad(y, live, _grad_output(y) if dy is None else dy)
    return [y.detach()] + list(grads)


def _as_f64(tensors):
    return tuple(None if t is None else t.detach().double().requires_grad_(t.requires_grad) for t in tensors)


def _assert_all_close(got, expected, tol=F64_TOL):
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a.shape == b.shape, i
        assert rel_err(a.detach().double().numpy(), b.detach().double().numpy()) <= tol, i


# ----- functional.conv2d ------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_forward_and_grads_match_torch_float64(case):
    tensors = _tensors(case)
    ours = _forward_and_grads(F.conv2d, tensors, case.kwargs)
    assert ours[0].dtype == torch.float64
    _assert_all_close(ours, _forward_and_grads(torch.nn.functional.conv2d, tensors, case.kwargs))


NUMPY_DTYPE = {torch.float16: numpy.float16, torch.bfloat16: ml_dtypes.bfloat16}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES)
def test_half_precisions_no_worse_than_torch(case, dtype):
    # torch's CPU backend runs float16 and bfloat16 conv2d forward and backward (checked with torch 2.13),
    # so "≤ 2x torch's own error, both against float64 of the same rounded values" applies to every output.
    tensors = _tensors(case, dtype)
    dy = _grad_output(torch.nn.functional.conv2d(*_as_f64(tensors), **case.kwargs)).to(dtype)
    ours = _forward_and_grads(F.conv2d, tensors, case.kwargs, dy)
    theirs = _forward_and_grads(torch.nn.functional.conv2d, tensors, case.kwargs, dy)
    refs = _forward_and_grads(torch.nn.functional.conv2d, _as_f64(tensors), case.kwargs, dy.double())
    for i, (got, torch_got, ref) in enumerate(zip(ours, theirs, refs)):
        assert got.dtype == dtype, i
        err = rel_err(got.double().numpy(), ref.numpy())
        torch_err = rel_err(torch_got.double().numpy(), ref.numpy())
        assert err <= bound(ref.numpy(), NUMPY_DTYPE[dtype]), i
        assert err <= TORCH_ERROR_FACTOR * torch_err, i


GRADCHECK_CASES = [
    pytest.param((2, 2, 5, 4), (3, 2, 3, 2), True, dict(), id="bias"),
    pytest.param((1, 4, 5, 5), (4, 2, 3, 3), True, dict(groups=2, padding=1), id="groups2"),
    pytest.param((1, 3, 5, 4), (3, 1, 2, 2), False, dict(groups=3), id="depthwise"),
    pytest.param((2, 2, 7, 6), (2, 2, 2, 3), True, dict(stride=(2, 1), dilation=(1, 2), padding=(1, 2)),
                 id="stride_dilation_padding"),
    pytest.param((1, 2, 5, 6), (2, 2, 2, 4), True, dict(padding="same"), id="same_even_kernel"),
    pytest.param((2, 5, 5), (3, 2, 3, 3), True, dict(padding=1), id="unbatched"),
]


@pytest.mark.parametrize("x_shape,w_shape,bias,kwargs", GRADCHECK_CASES)
def test_gradcheck(x_shape, w_shape, bias, kwargs):
    gen = torch.Generator().manual_seed(11)
    make = lambda shape: torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)
    inputs = (make(x_shape), make(w_shape)) + ((make(w_shape[:1]),) if bias else ())
    assert torch.autograd.gradcheck(lambda *t: F.conv2d(*t, **kwargs), inputs)


@pytest.mark.parametrize("x_shape,w_shape,bias,kwargs", GRADCHECK_CASES)
def test_gradgradcheck(x_shape, w_shape, bias, kwargs):
    """Double backward (gradient penalties, MAML, Hessian-vector products): dgrad and wgrad have formulas of their
    own, each again a convolution."""
    gen = torch.Generator().manual_seed(12)
    make = lambda shape: torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)
    inputs = (make(x_shape), make(w_shape)) + ((make(w_shape[:1]),) if bias else ())
    assert torch.autograd.gradgradcheck(lambda *t: F.conv2d(*t, **kwargs), inputs)


def test_gradient_penalty_matches_torch():
    """A WGAN-GP style penalty: the norm of d(out)/d(x), differentiated again with respect to the weight."""
    gen = torch.Generator().manual_seed(13)
    x = torch.randn(2, 3, 7, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    results = []
    for conv in (F.conv2d, torch.nn.functional.conv2d):
        (gx,) = torch.autograd.grad(conv(x, w, padding=1, stride=2).tanh().sum(), x, create_graph=True)
        results.append(torch.autograd.grad(gx.square().sum(), w)[0])
    _assert_all_close([results[0]], [results[1]])


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # (torch.func's import)
@pytest.mark.parametrize("x_shape,w_shape,bias,kwargs", GRADCHECK_CASES)
def test_forward_mode_ad_matches_torch(x_shape, w_shape, bias, kwargs):
    """Tangents through torch.func.jvp and torch.autograd.forward_ad equal torch's (never zeros, never None)."""
    import torch.autograd.forward_ad as fwAD

    gen = torch.Generator().manual_seed(14)
    make = lambda shape: torch.randn(shape, generator=gen, dtype=torch.float64)
    primals = (make(x_shape), make(w_shape)) + ((make(w_shape[:1]),) if bias else ())
    tangents = tuple(make(p.shape) for p in primals)
    ours = lambda *t: F.conv2d(*t, **kwargs)
    ref = lambda *t: torch.nn.functional.conv2d(*t, **kwargs)
    _assert_all_close([torch.func.jvp(ours, primals, tangents)[1]], [torch.func.jvp(ref, primals, tangents)[1]])
    with fwAD.dual_level():
        got = fwAD.unpack_dual(ours(fwAD.make_dual(primals[0], tangents[0]), *primals[1:])).tangent
        expected = fwAD.unpack_dual(ref(fwAD.make_dual(primals[0], tangents[0]), *primals[1:])).tangent
    assert got is not None
    _assert_all_close([got], [expected])


@pytest.mark.parametrize("needs", [(True, False, False), (False, True, False), (False, False, True),
                                   (True, True, False)], ids=["x", "w", "b", "x_w"])
def test_backward_runs_only_needed_grads(needs, monkeypatch):
    import cuconv.cpu.reference

    calls = []
    for name in ("dgrad", "wgrad"):
        real = getattr(cuconv.cpu.reference, name)
        monkeypatch.setattr(cuconv.cpu.reference, name,
                            lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    gen = torch.Generator().manual_seed(13)
    x, w, b = (torch.randn(shape, generator=gen, dtype=torch.float64).requires_grad_(need)
               for shape, need in zip(((2, 3, 6, 5), (4, 3, 3, 3), (4,)), needs))
    y = F.conv2d(x, w, b, padding=1)
    y.backward(_grad_output(y))
    assert calls == [name for name, need in zip(("dgrad", "wgrad"), needs) if need]
    assert [t.grad is not None for t in (x, w, b)] == list(needs)
    _assert_all_close([t.grad for t in (x, w, b) if t.requires_grad],
                      _forward_and_grads(torch.nn.functional.conv2d, (x, w, b), dict(padding=1),
                                         _grad_output(y))[1:])


@pytest.mark.parametrize("kwargs", [dict(padding=1), dict(stride=2, groups=3)], ids=["dense", "grouped_s2"])
def test_cpu_path_multiplies_through_torch_not_numpy(kwargs, monkeypatch):
    """Every GEMM of the CPU path under cuconv.nn runs as torch's matmul (on torch's threads): NumPy's BLAS threads
    spinning beside torch's made a converted model's CPU training step several times slower on two cores."""
    import cuconv.nn._bridge as bridge

    def numpy_blas(a, b):
        raise AssertionError("the CPU path multiplied through NumPy")

    calls = []
    real = bridge._torch_matmul
    monkeypatch.setattr(numpy, "matmul", numpy_blas)
    monkeypatch.setattr(bridge, "_torch_matmul", lambda a, b: calls.append(a.shape) or real(a, b))
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 6, 9, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(12, 6 // kwargs.get("groups", 1), 3, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    y = F.conv2d(x, w, **kwargs)
    y.backward(_grad_output(y))
    assert len(calls) >= 3  # forward, dgrad, wgrad
    _assert_all_close([y, x.grad, w.grad],
                      _forward_and_grads(torch.nn.functional.conv2d, (x, w), kwargs, _grad_output(y)))


def test_noncontiguous_tensors_and_expanded_grad_output():
    # channels_last input and weight, a transposed view, and y.sum()'s grad_output (an expanded tensor of
    # stride 0) all cross into the arrays as the values they hold.
    gen = torch.Generator().manual_seed(14)
    x = torch.randn(2, 3, 9, 7, generator=gen, dtype=torch.float64).to(memory_format=torch.channels_last)
    w = torch.randn(4, 3, 3, 2, generator=gen, dtype=torch.float64).to(memory_format=torch.channels_last)
    b = torch.randn(8, generator=gen, dtype=torch.float64)[::2]
    xt = torch.randn(2, 3, 7, 9, generator=gen, dtype=torch.float64).transpose(2, 3)
    for inputs in ((x, w, b), (xt, w, b)):
        inputs = tuple(t.requires_grad_() for t in inputs)
        assert not any(t.is_contiguous() for t in inputs)
        got = [F.conv2d(*inputs, stride=(2, 1), padding=1).sum()]
        got += torch.autograd.grad(got[0], inputs)
        expected = [torch.nn.functional.conv2d(*inputs, stride=(2, 1), padding=1).sum()]
        expected += torch.autograd.grad(expected[0], inputs)
        _assert_all_close(got, expected)


def _misuse(**kwargs):
    """A call of cuconv.nn.functional.conv2d on valid float64 tensors with some arguments replaced."""
    def call():
        gen = torch.Generator().manual_seed(15)
        args = dict(input=torch.randn(2, 4, 8, 8, generator=gen, dtype=torch.float64),
                    weight=torch.randn(6, 4, 3, 3, generator=gen, dtype=torch.float64),
                    bias=torch.randn(6, generator=gen, dtype=torch.float64))
        args.update({k: (v(args) if callable(v) else v) for k, v in kwargs.items()})
        return F.conv2d(args.pop("input"), args.pop("weight"), args.pop("bias"), **args)
    return call


MISUSES = [
    # ----- non-tensors -----------------------------------------------------------------------------------
    pytest.param(_misuse(input=lambda a: a["input"].numpy()), TypeError,
                 r"conv2d\(\): argument 'input' must be Tensor, not ndarray", id="input_numpy"),
    pytest.param(_misuse(input=lambda a: a["input"].tolist()), TypeError,
                 r"conv2d\(\): argument 'input' must be Tensor, not list", id="input_list"),
    pytest.param(_misuse(weight=lambda a: a["weight"].numpy()), TypeError,
                 r"conv2d\(\): argument 'weight' must be Tensor, not ndarray", id="weight_numpy"),
    pytest.param(_misuse(bias=lambda a: a["bias"].tolist()), TypeError,
                 r"conv2d\(\): argument 'bias' must be Tensor, not list", id="bias_list"),
    pytest.param(_misuse(weight=None), TypeError, r"conv2d\(\): argument 'weight' must be Tensor, not NoneType",
                 id="weight_none"),
    # ----- ranks -----------------------------------------------------------------------------------------
    pytest.param(_misuse(input=lambda a: a["input"][0, 0]), ValueError,
                 r"Expected 3D \(unbatched\) or 4D \(batched\) input to conv2d, but got input of size: \[8, 8\]",
                 id="input_2d"),
    pytest.param(_misuse(input=lambda a: a["input"][None]), ValueError,
                 r"Expected 3D \(unbatched\) or 4D \(batched\) input to conv2d, but got input of size: "
                 r"\[1, 2, 4, 8, 8\]", id="input_5d"),
    pytest.param(_misuse(weight=lambda a: a["weight"][0]), ValueError,
                 r"expected stride to be a single integer value or a list of 1 values to match the convolution "
                 r"dimensions, but got stride=\[", id="weight_3d"),
    pytest.param(_misuse(weight=lambda a: a["weight"][0, 0]), ValueError,
                 r"weight should have at least three dimensions", id="weight_2d"),
    # ----- dtypes ----------------------------------------------------------------------------------------
    pytest.param(_misuse(weight=lambda a: a["weight"].float()), TypeError,
                 r"Input type \(torch\.float64\) and weight type \(torch\.float32\) should be the same",
                 id="dtype_mismatch_weight"),
    pytest.param(_misuse(bias=lambda a: a["bias"].half()), TypeError,
                 r"Input type \(torch\.float64\) and bias type \(torch\.float16\) should be the same",
                 id="dtype_mismatch_bias"),
    pytest.param(_misuse(input=lambda a: a["input"].long(), weight=lambda a: a["weight"].long(), bias=None),
                 TypeError, r"cuconv: input dtype torch\.int64 is not supported; expected one of torch\.float16, "
                 r"torch\.bfloat16, torch\.float32, torch\.float64", id="dtype_int64"),
    pytest.param(_misuse(input=lambda a: a["input"].int(), weight=lambda a: a["weight"].int(), bias=None),
                 TypeError, r"cuconv: input dtype torch\.int32 is not supported", id="dtype_int32"),
    pytest.param(_misuse(input=lambda a: a["input"].cdouble(), weight=lambda a: a["weight"].cdouble(), bias=None),
                 TypeError, r"cuconv: input dtype torch\.complex128 is not supported", id="dtype_complex"),
    # ----- bias, geometry, device ------------------------------------------------------------------------
    pytest.param(_misuse(bias=lambda a: a["bias"][:5]), ValueError,
                 r"Given weight of size \[6, 4, 3, 3\], expected bias to be 1-dimensional with 6 elements, but "
                 r"got bias of size \[5\] instead", id="bias_wrong_length"),
    pytest.param(_misuse(bias=lambda a: a["bias"][None]), ValueError,
                 r"expected bias to be 1-dimensional with 6 elements, but got bias of size \[1, 6\] instead",
                 id="bias_2d"),
    pytest.param(_misuse(weight=lambda a: a["weight"][:, :3]), ValueError,
                 r"Given groups=1, weight of size \[6, 3, 3, 3\], expected input\[2, 4, 8, 8\] to have 3 "
                 r"channels, but got 4 channels instead", id="channel_mismatch"),
    pytest.param(_misuse(groups=4), ValueError,
                 r"Given groups=4, expected weight to be divisible by 4 at dimension 0", id="groups_not_dividing_K"),
    pytest.param(_misuse(padding="same", stride=2), ValueError,
                 r"padding='same' is not supported for strided convolutions", id="same_strided"),
    pytest.param(_misuse(weight=lambda a: a["weight"].to("meta")), ValueError,
                 r"Expected all tensors to be on the same device, but found input on cpu and weight on meta",
                 id="weight_on_other_device"),
    # ----- algo ------------------------------------------------------------------------------------------
    pytest.param(_misuse(algo="fft"), ValueError,
                 r"cuconv: unknown algo 'fft'; expected 'auto' or one of \('im2col_gemm',", id="algo_unknown"),
    pytest.param(_misuse(algo=None), TypeError, r"conv2d\(\): argument 'algo' must be str, not NoneType",
                 id="algo_not_str"),
]


@pytest.mark.parametrize("misuse,exc,message", MISUSES)
def test_misuse_raises_what_torch_raises(misuse, exc, message, monkeypatch):
    """Where torch's conv2d refuses the same call, our exception is also of torch's class (RuntimeError for
    shapes, dtypes and geometry), besides the ValueError/TypeError of cuconv's array API."""
    monkeypatch.setattr(F, "conv2d", lambda *a, algo="auto", **k: torch.nn.functional.conv2d(*a, **k))
    try:
        misuse()
        theirs = None
    except Exception as caught:  # torch's class, whatever it is
        theirs = type(caught)
    monkeypatch.undo()
    with pytest.raises(exc) as ours:
        misuse()
    if theirs is not None:
        assert isinstance(ours.value, theirs), (type(ours.value), theirs)


@pytest.mark.parametrize("misuse,exc,message", MISUSES)
def test_misuse_raises(misuse, exc, message):
    with pytest.raises(exc, match=message):
        misuse()


def _opcheck_samples():
    gen = torch.Generator().manual_seed(16)
    t = lambda *shape, grad=False: torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=grad)
    # stride (2, 1), four-sided padding (top 1, bottom 1, left 0, right 1), dilation (1, 2), groups 2
    geometry = ([2, 1], [1, 1, 0, 1], [1, 2], 2, "auto", "ieee")
    ops = torch.ops.cuconv
    return [
        pytest.param(ops.conv2d.default, (t(2, 4, 6, 7, grad=True), t(6, 2, 3, 2, grad=True), t(6, grad=True))
                     + geometry, id="conv2d"),
        pytest.param(ops.conv2d.default, (t(2, 4, 6, 7, grad=True), t(6, 2, 3, 2, grad=True), None) + geometry,
                     id="conv2d_no_bias"),
        pytest.param(ops.conv2d.default, (t(1, 3, 5, 5), t(2, 3, 1, 1), None, [1, 1], [0, 0, 0, 0], [1, 1], 1,
                                          "auto", "ieee"), id="conv2d_pointwise"),
        pytest.param(ops.conv2d_input.default, ([2, 4, 6, 7], t(6, 2, 3, 2), t(2, 6, 3, 6)) + geometry,
                     id="conv2d_input"),
        pytest.param(ops.conv2d_weight.default, (t(2, 4, 6, 7), [6, 2, 3, 2], t(2, 6, 3, 6)) + geometry,
                     id="conv2d_weight"),
        pytest.param(ops.conv2d_bias_grad.default, (t(2, 6, 3, 6),), id="conv2d_bias_grad"),
    ]


@pytest.mark.parametrize("op,args", _opcheck_samples())
def test_opcheck(op, args):
    # Schema, autograd registration, fake (meta) implementation and AOT dispatch with dynamic shapes. The
    # backward ops are checked with inputs that do not require grad: they have no autograd formula.
    result = torch.library.opcheck(op, args)
    assert result and all(v == "SUCCESS" for v in result.values()), result


# ----- cuconv.nn.Conv2d ------------------------------------------------------------------------------------
MODULE_CONFIGS = [
    pytest.param((3, 8, 3), dict(), id="k3"),
    pytest.param((3, 8, (3, 5)), dict(padding="same"), id="tuple_kernel_same"),
    pytest.param((4, 6, (3, 2)), dict(stride=2, padding=1, groups=2, bias=False), id="groups2_no_bias"),
    pytest.param((4, 4, 3), dict(groups=4, dilation=2, padding=2, padding_mode="reflect"), id="depthwise_reflect"),
    pytest.param((3, 5, (2, 4)), dict(padding="same", dtype=torch.float64), id="same_even_float64"),
    pytest.param((2, 3, 1), dict(stride=(2, 1), padding=1, padding_mode="circular", bias=False),
                 id="pointwise_circular"),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("args,kwargs", MODULE_CONFIGS)
def test_seeded_parameters_bit_identical(args, kwargs, seed):
    torch.manual_seed(seed)
    theirs = torch.nn.Conv2d(*args, **kwargs)
    theirs_rng = torch.get_rng_state()
    torch.manual_seed(seed)
    ours = cuconv.nn.Conv2d(*args, **kwargs)
    assert torch.equal(torch.get_rng_state(), theirs_rng)  # the same draws, in the same order
    assert torch.equal(ours.weight, theirs.weight)
    assert ours.weight.dtype == theirs.weight.dtype
    assert (ours.bias is None) == (theirs.bias is None)
    assert ours.bias is None or torch.equal(ours.bias, theirs.bias)


@pytest.mark.parametrize("direction", ["torch_to_cuconv", "cuconv_to_torch"])
@pytest.mark.parametrize("args,kwargs", MODULE_CONFIGS)
def test_state_dict_round_trip(args, kwargs, direction):
    classes = [torch.nn.Conv2d, cuconv.nn.Conv2d]
    src_cls, dst_cls = classes if direction == "torch_to_cuconv" else classes[::-1]
    torch.manual_seed(0)
    src = src_cls(*args, **kwargs)
    torch.manual_seed(1)
    dst = dst_cls(*args, **kwargs)
    state = src.state_dict()
    assert list(dst.state_dict()) == list(state)
    result = dst.load_state_dict(state, strict=True)
    assert (result.missing_keys, result.unexpected_keys) == ([], [])
    assert all(torch.equal(dst.state_dict()[key], value) for key, value in state.items())


@pytest.mark.parametrize("args,kwargs", MODULE_CONFIGS)
def test_extra_repr(args, kwargs):
    theirs = torch.nn.Conv2d(*args, **kwargs)
    ours = cuconv.nn.Conv2d(*args, **kwargs)
    assert ours.extra_repr() == theirs.extra_repr()
    assert repr(ours) == repr(theirs)
    forced = cuconv.nn.Conv2d(*args, **kwargs, algo="im2col_gemm")
    assert forced.extra_repr() == f"{theirs.extra_repr()}, algo='im2col_gemm'"


def test_is_a_torch_conv2d():
    conv = cuconv.nn.Conv2d(3, 4, 3)
    assert isinstance(conv, torch.nn.Conv2d)
    assert conv.algo == "auto"
    assert cuconv.nn.Conv2d(3, 4, 3, algo="im2col_gemm").algo == "im2col_gemm"


@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("x_shape,args,kwargs", [
    pytest.param((2, 3, 7, 8), (3, 4, (3, 2)), dict(stride=(1, 2), padding=(1, 2), dilation=(1, 2)),
                 id="k3x2_s1x2_p1x2_d1x2"),
    pytest.param((2, 4, 6, 7), (4, 6, (4, 2)), dict(padding="same", groups=2), id="same_even_groups2"),
    pytest.param((3, 6, 5), (3, 2, 3), dict(padding=1, bias=False), id="unbatched_no_bias"),
])
def test_padding_modes_match_torch(x_shape, args, kwargs, mode):
    torch.manual_seed(17)
    theirs = torch.nn.Conv2d(*args, **kwargs, padding_mode=mode, dtype=torch.float64)
    ours = cuconv.nn.Conv2d(*args, **kwargs, padding_mode=mode, dtype=torch.float64)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(x_shape, dtype=torch.float64, requires_grad=True)
    results = []
    for module in (ours, theirs):
        y = module(x)
        inputs = [x] + list(module.parameters())
        results.append([y.detach()] + list(torch.autograd.grad(y, inputs, _grad_output(y))))
    _assert_all_close(*results)


# ----- convert -------------------------------------------------------------------------------------------
class BasicBlock(torch.nn.Module):
    """ResNet's basic block, from torch.nn layers."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.downsample = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                              torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.downsample(x))


class OwnConv(torch.nn.Conv2d):
    """A user's subclass with a method of its own: convert leaves it alone."""

    def flops(self):
        return self.weight.numel()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # No bias before a BatchNorm (its gradient would be zero up to rounding), as in ResNet.
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 4, (3, 2), padding="same", padding_mode="replicate",
                                                        bias=False),
                                        torch.nn.BatchNorm2d(4), torch.nn.ReLU())
        self.block = BasicBlock(4, 6, stride=2)
        self.mix = torch.nn.Sequential(torch.nn.Conv2d(6, 6, (1, 2), groups=2), OwnConv(6, 6, 1))
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.mix(self.block(self.stem(x))).mean((2, 3)))


def _net():
    torch.manual_seed(18)
    return Net().double()


def _inputs(seed=19):
    return torch.randn(2, 3, 9, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


PLAIN_CONVS = ["stem.0", "block.conv1", "block.conv2", "block.downsample.0", "mix.0"]


@pytest.mark.parametrize("algo", ["auto", "im2col_gemm"])
def test_convert_replaces_plain_convs_and_keeps_everything_else(algo):
    model = _net()
    model.block.eval()  # a mixed training state must survive
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    training = {name: m.training for name, m in modules.items()}
    keys = list(model.state_dict())
    assert cuconv.nn.convert(model, algo=algo) is model
    after = dict(model.named_modules())
    assert list(after) == list(modules)
    for name, module in after.items():
        if name in PLAIN_CONVS:
            assert type(module) is cuconv.nn.Conv2d and module.algo == algo, name
        else:
            assert module is modules[name], name
        assert module.training == training[name], name
    assert type(model.mix[1]) is OwnConv
    assert all(p is params[name] for name, p in model.named_parameters())
    assert all(b is buffers[name] for name, b in model.named_buffers())
    assert all(p.dtype == torch.float64 for p in model.parameters())
    assert list(model.state_dict()) == keys


def test_convert_takes_subclasses_that_add_no_behaviour_as_the_plain_convolution():
    """A subclass adding only a constructor and static methods (torchvision's video models build with such
    Conv3d subclasses) converts as the plain one, its state kept; one with a method of its own stays, named."""
    import warnings

    class Simple(torch.nn.Conv3d):
        def __init__(self, cin, cout):
            super().__init__(cin, cout, 3, padding=1, bias=False)

        @staticmethod
        def get_downsample_stride(stride):
            return stride, stride, stride

    class Simple2d(torch.nn.Conv2d):
        """Documented, nothing else."""

    model = torch.nn.Sequential(Simple(2, 3), torch.nn.Flatten(1, 2), Simple2d(12, 4, 1), OwnConv(4, 4, 1)).double()
    x = torch.randn(2, 2, 4, 5, 6, dtype=torch.float64)
    want = model(x)
    weight = model[0].weight
    with pytest.warns(UserWarning, match=r"3: a subclass of torch.nn.Conv2d with methods of its own"):
        cuconv.nn.convert(model)
    assert type(model[0]) is cuconv.nn.Conv3d and model[0].weight is weight
    assert type(model[2]) is cuconv.nn.Conv2d and type(model[3]) is OwnConv
    assert rel_err(model(x).detach().numpy(), want.detach().numpy()) <= F64_TOL
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cuconv.nn.convert(torch.nn.Sequential(Simple(2, 3)))


def test_convert_single_conv_keeps_parameters_and_hooks():
    conv = torch.nn.Conv2d(3, 4, 3, padding=1, dtype=torch.float64)
    seen = []
    conv.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    new = cuconv.nn.convert(conv)
    assert type(new) is cuconv.nn.Conv2d
    assert new.weight is conv.weight and new.bias is conv.bias
    y = new(_inputs())
    assert seen == [y.shape]
    assert rel_err(y.detach().numpy(), conv(_inputs()).detach().numpy()) <= F64_TOL


def test_converted_model_trains_like_the_original():
    reference = _net()
    model = copy.deepcopy(reference)
    # Optimizers made before convert: they hold the Parameter objects the converted model keeps using.
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    cuconv.nn.convert(model)
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    for step in range(2):
        x = _inputs(seed=20 + step)
        outputs = []
        for net, optimizer in ((model, opt), (reference, opt_ref)):
            optimizer.zero_grad()
            y = net(x)
            y.square().sum().backward()
            outputs.append(y.detach())
            optimizer.step()
        _assert_all_close([outputs[0]], [outputs[1]])
        _assert_all_close([p.grad for p in model.parameters()], [p.grad for p in reference.parameters()])
    _assert_all_close(list(model.parameters()), list(reference.parameters()))
    _assert_all_close(list(model.buffers()), list(reference.buffers()))
    assert all(not torch.equal(p, initial[name]) for name, p in model.named_parameters())


@pytest.fixture
def fresh_dynamo():
    yield
    torch._dynamo.reset()


# torch.compile imports torch.jit, which warns about its own deprecation.
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_compiled_converted_model_matches_eager(fresh_dynamo):
    model = cuconv.nn.convert(_net())
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, fullgraph=True)
    x = _inputs()
    results = []
    for net in (compiled, eager):
        y = net(x)
        results.append([y.detach()] + list(torch.autograd.grad(y.square().sum(), list(net.parameters()))))
    _assert_all_close(*results)


def test_unknown_algo_is_refused_when_the_module_is_built():
    with pytest.raises(ValueError, match=r"unknown algo 'nope'"):
        cuconv.nn.Conv2d(2, 3, 3, algo="nope")


def test_a_forced_algo_runs_or_is_refused_on_the_cpu_as_on_the_gpu():
    """On CPU tensors a forced algorithm the GPU could run gives the auto path's result; one it would refuse (not
    a depthwise convolution, float64 on tensor cores) is refused before anything runs, in the GPU's words."""
    x, w = torch.randn(2, 4, 9, 9, dtype=torch.float64), torch.randn(6, 4, 3, 3, dtype=torch.float64)
    want = torch.nn.functional.conv2d(x, w, padding=1)
    got = cuconv.nn.functional.conv2d(x, w, padding=1, algo="im2col_gemm")
    assert (got - want).abs().max() <= 1e-12 * want.abs().max()
    with pytest.raises(NotImplementedError, match=r"cuconv: algo 'depthwise' cannot run this fprop: "):
        cuconv.nn.functional.conv2d(x, w, padding=1, algo="depthwise")
    with pytest.raises(NotImplementedError, match=r"cuconv: algo 'implicit_gemm' cannot run this fprop: "):
        cuconv.nn.Conv2d(4, 6, 3, padding=1, algo="implicit_gemm").double()(x)
    with pytest.raises(NotImplementedError, match=r"cuconv: algo 'depthwise' cannot run this fprop: "):
        cuconv.conv2d(x.numpy(), w.numpy(), padding=1, algo="depthwise")


def test_autocast_runs_in_its_lower_precision_like_torch():
    torch.manual_seed(31)
    ref = torch.nn.Conv2d(3, 4, 3)
    ours = cuconv.nn.convert(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)))[0]
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 9, 9)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, got = ref(x), ours(x)
    assert got.dtype == expected.dtype == torch.bfloat16
    assert rel_err(got.detach().double().numpy(), expected.detach().double().numpy()) <= 2e-2


@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["x_f32", "x_bf16", "x_f16"])
def test_autocast_casts_mixed_dtypes_before_any_check(mode, x_dtype):
    """Under autocast a bfloat16 activation meets float32 parameters (every layer after the first): cast as torch
    casts its convolution, then computed; gradients come back in each tensor's own dtype."""
    torch.manual_seed(32)
    ref = torch.nn.Conv2d(3, 4, 3, padding=1, padding_mode=mode)
    ours = cuconv.nn.Conv2d(3, 4, 3, padding=1, padding_mode=mode)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 9, 8).to(x_dtype)
    xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, got = ref(xr), ours(xo)
    assert got.dtype == expected.dtype == torch.bfloat16
    assert rel_err(got.detach().double().numpy(), expected.detach().double().numpy()) <= 2e-2
    dy = torch.randn(expected.shape, generator=torch.Generator().manual_seed(33)).to(torch.bfloat16)
    expected.backward(dy)
    got.backward(dy)
    assert xo.grad.dtype == x_dtype and ours.weight.grad.dtype == ours.bias.grad.dtype == torch.float32
    for a, b in ((xo.grad, xr.grad), (ours.weight.grad, ref.weight.grad), (ours.bias.grad, ref.bias.grad)):
        assert rel_err(a.double().numpy(), b.double().numpy()) <= 2e-2


def test_autocast_leaves_float64_alone():
    gen = torch.Generator().manual_seed(34)
    x, w = torch.randn(1, 2, 6, 6, generator=gen, dtype=torch.float64), torch.randn(3, 2, 3, 3, generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert F.conv2d(x, w.double()).dtype == torch.float64
        # float64 input, float32 weight: the weight is cast, the input is not; the types then differ, as in torch
        with pytest.raises(TypeError, match=r"Input type \(torch\.float64\) and weight type \(torch\.bfloat16\)"):
            F.conv2d(x, w)
    _assert_all_close([F.conv2d(x, w.double())], [torch.nn.functional.conv2d(x, w.double())])


def test_convert_replaces_every_use_of_a_shared_module():
    """A convolution used twice (in one Sequential, and under a second name elsewhere) becomes one converted
    module in every place, still shared."""
    conv = torch.nn.Conv2d(3, 3, 3, padding=1, dtype=torch.float64)
    model = torch.nn.Sequential(conv, torch.nn.ReLU(), conv)
    model.alias = conv
    x = _inputs()
    expected = model(x)
    cuconv.nn.convert(model)
    assert type(model[0]) is cuconv.nn.Conv2d and model[2] is model[0] and model.alias is model[0]
    assert model[0].weight is conv.weight
    _assert_all_close([model(x)], [expected])


def test_converted_module_has_hook_and_parameter_dicts_of_its_own():
    conv = torch.nn.Conv2d(3, 4, 3, dtype=torch.float64)
    before = []
    conv.register_forward_hook(lambda *a: before.append("before"))
    new = cuconv.nn.convert(conv)
    after = []
    new.register_forward_hook(lambda *a: after.append("new"))
    conv(_inputs())
    assert before == ["before"] and after == []  # the hook registered on the new module stays there
    new(_inputs())
    assert before == ["before", "before"] and after == ["new"]  # the old hook was carried over
    assert new._parameters is not conv._parameters and new.weight is conv.weight
    new.register_parameter("extra", torch.nn.Parameter(torch.zeros(1)))
    assert "extra" not in dict(conv.named_parameters())


@pytest.mark.parametrize("model,algo,exc,message", [
    (None, "auto", TypeError, r"convert\(\): argument 'model' must be a torch\.nn\.Module, not NoneType"),
    ("conv", "auto", TypeError, r"must be a torch\.nn\.Module, not str"),
    (torch.nn.Conv2d(1, 1, 1), "bogus", ValueError, r"cuconv: unknown algo 'bogus'"),
    (torch.nn.Conv2d(1, 1, 1), None, TypeError, r"convert\(\): argument 'algo' must be str, not NoneType"),
], ids=["none", "not_a_module", "unknown_algo", "algo_not_str"])
def test_convert_refuses_bad_arguments_at_once(model, algo, exc, message):
    with pytest.raises(exc, match=message):
        cuconv.nn.convert(model, algo=algo)


# ---- cuconv.nn.warmup ------------------------------------------------------------------------------------
class _Net(torch.nn.Module):
    """Convolutions of several kinds, one reused, one with a bias and reflect padding, one unbatched-safe."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8, padding_mode="reflect")
        self.pw = torch.nn.Conv2d(8, 8, 1)

    def forward(self, x, scale=1.0):
        x = torch.relu(self.bn(self.stem(x)))
        return self.pw(self.pw(self.dw(x))) * scale


def test_warmup_records_every_convolution_on_meta_tensors():
    from cuconv.nn import _warmup

    model = cuconv.nn.convert(_Net())
    x = torch.randn(2, 3, 17, 15)
    calls = _warmup._record_calls(model, (x,), {"scale": 2.0})
    got = [(tuple(c[0].shape), tuple(c[1].shape), c[2] is not None, c[7], c[10]) for c in calls]
    assert got == [((2, 3, 17, 15), (8, 3, 3, 3), False, 1, True), ((2, 8, 11, 10), (8, 1, 3, 3), True, 8, False),
                   ((2, 8, 9, 8), (8, 8, 1, 1), True, 1, False), ((2, 8, 9, 8), (8, 8, 1, 1), True, 1, False)]
    assert all(c[0].device.type == "meta" for c in calls)
    assert F._recorder is None and not model.bn.num_batches_tracked  # the model's own state untouched
    assert all(p.device.type == "cpu" for p in model.parameters())
    # an input that needs a gradient: the first layer's dgrad is wanted too
    assert not _warmup._record_calls(model, (x.requires_grad_(),), {})[0][10]


def test_warmup_keys_are_the_keys_real_calls_look_up():
    """A layer warmup keeps must be found by the call it was made for: the same key, built from shapes and
    strides (channels-last tensors and views among them)."""
    b = torch.randn(4)
    for x, w in ((torch.randn(2, 3, 9, 9), torch.randn(4, 3, 3, 3)),
                 (torch.randn(2, 3, 9, 9).to(memory_format=torch.channels_last), torch.randn(4, 3, 3, 3)),
                 (torch.randn(2, 3, 9, 12)[..., ::2][..., :5],
                  torch.randn(4, 3, 3, 3).to(memory_format=torch.channels_last))):
        for bias in (b, None):
            for stride, padding in (((2, 1), (1, 0)), (1, "same"), (2, 0)):
                if padding == "same" and stride != 1:
                    continue
                real = F._signature(x, w, bias, stride, padding, (1, 1), 1, "auto", cuconv.config.settings())
                made = F._signature_of(x.shape, x.stride(), x.dtype, -1, w.shape, w.stride(),
                                       bias is not None and bias.shape, stride, padding, (1, 1), 1, "auto",
                                       cuconv.config.workspace_limit, cuconv.config.benchmark)
                assert made == real and hash(made) == hash(real)


def test_warmup_has_nothing_to_do_on_the_cpu_and_refuses_bad_arguments():
    model = cuconv.nn.convert(_Net())
    assert cuconv.nn.warmup(model, torch.randn(1, 3, 8, 8)) == 0
    with pytest.raises(TypeError, match="must be a torch.nn.Module"):
        cuconv.nn.warmup("resnet", torch.randn(1, 3, 8, 8))
    with pytest.raises(ValueError, match="threads must be a positive int"):
        cuconv.nn.warmup(model, torch.randn(1, 3, 8, 8), threads=0)


def test_warmup_names_a_model_that_cannot_run_on_meta_tensors():
    from cuconv.nn import _warmup

    class DataDependent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = cuconv.nn.Conv2d(3, 3, 1)

        def forward(self, x):
            return self.conv(x) if x.sum().item() > 0 else x

    with pytest.raises(RuntimeError, match="could not run on meta tensors"):
        _warmup._record_calls(DataDependent(), (torch.randn(1, 3, 4, 4),), {})
    assert F._recorder is None


def _graph_tools_model():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                            torch.nn.Conv2d(8, 6, 1), torch.nn.ReLU()).eval()
    m[1].running_mean.normal_()
    m[1].running_var.uniform_(0.5, 2.0)
    return m


def graph_tools_agree(device: str, dtype=torch.float64):
    """torch.jit.trace (with and without gradients, and after a save/load round trip) of a converted and of a
    fused model gives torch's result on inputs other than the traced ones; torch.jit.script refuses with what to
    do; torch.ao.quantization.fuse_modules fuses cuconv's layers in eval mode (still cuconv's) and refuses
    quantization-aware training clearly. Shared by the CPU test and the GPU one (test_nn_gpu)."""
    import copy
    import io
    import warnings

    ref = _graph_tools_model().to(device, dtype)
    x, x2 = (torch.randn(2, 3, 9, 8, device=device, dtype=dtype) for _ in range(2))
    want = ref(x2)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for model in (cuconv.nn.convert(copy.deepcopy(ref)), cuconv.nn.convert(copy.deepcopy(ref), fuse=True)):
        for grad in (False, True):
            with torch.set_grad_enabled(grad), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                traced = torch.jit.trace(model, x)
            buffer = io.BytesIO()
            torch.jit.save(traced, buffer)
            buffer.seek(0)
            for t in (traced, torch.jit.load(buffer, map_location=device)):
                got = t(x2)
                assert float((got - want).norm() / want.norm()) <= tol
        with pytest.raises(RuntimeError, match="torch.jit.script cannot compile cuconv's .* torch.jit.trace"):
            torch.jit.script(model)
    converted = cuconv.nn.convert(copy.deepcopy(ref))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = torch.ao.quantization.fuse_modules(converted, [["0", "1", "2"], ["3", "4"]])
        assert isinstance(fused[0][0], cuconv.nn.Conv2d) and isinstance(fused[3][0], cuconv.nn.Conv2d)
        got = fused(x2)
        assert float((got - want).norm() / want.norm()) <= tol
        with pytest.raises(NotImplementedError, match="quantization-aware training"):
            torch.ao.quantization.fuse_modules_qat(cuconv.nn.convert(copy.deepcopy(ref)).train(), [["0", "1", "2"]])


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_graph_tools_on_converted_models():
    graph_tools_agree("cpu")


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_eager_quantization_refuses_cuconv_layers_clearly():
    """torch's eager-mode quantization passed cuconv's Conv2d over (a subclass: not in its mappings), leaving it
    float without a word: ``convert`` and ``prepare_qat`` now refuse it with what to do; a layer whose qconfig is
    None is left alone, as torch leaves its own."""
    import copy

    m = torch.nn.Sequential(torch.ao.quantization.QuantStub(), torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
                            torch.ao.quantization.DeQuantStub()).eval()
    c = cuconv.nn.convert(copy.deepcopy(m))
    c.qconfig = torch.ao.quantization.get_default_qconfig("x86")
    prepared = torch.ao.quantization.prepare(c)
    prepared(torch.randn(1, 3, 8, 8))
    with pytest.raises(NotImplementedError, match="has no quantized form; quantize the torch model"):
        torch.ao.quantization.convert(prepared)
    qat = cuconv.nn.convert(copy.deepcopy(m)).train()
    qat.qconfig = torch.ao.quantization.get_default_qat_qconfig("x86")
    with pytest.raises(NotImplementedError, match="has no quantized form"):
        torch.ao.quantization.prepare_qat(qat)
    skipped = cuconv.nn.convert(copy.deepcopy(m))
    skipped.qconfig = torch.ao.quantization.get_default_qconfig("x86")
    skipped[1].qconfig = None
    prepared = torch.ao.quantization.prepare(skipped)
    prepared(torch.randn(1, 3, 8, 8))
    assert type(torch.ao.quantization.convert(prepared)[1]) is cuconv.nn.Conv2d


def test_convert_says_which_convolutions_it_left_on_torch():
    """A LazyConv2d before its first forward and a parametrized Conv2d stay torch's, named in one warning with
    what to do; after the lazy one's forward it converts; a plain one converts without a warning."""
    import warnings

    lazy, normed = torch.nn.LazyConv2d(4, 3), torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv2d(3, 4, 3))
    model = torch.nn.Sequential(lazy, torch.nn.Sequential(normed), torch.nn.Conv2d(4, 4, 1))
    with pytest.warns(UserWarning, match=r"left these convolutions on torch: 0: a LazyConv2d before its first "
                                         r"forward \(run one forward, then convert\); 1\.0: a parametrized weight"):
        cuconv.nn.convert(model)
    assert model[0] is lazy and model[1][0] is normed and type(model[2]) is cuconv.nn.Conv2d
    lazy(torch.randn(1, 3, 6, 6))  # (it becomes a torch.nn.Conv2d)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        converted = cuconv.nn.convert(torch.nn.Sequential(lazy))
    assert type(converted[0]) is cuconv.nn.Conv2d


@pytest.mark.parametrize("kwargs", [dict(stride=torch.tensor(2)), dict(padding=torch.tensor(1)),
                                    dict(dilation=torch.tensor(2)), dict(groups=torch.tensor(1)),
                                    dict(stride=(torch.tensor(2), 1)), dict(stride=torch.tensor(True))],
                         ids=["stride", "padding", "dilation", "groups", "stride_pair", "stride_bool"])
def test_zero_dim_integer_tensors_are_geometry_arguments_as_in_torch(kwargs):
    x, w = torch.randn(1, 2, 7, 6, dtype=torch.float64), torch.randn(3, 2, 3, 3, dtype=torch.float64)
    want = torch.nn.functional.conv2d(x, w, **kwargs)
    assert torch.allclose(cuconv.nn.functional.conv2d(x, w, **kwargs), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_dtypes_without_a_path_raise_what_except_runtimeerror_catches(dtype):
    """torch raises RuntimeError (or computes) where cuconv has no kernel: cuconv's refusal is both a TypeError
    and a RuntimeError."""
    x, w = torch.ones(1, 2, 4, 4, dtype=dtype), torch.ones(3, 2, 3, 3, dtype=dtype)
    with pytest.raises(RuntimeError, match="is not supported") as info:
        cuconv.nn.functional.conv2d(x, w)
    assert isinstance(info.value, TypeError)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_fx_quantization_refuses_cuconv_layers_clearly():
    """FX-mode quantization traced through cuconv's layer to a call it has no pattern for, leaving the convolution
    float without a word: prepare_fx now refuses with what to do; plain fx tracing is unaffected."""
    import copy

    from torch.ao.quantization import get_default_qconfig_mapping, quantize_fx

    model = cuconv.nn.convert(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()).eval())
    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(NotImplementedError, match="has no quantized form; quantize the torch model"):
        quantize_fx.prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping("x86"), (x,))
    assert torch.equal(torch.fx.symbolic_trace(model)(x), model(x))
