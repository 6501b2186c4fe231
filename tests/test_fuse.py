"""``cuconv.nn.convert(model, fuse=True)`` on the CPU path: which chains fuse (conv, BatchNorm, activation, residual
add), outputs against the unfused torch model in float64, the state_dict kept (keys, values, checkpoints both ways),
the BatchNorm folded again whenever its tensors change, train mode exact (running statistics, gradients), models
that do not trace (Sequential patterns), and converted models tracing with torch.fx."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import cuconv.nn  # noqa: E402
from cases import captured  # noqa: E402
from cuconv.nn.fuse import FusedConv2d  # noqa: E402

_F = torch.nn.functional


def _randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random BatchNorm statistics and affine parameters (fresh ones fold to nothing worth checking)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            if m.running_mean is not None:
                m.running_mean.copy_(torch.randn(m.num_features, generator=g, dtype=m.running_mean.dtype))
                m.running_var.copy_(torch.rand(m.num_features, generator=g, dtype=m.running_var.dtype) + 0.5)
            if m.weight is not None:
                m.weight.data.copy_(torch.randn(m.num_features, generator=g, dtype=m.weight.dtype))
                m.bias.data.copy_(torch.randn(m.num_features, generator=g, dtype=m.bias.dtype))
    return model


class Basic(torch.nn.Module):
    """ResNet's basic block: relu(bn2(conv2(relu(bn1(conv1(x))))) + identity), the identity projected at a stride."""

    def __init__(self, c_in, c, stride=1):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(c_in, c, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.relu = torch.nn.ReLU(inplace=True)
        self.conv2 = torch.nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(c)
        self.downsample = None
        if stride != 1 or c_in != c:
            self.downsample = torch.nn.Sequential(torch.nn.Conv2d(c_in, c, 1, stride, bias=False),
                                                  torch.nn.BatchNorm2d(c))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Inverted(torch.nn.Module):
    """MobileNetV2's inverted residual: expand (ReLU6), depthwise (ReLU6), project (no activation), x + block(x)."""

    def __init__(self, c, expand=4):
        super().__init__()
        h = c * expand
        self.conv = torch.nn.Sequential(
            torch.nn.Conv2d(c, h, 1, bias=False), torch.nn.BatchNorm2d(h), torch.nn.ReLU6(inplace=True),
            torch.nn.Conv2d(h, h, 3, 1, 1, groups=h, bias=False), torch.nn.BatchNorm2d(h), torch.nn.ReLU6(inplace=True),
            torch.nn.Conv2d(h, c, 1, bias=False), torch.nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.conv(x)


class Squeeze(torch.nn.Module):
    """EfficientNet-like: SiLU convs, squeeze-excitation (a product: not fused), dropout between (eval: identity)."""

    def __init__(self, c):
        super().__init__()
        self.a = torch.nn.Sequential(torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c),
                                     torch.nn.SiLU())
        self.se1 = torch.nn.Conv2d(c, 4, 1)
        self.se2 = torch.nn.Conv2d(4, c, 1)
        self.b = torch.nn.Conv2d(c, c, 1, bias=False)
        self.bn = torch.nn.BatchNorm2d(c)
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, x):
        y = self.a(x)
        s = torch.sigmoid(self.se2(_F.silu(self.se1(_F.adaptive_avg_pool2d(y, 1)))))
        y = self.bn(self.b(y * s))
        return self.drop(y) + x


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 2, 1, bias=False), torch.nn.BatchNorm2d(8),
                                        torch.nn.ReLU(inplace=True))
        self.layer1 = torch.nn.Sequential(Basic(8, 8), Basic(8, 16, stride=2))
        self.inv = Inverted(16)
        self.sq = Squeeze(16)
        self.head = torch.nn.Conv2d(16, 10, 1)  # (bias, no BatchNorm: a chain of one, left alone)

    def forward(self, x):
        return self.head(self.sq(self.inv(self.layer1(self.stem(x)))))


def _pair(model_fn=Net, dtype=torch.float64):
    torch.manual_seed(0)
    ref = _randomize(model_fn().to(dtype)).eval()
    fused = cuconv.nn.convert(copy.deepcopy(ref), fuse=True)
    return ref, fused


def _fused_modules(model):
    return [m for m in model.modules() if isinstance(m, FusedConv2d)]


