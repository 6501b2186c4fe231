"""``cuconv.nn.convert(model, fuse=True)``: a convolution, the BatchNorm after it, its activation and a residual add,
run as one fused call (``FusedConv2d``).

Where the model traces with ``torch.fx`` (torchvision's do), the graph is searched for chains

    conv -> [BatchNorm2d] -> [add residual] -> [activation] -> [dropout, stochastic depth] -> [add residual]

(each link optional, at least one present, every intermediate value used by the next link only; the dropouts only
before an add, applied in train mode) and each chain is replaced by one call of a ``FusedConv2d``; the result is a
``torch.fx.GraphModule``. The model is traced in train and in eval mode, and fused so only where the two graphs
agree (a branch on ``self.training`` outside torch's modules would otherwise be baked in). Where it does not trace,
or its graph depends on the mode, ``torch.nn.Sequential`` containers are searched for conv, BatchNorm2d and
activation children in a row (torchvision's ``Conv2dNormActivation``), which are fused in place. In a traced graph,
Linear layers on a channels-last image's channels (ConvNeXt's) fuse too, as 1x1 convolutions (``fuse_linear``).

The convolution and the BatchNorm stay registered where they were, with the same Parameter and buffer objects:
the state_dict keys and values are the original's, a checkpoint of either model loads into the other, and
``.to()``, optimizers and ``load_state_dict`` act on the tensors the fused call reads. In eval mode (the BatchNorm
not training) the BatchNorm is folded into the convolution's weight and bias, once per version of those tensors
(an optimizer step or a ``.to()`` folds again at the next call, a ``load_state_dict`` at once; a fold like the
kept one is written into the kept tensors, which a captured CUDA graph reads; with gradients recorded it is folded on
every call, differentiably). In train mode a block is one autograd node (``fuse_train``: the batch's statistics,
the running ones updated as torch's BatchNorm updates them, the epilogue, one backward; on CUDA cuconv's BatchNorm
kernels); under torch.compile or tracing the fused call runs the convolution, the BatchNorm and the rest link by
link, exactly as the original graph did.
"""

from __future__ import annotations

import copy
import operator
import weakref
from typing import Optional

import torch

from . import _bound
from . import functional as F
from . import fuse_train as _fuse_train
from .modules import _TWINS as _twins
from .modules import Conv2d, Conv3d

__all__ = ["FusedConv2d", "fuse", "activation_of", "apply_epilogue"]

_nnF = torch.nn.functional
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_is_tracing = torch._C._is_tracing

# Activations: a module, function or method of torch -> (cuconv's name, its parameter: leaky_relu's slope)
_ACTIVATION_MODULES = {
    torch.nn.ReLU: lambda m: ("relu", 0.0),
    torch.nn.ReLU6: lambda m: ("relu6", 0.0),
    torch.nn.LeakyReLU: lambda m: ("leaky_relu", float(m.negative_slope)),
    torch.nn.SiLU: lambda m: ("silu", 0.0),
    torch.nn.GELU: lambda m: ("gelu_tanh" if m.approximate == "tanh" else "gelu", 0.0),
    torch.nn.Hardswish: lambda m: ("hardswish", 0.0),
    torch.nn.Hardsigmoid: lambda m: ("hardsigmoid", 0.0),
    torch.nn.Sigmoid: lambda m: ("sigmoid", 0.0),
    torch.nn.Hardtanh: lambda m: ("relu6", 0.0) if (m.min_val, m.max_val) == (0.0, 6.0) else None,
}
_ACTIVATION_FUNCTIONS = {
    _nnF.relu: "relu", torch.relu: "relu", torch.relu_: "relu", _nnF.relu_: "relu", _nnF.relu6: "relu6",
    _nnF.leaky_relu: "leaky_relu", _nnF.silu: "silu", _nnF.gelu: "gelu", _nnF.hardswish: "hardswish",
    _nnF.hardsigmoid: "hardsigmoid", torch.sigmoid: "sigmoid", _nnF.sigmoid: "sigmoid",
}
_ACTIVATION_METHODS = {"relu": "relu", "relu_": "relu", "sigmoid": "sigmoid", "sigmoid_": "sigmoid"}
_ADDS = (operator.add, operator.iadd, torch.add)


