"""``cuconv.nn._bound`` on the CPU: the bound call's logic (keys, weights' records, what is made again each call)
with the GPU parts stood in for (a tensor type that says it is on CUDA; the layer's lookup and run recorded), and
the record's comparisons. The GPU tests (tests/test_nn_gpu.py, tests/test_fuse.py) run the real path."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import cuconv.nn  # noqa: E402
from cuconv.nn import _bound, modules  # noqa: E402
from cuconv.nn import functional as F  # noqa: E402


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA (the bound path's entry test), computed as a plain tensor."""

    @property
    def is_cuda(self):
        return True

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class _Layer:
    """A stand-in layer: the geometry to run with torch's convolution."""

    def __init__(self, conv):
        self.stride, self.padding, self.dilation, self.groups = conv.stride, conv.padding, conv.dilation, conv.groups


@pytest.fixture
def recorded(monkeypatch):
    """(finds, runs): each call of the checked lookup (``plain_layer``) and of the run, with the weight it ran."""
    finds, runs = [], []

    def plain_layer(x, w, b, stride, padding, dilation, groups, algo):
        finds.append(1)
        return _Layer(types_conv[0]), x, w, b

    def run_layer(layer, x, w, b):
        runs.append(w)
        return torch.nn.functional.conv2d(x.as_subclass(torch.Tensor), w, b, layer.stride, layer.padding,
                                          layer.dilation, layer.groups)

    types_conv = []
    monkeypatch.setattr(modules, "_Tensor", _OnCuda)
    monkeypatch.setattr(F, "plain_layer", plain_layer)
    monkeypatch.setattr(F, "run_layer", run_layer)
    return finds, runs, types_conv


def test_a_call_like_the_last_runs_its_layer_and_any_change_finds_it_again(recorded):
    finds, runs, types_conv = recorded
    torch.manual_seed(0)
    ref = torch.nn.Conv2d(4, 6, 3, padding=1)
    conv = cuconv.nn.convert(copy.deepcopy(ref))
    types_conv.append(conv)
    x = torch.randn(2, 4, 7, 5).as_subclass(_OnCuda)
    plain = x.as_subclass(torch.Tensor)

    def check():
        assert torch.allclose(conv(x), ref(plain), atol=1e-6)

    with torch.no_grad():
        check()
        check()
        assert len(finds) == 1 and len(runs) == 2 and runs[-1] is conv.weight  # (the weight itself, each call)
        for m in (ref, conv):
            m.weight.mul_(0.5)  # (a new version)
        check()
        assert len(finds) == 2
        for m in (ref, conv):
            m.weight.data = m.weight.data * 2  # (a new data pointer, no new version)
        check()
        assert len(finds) == 3
        for m in (ref, conv):
            m.bias = torch.nn.Parameter(m.bias.detach() + 1)  # (a new Parameter)
        check()
        assert len(finds) == 4
        conv.stride = (2, 2)  # (the geometry is in the key)
        ref.stride = (2, 2)
        check()
        assert len(finds) == 5
        with cuconv.config(workspace_limit=1 << 20):  # (the configuration too)
            check()
        assert len(finds) == 6
    conv(x)  # (gradients recorded: the checked path, nothing bound or run through the stand-ins)
    assert len(finds) == 6


def test_a_weight_made_anew_is_made_each_call(recorded, monkeypatch):
    """Where the layer takes another layout of the weight (or autocast's cast), the bound call makes it again from
    the module's weight each call: an edit through .data shows."""
    finds, runs, types_conv = recorded
    torch.manual_seed(0)
    conv = cuconv.nn.Conv2d(4, 6, 3, padding=1)
    types_conv.append(conv)
    real = F.plain_layer

    def laid_out(x, w, b, *args):  # (the layer reads a contiguous copy of a channels-last weight)
        layer, x, w, b = real(x, w, b, *args)
        return layer, x, w.contiguous().clone(), b
    monkeypatch.setattr(F, "plain_layer", laid_out)
    monkeypatch.setattr(F, "layer_operands", lambda layer, w, b: (w.contiguous().clone(), b))
    x = torch.randn(1, 4, 6, 6).as_subclass(_OnCuda)
    with torch.no_grad():
        conv(x)
        conv.weight.data.mul_(-1)  # (no new version, no new pointer)
        y = conv(x)
    assert len(finds) == 1 and runs[-1] is not conv.weight
    assert torch.allclose(y, torch.nn.functional.conv2d(x.as_subclass(torch.Tensor), conv.weight, conv.bias, padding=1),
                          atol=1e-6)