def test_chains_fuse_and_match_the_unfused_model():
    ref, fused = _pair()
    chains = {(m.bn is not None, m.activation, m.residual) for m in _fused_modules(fused)}
    assert (True, "relu", None) in chains and (True, "relu", "before") in chains  # ResNet's
    assert (True, "relu6", None) in chains and (True, None, "before") in chains  # MobileNetV2's projection + x
    assert (True, "silu", None) in chains
    # stem, 2 x 2 basic and a downsample, 3 inverted, the squeeze block's conv-norm-silu, its two excitation convs
    # (silu, sigmoid: no norm) and its projection (the dropout before the add stops that chain)
    assert len(_fused_modules(fused)) == 13
    x = torch.randn(2, 3, 17, 15, dtype=torch.float64)
    with torch.no_grad():
        want, got = ref(x), fused(x)
    assert (got - want).norm() / want.norm() <= 1e-12


def test_the_state_dict_stays_the_originals_and_checkpoints_load_both_ways():
    ref, fused = _pair()
    a, b = ref.state_dict(), fused.state_dict()
    assert sorted(a) == sorted(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    other = _randomize(Net().double(), seed=5).eval()
    fused.load_state_dict(other.state_dict())  # the original's checkpoint into the fused model: folded again
    x = torch.randn(1, 3, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        assert (fused(x) - other(x)).abs().max() <= 1e-12 * other(x).abs().max()
    restored = Net().double().eval()
    restored.load_state_dict(fused.state_dict())  # and the fused model's into the original
    with torch.no_grad():
        assert torch.equal(restored(x), other(x))


def test_the_fold_follows_every_change_of_the_batchnorm():
    ref, fused = _pair()
    x = torch.randn(1, 3, 12, 12, dtype=torch.float64)
    with torch.no_grad():
        fused(x)
        for name in ("stem.1", "layer1.1.bn2", "inv.conv.4"):
            bn_ref, bn_fused = ref.get_submodule(name), fused.get_submodule(name)
            for bn in (bn_ref, bn_fused):
                bn.running_var.mul_(3.0)  # in place: the tensors' versions change
                bn.weight.add_(0.25)
        assert (fused(x) - ref(x)).abs().max() <= 1e-12 * ref(x).abs().max()
    single = fused.to(torch.float32)  # .to(): new tensors
    with torch.no_grad():
        y = single(x.float())
    assert y.dtype == torch.float32 and (y.double() - ref(x)).norm() / ref(x).norm() <= 1e-5


def test_a_fold_to_autocasts_dtype_is_the_cast_of_the_fold_and_kept_apart():
    """Under autocast the fold is kept in autocast's dtype (no cast per call): the same values as the float32 fold
    cast, and a fold of another dtype is not served from the same cache entry."""
    conv = cuconv.nn.Conv2d(3, 8, 3, bias=True).float()
    bn = torch.nn.BatchNorm2d(8).eval()
    with torch.no_grad():
        for t in (bn.weight, bn.bias, bn.running_mean):
            t.normal_()
        bn.running_var.uniform_(0.5, 2.0)
    fused = FusedConv2d(conv, bn, "relu").eval()
    with torch.no_grad():
        w32, b32 = fused._weights()
        w16, b16 = fused._weights(torch.bfloat16)
        assert w16.dtype == b16.dtype == torch.bfloat16
        assert torch.equal(w16, w32.to(torch.bfloat16)) and torch.equal(b16, b32.to(torch.bfloat16))
        assert fused._weights()[0].dtype == torch.float32  # (each dtype its own entry: the last is refolded)
    assert FusedConv2d._autocast_dtype(conv.weight) is None  # (a CPU weight: autocast on CUDA does not apply)
    plain = FusedConv2d(conv, None, "sigmoid").eval()  # (no BatchNorm: the weight and bias cast once, kept)
    with torch.no_grad():
        w16, b16 = plain._weights(torch.bfloat16)
        assert torch.equal(w16, conv.weight.to(torch.bfloat16)) and torch.equal(b16, conv.bias.to(torch.bfloat16))
        assert plain._weights(torch.bfloat16)[0] is w16
        conv.weight.add_(1.0)  # (in place: a new version, cast again)
        assert torch.equal(plain._weights(torch.bfloat16)[0], conv.weight.to(torch.bfloat16))
        assert plain._weights(None)[0] is conv.weight
    assert plain._weights(torch.bfloat16)[0] is conv.weight  # (gradients on: autocast casts, differentiably)


def _fold_of(m: FusedConv2d):
    """``m``'s convolution and BatchNorm folded by hand, in float64 (the reference for its kept fold)."""
    conv, bn = m.conv, m.bn
    scale = bn.weight.double() / torch.sqrt(bn.running_var.double() + bn.eps)
    shift = bn.bias.double() - bn.running_mean.double() * scale
    if conv.bias is not None:
        shift = shift + conv.bias.double() * scale
    return conv.weight.double() * scale.reshape(-1, 1, 1, 1), shift


def test_a_refold_writes_into_the_kept_fold_and_a_checkpoint_refolds_at_once():
    """A new fold of the same kind goes into the kept fold's tensors (a CUDA graph captured with them replays the new
    one, where new tensors would leave it reading freed memory); ``load_state_dict`` refolds at once, before any
    call, and ``refold`` after an edit through ``.data``; a deep copy's hooks refold the copy alone."""
    ref, fused = _pair()
    x = torch.randn(2, 3, 12, 12, dtype=torch.float64)
    with torch.no_grad():
        fused(x)
    folding = [m for m in _fused_modules(fused) if m.bn is not None]
    kept = [m._folded[2:4] for m in folding]
    assert folding and all(k[0] is not None for k in kept)
    twin = copy.deepcopy(fused)
    twin_kept = [m._folded[2].clone() for m in _fused_modules(twin) if m.bn is not None]
    other = _randomize(copy.deepcopy(ref), seed=1)
    with torch.no_grad():
        other.layer1[0].conv1.weight.mul_(-2.0)
    fused.load_state_dict(other.state_dict())
    for m, (w, b) in zip(folding, kept):
        assert m._folded[2] is w and m._folded[3] is b  # (the same tensors, refolded before any call)
        want_w, want_b = _fold_of(m)
        assert torch.allclose(w, want_w, rtol=1e-12, atol=0) and torch.allclose(b, want_b, rtol=1e-12, atol=1e-15)
    for m, w in zip([m for m in _fused_modules(twin) if m.bn is not None], twin_kept):
        assert torch.equal(m._folded[2], w)  # (the copy's fold untouched by the original's checkpoint)
        assert len(m.bn._load_state_dict_post_hooks) == 1
    with torch.no_grad():
        y = fused(x)
        assert (y - other(x)).abs().max() <= 1e-12 * other(x).abs().max()
        assert all(m._folded[2] is w for m, (w, _) in zip(folding, kept))
        m = folding[0]
        m.bn.running_var.data.mul_(4.0)  # (through .data: no new version, the fold cannot see it)
        m.refold()
        assert m._folded[2] is kept[0][0] and torch.allclose(kept[0][0], _fold_of(m)[0], rtol=1e-12, atol=0)
    twin.load_state_dict(other.state_dict())
    with torch.no_grad():
        assert (twin(x) - other(x)).abs().max() <= 1e-12 * other(x).abs().max()


class _ConvBn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_a_sequential_fused_chain_refolds_at_once_and_copies_and_pickles():
    """The Sequential path: its BatchNorm's wrapper carries the refold hook (the chain held the new conv weight with
    the old statistics until a call); a deep copy and a pickle of the fused model work and fold on their own."""
    import pickle

    ref, fused = _pair(_Untraceable)  # (below: data-dependent control flow around Sequential blocks)
    chain = fused.a[0]._chain
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    with torch.no_grad():
        fused(x)
    kept = chain._folded[2]
    other = _randomize(copy.deepcopy(ref), seed=1)
    with torch.no_grad():
        other.a[0].weight.mul_(-2.0)
    for model in (copy.deepcopy(fused), pickle.loads(pickle.dumps(fused))):
        model.load_state_dict(other.state_dict())
        with torch.no_grad():
            assert (model(x) - other(x)).abs().max() <= 1e-12 * other(x).abs().max()
    assert torch.equal(chain._folded[2], kept)  # (the copies' checkpoints leave the original's fold alone)
    fused.load_state_dict(other.state_dict())
    assert chain._folded[2] is kept and torch.allclose(kept, _fold_of(chain)[0], rtol=1e-12, atol=0)
    with torch.no_grad():
        assert (fused(x) - other(x)).abs().max() <= 1e-12 * other(x).abs().max()


def test_a_fold_lent_to_autograd_is_not_written_under_its_backward():
    """Frozen parameters, an input that needs its gradient: autograd saves the kept fold for the backward, so a
    refold before that backward (statistics changed in between) makes new tensors rather than writing it."""
    ref = _randomize(_ConvBn().double()).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    fused = cuconv.nn.convert(copy.deepcopy(ref), fuse=True).eval()
    doubled = copy.deepcopy(ref)
    with torch.no_grad():
        doubled.bn.running_var.mul_(2.0)
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64, requires_grad=True)
    y1 = fused(x).sum()
    with torch.no_grad():
        fused.bn.running_var.mul_(2.0)  # (between the forwards and before the backward: the fold is made again)
    (y1 + fused(x).sum()).backward()
    x_ref = x.detach().clone().requires_grad_(True)
    (ref(x_ref).sum() + doubled(x_ref).sum()).backward()
    assert (x.grad - x_ref.grad).abs().max() <= 1e-12 * x_ref.grad.abs().max()


def test_a_fold_follows_a_new_memory_format_and_an_inference_mode_fold_is_refolded_in_place():
    ref = _randomize(_ConvBn().double()).eval()
    fused = cuconv.nn.convert(copy.deepcopy(ref), fuse=True).eval()
    chain = _fused_modules(fused)[0]
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    with torch.inference_mode():
        fused(x)
    kept = chain._folded[2]
    assert kept.is_inference()
    other = _randomize(copy.deepcopy(ref), seed=2)
    fused.load_state_dict(other.state_dict())  # (outside inference mode: written in place all the same)
    assert chain._folded[2] is kept and torch.allclose(kept, _fold_of(chain)[0], rtol=1e-12, atol=0)
    fused.to(memory_format=torch.channels_last)  # (a weight laid out anew: a fold of the new layout, not a copy)
    with torch.no_grad():
        fused(x)
    assert chain._folded[2].is_contiguous(memory_format=torch.channels_last) and not chain._folded[2].is_contiguous()


def test_a_checkpoint_assigned_from_another_device_loads_whole():
    """``load_state_dict(assign=True)`` of tensors on another device (meta stands in): the conv's hook runs before
    the BatchNorm is loaded, when the fold cannot be made; the fold is dropped, the load goes on."""
    ref = _randomize(_ConvBn().double()).eval()
    fused = cuconv.nn.convert(copy.deepcopy(ref), fuse=True).eval()
    with torch.no_grad():
        fused(torch.randn(1, 3, 6, 6, dtype=torch.float64))
    fused.load_state_dict({k: v.to("meta") for k, v in ref.state_dict().items()}, assign=True)
    assert fused.conv.weight.is_meta and fused.bn.running_var.is_meta


def test_refold_forgets_the_bound_call_even_without_a_kept_fold():
    conv = cuconv.nn.Conv2d(3, 4, 3)
    chain = FusedConv2d(conv, None, "relu")
    chain._bound_call.value = ("a call's key", None, None)
    chain.refold()
    assert chain._folded is None and chain._bound_call.value is None


def test_train_mode_runs_the_original_graph():
    ref, fused = _pair()
    ref.train()
    fused.train()
    x = torch.randn(4, 3, 12, 12, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(1)
    want = ref(x)
    torch.manual_seed(1)  # (the same dropout mask)
    xf = x.detach().clone().requires_grad_(True)
    got = fused(xf)
    assert (got - want).abs().max() <= 1e-12 * want.abs().max()
    want.square().sum().backward()
    got.square().sum().backward()
    assert (xf.grad - x.grad).abs().max() <= 1e-10 * x.grad.abs().max()
    pr, pf = dict(ref.named_parameters()), dict(fused.named_parameters())
    assert sorted(pr) == sorted(pf)
    for k in pr:
        assert (pf[k].grad - pr[k].grad).abs().max() <= 1e-10 * (pr[k].grad.abs().max() + 1e-30), k
    br, bf = dict(ref.named_buffers()), dict(fused.named_buffers())
    for k in br:  # running statistics updated alike
        assert torch.allclose(bf[k].double(), br[k].double(), rtol=1e-12, atol=0), k


def test_gradients_flow_through_the_fold_in_eval_mode():
    """Fine-tuning with frozen statistics (eval mode, gradients on): the fold is recomputed differentiably."""
    ref, fused = _pair()
    x = torch.randn(2, 3, 10, 10, dtype=torch.float64)
    ref(x).sum().backward()
    fused(x).sum().backward()
    for (k, p), (_, q) in zip(sorted(ref.named_parameters()), sorted(fused.named_parameters())):
        assert (q.grad - p.grad).abs().max() <= 1e-9 * (p.grad.abs().max() + 1e-30), k


@pytest.mark.parametrize("make,name", [
    (lambda: torch.nn.ReLU(), "relu"), (lambda: torch.nn.ReLU6(), "relu6"),
    (lambda: torch.nn.LeakyReLU(0.2), "leaky_relu"), (lambda: torch.nn.SiLU(), "silu"),
    (lambda: torch.nn.GELU(), "gelu"), (lambda: torch.nn.GELU("tanh"), "gelu_tanh"),
    (lambda: torch.nn.Hardswish(), "hardswish"), (lambda: torch.nn.Hardsigmoid(), "hardsigmoid"),
    (lambda: torch.nn.Sigmoid(), "sigmoid"), (lambda: torch.nn.Hardtanh(0.0, 6.0), "relu6"),
])
def test_every_activation_module_fuses(make, name):
    model = lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.BatchNorm2d(6), make())
    ref, fused = _pair(model)
    (m,) = _fused_modules(fused)
    assert m.activation == name and (name != "leaky_relu" or m.slope == 0.2)
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        assert (fused(x) - ref(x)).norm() / ref(x).norm() <= 1e-12


class _Functional(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.conv, self.bn, self.fn = torch.nn.Conv2d(3, 6, 3, padding=1), torch.nn.BatchNorm2d(6), fn

    def forward(self, x):
        return self.fn(self.bn(self.conv(x)), x.repeat(1, 2, 1, 1))


@pytest.mark.parametrize("fn,activation,residual", [
    (lambda y, r: _F.relu(y + r), "relu", "before"),
    (lambda y, r: torch.relu(y) + r, "relu", "after"),
    (lambda y, r: _F.leaky_relu(y, 0.1) + r, "leaky_relu", "after"),
    (lambda y, r: _F.gelu(torch.add(r, y), approximate="tanh"), "gelu_tanh", "before"),
    (lambda y, r: (y + r).sigmoid(), "sigmoid", "before"),
    (lambda y, r: _F.silu(y).add(r), "silu", "after"),
])
def test_functional_activations_and_adds_fuse(fn, activation, residual):
    ref, fused = _pair(lambda: _Functional(fn))
    (m,) = _fused_modules(fused)
    assert (m.activation, m.residual) == (activation, residual)
    x = torch.randn(2, 3, 7, 9, dtype=torch.float64)
    with torch.no_grad():
        assert (fused(x) - ref(x)).norm() / ref(x).norm() <= 1e-12


class _Unfusable(torch.nn.Module):
    """A conv output used twice, a BatchNorm with batch statistics only, an add of the chain to itself."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2, self.c3 = (torch.nn.Conv2d(4, 4, 3, padding=1) for _ in range(3))
        self.batch_stats = torch.nn.BatchNorm2d(4, track_running_stats=False)

    def forward(self, x):
        y = self.c1(x)
        z = torch.relu(y) * y
        w = self.batch_stats(self.c2(z))
        v = self.c3(w)
        return v + v


@pytest.mark.parametrize("hooked", ["stem.0", "stem.1", "stem.2"])
def test_a_module_with_a_hook_is_not_fused_and_its_hook_runs(hooked):
    """A forward hook on a chain's convolution, BatchNorm or activation (a feature extractor's, say) would be
    skipped by a fused call: that chain stays unfused, the others fuse."""
    ref, _ = _pair()
    seen = []
    ref.get_submodule(hooked).register_forward_hook(lambda m, i, o: seen.append(tuple(o.shape)))
    fused = cuconv.nn.convert(copy.deepcopy(ref), fuse=True).eval()
    fewer = 0 if hooked == "stem.2" else 1  # (a hooked activation is left out of the chain: conv and BN still fuse)
    assert len(_fused_modules(fused)) == len(_fused_modules(_pair()[1])) - fewer
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        want = ref(x)
        assert float((fused(x) - want).norm() / want.norm()) <= 1e-12
    assert len(seen) == 2  # (the reference's call and the fused model's)


def test_what_cannot_fuse_runs_as_before():
    ref, fused = _pair(_Unfusable)
    assert not _fused_modules(fused)
    x = torch.randn(2, 4, 6, 6, dtype=torch.float64)
    with torch.no_grad():
        assert (fused(x) - ref(x)).abs().max() <= 1e-12 * ref(x).abs().max()


class _Untraceable(torch.nn.Module):
    """Data-dependent control flow (torch.fx cannot trace it) around Sequential conv-norm-activation blocks."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
                                     torch.nn.ReLU(inplace=True))
        self.b = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8))

    def forward(self, x):
        y = self.a(x)
        if y.sum() > 0:
            y = y * 2
        return self.b(y)