def _apply_activation(y: torch.Tensor, activation: Optional[str], slope: float) -> torch.Tensor:
    if activation is None:
        return y
    if activation == "relu":
        return _nnF.relu(y)
    if activation == "relu6":
        return _nnF.relu6(y)
    if activation == "leaky_relu":
        return _nnF.leaky_relu(y, slope)
    if activation == "silu":
        return _nnF.silu(y)
    if activation == "gelu":
        return _nnF.gelu(y)
    if activation == "gelu_tanh":
        return _nnF.gelu(y, approximate="tanh")
    if activation == "hardswish":
        return _nnF.hardswish(y)
    if activation == "hardsigmoid":
        return _nnF.hardsigmoid(y)
    return torch.sigmoid(y)


def apply_epilogue(y: torch.Tensor, activation, slope: float, residual, position, passthrough=()) -> torch.Tensor:
    """The epilogue as torch's operations (differentiable): ``residual`` added ``position`` ("before" or "after")
    the activation, the ``passthrough`` modules between the activation and a residual added after it."""
    if position == "before":
        y = y + residual
    y = _apply_activation(y, activation, slope)
    for m in passthrough:
        y = m(y)
    return y + residual if position == "after" else y


def _kernels_apply(x: torch.Tensor, bn, residual, running: bool, count) -> bool:
    """Whether a CUDA train-mode block runs cuconv's BatchNorm kernels (``blocks/batch_norm``): an input (autocast's
    cast) of float32 or a half type, float32 affine parameters and running statistics (an int64 count), a residual
    of the input's dtype (torch would promote another)."""
    from ..blocks import batch_norm

    if not batch_norm.supports(_fuse_train.batch_norm_dtype(x.dtype)):
        return False
    f32 = torch.float32
    if any(t is not None and (t.dtype != f32 or not t.is_contiguous()) for t in (bn.weight, bn.bias)):
        return False
    if running and (bn.running_mean.dtype != f32 or bn.running_var.dtype != f32):
        return False
    if count is not None and count.dtype != torch.int64:
        return False
    return residual is None or residual.dtype == x.dtype


