"""torch.func on cuconv's convolution (``cuconv.nn._transforms``): every transform and their compositions against
torch's convolution in float64, on the CPU and (marked) on the GPU, to rounding."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import cuconv.nn.functional as F  # noqa: E402

_DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# (input, weight, keywords): plain, strided with groups, and an unbatched input
_CASES = [
    pytest.param((2, 3, 6, 7), (4, 3, 3, 3), dict(padding=1), id="3x3"),
    pytest.param((2, 4, 7, 7), (6, 2, 3, 3), dict(stride=2, groups=2), id="s2_g2"),
    pytest.param((3, 5, 6), (4, 3, 1, 2), dict(padding=(0, 1)), id="unbatched"),
]


def _operands(x_shape, w_shape, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, dtype=torch.float64, generator=g).to(device)  # noqa: E731
    return make(*x_shape), make(*w_shape), make(w_shape[0])


def _both(kwargs):
    return (lambda x, w, b: F.conv2d(x, w, b, **kwargs),
            lambda x, w, b: torch.nn.functional.conv2d(x, w, b, **kwargs))


_TRANSFORMS = {
    "grad_of_a_square": lambda f, x, w, b: torch.func.grad(lambda w: f(x, w, b).square().sum())(w),
    "grad_argnums": lambda f, x, w, b: torch.func.grad(lambda x, w, b: f(x, w, b).sin().sum(), argnums=(0, 1, 2))(
        x, w, b),
    "vmap_inputs": lambda f, x, w, b: torch.func.vmap(lambda x: f(x, w, b))(torch.stack([x, 2 * x, x.cos()])),
    "vmap_inputs_dim1": lambda f, x, w, b: torch.func.vmap(lambda x: f(x, w, b), in_dims=1)(
        torch.stack([x, x.sin()], 1)),
    "vmap_weights": lambda f, x, w, b: torch.func.vmap(lambda w: f(x, w, b))(torch.stack([w, w.exp()])),
    "vmap_all": lambda f, x, w, b: torch.func.vmap(f)(torch.stack([x, -x]), torch.stack([w, w.sin()]),
                                                     torch.stack([b, b + 1])),
    "jvp": lambda f, x, w, b: torch.func.jvp(lambda x, w: f(x, w, b), (x, w), (x.cos(), w.sin()))[1],
    "jacrev": lambda f, x, w, b: torch.func.jacrev(lambda w: f(x, w, b).sum(0))(w),
    "jacfwd": lambda f, x, w, b: torch.func.jacfwd(lambda w: f(x, w, b).sum(0))(w),
    "hessian": lambda f, x, w, b: torch.func.hessian(lambda w: f(x, w, b).square().sum())(w),
    "per_sample_grads": lambda f, x, w, b: torch.func.vmap(
        torch.func.grad(lambda w, xi: f(xi.unsqueeze(0), w, b).square().sum()), in_dims=(None, 0))(w, x)
    if x.dim() == 4 else torch.func.grad(lambda w: f(x, w, b).square().sum())(w),
}


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("x_shape,w_shape,kwargs", _CASES)
@pytest.mark.parametrize("name", sorted(_TRANSFORMS))
def test_torch_func_transforms_match_torch(name, x_shape, w_shape, kwargs, device):
    ours, theirs = _both(kwargs)
    x, w, b = _operands(x_shape, w_shape, device)
    got, want = _TRANSFORMS[name](ours, x, w, b), _TRANSFORMS[name](theirs, x, w, b)
    for g, t in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g.shape == t.shape
        assert (g - t).norm() <= 1e-12 * t.norm()


@pytest.mark.parametrize("device", _DEVICES)
def test_forward_ad_and_forward_over_reverse_gradchecks(device):
    ours, _ = _both(dict(padding=1, stride=(1, 2)))
    x, w, b = (t.requires_grad_() for t in _operands((2, 3, 5, 6), (4, 3, 3, 3), device, seed=3))
    assert torch.autograd.gradcheck(ours, (x, w, b), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(ours, (x, w, b), check_fwd_over_rev=True)


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("x_shape,w_shape,kwargs", _CASES)
def test_gradchecks_with_batched_gradients(x_shape, w_shape, kwargs, device):
    """``check_batched_grad`` (torch's legacy vmap over the backward: grad_outputs batched, no transform active)
    and batched gradients of the gradients, with and without a bias."""
    ours, _ = _both(kwargs)
    x, w, b = (t.requires_grad_() for t in _operands(x_shape, w_shape, device, seed=7))
    assert torch.autograd.gradcheck(ours, (x, w, b), check_batched_grad=True)
    assert torch.autograd.gradgradcheck(ours, (x, w, b), check_batched_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: ours(x, w, None), (x, w), check_batched_grad=True)


def test_batched_grad_outputs_match_torch():
    """``torch.autograd.grad(..., is_grads_batched=True)``: a batch of vector-Jacobian products in one call."""
    ours, theirs = _both(dict(padding=1, stride=(2, 1)))
    x, w, b = (t.requires_grad_() for t in _operands((2, 3, 6, 7), (4, 3, 3, 3), "cpu", seed=8))
    g = torch.randn(5, *theirs(x, w, b).shape, dtype=torch.float64)
    got = torch.autograd.grad(ours(x, w, b), (x, w, b), g, is_grads_batched=True)
    want = torch.autograd.grad(theirs(x, w, b), (x, w, b), g, is_grads_batched=True)
    for a, e in zip(got, want):
        assert a.shape == e.shape and (a - e).norm() <= 1e-12 * e.norm()


def _small_net():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 4, 1)).double().eval()
    with torch.no_grad():
        net[1].running_var.uniform_(0.5, 2.0)
        net[1].running_mean.normal_()
    return net


def _batch_dim(device: str, bounded: bool):
    """The batch's export dimension. Where a BatchNorm is left to torch on a GPU it is at most 65535: torch's CUDA
    batch_norm in eval mode asks whether cuDNN takes the batch (``input.sym_size(0) <= 65535``), a guard that
    bounds the dimension in torch's own model's export too."""
    return torch.export.Dim("batch", max=65535) if bounded and device == "cuda" else torch.export.Dim("batch")


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("fuse", [False, True])
def test_export_keeps_a_dynamic_batch_dynamic(fuse, device):
    """torch.export with a dynamic batch dimension: one program, right at other batches (it specialised the batch
    to the example's)."""
    import cuconv.nn

    ref = _small_net().to(device)
    model = cuconv.nn.convert(_small_net().to(device), fuse=fuse).eval()
    batch = _batch_dim(device, bounded=not fuse)
    program = torch.export.export(model, (torch.randn(2, 3, 8, 8, dtype=torch.float64, device=device),),
                                  dynamic_shapes={"input": {0: batch}} if not fuse else ({0: batch},))
    for n in (1, 5):
        x = torch.randn(n, 3, 8, 8, dtype=torch.float64, device=device)
        with torch.no_grad():
            want = ref(x)
            assert (program.module()(x) - want).norm() <= 1e-12 * want.norm()


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("fuse", [False, True])
def test_compile_with_dynamic_shapes_compiles_one_graph_for_every_batch(fuse, device):
    import cuconv.nn
    from torch._dynamo.testing import CompileCounter

    ref = _small_net().to(device)
    model = cuconv.nn.convert(_small_net().to(device), fuse=fuse).eval()
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, dynamic=True)
    with torch.no_grad():
        for n in (2, 3, 4, 5):
            x = torch.randn(n, 3, 8, 8, dtype=torch.float64, device=device)
            assert (compiled(x) - ref(x)).norm() <= 1e-12 * ref(x).norm()
    torch._dynamo.reset()
    assert counter.frame_count == 1


def test_second_order_transforms_of_a_biased_layer_and_tangents_that_reach_no_pass():
    """The tangent and double-backward convolutions of a layer with a bias add none (its plans read a bias
    pointer: they are given zeros), and a pass no tangent reaches has a zero tangent (hessian in x alone)."""
    ours, theirs = _both(dict(padding=1))
    x, w, b = _operands((2, 3, 5, 5), (4, 3, 3, 3), "cpu", seed=5)
    for f in (lambda f: torch.func.hessian(lambda x: f(x, w, b).square().sum())(x),
              lambda f: torch.func.hessian(lambda x: f(x, w, b).sum())(x),
              lambda f: torch.func.jacfwd(torch.func.grad(lambda w: f(x, w, b).sin().sum()))(w)):
        got, want = f(ours), f(theirs)
        assert (got - want).norm() <= 1e-12 * max(want.norm(), 1e-300) or want.norm() == got.norm() == 0


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("fuse", [False, True])
def test_compile_with_dynamic_shapes_compiles_one_graph_for_every_image_size(fuse, device):
    """torch.compile(dynamic=True) over inputs of several heights and widths: one graph, as torch compiles (the
    spatial sizes were specialised to each input's, a graph per size)."""
    import cuconv.nn
    from torch._dynamo.testing import CompileCounter

    ref = _small_net().to(device)
    model = cuconv.nn.convert(_small_net().to(device), fuse=fuse).eval()
    counts = []
    for m in (ref, model):  # (torch's own count beside ours; the first sizes all differ, or duck sizing ties them)
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(m, backend=counter, dynamic=True)
        with torch.no_grad():
            for n, h, w in ((2, 9, 12), (3, 8, 8), (2, 16, 7), (5, 11, 10)):
                x = torch.randn(n, 3, h, w, dtype=torch.float64, device=device)
                want = ref(x)
                assert (compiled(x) - want).norm() <= 1e-12 * want.norm()
        counts.append(counter.frame_count)
    torch._dynamo.reset()
    assert counts == [1, 1]


def _strided_net():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(8, 8, 3, padding="same", dilation=2),
                               torch.nn.Conv2d(8, 4, (1, 3), stride=(1, 2))).double().eval()


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("net", [_small_net, _strided_net])
def test_export_keeps_dynamic_spatial_sizes_dynamic(net, device):
    """torch.export with dynamic batch, height and width: one program, right at other sizes (strided, dilated and
    "same"-padded layers among them); an input too small for a kernel is refused when the program runs."""
    import cuconv.nn

    ref = net().to(device)
    model = cuconv.nn.convert(net().to(device)).eval()
    # (sizes from which no layer's output is one position wide: torch specialises a size of one)
    dims = {0: _batch_dim(device, bounded=net is _small_net), 2: torch.export.Dim("height", min=12),
            3: torch.export.Dim("width", min=12)}
    program = torch.export.export(model, (torch.randn(2, 3, 16, 20, dtype=torch.float64, device=device),),
                                  dynamic_shapes={"input": dims})
    for shape in ((1, 3, 13, 17), (3, 3, 24, 12)):
        x = torch.randn(*shape, dtype=torch.float64, device=device)
        with torch.no_grad():
            want = ref(x)
            assert (program.module()(x) - want).norm() <= 1e-12 * want.norm()


def test_compiled_dynamic_spatial_sizes_refuse_an_input_smaller_than_the_kernel():
    import cuconv.nn

    model = cuconv.nn.convert(torch.nn.Conv2d(3, 4, 5).double())
    torch._dynamo.reset()
    compiled = torch.compile(model, dynamic=True, backend="eager")
    with torch.no_grad():
        compiled(torch.randn(2, 3, 9, 11, dtype=torch.float64))
        with pytest.raises(Exception, match="Kernel size can't be greater than actual input size"):
            compiled(torch.randn(2, 3, 4, 12, dtype=torch.float64))
    torch._dynamo.reset()
