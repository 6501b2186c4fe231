"""conv_transpose2d, conv1d and conv3d (``cuconv.variants``, ``cuconv.nn.functional``, ``cuconv.nn.ConvTranspose2d``,
``Conv1d`` and ``Conv3d``, ``convert``) against torch's in float64: outputs, gradients, the modules as drop-ins, and every
refusal in torch's words; on the CPU and (marked) on the GPU."""

from __future__ import annotations

import numpy
import pytest

torch = pytest.importorskip("torch")

import cuconv  # noqa: E402
import cuconv.nn  # noqa: E402
import cuconv.nn.functional as F  # noqa: E402

_DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
_TF = torch.nn.functional

# (input, weight, keywords): transposed convolutions of decoders and odd ones
_TRANSPOSED = [
    pytest.param((2, 4, 5, 6), (4, 3, 3, 2), dict(), id="plain"),
    pytest.param((2, 8, 7, 7), (8, 4, 4, 4), dict(stride=2, padding=1), id="unet_up_4x4_s2"),
    pytest.param((1, 6, 5, 4), (6, 5, 2, 2), dict(stride=2), id="up_2x2_s2_batch1"),
    pytest.param((2, 4, 5, 6), (4, 3, 3, 3), dict(stride=2, padding=1, output_padding=1), id="output_padding"),
    pytest.param((3, 6, 4, 5), (6, 2, 3, 2), dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2),
                                                 dilation=(1, 2), groups=3), id="groups_dilation_rect"),
    pytest.param((4, 5, 6), (4, 2, 3, 3), dict(padding=1), id="unbatched"),
    pytest.param((2, 6, 5, 5), (6, 1, 3, 3), dict(stride=2, padding=1, groups=6), id="depthwise"),
    # an output padding at or past the stride (allowed below the dilation): positions no window reaches
    pytest.param((1, 2, 3, 3), (2, 2, 2, 2), dict(output_padding=1, dilation=2), id="output_padding_past_stride"),
    pytest.param((2, 2, 4, 3), (2, 3, 3, 2), dict(stride=(1, 2), padding=(0, 1), output_padding=(2, 1),
                                                 dilation=(3, 2)), id="output_padding_past_padding_and_stride"),
]
_ONE_D = [
    pytest.param((2, 6, 17), (6, 1, 4), dict(groups=6, padding=3), id="depthwise_causal_window"),
    pytest.param((2, 4, 19), (5, 4, 3), dict(stride=2, padding=1, dilation=2), id="strided_dilated"),
    pytest.param((3, 12), (4, 3, 5), dict(padding="same"), id="unbatched_same"),
    pytest.param((2, 8, 9), (8, 2, 3), dict(groups=4, padding="valid"), id="grouped_valid"),
]

_THREE_D = [
    pytest.param((2, 4, 5, 6, 7), (6, 4, 3, 3, 3), dict(padding=1), id="r3d_3x3x3"),
    pytest.param((2, 4, 7, 6, 7), (6, 2, 3, 2, 3), dict(stride=(2, 1, 2), padding=(1, 0, 1), dilation=(2, 1, 1),
                                                    groups=2), id="strided_dilated_grouped"),
    pytest.param((4, 5, 6, 7), (6, 4, 2, 3, 3), dict(padding="same"), id="unbatched_same_even_depth"),
    pytest.param((1, 6, 4, 5, 5), (6, 1, 3, 3, 3), dict(groups=6, padding=1), id="depthwise"),
    pytest.param((2, 3, 6, 9, 9), (5, 3, 3, 1, 1), dict(padding=(1, 0, 0)), id="r2plus1d_temporal"),
    pytest.param((2, 3, 4, 9, 9), (5, 3, 1, 3, 3), dict(stride=(1, 2, 2), padding=(0, 1, 1)), id="r2plus1d_spatial"),
]


def _make(shape, device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.float64, generator=g).to(device)


def _close(a, b, tol=1e-12):
    a, b = a.detach(), b.detach()
    assert a.shape == b.shape
    assert float((a - b).norm()) <= tol * max(float(b.norm()), 1e-300)


# each op: (cuconv's torch door, torch's, cuconv's array door, its cases, the first of its four seeds); a bias has
# the output's channels: the weight's second dimension times the groups for the transposed convolution
_OPS = {
    "conv_transpose2d": (F.conv_transpose2d, _TF.conv_transpose2d, cuconv.conv_transpose2d, _TRANSPOSED, 1),
    "conv1d": (F.conv1d, _TF.conv1d, cuconv.conv1d, _ONE_D, 5),
    "conv3d": (F.conv3d, _TF.conv3d, cuconv.conv3d, _THREE_D, 10),
}
_OP_CASES = [pytest.param(op, *case.values, id=f"{op}-{case.id}") for op, row in _OPS.items() for case in row[3]]