class FusedConv2d(torch.nn.Module):
    """One call of ``conv`` (a :class:`cuconv.nn.Conv2d`, or a ``Conv3d`` with a BatchNorm3d: the activation then in
    its one 2-D convolution's epilogue, a residual added after it), the BatchNorm ``bn`` after it (or None), a residual
    added before the activation (``residual="before"``) or after it (``"after"``; None: no residual) and the
    ``activation`` (one of ``cuconv.problem.ACTIVATIONS``, ``slope`` leaky_relu's).

    It holds ``conv`` and ``bn`` by reference, not as submodules: they stay registered where the model had them,
    so its state_dict is the original's. ``forward(x, residual=None)``."""

    def __init__(self, conv: Conv2d, bn: Optional[torch.nn.BatchNorm2d] = None, activation: Optional[str] = None,
                 slope: float = 0.0, residual: Optional[str] = None, passthrough: tuple = ()):
        super().__init__()
        if residual not in (None, "before", "after"):
            raise ValueError(f"cuconv: residual must be None, 'before' or 'after', got {residual!r}")
        object.__setattr__(self, "conv", conv)  # (not submodules: see the class docstring)
        object.__setattr__(self, "bn", bn)
        # modules that are the identity in eval mode (dropout, stochastic depth) between the activation and a
        # residual added after it: applied when one of them is training
        object.__setattr__(self, "passthrough", tuple(passthrough))
        self.activation, self.slope, self.residual = activation, float(slope), residual
        # (the fold's key, its inputs' record, weight, bias: the last fold, or without a BatchNorm the last cast,
        # ``_weights``)
        self._folded = None
        # (the last call's key, its weights' record and what it ran: ``_bind``)
        object.__setattr__(self, "_bound_call", _bound.Slot())
        # (a checkpoint loaded into either refolds into the kept fold at once: a captured CUDA graph reads it)
        for module in (conv, bn):
            if module is not None:
                module.register_load_state_dict_post_hook(_RefreshHook(self))

    def extra_repr(self) -> str:
        extra = [f"residual={self.residual!r}"] if self.residual else []
        return describe([f"bn={self.bn is not None}", f"activation={self.activation!r}"], self, extra)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        key = self._call_key(x, residual) if type(x) is _Tensor and x.is_cuda else None
        bound = _bound.slot(self).value
        if key is not None and bound is not None and key == bound[0] and _bound.unchanged(bound[1],
                                                                                         self._fold_inputs()):
            # a call like the last one (inference on CUDA, nothing changed): its layer and weights, no checks
            layer, low, weight, bias = bound[2]
            return F.run_fused(layer, x if low is None else low(x), weight, bias, residual)
        if (residual is None) != (self.residual is None):
            raise TypeError(f"FusedConv2d.forward(): {'a' if self.residual else 'no'} residual tensor expected")
        bn, conv = self.bn, self.conv
        active = [m for m in self.passthrough if m.training]
        if (bn is None or not bn.training) and not active and conv.padding_mode == "zeros":
            # the whole chain as one call of cuconv's conv2d with its epilogue (on CUDA without gradients: one
            # plan, the epilogue a pass of it or inside its kernels)
            weight, bias = self._weights(self._autocast_dtype(conv.weight))
            if isinstance(conv, Conv3d):  # (its one 2-D convolution applies an activation alone; a residual after)
                y = F.conv3d(x, weight, bias, conv.stride, conv.padding, conv.dilation, conv.groups, algo=conv.algo,
                             activation=self.activation if residual is None else None, negative_slope=self.slope)
                return y if residual is None else apply_epilogue(y, self.activation, self.slope, residual,
                                                                 self.residual)
            if key is not None:
                return self._bind(key, x, weight, bias, residual)
            return F.conv2d(x, weight, bias, conv.stride, conv.padding, conv.dilation, conv.groups, algo=conv.algo,
                            activation=self.activation, negative_slope=self.slope, residual=residual,
                            residual_position=self.residual or "before")
        if bn is not None and bn.training:
            self._folded = None  # (the running statistics change)
            _bound.slot(self).value = None
            out = self._train_block(x, residual, active)
            if out is not None:
                return out
            y = bn(conv(x))  # (the original graph, link by link)
        elif bn is not None:
            weight, bias = self._weights()
            y = conv._conv_forward(x, weight, bias)
        else:
            y = conv(x)
        return apply_epilogue(y, self.activation, self.slope, residual, self.residual, active)

    def _train_block(self, x: torch.Tensor, residual, active: list):
        """Train mode as one autograd node (``fuse_train.conv_bn_train``: the batch's statistics, the running ones
        updated as torch's BatchNorm updates them, the epilogue, one backward), where it applies: plain CPU tensors
        in eager mode, a 4-D input, a batch of more than one value per channel (torch's BatchNorm refuses one), a
        residual of the output's shape, no hooks added since the fuse. None elsewhere: the caller runs the links.
        On CUDA the BatchNorm and the epilogue are cuconv's kernels where they apply (``_kernels_apply``), else
        torch's BatchNorm kernel inside the node."""
        conv, bn = self.conv, self.bn
        if (type(x) is not _Tensor or x.device.type not in ("cpu", "cuda") or x.dim() != 4
                or isinstance(conv, Conv3d) or _is_compiling() or _is_tracing() or F._transforms_active()
                or not (_plain(conv) and _plain(bn)) or (residual is not None and type(residual) is not _Tensor)):
            return None
        weight, bias = conv.weight, conv.bias
        device_type = x.device.type
        if torch.is_autocast_enabled(device_type):
            x, weight, bias = F._autocast(x, weight, bias, device_type)
        geometry = (conv.stride, conv.padding, conv.dilation, conv.groups, conv.algo)
        if x.is_cuda and F._plain_tensor(weight) and (bias is None or F._plain_tensor(bias)):
            layer = F._checked_layer(x, weight, bias, *geometry, F._settings())  # (kept per call signature)
        else:
            layer = F._checked(x, weight, bias, *geometry, None, autocast_done=True, run=False)
        out_shape = layer.out_shape if layer is not None else None
        if (layer is None or len(out_shape) != 4 or out_shape[0] * out_shape[2] * out_shape[3] <= 1
                or (residual is not None and tuple(residual.shape) != tuple(out_shape))):
            return None
        running = bn.track_running_stats and bn.running_mean is not None
        count = bn.num_batches_tracked if bn.track_running_stats else None
        kernels = x.is_cuda and _kernels_apply(x, bn, residual, running, count)
        # (torch's _BatchNorm.forward: the count first, then this batch's factor; on CUDA the kernels read
        # momentum=None's 1/count on the device, with no copy of the count to the host)
        if count is not None:
            count.add_(1)
        momentum = cumulative = None
        if running:
            cumulative = kernels and bn.momentum is None and count is not None
            if not cumulative:
                momentum = bn.momentum if bn.momentum is not None else (
                    1.0 / float(count) if count is not None else 0.0)
        after = self.residual == "after"
        args = _fuse_train.BlockArgs(layer, bn.eps, momentum, bn.running_mean if running else None,
                                     bn.running_var if running else None, self.activation, self.slope,
                                     None if residual is None or (after and active) else self.residual,
                                     geometry, kernels, bool(cumulative), count)
        out = _fuse_train.conv_bn_train(x, weight, bias, bn.weight, bn.bias,
                                        None if args.position is None else residual, args)
        if active:  # (dropout, stochastic depth in train mode: between the activation and a residual after it)
            for m in active:
                out = m(out)
            if after:
                out = out + residual
        return out

    def _call_key(self, x: torch.Tensor, residual):
        """What a call of the 2-D chain on ``x`` depends on besides the weights (``_fold_inputs``): the tensors'
        shapes, strides, dtypes and devices, ``_bound.context``, the convolution's geometry and the epilogue; None
        where the call is not one a bound call may serve (``_bound.may_bind``, a module in train mode, a residual
        not a plain tensor)."""
        if not _bound.may_bind():
            return None
        bn, conv = self.bn, self.conv
        if (bn is not None and bn.training) or (self.passthrough and any(m.training for m in self.passthrough)):
            return None
        if residual is not None and type(residual) is not _Tensor:
            return None
        return (x.shape, x.stride(), x.dtype, x.device, None if residual is None else _bound.tensor_key(residual),
                _bound.context(), conv.stride, conv.padding, conv.dilation, conv.groups, conv.algo,
                conv.padding_mode, None if bn is None else bn.eps, self.activation, self.slope, self.residual)

    def _bind(self, key, x, weight, bias, residual):
        """The 2-D chain's call through ``F.fused_layer`` and ``F.run_fused``, kept as the bound call of ``key``
        with the record of the weights it was made from (where one can be made: ``_bound.record``); the checked path
        (``F.conv2d``) where no fused layer applies."""
        conv = self.conv
        record = _bound.record(self._fold_inputs())
        found = F.fused_layer(x, weight, bias, conv.stride, conv.padding, conv.dilation, conv.groups, conv.algo,
                              self.activation, self.slope, residual, self.residual or "before")
        if found is None:
            _bound.slot(self).value = None
            return F.conv2d(x, weight, bias, conv.stride, conv.padding, conv.dilation, conv.groups, algo=conv.algo,
                            activation=self.activation, negative_slope=self.slope, residual=residual,
                            residual_position=self.residual or "before")
        layer, xin, weight, bias = found
        low = None if xin.dtype is x.dtype else F.lower_of(xin.dtype)
        if record is not None:
            _bound.slot(self).value = (key, record, (layer, low, weight, bias))
        return F.run_fused(layer, xin, weight, bias, residual)

    def _fold_inputs(self) -> tuple:
        """The tensors the fold reads (None where absent): the convolution's weight and bias, the BatchNorm's
        weight, bias, running statistics and count, read from the modules' dictionaries
        (``_bound.parameters``)."""
        conv, bn = self.conv, self.bn
        w, b = _bound.parameters(conv)
        if bn is None:
            return (w, b)
        q, r = bn._parameters, bn._buffers
        return (w, b, q.get("weight"), q.get("bias"), r.get("running_mean"), r.get("running_var"),
                r.get("num_batches_tracked"))

    def refold(self) -> None:
        """Fold again now, into the kept fold's memory: for edits of the convolution's or BatchNorm's tensors
        through ``.data`` (which leave their version counters alone, so the fold cannot see them)."""
        _bound.slot(self).value = None
        self._refresh()

    @staticmethod
    def _autocast_dtype(w: torch.Tensor):
        """The dtype CUDA autocast would cast a float32 ``w`` to for a convolution (None: no cast, or a weight of
        another dtype, whose fold rounded to it first and cast after may differ from one rounding to autocast's)."""
        if w.dtype == torch.float32 and w.is_cuda and torch.is_autocast_enabled("cuda"):
            return torch.get_autocast_dtype("cuda")
        return None

    def _weights(self, dtype=None):
        """The weight and bias this call convolves with: ``conv``'s with ``bn`` (eval mode: its running statistics)
        folded in, computed in float32 (float64 for a float64 weight) and rounded once to the weight's dtype, or to
        ``dtype`` (autocast's: the values autocast's cast of the weight-dtype fold would give, without a cast per
        call); without a BatchNorm ``conv``'s own, cast to ``dtype`` (None: as they are). Kept while the tensors'
        identities, data pointers and versions stay (``_bound.record``; ``refold`` after edits through ``.data``); a
        new fold of the same key is copied into the kept one's tensors."""
        conv, bn = self.conv, self.bn
        if bn is None and dtype is None:
            return conv.weight, conv.bias
        # (num_batches_tracked: a BatchNorm's training forward counts it up in place, whichever module runs it,
        # where its own kernel may update the statistics without a new version)
        tensors = self._fold_inputs()
        w = tensors[0]
        recording = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors[:4])
        if recording:  # (autocast casts the result, differentiably, as torch's would)
            if bn is None:
                return conv.weight, conv.bias
            dtype = None
        # (under torch.compile or torch.jit.trace the fold is part of the graph: no data pointers to key a cache by,
        # and a kept fold would be traced as a constant)
        key = None if recording or _is_compiling() or _is_tracing() or w.is_meta else (
            None if bn is None else bn.eps, dtype)
        kept = self._folded
        if key is not None and kept is not None and kept[0] == key and kept[1] is not None and _bound.unchanged(
                kept[1], tensors):
            if not kept[4] and torch.is_grad_enabled():  # (lent to autograd, which may save it for a backward)
                self._folded = kept[:4] + (True,)
            return kept[2], kept[3]
        dtype = dtype or w.dtype
        if bn is None:
            weight, bias = w.to(dtype), None if conv.bias is None else conv.bias.to(dtype)
        else:
            acc = torch.float64 if w.dtype == torch.float64 else torch.float32
            var, mean = bn.running_var.to(acc), bn.running_mean.to(acc)
            scale = torch.rsqrt(var + bn.eps)
            if bn.weight is not None:
                scale = scale * bn.weight.to(acc)
            shift = -mean * scale
            if conv.bias is not None:
                shift = shift + conv.bias.to(acc) * scale
            if bn.bias is not None:
                shift = shift + bn.bias.to(acc)
            weight = (w.to(acc) * scale.reshape((-1,) + (1,) * (w.dim() - 1))).to(dtype)
            bias = shift.to(dtype)
        record = None if key is None else _bound.record(tensors)
        if record is not None:
            if (kept is not None and kept[0] == key and not kept[4] and _refreshable(kept[2], weight, tensors)
                    and _refreshable(kept[3], bias, tensors)):
                # the new fold into the kept one's memory: a CUDA graph captured with the kept fold reads these
                # tensors (replaced, they would be freed under it), and a replay after this call reads the new one.
                # (Not a fold lent to autograd: a backward may still read it. The copy is enqueued on the current
                # stream: one still reading the fold on another stream is the caller's to order, as for weights.)
                weight, bias = write_fold(kept[2], kept[3], weight, bias)
            # (key, record, weight, bias, lent: returned while gradients were recorded)
            self._folded = (key, record, weight, bias, torch.is_grad_enabled())
        return weight, bias

    def _refresh(self) -> None:
        """The kept fold made again, in place, from the tensors as they are now (a ``load_state_dict`` post hook of
        the convolution and the BatchNorm, and ``refold``): a CUDA graph captured with the fold replays the new one
        without an eager call first. Nothing where no fold is kept."""
        kept = self._folded
        if kept is None:
            return
        _bound.slot(self).value = None
        self._folded = (kept[0], None) + kept[2:]  # (a record that ``unchanged`` never matches)
        try:
            with torch.no_grad():
                self._weights(kept[0][1])
        except RuntimeError:  # (a load half done: ``assign=True`` moved the conv's tensors, not yet the BatchNorm's)
            self._folded = None