def test_a_subclass_with_its_own_conv_forward_is_not_bound(recorded):
    finds, runs, types_conv = recorded

    class Doubled(cuconv.nn.Conv2d):
        def _conv_forward(self, input, weight, bias):
            return torch.nn.functional.conv2d(input.as_subclass(torch.Tensor), 2 * weight, bias, self.stride,
                                              self.padding)

    conv = Doubled(4, 6, 3, padding=1)
    types_conv.append(conv)
    x = torch.randn(1, 4, 6, 6).as_subclass(_OnCuda)
    with torch.no_grad():
        y = conv(x)
    assert finds == [] and torch.allclose(
        y, torch.nn.functional.conv2d(x.as_subclass(torch.Tensor), 2 * conv.weight, conv.bias, padding=1), atol=1e-6)


def test_the_record_compares_identity_version_pointer_dtype_and_shape():
    w, b = torch.randn(6, 4, 3, 3), torch.randn(6)
    kept = _bound.record((w, b))
    assert _bound.unchanged(kept, (w, b))
    assert not _bound.unchanged(kept, (w.clone(), b))  # (another tensor of equal values)
    b.add_(1)
    assert not _bound.unchanged(kept, (w, b))
    kept = _bound.record((w, b))
    b.data = b.data.to(torch.float64)
    assert not _bound.unchanged(kept, (w, b))
    kept = _bound.record((w, None))
    assert _bound.unchanged(kept, (w, None)) and not _bound.unchanged(kept, (w, b))
    with torch.inference_mode():
        t = torch.randn(3)
    assert _bound.record((t,)) is None  # (no version counter: nothing kept)


def test_a_slot_is_neither_copied_nor_pickled():
    import pickle

    conv = cuconv.nn.Conv2d(2, 3, 1)
    _bound.slot(conv).value = ("anything",)
    assert copy.deepcopy(conv)._bound_call.value is None
    assert pickle.loads(pickle.dumps(conv))._bound_call.value is None


def test_a_fused_call_like_the_last_runs_its_layer_with_the_fold_kept(monkeypatch):
    """FusedConv2d: the bound call runs the fold it was made with while the convolution's and the BatchNorm's
    tensors stay; an in-place edit folds again; an edit through .data needs ``refold`` (as the fold's cache)."""
    from cuconv.nn import fuse

    finds, runs = [], []

    def fused_layer(x, w, b, stride, padding, dilation, groups, algo, activation, slope, residual, position):
        finds.append(1)
        return (stride, padding), x, w, b

    def run_fused(layer, x, w, b, residual):
        runs.append(w)
        return torch.relu(torch.nn.functional.conv2d(x.as_subclass(torch.Tensor), w, b, *layer))

    monkeypatch.setattr(fuse, "_Tensor", _OnCuda)
    monkeypatch.setattr(F, "fused_layer", fused_layer)
    monkeypatch.setattr(F, "run_fused", run_fused)
    torch.manual_seed(0)
    conv, bn = cuconv.nn.Conv2d(4, 6, 3, padding=1, bias=False), torch.nn.BatchNorm2d(6).eval()
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2)
        bn.weight.normal_()
        bn.bias.normal_()
    fused = fuse.FusedConv2d(conv, bn, "relu").eval()
    x = torch.randn(2, 4, 6, 6).as_subclass(_OnCuda)
    plain = x.as_subclass(torch.Tensor)

    def check():
        want = torch.relu(bn(torch.nn.functional.conv2d(plain, conv.weight, None, 1, 1)))
        assert torch.allclose(fused(x), want, atol=1e-5)

    with torch.no_grad():
        check()
        check()
        assert len(finds) == 1 and runs[0] is runs[1]  # (the kept fold)
        bn.running_var.mul_(2)
        check()
        assert len(finds) == 2
        bn.weight.data.mul_(-1)  # (no new version: the fold is refolded on request)
        fused.refold()
        check()
        assert len(finds) == 3
        assert fuse._bound.slot(fused).value is not None
        bn.train()
        fused(x)  # (a BatchNorm in train mode: the original graph, the bound call dropped)
        assert fuse._bound.slot(fused).value is None and len(finds) == 3
