"""``cuconv.nn.convert(model, fuse=True)``'s pointwise layers: a ``torch.nn.Linear`` applied to the channels of a
channels-last image, (N, H, W, C) -> (N, H, W, K), is a 1x1 convolution of the channels-last (N, C, H, W) tensor
that is the same memory, and runs as one with its epilogue (``FusedLinear``). ConvNeXt's blocks are the pattern:

    depthwise conv -> permute(0, 2, 3, 1) -> LayerNorm -> Linear -> GELU -> Linear -> permute(0, 3, 1, 2)
        -> layer scale (a per-channel Parameter) -> stochastic depth -> add the block's input

Two chains of such a graph are fused (``fuse_linears``): ``[LayerNorm] -> Linear -> activation`` (the norm's
affine part folded into the Linear's weight and bias, its normalization one pass of ``blocks.layer_norm`` into the
Linear's precision, the GELU in the Linear's epilogue) and ``Linear -> permute(0, 3, 1, 2) -> [mul by a
per-channel tensor] -> [dropout, stochastic depth] -> add`` (the scale folded into the second Linear's weight and
bias, the residual added in its epilogue), each link's value used by the next link only.

A fused call runs so for inference (no gradients recorded, nothing compiling or tracing, the dropouts in eval
mode) on a contiguous 4-D input, in the precisions where torch's Linear and cuconv's convolution compute alike:
float16 and bfloat16 (a model of those, or CUDA autocast, which casts a Linear as it casts a convolution), float64,
and float32 on the CPU. CUDA float32 follows torch's matmul precision, not its convolutions' (TF32 off by default),
so there, as everywhere else (train mode, other ranks, CPU autocast, under ``torch.compile``, whose inductor fuses
these elementwise tails itself), the chain runs as the original graph's operations. The result has torch's dtype:
under autocast a float32 scale or residual makes the sum float32, as torch's type promotion does (then the add is
torch's, after the kernel; the residual is added in the kernel where it has the result's dtype).

The Linear stays registered where it was and the scale where it was (the same Parameter objects): the state_dict
is the original's. The folded weight is kept while its tensors are unchanged (``_bound.record``), refolded into the
kept tensors where it can be (a CUDA graph may have captured them), and at once after a ``load_state_dict``.
"""

from __future__ import annotations

import operator
from typing import Optional

import torch

from ..blocks import layer_norm
from . import _bound, _bridge
from . import functional as F
from .fuse import _RefreshHook, _apply_activation, _depends_on, _identity_in_eval, _in_place_add, _only_user, \
    _plain, _refreshable, _residual_of, activation_of, describe, write_fold

__all__ = ["FusedLinear", "fuse_linears"]

_Tensor = torch.Tensor
_nnF = torch.nn.functional
_is_compiling = torch.compiler.is_compiling
_is_tracing = torch._C._is_tracing
_forward_ad = torch.autograd.forward_ad
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
_HALVES = (torch.float16, torch.bfloat16)
_current_device = F._current_device
_TO_NCHW = (0, 3, 1, 2)
_ONES, _ZEROS = (1, 1), (0, 0)  # (a 1x1 convolution's stride and dilation, its padding)