def describe(parts: list, fused, extra: list) -> str:
    """A fused module's ``extra_repr``: ``parts``, leaky_relu's slope, ``extra``, the passthrough modules."""
    if fused.activation == "leaky_relu":
        parts = parts + [f"slope={fused.slope}"]
    parts = parts + extra
    if fused.passthrough:
        parts = parts + [f"passthrough={[type(m).__name__ for m in fused.passthrough]}"]
    return ", ".join(parts)


def _refreshable(old, new, inputs: tuple) -> bool:
    """Whether a new fold ``new`` may be copied into the kept fold's tensor ``old``: both None, or a tensor of the
    fold's own (not the memory of one of the fold's ``inputs``, as an uncast weight, or a view of it, is) of the same
    shape, strides (a weight laid out anew by ``.to(memory_format=...)`` keeps its new layout), dtype and device."""
    if old is None or new is None:
        return old is None and new is None
    memory = old.untyped_storage().data_ptr()
    return (old is not new and all(t is None or t.untyped_storage().data_ptr() != memory for t in inputs)
            and old.shape == new.shape and old.stride() == new.stride() and old.dtype == new.dtype
            and old.device == new.device)


def write_fold(kept_weight, kept_bias, weight, bias) -> tuple:
    """A new fold written into the kept fold's tensors (a CUDA graph captured with them reads them) outside autograd:
    in inference mode where they are inference tensors (writable there alone), under no_grad elsewhere (inference
    mode off would turn gradients on). Returns the kept tensors."""
    with torch.inference_mode() if kept_weight.is_inference() else torch.no_grad():
        kept_weight.copy_(weight)
        if bias is not None:
            kept_bias.copy_(bias)
    return kept_weight, kept_bias


