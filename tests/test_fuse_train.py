"""``convert(model, fuse=True)`` in train mode on the CPU path (``cuconv.nn.fuse_train``): a Conv -> BatchNorm2d ->
[residual] -> activation -> [residual] block is one autograd node whose outputs, gradients (of the input, the
weights, the BatchNorm's affine parameters and the residual) and running statistics are torch's unfused graph's in
float64, for every activation and residual position, BatchNorm's momentum=None, frozen parameters, gradient
checkpointing, a gradient penalty (double backward), autocast, 200 SGD steps and DDP (gloo); on the GPU, cuconv's
BatchNorm kernels against torch's model on cuDNN, NCHW and channels-last, float32 and bf16 autocast."""

from __future__ import annotations

import copy
import os

import pytest

torch = pytest.importorskip("torch")

import cuconv.nn  # noqa: E402
import cuconv.nn.fuse_train as fuse_train  # noqa: E402
from cuconv.nn.fuse import FusedConv2d  # noqa: E402
from test_fuse import _randomize  # noqa: E402

_F = torch.nn.functional
_ACTIVATIONS = {"relu": torch.nn.ReLU, "relu6": torch.nn.ReLU6, "leaky_relu": lambda: torch.nn.LeakyReLU(0.2),
                "silu": torch.nn.SiLU, "gelu": torch.nn.GELU, "gelu_tanh": lambda: torch.nn.GELU("tanh"),
                "hardswish": torch.nn.Hardswish, "hardsigmoid": torch.nn.Hardsigmoid, "sigmoid": torch.nn.Sigmoid,
                None: None}


class _Block(torch.nn.Module):
    """conv -> bn -> [+ x before] -> act -> [+ x after]: every position a chain takes."""

    def __init__(self, c, activation, residual, bias=False, stride=1, momentum=0.1, affine=True, groups=1):
        super().__init__()
        self.conv = torch.nn.Conv2d(c, c, 3, stride, 1, bias=bias, groups=groups)
        self.bn = torch.nn.BatchNorm2d(c, momentum=momentum, affine=affine)
        self.act = None if activation is None else _ACTIVATIONS[activation]()
        self.residual = residual

    def forward(self, x):
        y = self.bn(self.conv(x))
        if self.residual == "before":
            y = y + x
        y = y if self.act is None else self.act(y)
        return y + x if self.residual == "after" else y


def _pair(make, dtype=torch.float64):
    torch.manual_seed(0)
    ref = _randomize(make().to(dtype)).train()
    fused = cuconv.nn.convert(copy.deepcopy(ref), fuse=True).train()
    return ref, fused


def _count_nodes(monkeypatch):
    calls = []
    forward = fuse_train._ConvBNTrain.forward

    def spy(ctx, *args):
        calls.append(args[-1])
        return forward(ctx, *args)

    monkeypatch.setattr(fuse_train._ConvBNTrain, "forward", staticmethod(spy))
    return calls


def _loss(y):  # (not a plain sum: the gradient differs from position to position)
    return (y.square() * torch.linspace(0.5, 1.5, y.numel(), dtype=y.dtype, device=y.device).reshape(y.shape)).sum() + y.sin().sum()