class FusedLinear(torch.nn.Module):
    """One call of ``linear`` on a channels-last image's channels as cuconv's 1x1 convolution (see the module): its
    ``activation`` after it (``slope`` leaky_relu's); or, with ``to_nchw``, the result permuted to (N, K, H, W),
    multiplied by the per-channel tensor ``owner.<scale>`` (None: no scale), passed through ``passthrough`` (modules
    that are the identity in eval mode) and added to the residual. ``forward(x, residual=None)``.

    It holds ``linear`` and the scale's owner by reference, not as submodules: they stay where the model had them."""

    def __init__(self, linear: torch.nn.Linear, activation: Optional[str] = None, slope: float = 0.0,
                 to_nchw: bool = False, owner: Optional[torch.nn.Module] = None, scale: Optional[str] = None,
                 passthrough: tuple = (), norm: Optional[torch.nn.LayerNorm] = None, in_place: bool = False):
        super().__init__()
        if to_nchw == (activation is not None):
            raise ValueError("cuconv: FusedLinear takes an activation, or to_nchw with a residual, not both")
        if norm is not None and (to_nchw or tuple(norm.normalized_shape) != (linear.in_features,)):
            raise ValueError("cuconv: FusedLinear's norm is a LayerNorm over the Linear's input features, before "
                             "an activation")
        object.__setattr__(self, "linear", linear)
        object.__setattr__(self, "owner", owner)
        object.__setattr__(self, "norm", norm)
        object.__setattr__(self, "passthrough", tuple(passthrough))
        self.activation, self.slope, self.to_nchw, self.scale = activation, float(slope), to_nchw, scale
        self.in_place = in_place  # (the residual added by ``value += residual``: torch keeps the value's dtype)
        # (the fold's dtype, its inputs' record, weight (K, C, 1, 1), bias: ``_weights``)
        self._folded = None
        object.__setattr__(self, "_bound_call", _bound.Slot())
        for module in (linear, owner, norm):
            if module is not None:
                module.register_load_state_dict_post_hook(_RefreshHook(self))

    def extra_repr(self) -> str:
        parts = [f"activation={self.activation!r}"] if self.activation else ["to_nchw=True, residual=True"]
        if self.norm is not None:
            parts.insert(0, f"norm=LayerNorm(eps={self.norm.eps})")
        return describe(parts, self, [f"scale={self.scale!r}"] if self.scale else [])

    def _scale_tensor(self):
        if self.scale is None:
            return None
        owner = self.owner
        found = owner._parameters.get(self.scale)
        if found is None:
            found = owner._buffers.get(self.scale)
        return found if found is not None else getattr(owner, self.scale)

    def _fold_inputs(self) -> tuple:
        """The tensors the fold reads: the Linear's weight and bias, the scale, the norm's weight and bias (None
        where absent)."""
        w, b = _bound.parameters(self.linear)
        norm = self.norm
        if norm is None:
            return (w, b, self._scale_tensor(), None, None)
        q = norm._parameters
        return (w, b, None, q.get("weight"), q.get("bias"))

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        if (residual is None) == self.to_nchw:
            raise TypeError(f"FusedLinear.forward(): {'a' if self.to_nchw else 'no'} residual tensor expected")
        key = None
        if type(x) is _Tensor and x.is_cuda and (residual is None or type(residual) is _Tensor) and \
                _bound.may_bind() and not (self.passthrough and any(m.training for m in self.passthrough)):
            # (what a call depends on besides the fold's tensors: a call like the last one runs its layer)
            key = (x.shape, x.stride(), x.dtype, x.device,
                   None if residual is None else _bound.tensor_key(residual), _bound.context(),
                   None if self.norm is None else self.norm.eps)
            bound = _bound.slot(self).value
            if bound is not None and key == bound[0] and _bound.unchanged(bound[1], self._fold_inputs()):
                layer, low, weight, bias, in_kernel, norm_launch, dtype = bound[2]
                if norm_launch is not None:
                    x = self._normalized(x, norm_launch, dtype)
                x4 = x.permute(_TO_NCHW)
                y = F.run_fused(layer, x4 if low is None else low(x4), weight, bias,
                                residual if in_kernel else None)
                return self._finish(y, residual, in_kernel)
        dtype = self._fused_dtype(x, residual)
        if dtype is None:
            return self._original(x, residual)
        weight, bias = self._weights(dtype)
        in_kernel = residual is not None and residual.dtype == dtype and \
            self._result_dtype(dtype, residual) == dtype and residual.device == x.device
        r = residual if in_kernel else None
        norm_launch = None
        if self.norm is not None:
            norm_launch = self._norm_launch(x, dtype) if x.is_cuda else None
            x = self._normalized(x, norm_launch, dtype) if norm_launch is not None else \
                _nnF.layer_norm(x, self.norm.normalized_shape, None, None, self.norm.eps)
        x4 = x.permute(_TO_NCHW)
        position = "after" if r is not None else "before"
        if key is not None:
            record = _bound.record(self._fold_inputs())
            found = F.fused_layer(x4, weight, bias, _ONES, _ZEROS, _ONES, 1, "auto", self.activation, self.slope, r,
                                  position)
            if found is not None:
                layer, xin, weight, bias = found
                low = None if xin.dtype is x4.dtype else F.lower_of(xin.dtype)
                _bound.slot(self).value = None if record is None or (self.norm is not None and norm_launch is None) \
                    else (key, record, (layer, low, weight, bias, in_kernel, norm_launch, dtype))
                return self._finish(F.run_fused(layer, xin, weight, bias, r), residual, in_kernel)
            _bound.slot(self).value = None
        y = F.conv2d(x4, weight, bias, _ONES, _ZEROS, _ONES, 1, activation=self.activation,
                     negative_slope=self.slope, residual=r, residual_position=position)
        return self._finish(y, residual, in_kernel)

    def _norm_launch(self, x, dtype):
        """The prepared LayerNorm kernel (``blocks.layer_norm``) normalizing ``x``'s rows into ``dtype``, kept for
        the last shape; None where no instance takes them (then torch's layer_norm without the affine part)."""
        c, rows = x.shape[-1], x.numel() // max(1, x.shape[-1])
        key = (x.dtype, dtype, rows, c, self.norm.eps, x.device)
        slot = self.__dict__.get("_norm_kept")
        if slot is None:
            slot = self.__dict__["_norm_kept"] = _bound.Slot()  # (not copied or pickled with the module)
        kept = slot.value
        if kept is not None and kept[0] == key:
            return kept[1]
        src, dst = _bridge._NUMPY_DTYPES.get(x.dtype), _bridge._NUMPY_DTYPES.get(dtype)
        if rows == 0 or src is None or dst is None or not layer_norm.supports(src, dst, c):
            return None
        try:
            with torch.cuda.device(x.device.index):
                launch = layer_norm.launch(src, dst, rows, c, float(self.norm.eps))
        except NotImplementedError:  # (more rows than its grid holds)
            return None
        slot.value = (key, launch)
        return launch

    @staticmethod
    def _normalized(x, launch, dtype):
        """``x``'s rows normalized (no affine part: the fold took it) into a new tensor of ``dtype``."""
        index = x.device.index
        if index != _current_device():  # (the launch belongs to its device's context)
            with torch.cuda.device(index):
                return FusedLinear._normalized(x, launch, dtype)
        y = torch.empty(x.shape, dtype=dtype, device=x.device)
        launch(_bridge.raw_stream(index), x.data_ptr(), y.data_ptr())
        return y

    def _finish(self, y, residual, in_kernel: bool):
        """The convolution's (N, K, H, W) result as the chain's: permuted back to (N, H, W, K), or with the residual
        added where the kernel did not add it (torch's add, into the dtype torch's graph gives the sum)."""
        if not self.to_nchw:
            y = y.permute(0, 2, 3, 1)
            return y if y.is_contiguous() else y.contiguous()  # (as torch's Linear gives it; float64 is NCHW)
        if not y.is_contiguous(memory_format=torch.channels_last):
            y = y.contiguous(memory_format=torch.channels_last)  # (the strides of torch's permuted Linear output)
        if in_kernel:
            return y
        dtype = self._result_dtype(y.dtype, residual)
        if torch.promote_types(y.dtype, residual.dtype) != dtype:  # (a float32 scale of half operands)
            y = y.to(dtype)
        return torch.add(y, residual)  # (in ``dtype``: the sum torch's graph makes in it)

    def _result_dtype(self, dtype, residual):
        """The dtype of torch's chain's result: the Linear's ``dtype`` promoted with the scale's and, for an add
        that is not in place, the residual's (``value += residual`` keeps the value's dtype)."""
        scale = self._scale_tensor()
        if scale is not None:
            dtype = torch.promote_types(dtype, scale.dtype)
        return dtype if self.in_place else torch.promote_types(dtype, residual.dtype)

    def _fused_dtype(self, x, residual):
        """The dtype the Linear computes in where this call runs fused (see the module), else None."""
        if (type(x) is not _Tensor or x.dim() != 4 or _is_compiling() or _is_tracing() or _transforms_active()
                or _forward_ad._current_level >= 0 or any(m.training for m in self.passthrough)
                or (residual is not None and type(residual) is not _Tensor) or not x.is_contiguous()):
            return None
        device = x.device.type
        if device not in ("cuda", "cpu") or (device == "cpu" and torch.is_autocast_enabled("cpu")):
            return None
        w, b, scale, nw, nb = self._fold_inputs()
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, w, b, scale, nw, nb,
                                                                                        residual)):
            return None
        if self.norm is not None and (any(t is not None and t.device != x.device for t in (nw, nb))
                                      or not isinstance(self.norm.eps, float)):
            return None
        if w.device != x.device or w.dim() != 2 or x.shape[3] != w.shape[1]:
            return None  # (torch's own call raises)
        if residual is not None and tuple(residual.shape) != (x.shape[0], w.shape[0], x.shape[1], x.shape[2]):
            return None  # (torch's add broadcasts it)
        if scale is not None and scale.device != x.device:
            return None  # (torch's multiply raises)
        dtype = x.dtype
        if device == "cuda" and torch.is_autocast_enabled("cuda") and dtype in (torch.float32,) + _HALVES:
            dtype = torch.get_autocast_dtype("cuda")
        elif w.dtype != dtype or (b is not None and b.dtype != dtype):
            return None
        if not (dtype in _HALVES or dtype == torch.float64 or (dtype == torch.float32 and device == "cpu")):
            return None
        if residual is not None and self.in_place:
            value = dtype if scale is None else torch.promote_types(dtype, scale.dtype)
            if torch.promote_types(value, residual.dtype) != value:
                return None  # (torch's in-place add refuses to store the promoted sum: its error)
        return dtype

    def _original(self, x, residual):
        """The chain as the original graph's operations."""
        linear = self.linear
        if self.norm is not None:
            x = self.norm(x)
        y = _nnF.linear(x, linear.weight, linear.bias)
        if not self.to_nchw:
            return _apply_activation(y, self.activation, self.slope)
        y = y.permute(_TO_NCHW)
        scale = self._scale_tensor()
        if scale is not None:
            y = scale * y
        for m in self.passthrough:
            y = m(y)
        if self.in_place:
            y += residual
            return y
        return y + residual

    def refold(self) -> None:
        """Fold again now, into the kept fold's memory (after edits through ``.data``)."""
        _bound.slot(self).value = None
        self._refresh()

    def _weights(self, dtype):
        """The Linear's weight as a (K, C, 1, 1) convolution weight and its bias, the scale folded in (computed in
        float32, float64 for float64) and rounded once to ``dtype``; kept while the tensors are unchanged, a new
        fold of the same dtype written into the kept one's tensors."""
        tensors = self._fold_inputs()
        w, b, scale, nw, nb = tensors
        kept = self._folded
        if kept is not None and kept[0] == dtype and kept[1] is not None and _bound.unchanged(kept[1], tensors):
            return kept[2], kept[3]
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        with torch.no_grad():
            weight, bias = w.to(acc), None if b is None else b.to(acc)
            if nb is not None:  # (W·(γ·n + β) + b = (W·diag γ)·n + (W·β + b); elementwise: no autocast, no TF32)
                shift = (weight * nb.to(device=w.device, dtype=acc)[None, :]).sum(dim=1)
                bias = shift if bias is None else bias + shift
            if nw is not None:
                weight = weight * nw.to(device=w.device, dtype=acc)[None, :]
            if scale is not None:
                s = scale.reshape(-1).to(device=w.device, dtype=acc)
                weight = weight * s[:, None]
                bias = None if bias is None else bias * s
            weight = weight.to(dtype).reshape(w.shape[0], w.shape[1], 1, 1).contiguous()
            bias = None if bias is None else bias.to(dtype)
        record = _bound.record(tensors)
        if record is not None:
            if kept is not None and kept[0] == dtype and _refreshable(kept[2], weight, tensors) and \
                    _refreshable(kept[3], bias, tensors):
                # (a fold that is the Linear's own memory, an uncast weight without a scale, is not: replaced)
                weight, bias = write_fold(kept[2], kept[3], weight, bias)
            self._folded = (dtype, record, weight, bias)
        return weight, bias

    def _refresh(self) -> None:
        """The kept fold made again in place from the tensors as they are now (a ``load_state_dict`` post hook of
        the Linear and of the scale's owner, and ``refold``)."""
        kept = self._folded
        if kept is None:
            return
        _bound.slot(self).value = None
        self._folded = (kept[0], None) + kept[2:]
        try:
            self._weights(kept[0])
        except RuntimeError:  # (a load half done: ``assign=True`` moved some tensors, not yet the others)
            self._folded = None