class _RefreshHook:
    """The ``load_state_dict`` post hook a ``FusedConv2d`` puts on its convolution and BatchNorm: its ``_refresh``,
    through a weak reference (a fused model dropped while the original modules live on is not kept alive by them);
    a deep copy's hook refreshes the copy of its FusedConv2d, a pickled one the unpickled FusedConv2d."""

    __slots__ = ("fused", "__weakref__")

    def __init__(self, fused):
        self.fused = weakref.ref(fused)

    def __call__(self, module, incompatible_keys) -> None:
        fused = self.fused()
        if fused is not None:
            fused._refresh()

    def __deepcopy__(self, memo):
        fused = self.fused()
        return _RefreshHook(copy.deepcopy(fused, memo)) if fused is not None else _dead_hook()

    def __reduce__(self):
        fused = self.fused()
        return (_RefreshHook, (fused,)) if fused is not None else (_dead_hook, ())


def _dead_hook() -> _RefreshHook:
    """A hook whose FusedConv2d is gone (as it is copied and pickled)."""
    hook = _RefreshHook.__new__(_RefreshHook)
    hook.fused = _gone
    return hook


def _gone():
    return None


def activation_of(node: torch.fx.Node, modules: dict):
    """(cuconv's activation name, slope) of a graph node that applies one, or None."""
    if node.op == "call_module":
        module = modules.get(node.target)  # (None: a fused call made earlier in the walk)
        make = _ACTIVATION_MODULES.get(type(module))
        return None if make is None else make(module)
    if node.op == "call_function" and node.target in _ACTIVATION_FUNCTIONS:
        name = _ACTIVATION_FUNCTIONS[node.target]
        if name == "leaky_relu":
            slope = node.args[1] if len(node.args) > 1 else node.kwargs.get("negative_slope", 0.01)
            return (name, float(slope)) if isinstance(slope, (int, float)) else None
        if name == "gelu":
            approximate = node.kwargs.get("approximate", "none")
            return ("gelu_tanh" if approximate == "tanh" else "gelu", 0.0) if approximate in ("none", "tanh") \
                else None
        return name, 0.0
    if node.op == "call_method" and node.target in _ACTIVATION_METHODS and len(node.args) == 1:
        return _ACTIVATION_METHODS[node.target], 0.0
    return None