def _bias_size(op, w_shape, kwargs):
    return w_shape[1] * kwargs.get("groups", 1) if op == "conv_transpose2d" else w_shape[0]


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("op,x_shape,w_shape,kwargs", _OP_CASES)
def test_outputs_and_gradients_match_torch(op, x_shape, w_shape, kwargs, bias, device):
    ours, theirs, _, _, seed = _OPS[op]
    x, w = _make(x_shape, device, seed).requires_grad_(), _make(w_shape, device, seed + 1).requires_grad_()
    b = _make((_bias_size(op, w_shape, kwargs),), device, seed + 2).requires_grad_() if bias else None
    y, want = ours(x, w, b, **kwargs), theirs(x, w, b, **kwargs)
    _close(y, want)
    g = _make(want.shape, device, seed + 3)
    inputs = (x, w) + ((b,) if bias else ())
    for got, ref in zip(torch.autograd.grad(y, inputs, g), torch.autograd.grad(want, inputs, g)):
        _close(got, ref)


@pytest.mark.parametrize("device", _DEVICES)
def test_conv_transpose2d_gradchecks(device):
    x, w, b = (_make(s, device, i).requires_grad_() for i, s in enumerate(((2, 4, 3, 4), (4, 3, 3, 2), (3,))))
    f = lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, w, b))
    assert torch.autograd.gradgradcheck(f, (x, w, b))


_TRANSPOSED_TRANSFORMS = {
    "jvp": lambda f, x, w: torch.func.jvp(lambda x, w: f(x, w), (x, w), (x.cos(), w.sin()))[1],
    "grad": lambda f, x, w: torch.func.grad(lambda w: f(x, w).sin().sum())(w),
    "vmap": lambda f, x, w: torch.func.vmap(lambda x: f(x, w))(torch.stack([x, x.cos()])),
    "hessian": lambda f, x, w: torch.func.hessian(lambda w: f(x, w).square().sum())(w),
    "jacfwd": lambda f, x, w: torch.func.jacfwd(lambda x: f(x, w).sum(0))(x),
}


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("name", sorted(_TRANSPOSED_TRANSFORMS))
def test_conv_transpose2d_under_torch_func(name, device):
    kwargs = dict(stride=2, padding=1, output_padding=1)
    x, w = _make((2, 3, 3, 4), device, 20), _make((3, 2, 3, 3), device, 21)
    got = _TRANSPOSED_TRANSFORMS[name](lambda x, w: F.conv_transpose2d(x, w, **kwargs), x, w)
    want = _TRANSPOSED_TRANSFORMS[name](lambda x, w: _TF.conv_transpose2d(x, w, **kwargs), x, w)
    _close(got, want)


@pytest.mark.parametrize("device", _DEVICES)
def test_conv_transpose2d_forward_mode_gradcheck(device):
    x, w = _make((1, 2, 3, 3), device, 22).requires_grad_(), _make((2, 2, 2, 2), device, 23).requires_grad_()
    for kwargs in (dict(stride=2, output_padding=1), dict(output_padding=1, dilation=2)):
        f = lambda x, w: F.conv_transpose2d(x, w, **kwargs)  # noqa: E731
        assert torch.autograd.gradcheck(f, (x, w), check_forward_ad=True)