def _rel(a, b, scale=0.0):
    """Normwise relative difference of ``a`` from ``b``; ``scale``: a floor of the norm (a gradient that is zero
    but for rounding, as a convolution's bias before BatchNorm in train mode has, measured against the others)."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / (max(float(b.norm()), scale) + 1e-300))


def _assert_same_step(ref, fused, x, tol=1e-12, with_input=True):
    xr = x.clone().requires_grad_(with_input)
    xf = x.clone().requires_grad_(with_input)
    want, got = ref(xr), fused(xf)
    assert _rel(got, want) <= tol
    _loss(want).backward()
    _loss(got).backward()
    if with_input:
        assert _rel(xf.grad, xr.grad) <= 10 * tol
    pr, pf = dict(ref.named_parameters()), dict(fused.named_parameters())
    assert sorted(pr) == sorted(pf)
    scale = max(float(p.grad.double().norm()) for p in pr.values() if p.grad is not None)
    for k in pr:
        assert (pr[k].grad is None) == (pf[k].grad is None), k
        if pr[k].grad is not None:
            assert _rel(pf[k].grad, pr[k].grad, scale) <= 10 * tol, k
    br, bf = dict(ref.named_buffers()), dict(fused.named_buffers())
    for k in br:
        assert _rel(bf[k], br[k]) <= tol and bf[k].dtype == br[k].dtype, k


@pytest.mark.parametrize("residual", [None, "before", "after"])
@pytest.mark.parametrize("activation", list(_ACTIVATIONS), ids=str)
def test_a_block_is_one_node_and_matches_torch_in_float64(activation, residual, monkeypatch):
    ref, fused = _pair(lambda: _Block(5, activation, residual, bias=activation == "silu"))
    (chain,) = [m for m in fused.modules() if isinstance(m, FusedConv2d)]
    # (without an activation an add after the BatchNorm is the one before it)
    assert chain.residual == ("before" if activation is None and residual else residual)
    assert chain.activation == activation
    calls = _count_nodes(monkeypatch)
    x = torch.randn(3, 5, 9, 7, dtype=torch.float64)
    for step in range(3):  # (the running statistics moved three times)
        _assert_same_step(ref, fused, x + step)
    assert len(calls) == 3
    y = fused(x.requires_grad_())
    assert type(y.grad_fn).__name__ == "_ConvBNTrainBackward"  # (one node: the residual inside it too)
    assert int(fused.bn.num_batches_tracked) == int(ref.bn.num_batches_tracked) + 1 == 4


@pytest.mark.parametrize("case", ["momentum_none", "no_affine", "strided_grouped", "batch_one", "frozen_bn",
                                  "frozen_conv"])
def test_batchnorm_options_and_frozen_parameters_as_torch(case, monkeypatch):
    kwargs = dict(momentum_none=dict(momentum=None), no_affine=dict(affine=False),
                  strided_grouped=dict(stride=2, groups=2, bias=True)).get(case, {})
    ref, fused = _pair(lambda: _Block(4, "relu", None if case == "strided_grouped" else "before", **kwargs))
    for model in (ref, fused):
        if case == "frozen_bn":
            model.bn.weight.requires_grad_(False)
            model.bn.bias.requires_grad_(False)
        if case == "frozen_conv":
            model.conv.weight.requires_grad_(False)
    calls = _count_nodes(monkeypatch)
    n = 1 if case == "batch_one" else 2
    for step in range(4):
        _assert_same_step(ref, fused, torch.randn(n, 4, 6, 5, dtype=torch.float64), with_input=case != "frozen_conv")
    assert len(calls) == 4


def test_one_value_per_channel_is_refused_as_torch_refuses_it():
    ref, fused = _pair(lambda: _Block(3, "relu", None))
    x = torch.randn(1, 3, 1, 1, dtype=torch.float64)
    with pytest.raises(ValueError) as theirs:
        ref(x)
    with pytest.raises(ValueError) as ours:
        fused(x)
    assert str(ours.value) == str(theirs.value)
    assert int(fused.bn.num_batches_tracked) == int(ref.bn.num_batches_tracked)


def test_a_gradient_penalty_takes_torchs_second_derivatives():
    ref, fused = _pair(lambda: _Block(4, "silu", "before", bias=True))
    x = torch.randn(2, 4, 6, 6, dtype=torch.float64)
    grads = []
    for model in (ref, fused):
        xi = x.clone().requires_grad_()
        (gx,) = torch.autograd.grad(_loss(model(xi)), xi, create_graph=True)
        gx.square().sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()] + [xi.grad.clone()])
    scale = max(float(g.norm()) for g in grads[0])  # (the bias before BatchNorm: zero but for rounding)
    for want, got in zip(*grads):
        assert _rel(got, want, scale) <= 1e-11


def test_gradient_checkpointing_recomputes_the_block_as_torch_does():
    """torch.utils.checkpoint runs the forward twice (the running statistics move twice, as torch's do)."""
    from torch.utils.checkpoint import checkpoint

    ref, fused = _pair(lambda: _Block(4, "relu", "after"))
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64)
    outs = []
    for model in (ref, fused):
        xi = x.clone().requires_grad_()
        y = checkpoint(model, xi, use_reentrant=False)
        _loss(y).backward()
        outs.append((y, xi.grad, model.conv.weight.grad, model.bn.weight.grad, model.bn.running_mean.clone(),
                     model.bn.num_batches_tracked.clone()))
    for want, got in zip(*outs):
        assert _rel(got, want) <= 1e-11


def test_float32_and_bfloat16_autocast_as_torch():
    ref, fused = _pair(lambda: _Block(8, "relu", "before"), dtype=torch.float32)
    _assert_same_step(ref, fused, torch.randn(4, 8, 10, 10), tol=1e-5)
    outs = []
    for model in (ref, fused):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(torch.randn(4, 8, 10, 10, generator=torch.Generator().manual_seed(3)))
        outs.append((y, model.bn.running_mean.clone()))
    assert outs[1][0].dtype == outs[0][0].dtype
    assert _rel(outs[1][0], outs[0][0]) <= 2e-2 and _rel(outs[1][1], outs[0][1]) <= 2e-2


