"""``cuconv.nn.fuse_linear``: a Linear on a channels-last image's channels as a 1x1 convolution with its epilogue
(ConvNeXt's blocks): which chains fuse, outputs against the unfused torch model (float64 to 1e-12 on the CPU path),
torch's result dtypes under autocast, the state_dict kept, the fold following every change, train mode and other
ranks running the original operations; on the GPU bf16/fp16, channels-last and CUDA graphs."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import cuconv.nn  # noqa: E402
from cases import captured  # noqa: E402
from cuconv.nn.fuse_linear import FusedLinear  # noqa: E402
from test_fuse import StochasticDepth  # noqa: E402  (torchvision's, which the fusion knows by its name)


class _Permute(torch.nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return torch.permute(x, self.dims)


class _CNBlock(torch.nn.Module):
    """torchvision's ConvNeXt block, as torchvision writes it."""

    def __init__(self, dim, p=0.1):
        super().__init__()
        self.block = torch.nn.Sequential(
            torch.nn.Conv2d(dim, dim, 7, padding=3, groups=dim), _Permute([0, 2, 3, 1]),
            torch.nn.LayerNorm(dim, eps=1e-6), torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
            torch.nn.Linear(4 * dim, dim), _Permute([0, 3, 1, 2]))
        self.layer_scale = torch.nn.Parameter(torch.randn(dim, 1, 1))
        self.stochastic_depth = StochasticDepth(p)

    def forward(self, input):
        result = self.layer_scale * self.block(input)
        result = self.stochastic_depth(result)
        result += input
        return result


class _LayerNorm2d(torch.nn.LayerNorm):
    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = torch.nn.functional.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class ConvNeXtish(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 4, stride=4), _LayerNorm2d(16, eps=1e-6))
        self.stage1 = torch.nn.Sequential(_CNBlock(16), _CNBlock(16))
        self.down = torch.nn.Sequential(_LayerNorm2d(16, eps=1e-6), torch.nn.Conv2d(16, 32, 2, stride=2))
        self.stage2 = torch.nn.Sequential(_CNBlock(32))
        self.head = torch.nn.Sequential(torch.nn.Flatten(1), torch.nn.Linear(32, 20), torch.nn.ReLU(),
                                        torch.nn.Linear(20, 10))

    def forward(self, x):
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(torch.nn.functional.adaptive_avg_pool2d(x, 1))