def _foldable_bn(module, conv) -> bool:
    norm = torch.nn.BatchNorm3d if isinstance(conv, Conv3d) else torch.nn.BatchNorm2d
    return (type(module) is norm and module.num_features == conv.out_channels
            and module.track_running_stats and module.running_mean is not None and _plain(module))


def _plain(module) -> bool:
    """A module without hooks or parametrizations: its call is its forward alone, which a fused call replaces (a
    forward hook, a pre-hook, or an old-style weight or spectral norm's pre-hook, would be skipped)."""
    return not (module._forward_hooks or module._forward_pre_hooks or getattr(module, "parametrizations", None)
                or torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks)


def _residual_of(node: torch.fx.Node, value: torch.fx.Node):
    """The other operand where ``node`` adds a tensor to ``value`` (a plain sum, no alpha), else None. An in-place
    add (``+=``, ``add_``) only where it writes ``value`` (``value += r``): one that writes the other operand
    (``r += value``) changes ``r`` for its later readers, which a fused call would not."""
    if node.op == "call_function" and node.target in _ADDS and len(node.args) == 2 and not node.kwargs:
        a, b = node.args
    elif node.op == "call_method" and node.target in ("add", "add_") and len(node.args) == 2 and not node.kwargs:
        a, b = node.args
    else:
        return None
    if _in_place_add(node) and a is not value:
        return None
    other = b if a is value else a if b is value else None
    return other if isinstance(other, torch.fx.Node) and other is not value else None


def _in_place_add(node: torch.fx.Node) -> bool:
    return (node.op == "call_function" and node.target is operator.iadd) or (
        node.op == "call_method" and node.target == "add_")