def _agree_in_both_modes(ref, fused, x):
    """The fused model's output equals the original's in eval mode (no gradients), then in train mode; both
    models are left in train mode."""
    with torch.no_grad():
        assert (fused(x) - ref(x)).abs().max() <= 1e-12 * ref(x).abs().max()
    ref.train()
    fused.train()
    want, got = ref(x), fused(x)
    assert (got - want).abs().max() <= 1e-12 * want.abs().max()


def test_models_that_do_not_trace_fuse_their_sequential_blocks_in_place():
    ref, fused = _pair(_Untraceable)
    assert type(fused) is _Untraceable and len(_fused_modules_in_sequentials(fused)) == 2
    assert sorted(ref.state_dict()) == sorted(fused.state_dict())
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64)
    _agree_in_both_modes(ref, fused, x)
    assert torch.allclose(fused.a[1].running_mean, ref.a[1].running_mean, rtol=1e-12, atol=0)
    fused.eval()
    ref.eval()
    with torch.no_grad():  # the statistics the train step updated, folded again
        assert (fused(x) - ref(x)).abs().max() <= 1e-12 * ref(x).abs().max()


def _fused_modules_in_sequentials(model):
    return [m for m in model.modules() if hasattr(m, "_chain") and isinstance(m, cuconv.nn.Conv2d)]