def _pair(dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    ref = ConvNeXtish().to(dtype).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return ref, cuconv.nn.convert(copy.deepcopy(ref), fuse=True).eval()


def _fused_linears(model):
    return [m for m in model.modules() if isinstance(m, FusedLinear)]


def _err(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm())


def test_convnext_blocks_fuse_both_linears_and_match_the_unfused_model():
    ref, fused = _pair()
    found = _fused_linears(fused)
    # (two a block; the head's Linear -> ReLU too, which runs torch's operations on its 2-D input)
    assert sorted(repr((m.activation, m.to_nchw, m.scale, m.norm is not None)) for m in found) == sorted(
        [repr(("gelu", False, None, True))] * 3 + [repr((None, True, "layer_scale", False))] * 3
        + [repr(("relu", False, None, False))])
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        want, got = ref(x), fused(x)
        assert _err(got, want) <= 1e-12
        got_again = fused(x)  # (the kept fold)
    assert torch.equal(got, got_again)
    ref32, fused32 = _pair(torch.float32)
    with torch.no_grad():
        assert _err(fused32(x.float()), ref32(x.float())) <= 1e-5


def test_the_state_dict_stays_the_originals_and_checkpoints_load_both_ways():
    ref, fused = _pair()
    assert list(fused.state_dict()) == list(ref.state_dict())
    other, _ = _pair(seed=3)
    fused.load_state_dict(other.state_dict())
    x = torch.randn(1, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        assert _err(fused(x), other(x)) <= 1e-12
        ref.load_state_dict(fused.state_dict())
        assert _err(ref(x), other(x)) == 0.0


def test_the_fold_follows_the_scale_and_the_weights_and_a_checkpoint_refolds_in_place():
    ref, fused = _pair()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        fused(x)
        second = [m for m in _fused_linears(fused) if m.to_nchw][0]
        kept = second._folded[2]
        for model in (ref, fused):
            model.get_parameter("stage1.0.layer_scale").mul_(-3.0)
            model.get_parameter("stage1.0.block.3.weight").add_(0.5)
        assert _err(fused(x), ref(x)) <= 1e-12
        other, _ = _pair(seed=5)
        fused.load_state_dict(other.state_dict())
        assert second._folded[2] is kept  # (refolded into the kept tensors at once: a CUDA graph may read them)
        scale = fused.get_parameter("stage1.0.layer_scale").reshape(-1, 1, 1, 1)
        assert torch.equal(kept, other.get_parameter("stage1.0.block.5.weight").reshape(16, 64, 1, 1) * scale)
        assert _err(fused(x), other(x)) <= 1e-12
        for model in (fused, other):  # (no new version: refold is the user's)
            model.get_parameter("stage1.0.layer_scale").data.mul_(2.0)
        second.refold()
        assert _err(fused(x), other(x)) <= 1e-12


def test_the_layer_norms_affine_part_is_folded_into_the_linear_after_it():
    """W·(γ·n + β) + b = (W·diag γ)·n + (W·β + b): the first Linear's fold takes the LayerNorm's weight and bias
    (its call normalizes without them), and follows edits of either."""
    ref, fused = _pair()
    first = [m for m in _fused_linears(fused) if m.norm is not None][0]
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        fused(x)
        ln, linear = first.norm, first.linear
        weight, bias = first._folded[2], first._folded[3]
        assert torch.equal(weight, (linear.weight * ln.weight[None, :]).reshape(weight.shape))
        assert torch.allclose(bias, linear.bias + linear.weight @ ln.bias, rtol=1e-15, atol=1e-15)
        for model in (ref, fused):
            norm = model.get_submodule("stage1.0.block.2")
            norm.weight.mul_(-2.0)
            norm.bias.add_(1.0)
        assert _err(fused(x), ref(x)) <= 1e-12


def test_train_mode_and_gradients_run_the_original_operations():
    """Train mode: the converted model's operations, in its order (bit for bit the unfused converted model's,
    stochastic depth's draws too)."""
    _, fused = _pair()
    ref = cuconv.nn.convert(_pair()[0])
    ref.train(), fused.train()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    torch.manual_seed(7)
    want = ref(x)
    want.sum().backward()
    torch.manual_seed(7)
    got = fused(x)
    got.sum().backward()
    assert torch.equal(got, want)
    for (name, p), q in zip(ref.named_parameters(), fused.parameters()):
        assert torch.equal(p.grad, q.grad), name
    ref.eval(), fused.eval()
    xg = x.clone().requires_grad_(True)  # (eval mode with gradients recorded: differentiable)
    fused(xg).sum().backward()
    assert xg.grad is not None


def test_other_ranks_and_non_contiguous_inputs_run_the_original_operations():
    """(and a fused call's result is contiguous, as torch's Linear's)"""
    linear = torch.nn.Linear(8, 12).double()
    fused = FusedLinear(linear, "gelu")
    for x in (torch.randn(5, 8, dtype=torch.float64), torch.randn(2, 3, 8, dtype=torch.float64),
              torch.randn(2, 8, 3, 4, dtype=torch.float64).permute(0, 2, 3, 1)):
        with torch.no_grad():
            assert torch.equal(fused(x), torch.nn.functional.gelu(linear(x)))
    assert fused._folded is None
    x = torch.randn(2, 3, 4, 8, dtype=torch.float64)
    with torch.no_grad():
        got = fused(x)
        assert _err(got, torch.nn.functional.gelu(linear(x))) <= 1e-12 and got.is_contiguous()
    assert fused._folded is not None
    with pytest.raises(TypeError, match="no residual tensor expected"):
        fused(x, x)


def test_a_fused_model_traces_compiles_and_runs_on_meta_tensors():
    ref, fused = _pair()
    x = torch.randn(1, 3, 32, 32, dtype=torch.float64)
    traced = torch.fx.symbolic_trace(fused)
    with torch.no_grad():
        assert _err(traced(x), ref(x)) <= 1e-12
        torch._dynamo.reset()
        compiled = torch.compile(fused, backend="eager")
        assert _err(compiled(x), ref(x)) <= 1e-12
        torch._dynamo.reset()
        assert fused.to("meta")(x.to("meta")).shape == (1, 10)


def test_a_fold_that_is_the_linears_own_memory_is_never_written_into_and_follows_in_place_updates():
    """A Linear without a bias in float64: the fold (a cast to its own dtype, a reshape) is the Parameter's memory,
    no copy; a refold must then replace it, never write into it (that would overwrite the Parameter, and raise under
    autograd's view rules)."""
    linear = torch.nn.Linear(8, 12, bias=False).double()
    fused = FusedLinear(linear, "relu")
    x = torch.randn(2, 3, 4, 8, dtype=torch.float64)
    with torch.no_grad():
        fused(x)
        assert fused._folded[2].untyped_storage().data_ptr() == linear.weight.untyped_storage().data_ptr()
        before = linear.weight.clone()
        linear.weight.add_(1.0)
        assert _err(fused(x), torch.relu(linear(x))) <= 1e-12
        assert torch.equal(linear.weight, before + 1.0)  # (only the update itself)
    linear.weight = torch.nn.Parameter(torch.randn(12, 8, dtype=torch.float64))  # (a new Parameter)
    with torch.no_grad():
        assert _err(fused(x), torch.relu(linear(x))) <= 1e-12


class _InPlace(torch.nn.Module):
    def __init__(self, into_residual: bool):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.into_residual = into_residual

    def forward(self, x):
        r = x.permute(0, 3, 1, 2).clone()
        y = self.linear(x).permute(0, 3, 1, 2)
        # (add_, not +=: torch.fx traces += as an add that is not in place)
        if self.into_residual:  # (writes r, which is read again after)
            r.add_(y)
            return r * 2 + r
        return y.add_(r)


@pytest.mark.parametrize("into_residual", [False, True])
def test_an_in_place_add_fuses_only_where_it_writes_the_chains_own_value(into_residual):
    model = _InPlace(into_residual).double().eval()
    fused = cuconv.nn.convert(copy.deepcopy(model), fuse=True).eval()
    assert len(_fused_linears(fused)) == (0 if into_residual else 1)
    if not into_residual:
        assert _fused_linears(fused)[0].in_place
    x = torch.randn(2, 4, 4, 8, dtype=torch.float64)
    with torch.no_grad():
        assert _err(fused(x), model(x)) <= 1e-12


def test_modules_with_hooks_are_left_alone():
    ref, _ = _pair()
    seen = []
    ref.get_submodule("stage1.0.block.3").register_forward_hook(lambda m, i, o: seen.append(1))
    fused = cuconv.nn.convert(copy.deepcopy(ref), fuse=True).eval()
    # (stage1.0's first Linear kept its hook and its own call; the others fused)
    assert len([m for m in _fused_linears(fused) if m.norm is not None]) == 2
    with torch.no_grad():
        fused(torch.randn(1, 3, 32, 32, dtype=torch.float64))
    assert seen == [1]


def test_a_chain_that_does_not_match_is_left_alone():
    class _Other(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)
            self.scale = torch.nn.Parameter(torch.randn(4))  # (per column of (N, C, H, W), not per channel)

        def forward(self, x):
            y = self.linear(x).permute(0, 3, 1, 2)
            return self.scale * y + x.permute(0, 3, 1, 2)

    model = _Other().double().eval()
    fused = cuconv.nn.convert(copy.deepcopy(model), fuse=True)
    x = torch.randn(2, 4, 4, 8, dtype=torch.float64)
    assert _fused_linears(fused) == []
    with torch.no_grad():
        assert torch.equal(fused(x), model(x))


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("autocast", [torch.bfloat16, torch.float16, None])
def test_fused_linears_on_the_gpu_match_torch_and_keep_its_dtypes(autocast, channels_last, monkeypatch):
    """On CUDA: autocast (the Linears in the half type, the residual stream float32 as torch's type promotion makes
    it), a float16 model and float64 (to 1e-12) within the precision's tolerance of torch's own model, a LayerNorm's
    eps changed after its call was bound; float32 without autocast runs torch's operations (its matmul precision):
    the same bits as the converted unfused model."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    ref, fused = _pair(torch.float32)
    plain = cuconv.nn.convert(copy.deepcopy(ref))
    ref, fused, plain = ref.cuda(), fused.cuda(), plain.cuda()
    x = torch.randn(3, 3, 64, 64, device="cuda")
    if channels_last:
        ref, fused, plain = (m.to(memory_format=torch.channels_last) for m in (ref, fused, plain))
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        exact = copy.deepcopy(ref).double()(x.double())
        if autocast is None:
            assert torch.equal(fused(x), plain(x))  # (torch's Linears, cuconv's convolutions)
            return
        with torch.autocast("cuda", dtype=autocast):
            want, got = ref(x), fused(x)
        assert _err(got, exact) <= max(2e-3, 2 * _err(want, exact))
        for model in (ref, fused):  # (after the bound calls: a new eps binds again)
            model.get_submodule("stage1.0.block.2").eps = 0.5
        with torch.autocast("cuda", dtype=autocast):
            want, got = ref(x), fused(x)
        exact = copy.deepcopy(ref).double()(x.double())
        assert _err(got, exact) <= max(2e-3, 2 * _err(want, exact))
        # a stage's blocks: the first adds its bf16 input to the float32 scaled branch, the next a float32 input
        torch.manual_seed(2)
        stage = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 4, stride=4), _CNBlock(16), _CNBlock(16)).cuda().eval()
        stage_fused = cuconv.nn.convert(copy.deepcopy(stage), fuse=True).eval()
        if channels_last:
            stage, stage_fused = stage.to(memory_format=torch.channels_last), stage_fused.to(
                memory_format=torch.channels_last)
        stage_exact = copy.deepcopy(stage).double()(x.double())
        with torch.autocast("cuda", dtype=autocast):
            want, got = stage(x), stage_fused(x)
        assert got.dtype == want.dtype == torch.float32
        assert got.stride() == want.stride()
        assert _err(got, stage_exact) <= max(2e-3, 2 * _err(want, stage_exact))
        half_ref, half_fused = copy.deepcopy(ref).half(), copy.deepcopy(fused).half()
        want, got = half_ref(x.half()), half_fused(x.half())
        assert got.dtype == torch.float16
        assert _err(got, exact) <= max(2e-3, 2 * _err(want, exact))
        ref64, fused64 = ref.double(), fused.double()
        assert _err(fused64(x.double()), ref64(x.double())) <= 1e-12


@pytest.mark.gpu
def test_fused_linears_replay_in_a_cuda_graph_after_a_checkpoint():
    ref, fused = _pair(torch.float32)
    ref, fused = ref.cuda(), fused.cuda()
    x = torch.randn(2, 3, 64, 64, device="cuda")
    # (autocast's cache off, as torch advises for a graph capture: the head's Linear is torch's, and its cached bf16
    # weight, which the graph would read, is not made again after a load within one autocast region)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        want = fused(x)
        graph, out = captured(fused, x)
        graph.replay()
        assert torch.equal(out, want)
        other, _ = _pair(torch.float32, seed=9)
        fused.load_state_dict(other.state_dict())
        graph.replay()
        replayed = out.clone()
        assert torch.equal(replayed, fused(x))
        exact = other.cuda().double()(x.double())
        assert _err(replayed, exact) <= 2e-2