def _is_permute_to_nchw(node: torch.fx.Node) -> bool:
    if node.op == "call_function" and node.target is torch.permute:
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dims")
        return len(node.args) >= 1 and dims is not None and tuple(dims) == _TO_NCHW
    if node.op == "call_method" and node.target == "permute" and len(node.args) >= 2 and not node.kwargs:
        dims = node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (list, tuple)) else node.args[1:]
        return tuple(dims) == _TO_NCHW
    return False


def _scale_of(node: torch.fx.Node, value: torch.fx.Node, gm: torch.fx.GraphModule, channels: int):
    """(owner module, attribute name) where ``node`` multiplies ``value`` by a per-channel tensor of the graph module
    ((C, 1, 1) or (1, C, 1, 1), C = ``channels``), else None."""
    if node.op == "call_function" and node.target in (operator.mul, torch.mul) and len(node.args) == 2 \
            and not node.kwargs:
        a, b = node.args
    elif node.op == "call_method" and node.target == "mul" and len(node.args) == 2 and not node.kwargs:
        a, b = node.args
    else:
        return None
    other = b if a is value else a if b is value else None
    if not isinstance(other, torch.fx.Node) or other.op != "get_attr" or other is value:
        return None
    path, _, name = other.target.rpartition(".")
    try:
        owner = gm.get_submodule(path)
    except AttributeError:
        return None
    tensor = getattr(owner, name, None)
    if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) not in ((channels, 1, 1), (1, channels, 1, 1)):
        return None
    return owner, name