def test_converted_models_trace_with_torch_fx():
    """torch.fx.symbolic_trace of a converted model records cuconv's conv2d as one call (a Proxy never meets the
    argument checks), and the traced module computes what the model does."""
    torch.manual_seed(0)
    model = cuconv.nn.convert(_randomize(Net().double()).eval())
    traced = torch.fx.symbolic_trace(model)
    targets = {n.target for n in traced.graph.nodes if n.op == "call_function"}
    assert cuconv.nn.functional.conv2d in targets
    x = torch.randn(1, 3, 11, 11, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(traced(x), model(x))


def test_a_fused_model_runs_on_meta_tensors():
    """cuconv.nn.warmup runs a model on meta tensors: the fold is computed there, never cached by data pointer."""
    _, fused = _pair()
    fused = fused.to("meta")
    with torch.no_grad():
        y = fused(torch.empty(2, 3, 16, 16, dtype=torch.float64, device="meta"))
    assert y.is_meta and y.shape == (2, 10, 4, 4)


def test_fuse_argument_is_checked():
    with pytest.raises(TypeError, match="argument 'fuse' must be bool"):
        cuconv.nn.convert(torch.nn.Conv2d(1, 1, 1), fuse=1)


@pytest.mark.parametrize("position", ["before", "after"])
def test_functional_conv2d_takes_the_epilogue(position):
    torch.manual_seed(3)
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    r = torch.randn(2, 5, 8, 8, dtype=torch.float64, requires_grad=True)
    got = cuconv.nn.functional.conv2d(x, w, padding=1, activation="leaky_relu", negative_slope=0.3, residual=r,
                                      residual_position=position)
    y = _F.conv2d(x, w, padding=1)
    want = _F.leaky_relu(y + r, 0.3) if position == "before" else _F.leaky_relu(y, 0.3) + r
    assert (got - want).abs().max() <= 1e-12 * want.abs().max()
    gx, gw, gr = torch.autograd.grad(got.square().sum(), (x, w, r))
    hx, hw, hr = torch.autograd.grad(want.square().sum(), (x, w, r))
    for a, b in ((gx, hx), (gw, hw), (gr, hr)):
        assert (a - b).abs().max() <= 1e-10 * b.abs().max()
    with pytest.raises(ValueError, match="expected residual of size"):
        cuconv.nn.functional.conv2d(x, w, padding=1, residual=r[:, :4])
    with pytest.raises(ValueError, match="argument 'activation' must be None or one of"):
        cuconv.nn.functional.conv2d(x, w, activation="tanh")


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("autocast", [None, torch.bfloat16, torch.float16])
def test_fused_model_on_the_gpu_matches_torch(autocast, channels_last):
    """On CUDA: eager inference of the fused model within the precision's tolerance of torch's own model (float32
    with TF32 off, or autocast), channels-last too; and float64 to 1e-12."""
    torch.backends.cudnn.allow_tf32 = False
    ref, fused = _pair(dtype=torch.float32)
    ref, fused = ref.cuda(), fused.cuda()
    x = torch.randn(4, 3, 32, 32, device="cuda")
    if channels_last:
        ref, fused = ref.to(memory_format=torch.channels_last), fused.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        exact = ref.double()(x.double())
        ref.float()
        ctx = torch.autocast("cuda", dtype=autocast) if autocast else torch.autocast("cuda", enabled=False)
        with ctx:
            want, got = ref(x).double(), fused(x).double()
    bound = 2e-3 if autocast else 1e-5
    torch_err = float((want - exact).norm() / exact.norm())
    assert float((got - exact).norm() / exact.norm()) <= max(bound, 2 * torch_err)
    ref64, fused64 = _pair(dtype=torch.float64)
    ref64, fused64 = ref64.cuda(), fused64.cuda()
    with torch.no_grad():
        x64 = x.double()
        assert float((fused64(x64) - ref64(x64)).norm() / ref64(x64).norm()) <= 1e-12


@pytest.mark.gpu
def test_fused_model_replays_in_a_cuda_graph_and_compiles():
    ref, fused = _pair(dtype=torch.float32)
    ref, fused = ref.cuda(), fused.cuda()
    x = torch.randn(2, 3, 32, 32, device="cuda")
    with torch.no_grad():
        want = fused(x)
        graph, out = captured(fused, x)
        graph.replay()
        assert torch.equal(out, want)
        # a checkpoint loaded after the capture: the graph replays the new fold (refolded into the captured
        # tensors at once), as torch's graph replays new parameters
        other = _randomize(copy.deepcopy(ref), seed=1)
        fused.load_state_dict(other.state_dict())
        graph.replay()
        replayed = out.clone()
        want = fused(x)  # (eager, as the graph's kernels compute: the same bits)
        assert torch.equal(replayed, want)
        exact = copy.deepcopy(other).double()(x.double())
        assert float((replayed.double() - exact).norm() / exact.norm()) <= 5e-3  # (TF32 where torch's flags say)
        old = copy.deepcopy(ref).double()(x.double())
        assert float((old - exact).norm() / exact.norm()) > 1e-2  # (the checkpoint changed the outputs)
        compiled = torch.compile(fused)
        assert float((compiled(x) - want).abs().max()) <= 1e-4 * float(want.abs().max())


@pytest.mark.gpu
def test_a_call_like_the_last_one_skips_the_checks_and_follows_every_change(monkeypatch):
    """On CUDA without gradients a fused call like the one before it (same shapes, strides, dtypes, autocast,
    precision, configuration, weights) runs the layer it bound without the checked path; any change (a BatchNorm
    edited in place, ``.to()``, another batch, channels-last, autocast, a new Parameter) binds again, and every
    output matches torch's model."""
    import cuconv.nn.functional as cf

    torch.backends.cudnn.allow_tf32 = False
    ref, fused = _pair(dtype=torch.float32)
    ref, fused = ref.cuda(), fused.cuda()
    binds = []
    real = cf.fused_layer
    monkeypatch.setattr(cf, "fused_layer", lambda *a: binds.append(1) or real(*a))
    chains = len(_fused_modules(fused))
    x = torch.randn(3, 3, 24, 24, device="cuda")

    def check(x, tol=1e-5):
        want, got = ref(x).double(), fused(x).double()
        assert float((got - want).norm() / want.norm()) <= tol

    with torch.no_grad():
        check(x)
        assert len(binds) == chains
        binds.clear()
        check(x)
        check(x.clone())  # (other memory, the same signature)
        assert binds == []  # (every chain's call bound)
        for bn in (ref.get_submodule("layer1.1.bn2"), fused.get_submodule("layer1.1.bn2")):
            bn.running_var.mul_(2.0)
            bn.bias.add_(0.5)
        check(x)
        assert len(binds) == 1  # (the chain of the edited BatchNorm alone)
        binds.clear()
        check(torch.randn(1, 3, 24, 24, device="cuda"))  # (another batch)
        assert len(binds) == chains
        with torch.autocast("cuda", dtype=torch.bfloat16):
            want, got = ref(x).double(), fused(x).double()
        assert float((got - want).norm() / want.norm()) <= 2e-2
        conv = fused.get_submodule("stem.0")
        for m in (ref.get_submodule("stem.0"), conv):
            m.weight = torch.nn.Parameter(m.weight.detach() * 1.5)  # (a new Parameter object)
        check(x)
        ref, fused = ref.to(memory_format=torch.channels_last), fused.to(memory_format=torch.channels_last)
        check(x.contiguous(memory_format=torch.channels_last))
        fused.get_submodule("stem.1").train()  # (a BatchNorm in train mode: the original graph)
        ref.get_submodule("stem.1").train()
        check(x)
    with torch.no_grad():
        ref.eval(), fused.eval()
        check(x)
    twin = copy.deepcopy(fused)  # (a copy binds its own calls)
    assert all(m._bound_call.value is None for m in _fused_modules(twin))
    with torch.no_grad():
        assert torch.equal(twin(x), fused(x))
    xg = x.clone().requires_grad_(True)  # (gradients recorded: the checked path, differentiable)
    y = fused(xg)
    y.sum().backward()
    assert xg.grad is not None


class StochasticDepth(torch.nn.Module):
    """torchvision.ops.StochasticDepth's behaviour (row mode): the identity in eval mode."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        keep = torch.empty((x.shape[0], 1, 1, 1), dtype=x.dtype, device=x.device).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


class _MBConv(torch.nn.Module):
    """EfficientNet's residual: x + stochastic_depth(bn(conv(silu(bn(conv(x))))))."""

    def __init__(self, c):
        super().__init__()
        self.block = torch.nn.Sequential(
            torch.nn.Sequential(torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c),
                                torch.nn.SiLU()),
            torch.nn.Sequential(torch.nn.Conv2d(c, c, 1, bias=False), torch.nn.BatchNorm2d(c)))
        self.stochastic_depth = StochasticDepth(0.5)

    def forward(self, x):
        result = self.stochastic_depth(self.block(x))
        result += x
        return result