def test_a_jit_trace_of_conv_transpose2d_refuses_other_shapes_rather_than_reading_past_them():
    """The trace records the output's size: another input's shape is refused by the dgrad op's check (its plans
    would read grad_output as the recorded size)."""
    traced = torch.jit.trace(cuconv.nn.ConvTranspose2d(4, 3, 3, stride=2).double(),
                             torch.randn(2, 4, 5, 5, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="Expected grad_output of size"):
        traced(torch.randn(3, 4, 5, 5, dtype=torch.float64))


@pytest.mark.parametrize("device", _DEVICES)
def test_conv3d_keeps_channels_last_3d(device):
    x = _make((2, 4, 5, 6, 7), device, 14).contiguous(memory_format=torch.channels_last_3d)
    w = _make((3, 4, 3, 3, 3), device, 15)
    y = F.conv3d(x, w, padding=1)
    assert y.is_contiguous(memory_format=torch.channels_last_3d)
    _close(y, _TF.conv3d(x, w, padding=1))


def _arrays(device):
    if device == "cpu":
        return numpy.asarray, lambda a: a
    import cupy

    return cupy.asarray, cupy.asnumpy


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("op,x_shape,w_shape,kwargs", _OP_CASES)
def test_array_door_matches_torch(op, x_shape, w_shape, kwargs, device):
    _, theirs, arrays, _, seed = _OPS[op]
    to, back = _arrays(device)
    x, w = _make(x_shape, "cpu", seed), _make(w_shape, "cpu", seed + 1)
    b = _make((_bias_size(op, w_shape, kwargs),), "cpu", seed + 2)
    y = back(arrays(to(x.numpy()), to(w.numpy()), to(b.numpy()), **kwargs))
    _close(torch.from_numpy(numpy.ascontiguousarray(y)), theirs(x, w, b, **kwargs))


@pytest.mark.parametrize("device", _DEVICES)
def test_conv3d_module_is_a_drop_in(device):
    for mode in ("zeros", "replicate", "circular"):
        torch.manual_seed(2)
        ref = torch.nn.Conv3d(3, 4, (3, 3, 1), padding=(1, 1, 0), padding_mode=mode).double().to(device)
        torch.manual_seed(2)
        ours = cuconv.nn.Conv3d(3, 4, (3, 3, 1), padding=(1, 1, 0), padding_mode=mode).double().to(device)
        assert torch.equal(ours.weight, ref.weight)
        x = _make((2, 3, 4, 5, 6), device, 16)
        _close(ours(x), ref(x))
    swapped = cuconv.nn.convert(torch.nn.Sequential(torch.nn.Conv3d(3, 4, 3)))
    assert type(swapped[0]) is cuconv.nn.Conv3d


@pytest.mark.parametrize("device", _DEVICES)
def test_modules_are_drop_ins_and_convert_swaps_them(device):
    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.ConvTranspose2d(4, 3, 4, stride=2, padding=1), torch.nn.ReLU(),
                                   torch.nn.Flatten(2), torch.nn.Conv1d(3, 2, 3, padding=1, padding_mode="circular"),
                                   ).double().to(device)

    ref, ours = model(), cuconv.nn.convert(model())
    assert [type(m) for m in ours[::3]] == [cuconv.nn.ConvTranspose2d, cuconv.nn.Conv1d]
    assert ours.state_dict().keys() == ref.state_dict().keys()
    for a, e in zip(ours.state_dict().values(), ref.state_dict().values()):
        assert torch.equal(a, e)
    x = _make((2, 4, 5, 6), device, 9)
    _close(ours(x), ref(x))
    torch.manual_seed(1)
    a = cuconv.nn.ConvTranspose2d(4, 3, 3, stride=2, algo="auto").double().to(device)
    torch.manual_seed(1)
    t = torch.nn.ConvTranspose2d(4, 3, 3, stride=2).double().to(device)
    assert torch.equal(a.weight, t.weight)
    for size in ([11, 13], [12, 14]):  # output_size picks the output padding, as torch's
        _close(a(x, output_size=size), t(x, output_size=size))


def _refusal(call):
    try:
        call()
    except (TypeError, ValueError, RuntimeError) as exc:
        return exc
    raise AssertionError("no exception")


_X, _W = (2, 4, 5, 5), (4, 3, 3, 3)
_BAD_TRANSPOSED = {
    "channels": ((2, 3, 5, 5), _W, None, dict()),
    "output_padding": (_X, _W, None, dict(stride=2, output_padding=2)),
    "output_padding_stride1": (_X, _W, None, dict(output_padding=1)),
    "bias": (_X, _W, (4,), dict()),
    "groups0": (_X, _W, None, dict(groups=0)),
    "groups3": (_X, _W, None, dict(groups=3)),
    "stride0": (_X, _W, None, dict(stride=0)),
    "negative_padding": (_X, _W, None, dict(padding=-1)),
    "input_5d": ((1, 2, 4, 5, 5), _W, None, dict()),
    "same": (_X, _W, None, dict(padding="same")),
    "no_input_channels": ((2, 0, 5, 5), (0, 3, 3, 3), None, dict()),
    "negative_output_padding": (_X, _W, None, dict(output_padding=-1)),
}


_BAD_ONE_D = {
    "input_4d": ((2, 3, 4, 5), (4, 3, 3), dict()),
    "channels": ((2, 2, 9), (4, 3, 3), dict()),
    "kernel_larger": ((2, 3, 2), (4, 3, 3), dict()),
    "kernel_larger_valid": ((2, 3, 2), (4, 3, 3), dict(padding="valid")),
    "weight_4d": ((2, 3, 9), (4, 3, 3, 3), dict()),
}


_BAD_THREE_D = {
    "input_6d": ((1, 2, 4, 5, 6, 7), (6, 4, 3, 3, 3), dict()),
    "channels": ((2, 3, 5, 6, 7), (6, 4, 3, 3, 3), dict()),
    "kernel_larger": ((2, 4, 2, 6, 7), (6, 4, 3, 3, 3), dict()),
    "stride_length": ((2, 4, 5, 6, 7), (6, 4, 3, 3, 3), dict(stride=(1, 2))),
    "same_strided": ((2, 4, 5, 6, 7), (6, 4, 3, 3, 3), dict(stride=2, padding="same")),
    "groups": ((2, 4, 5, 6, 7), (6, 3, 3, 3, 3), dict(groups=3)),
}