def _only_user(node: torch.fx.Node):
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _depends_on(node: torch.fx.Node, target: torch.fx.Node, limit: int = 10000) -> bool:
    """Whether ``node``'s value is computed from ``target``'s (a residual must not be)."""
    stack, seen = [node], set()
    while stack and len(seen) < limit:
        n = stack.pop()
        if n is target:
            return True
        if n in seen:
            continue
        seen.add(n)
        stack.extend(a for a in n.all_input_nodes)
    return len(seen) >= limit


_DROPOUTS = (torch.nn.Dropout, torch.nn.Dropout2d, torch.nn.Dropout1d, torch.nn.Dropout3d, torch.nn.AlphaDropout,
             torch.nn.FeatureAlphaDropout)


def _identity_in_eval(module) -> bool:
    """Dropout and torchvision's StochasticDepth (matched by name: torchvision is not a dependency): the identity
    in eval mode."""
    return isinstance(module, _DROPOUTS) or (type(module).__name__ == "StochasticDepth" and hasattr(module, "p"))


_CUCONV_LEAVES = tuple(_twins.values())


class _Tracer(torch.fx.Tracer):
    """torch.fx's tracer, a ``cuconv.nn.Conv2d`` a leaf like torch's own modules, and so the modules whose forward
    depends on the training mode (StochasticDepth; torch's own dropouts are leaves already), so that the graph
    holds them rather than the branch of the mode it was traced in."""

    def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:
        return isinstance(m, _CUCONV_LEAVES) or _identity_in_eval(m) or super().is_leaf_module(m, qualname)


def _trace_both_modes(model: torch.nn.Module):
    """The model's graph, traced in train and in eval mode (every module's flag restored after); None where the
    two differ: Python control flow on ``self.training`` outside the leaves would be baked into one graph."""
    flags = [(m, m.training) for m in model.modules()]
    try:
        graphs = []
        for mode in (True, False):
            model.train(mode)
            graphs.append(_Tracer().trace(model))
    finally:
        for m, flag in flags:
            m.training = flag
    shape = [[(n.op, str(n.target), len(n.args)) for n in g.nodes] for g in graphs]
    return graphs[1] if shape[0] == shape[1] else None