def test_residuals_fuse_across_stochastic_depth_and_train_mode_still_drops():
    ref, fused = _pair(lambda: _MBConv(6))
    chains = _fused_modules(fused)
    assert len(chains) == 2 and chains[1].residual is not None and chains[1].passthrough
    x = torch.randn(8, 6, 7, 7, dtype=torch.float64)
    with torch.no_grad():
        assert (fused(x) - ref(x)).abs().max() <= 1e-12 * ref(x).abs().max()
    ref.train()
    fused.train()
    torch.manual_seed(7)
    want = ref(x)
    torch.manual_seed(7)
    got = fused(x)
    assert (got - want).abs().max() <= 1e-12 * want.abs().max()


class _ModeBranch(torch.nn.Module):
    """Python control flow on ``self.training`` (as torchvision's Inception and GoogLeNet have): a graph traced in one
    mode would bake that branch in."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
        self.aux = torch.nn.Conv2d(4, 4, 1)

    def forward(self, x):
        y = self.a(x)
        if self.training:
            return y + self.aux(y)
        return y


def test_models_whose_graph_depends_on_the_mode_fuse_only_their_sequentials():
    ref, fused = _pair(_ModeBranch)
    assert type(fused) is _ModeBranch and _fused_modules_in_sequentials(fused)
    assert sorted(ref.state_dict()) == sorted(fused.state_dict())
    _agree_in_both_modes(ref, fused, torch.randn(2, 3, 6, 6, dtype=torch.float64))


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_functional_epilogue_on_cuda_is_one_fused_layer(dtype, channels_last):
    """Without gradients on CUDA, conv2d with an activation and a residual runs one layer whose plan holds the
    epilogue; its result matches torch's unfused ops (TF32 off), NCHW and channels-last, a residual of the other
    layout copied; with gradients the same call is differentiable through torch's ops."""
    torch.backends.cudnn.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(3, 16, 14, 13, device="cuda", generator=g).to(dtype)
    w = torch.randn(24, 16, 3, 3, device="cuda", generator=g).to(dtype)
    b = torch.randn(24, device="cuda", generator=g).to(dtype)
    r = torch.randn(3, 24, 14, 13, device="cuda", generator=g).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        v = _F.conv2d(x.double(), w.double(), b.double(), padding=1) + r.double()
        want = v * (v + 3).clamp(0, 6) / 6  # (torch's CUDA hardswish multiplies float64 by 1/6 rounded to fp32)
        for _ in range(2):  # (the second call: the layer kept for the signature)
            got = cuconv.nn.functional.conv2d(x, w, b, padding=1, activation="hardswish", residual=r)
            assert got.dtype == dtype and got.shape == want.shape
            tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3}[dtype]
            assert float((got.double() - want).norm() / want.norm()) <= tol
    xg = x.detach().clone().requires_grad_(True)
    y = cuconv.nn.functional.conv2d(xg, w, b, padding=1, activation="hardswish", residual=r)
    y.float().sum().backward()
    assert xg.grad is not None and xg.grad.shape == x.shape