def _norm_before(node: torch.fx.Node, linear: torch.nn.Linear, modules: dict):
    """The LayerNorm module whose value only ``node`` (the Linear's call) takes, over the Linear's input features
    (ConvNeXt's), else None."""
    prev = node.args[0]
    if not (isinstance(prev, torch.fx.Node) and prev.op == "call_module" and len(prev.users) == 1
            and len(prev.args) == 1 and not prev.kwargs and isinstance(prev.args[0], torch.fx.Node)):
        return None
    norm = modules.get(prev.target)
    if type(norm) is not torch.nn.LayerNorm or tuple(norm.normalized_shape) != (linear.in_features,) \
            or not _plain(norm):
        return None
    return norm



def fuse_linears(gm: torch.fx.GraphModule, modules: dict) -> int:
    """Each fusable chain from a ``torch.nn.Linear`` of ``gm``'s graph (see the module) replaced by one call of a
    ``FusedLinear`` registered in ``gm``; the number fused. ``modules``: the model's modules by qualified name."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or type(modules.get(node.target)) is not torch.nn.Linear:
            continue
        linear = modules[node.target]
        nxt = _only_user(node)
        if nxt is None or len(node.args) != 1 or node.kwargs or not _plain(linear):
            continue
        chain, residual_node, fused, source = [node, nxt], None, None, node.args[0]
        found = activation_of(nxt, modules)
        if found is not None:
            norm = _norm_before(node, linear, modules)
            if norm is not None:
                chain.insert(0, source)
                source = source.args[0]
            fused = FusedLinear(linear, found[0], found[1], norm=norm)
        elif _is_permute_to_nchw(nxt):
            last, probe = nxt, _only_user(nxt)
            owner = name = None
            scale = _scale_of(probe, last, gm, linear.out_features) if probe is not None else None
            if scale is not None:
                owner, name = scale
                chain.append(probe)
                last, probe = probe, _only_user(probe)
            passthrough = []
            while probe is not None and probe.op == "call_module" and _identity_in_eval(modules.get(probe.target)):
                passthrough.append(probe)
                probe = _only_user(probe)
            other = None if probe is None else _residual_of(probe, passthrough[-1] if passthrough else last)
            if other is None or _depends_on(other, node):
                continue
            chain.extend(passthrough)
            chain.append(probe)
            residual_node = other
            fused = FusedLinear(linear, to_nchw=True, owner=owner, scale=name,
                                passthrough=[modules[n.target] for n in passthrough], in_place=_in_place_add(probe))
        if fused is None:
            continue
        target = f"_fused_linear_{count}_{node.target.replace('.', '_')}"
        count += 1
        gm.add_submodule(target, fused)
        last = chain[-1]
        with gm.graph.inserting_after(last):
            args = (source,) if residual_node is None else (source, residual_node)
            call = gm.graph.call_module(target, args)
        last.replace_all_uses_with(call)
        for n in reversed(chain):
            attrs = [a for a in n.all_input_nodes if a.op == "get_attr"]
            gm.graph.erase_node(n)
            for a in attrs:  # (the scale's read, used by the multiply alone)
                if not a.users:
                    gm.graph.erase_node(a)
    return count