def fuse(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` (its convolutions cuconv's) with every fusable chain as one ``FusedConv2d`` call (see the module):
    a ``torch.fx.GraphModule`` where it traces, else ``model`` itself with its Sequential patterns fused."""
    try:
        graph = _trace_both_modes(model)
    except Exception:  # (a model that does not trace: data-dependent control flow, say)
        graph = None
    if graph is None:  # (or one whose graph depends on the mode it is traced in)
        return _fuse_sequentials(model, set())
    gm = torch.fx.GraphModule(model, graph, class_name=type(model).__name__)
    modules = dict(model.named_modules(remove_duplicate=False))
    count = 0  # (the modules the fused calls reference stay registered where they were: GraphModule copied them)
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or not isinstance(modules.get(node.target), (Conv2d, Conv3d)) \
                or not _plain(modules[node.target]):
            continue
        conv, chain, last = modules[node.target], [node], node
        bn = activation = residual_node = residual = None
        slope = 0.0
        nxt = _only_user(last)
        if nxt is not None and nxt.op == "call_module" and _foldable_bn(modules.get(nxt.target), conv):
            bn, last = modules[nxt.target], nxt
            chain.append(nxt)
            nxt = _only_user(last)
        passthrough = []
        for stage in ("before", "activation", "passthrough", "after"):
            if nxt is None:
                break
            if stage == "passthrough":  # (kept only where a residual add follows them)
                tentative, probe = [], nxt
                while probe is not None and probe.op == "call_module" and _identity_in_eval(modules.get(probe.target)):
                    tentative.append(probe)
                    probe = _only_user(probe)
                if tentative and residual is None and probe is not None and \
                        _residual_of(probe, tentative[-1]) is not None:
                    passthrough = [modules[n.target] for n in tentative]
                    chain.extend(tentative)
                    last, nxt = tentative[-1], probe
                continue
            if stage == "activation":
                found = activation_of(nxt, modules)
                if found is None or (nxt.op == "call_module" and not _plain(modules[nxt.target])):
                    continue
                activation, slope = found
            else:
                if residual is not None:
                    continue
                other = _residual_of(nxt, last)
                if other is None or _depends_on(other, node):
                    continue
                residual_node, residual = other, stage
            chain.append(nxt)
            last = nxt
            nxt = _only_user(last)
        if len(chain) == 1:
            continue
        name = f"_fused_{count}_{node.target.replace('.', '_')}"
        count += 1
        gm.add_submodule(name, FusedConv2d(conv, bn, activation, slope, residual, passthrough))
        with gm.graph.inserting_after(last):
            args = (node.args[0],) if residual_node is None else (node.args[0], residual_node)
            fused = gm.graph.call_module(name, args)
        last.replace_all_uses_with(fused)
        for n in reversed(chain):
            gm.graph.erase_node(n)
    from .fuse_linear import fuse_linears  # (imports this module)

    fuse_linears(gm, modules)
    gm.graph.lint()
    gm.recompile()
    return gm


def _fuse_sequentials(module: torch.nn.Module, walked: set) -> torch.nn.Module:
    """Conv, BatchNorm2d and an activation in a row inside ``torch.nn.Sequential`` containers, fused in place: the
    conv child becomes a ``_SequentialFused`` (the conv's own Parameters, the chain by reference), the BatchNorm and
    the activation pass their input through wherever the fused call applied them (eval mode)."""
    if id(module) in walked:
        return module
    walked.add(id(module))
    if isinstance(module, torch.nn.Sequential):
        names = list(module._modules)
        i = 0
        while i < len(names):
            conv = module._modules[names[i]]
            if type(conv) is not Conv2d or not _plain(conv):
                i += 1
                continue
            j, bn, activation, slope = i + 1, None, None, 0.0
            if j < len(names) and _foldable_bn(module._modules[names[j]], conv):
                bn = module._modules[names[j]]
                j += 1
            act_module = module._modules[names[j]] if j < len(names) else None
            make = _ACTIVATION_MODULES.get(type(act_module)) if act_module is not None else None
            found = make(act_module) if make is not None and _plain(act_module) else None
            if found is not None:
                activation, slope = found
            if bn is None:  # (an activation alone is not worth the wrappers)
                i += 1
                continue
            fused = FusedConv2d(conv, bn, activation, slope)
            module._modules[names[i]] = _SequentialFused(fused)
            module._modules[names[i + 1]] = _Applied(bn, fused)
            if activation is not None:
                module._modules[names[i + 2]] = _Applied(act_module, fused)
            i = j + (activation is not None)
    for child in module._modules.values():
        if child is not None:
            _fuse_sequentials(child, walked)
    return module


class _SequentialFused(Conv2d):
    """A Sequential's conv child that runs its fused chain: the conv's own Parameters and buffers (its
    state_dict keys), the chain (``FusedConv2d``) by reference."""

    def __init__(self, fused: FusedConv2d):
        conv = fused.conv
        for name, value in conv.__dict__.items():
            object.__setattr__(self, name, value.copy() if isinstance(value, (dict, set)) else value)
        object.__setattr__(self, "_chain", fused)
        object.__setattr__(fused, "conv", _PlainConv(self))

    def forward(self, x):
        bn = self._chain.bn
        return self._chain(x) if not bn.training else super().forward(x)


class _PlainConv:
    """The convolution of a ``_SequentialFused`` as its chain calls it (``conv(x)``, ``conv._conv_forward``)."""

    def __init__(self, owner: Conv2d):
        self._owner = owner

    def __getattr__(self, name):
        # (not for dunders or ``_owner`` itself: a copy or an unpickling asks for ``__setstate__`` before its
        # ``_owner`` is set, which looked up here recursed without end)
        if name == "_owner" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._owner, name)

    def __call__(self, x):
        return Conv2d.forward(self._owner, x)

    def _conv_forward(self, x, weight, bias):
        return Conv2d._conv_forward(self._owner, x, weight, bias)


class _Applied(torch.nn.Module):
    """A BatchNorm or activation child that the fused conv before it applies in eval mode: there its input passes
    through; in train mode it runs. The wrapped module's Parameters and buffers are its own (the same keys)."""

    def __init__(self, module: torch.nn.Module, fused: FusedConv2d):
        super().__init__()
        for name, value in module.__dict__.items():  # (and its checkpoint hooks: a BatchNorm's refolds the chain)
            if name in ("_parameters", "_buffers", "_load_state_dict_post_hooks"):
                object.__setattr__(self, name, value)
        object.__setattr__(self, "_wrapped", module)
        object.__setattr__(self, "_chain", fused)

    def forward(self, x):
        bn = self._chain.bn
        return self._wrapped(x) if bn.training else x

    def train(self, mode: bool = True):
        super().train(mode)
        self._wrapped.train(mode)  # (the module the chain asks: not a child of the model any more)
        return self

    def extra_repr(self) -> str:
        return f"applied by the fused conv before it in eval mode: {self._wrapped!r}"