class _Small(torch.nn.Module):
    """A stem, two basic-block-like residuals and a head: 200 SGD steps."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 2, 1, bias=False), torch.nn.BatchNorm2d(8),
                                        torch.nn.ReLU())
        self.b1 = _Block(8, "relu", "before")
        self.b2 = _Block(8, "hardswish", "after", momentum=None)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.b2(self.b1(self.stem(x))).mean((2, 3)))


def test_two_hundred_sgd_steps_track_torchs():
    """float64, the same data: the losses of the two models agree to rounding at every step (the run-to-run
    spread of torch against itself in float64 is rounding: a cross entropy of ~1, ~1e-15)."""
    torch.manual_seed(0)
    ref = _Small().double().train()
    fused = cuconv.nn.convert(copy.deepcopy(ref), fuse=True).train()
    assert sum(isinstance(m, FusedConv2d) for m in fused.modules()) == 3
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ref, fused)]
    g = torch.Generator().manual_seed(1)
    worst = 0.0
    for step in range(200):
        x = torch.randn(4, 3, 8, 8, generator=g, dtype=torch.float64)
        t = torch.randint(0, 4, (4,), generator=g)
        losses = []
        for model, opt in zip((ref, fused), opts):
            opt.zero_grad()
            loss = _F.cross_entropy(model(x), t)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        worst = max(worst, abs(losses[1] - losses[0]) / abs(losses[0]))
    assert worst <= 1e-9
    for (k, a), (_, b) in zip(ref.state_dict().items(), fused.state_dict().items()):
        assert _rel(b, a) <= 1e-8, k


def _ddp_worker(rank, world, path, result_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        ref = _Small().double().train()
        fused = cuconv.nn.convert(copy.deepcopy(ref), fuse=True).train()
        models = [torch.nn.parallel.DistributedDataParallel(m) for m in (ref, fused)]
        opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
        g = torch.Generator().manual_seed(10 + rank)  # (each rank its own data: the gradients all-reduced)
        for _ in range(5):
            x = torch.randn(4, 3, 8, 8, generator=g, dtype=torch.float64)
            t = torch.randint(0, 4, (4,), generator=g)
            for model, opt in zip(models, opts):
                opt.zero_grad()
                _F.cross_entropy(model(x), t).backward()
                opt.step()
        worst = max(_rel(b, a) for a, b in zip(ref.state_dict().values(), fused.state_dict().values())
                    if a.is_floating_point())
        with open(os.path.join(result_dir, f"rank{rank}"), "w") as f:
            f.write(repr(worst))
    finally:
        dist.destroy_process_group()


def test_ddp_with_gloo_trains_a_fused_model_as_torchs(tmp_path):
    import torch.multiprocessing as mp

    world = 2
    mp.spawn(_ddp_worker, args=(world, str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=world, join=True)
    worst = [float((tmp_path / f"rank{rank}").read_text()) for rank in range(world)]
    assert max(worst) <= 1e-10


def test_compiled_calls_run_the_links(monkeypatch):
    """What the node does not take runs as before: under torch.compile the links, one by one."""
    calls = _count_nodes(monkeypatch)
    ref, fused = _pair(lambda: _Block(4, "relu", None))
    monkeypatch.setattr(cuconv.nn.fuse, "_is_compiling", lambda: True)
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64)
    assert _rel(fused(x), ref(x)) <= 1e-12 and not calls


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("mode", ["float32", "bf16_autocast", "float64"])
@pytest.mark.parametrize("make", [lambda: _Block(16, "relu", "before"), lambda: _Block(24, "silu", "after", bias=True),
                                  lambda: _Block(8, "hardswish", None, momentum=None), _Small],
                         ids=["relu_before", "silu_after_bias", "hardswish_cumulative", "small"])
def test_cuda_blocks_match_torch(make, mode, channels_last, monkeypatch):
    """On CUDA: cuconv's BatchNorm kernels (float32, bf16 autocast) or torch's inside the node (float64), against
    torch's unfused model on cuDNN, two steps: outputs, gradients, running statistics."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    kernels = []
    forward = fuse_train._forward_kernels

    def spy(*a):
        kernels.append(1)
        return forward(*a)

    monkeypatch.setattr(fuse_train, "_forward_kernels", spy)
    dtype = torch.float64 if mode == "float64" else torch.float32
    ref, fused = _pair(make, dtype)
    ref, fused = ref.cuda(), fused.cuda()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    tol = {"float64": 1e-10, "float32": 1e-4, "bf16_autocast": 3e-2}[mode]
    g = torch.Generator().manual_seed(2)
    for step in range(2):
        x = torch.randn(4, 3 if make is _Small else ref.conv.in_channels, 12, 10, generator=g, dtype=dtype)
        x = x.cuda().contiguous(memory_format=fmt)
        outs = []
        for model in (ref, fused):
            xi = x.clone().requires_grad_()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "bf16_autocast"):
                y = model(xi)
            _loss(y.float()).backward()
            outs.append((y, xi.grad))
        assert _rel(outs[1][0], outs[0][0]) <= tol and _rel(outs[1][1], outs[0][1]) <= tol
        pr, pf = dict(ref.named_parameters()), dict(fused.named_parameters())
        scale = max(float(p.grad.double().norm()) for p in pr.values())
        for k in pr:
            assert _rel(pf[k].grad, pr[k].grad, scale) <= tol, k
        for (k, a), (_, b) in zip(ref.named_buffers(), fused.named_buffers()):
            assert _rel(b, a) <= tol, k
        for model in (ref, fused):
            model.zero_grad()
    assert bool(kernels) == (mode != "float64")