_BAD = [pytest.param(op, *case, id=f"{op}-{name}") for op, table in (
    ("conv_transpose2d", _BAD_TRANSPOSED),
    ("conv1d", {k: (x, w, None, kw) for k, (x, w, kw) in _BAD_ONE_D.items()}),
    ("conv3d", {k: (x, w, None, kw) for k, (x, w, kw) in _BAD_THREE_D.items()})) for name, case in sorted(table.items())]


@pytest.mark.parametrize("op,x_shape,w_shape,b_shape,kwargs", _BAD)
def test_refusals_are_torchs(op, x_shape, w_shape, b_shape, kwargs):
    """Each refusal of torch's CPU op, in its words and of its types (RuntimeError where torch raises it:
    ConvValueError is one), from both doors, before anything runs."""
    ours, theirs, arrays, _, _ = _OPS[op]
    make = lambda s: None if s is None else torch.randn(*s, dtype=torch.float64)  # noqa: E731
    x, w, b = make(x_shape), make(w_shape), make(b_shape)
    expected = _refusal(lambda: theirs(x, w, b, **kwargs))
    for got in (_refusal(lambda: ours(x, w, b, **kwargs)),
                _refusal(lambda: arrays(x.numpy(), w.numpy(), None if b is None else b.numpy(), **kwargs))):
        assert isinstance(got, type(expected)), (got, expected)
        assert str(got) == str(expected).splitlines()[0]


def test_graph_tools_take_conv_transpose2d_as_the_custom_op():
    """torch.compile (fullgraph), torch.export, torch.jit.trace and torch.fx of a converted decoder step."""
    model = cuconv.nn.convert(torch.nn.Sequential(torch.nn.ConvTranspose2d(3, 2, 3, stride=2), torch.nn.Flatten(2),
                                                  torch.nn.Conv1d(2, 2, 3)).double()).eval()
    x = torch.randn(2, 3, 6, 7, dtype=torch.float64)
    with torch.no_grad():
        want = model(x)
        other = torch.randn(2, 3, 6, 7, dtype=torch.float64)
        _close(torch.jit.trace(model, x)(other), model(other))
        _close(torch.fx.symbolic_trace(model)(x), want)
        torch._dynamo.reset()
        _close(torch.compile(model, backend="eager", fullgraph=True)(x), want)
        torch._dynamo.reset()
        program = torch.export.export(model, (x,))
        _close(program.module()(x), want)
        assert "cuconv.conv2d_input" in str(program.graph)


def test_graph_tools_on_conv3d():
    model = cuconv.nn.convert(torch.nn.Sequential(torch.nn.Conv3d(3, 4, 3, padding=1), torch.nn.ReLU(),
                                                  torch.nn.Conv3d(4, 2, (1, 3, 3))).double()).eval()
    x, other = (torch.randn(2, 3, 4, 6, 7, dtype=torch.float64) for _ in range(2))
    with torch.no_grad():
        want = model(x)
        torch._dynamo.reset()
        _close(torch.compile(model, backend="eager", fullgraph=True)(x), want)
        torch._dynamo.reset()
        _close(torch.export.export(model, (x,)).module()(x), want)
        _close(torch.fx.symbolic_trace(model)(x), want)
        _close(torch.jit.trace(model, x)(other), model(other))


class _Block3d(torch.nn.Module):
    """A video ResNet's basic block: conv-BN-ReLU, conv-BN, the residual, ReLU."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv3d(4, 4, 3, padding=1, bias=False), torch.nn.BatchNorm3d(4)
        self.c2, self.b2 = torch.nn.Conv3d(4, 4, (1, 3, 3), padding=(0, 1, 1), bias=False), torch.nn.BatchNorm3d(4)

    def forward(self, x):
        return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + x)


@pytest.mark.parametrize("device", _DEVICES)
def test_fuse_folds_conv3d_and_batchnorm3d(device):
    """convert(fuse=True) fuses Conv3d -> BatchNorm3d -> activation (and the residual) as for 2-D; eval folds the
    statistics, train mode runs the original graph; the state_dict stays the original's."""
    import copy

    torch.manual_seed(3)
    model = torch.nn.Sequential(_Block3d(), _Block3d()).double().to(device)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm3d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2.0)
    fused = cuconv.nn.convert(copy.deepcopy(model), fuse=True)
    assert sum(type(m).__name__ == "FusedConv2d" for m in fused.modules()) == 4
    assert fused.state_dict().keys() == model.state_dict().keys()
    x = _make((2, 4, 3, 5, 6), device, 30)
    for train in (False, True):
        model.train(train)
        fused.train(train)
        with torch.no_grad():
            _close(fused(x), model(x))
