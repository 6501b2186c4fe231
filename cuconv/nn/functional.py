"""``cuconv.nn.functional.conv2d``: torch's ``F.conv2d`` on cuconv kernels, autograd-aware.

Eager calls go through an ``autograd.Function`` whose forward and backward run a ``_bridge.Layer``, kept per
call signature: a layer called again costs a dictionary lookup, two allocations and its launches (no checks
repeated: every property a check reads is part of the signature). Calls that ``torch.compile`` traces go
through three ``torch.library.custom_op`` s (``cuconv::conv2d``, ``cuconv::conv2d_input``,
``cuconv::conv2d_weight``, plus ``cuconv::conv2d_bias_grad``) with fake implementations and an autograd
formula, on the same layers. Under ``torch.autocast`` the tensors are cast first, exactly as torch casts its
own convolution.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from .. import _layout, variants as _variants
from .._config import config
from .._errors import ConvTypeError, ConvValueError
from ..checks import check_grad_output, epilogue_of
from ..dispatch import call_key
from ..select import algorithms
from ..spec import ConvSpec, output_size, pair
from . import _bridge, _transforms

__all__ = ["conv2d", "conv_transpose2d", "conv1d", "conv3d", "torch_precision"]

_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_Tensor = torch.Tensor
_PARAMETER = torch.nn.Parameter
# (module-level names for what a call seen before asks: each attribute lookup on ``torch`` is host time)
_is_compiling = torch.compiler.is_compiling
# torch.jit.trace records the dispatcher's ops only: a result written through a raw pointer would be traced as the
# empty tensor it was made from (outputs of whatever memory held), so a trace takes the custom op
_is_tracing = torch._C._is_tracing
_settings = config.settings  # (the one read of the configuration per call: passed down from the entry points)
_autocast_enabled = torch.is_autocast_enabled
_grad_enabled = torch.is_grad_enabled
_forward_ad = torch.autograd.forward_ad  # (its ``_current_level``: the innermost open dual level, -1 if none)


try:  # torch's own getters, without the attribute lookups of torch.backends.cudnn(.conv) (~1 µs a call)
    _fp32_precision_getter = torch._C._get_fp32_precision_getter
    _cudnn_allow_tf32 = torch._C._get_cudnn_allow_tf32
    _fp32_precision_getter("cuda", "conv")
except (AttributeError, RuntimeError, TypeError):  # pragma: no cover - a torch without them
    _fp32_precision_getter = None


@torch.compiler.assume_constant_result
def torch_precision() -> str:
    """The float32 precision ``torch.nn.Conv2d`` would use now: cuDNN's TF32 switch, as torch reads it
    (``torch.backends.cudnn.conv.fp32_precision`` where it says "tf32" or "ieee", else
    ``torch.backends.cudnn.allow_tf32``).

    Under ``torch.compile`` it is read once, when the graph is traced (dynamo cannot trace torch's flag
    object); eager calls read it every time.
    """
    if _fp32_precision_getter is not None:
        fp32 = _fp32_precision_getter("cuda", "conv")
        if fp32 == "tf32" or fp32 == "ieee":
            return fp32
        return "tf32" if _cudnn_allow_tf32() else "ieee"
    conv = getattr(torch.backends.cudnn, "conv", None)
    fp32 = getattr(conv, "fp32_precision", None) if conv is not None else None
    if fp32 in ("tf32", "ieee"):
        return fp32
    return "tf32" if torch.backends.cudnn.allow_tf32 else "ieee"


# ----------------------------------------------------------------------------------------------------------
# Layers per call signature
# ----------------------------------------------------------------------------------------------------------
# signature -> _bridge.Layer. The signature holds everything the checks and the plans read: shapes, dtypes and
# devices of the three tensors, the plain geometry arguments, algo, the float32 precision and the config values.
# Bounded: cleared when full.
_layers: dict = {}
_LAYERS_MAX = 4096


# ``cuconv.nn.warmup``'s recorder while it runs a model on meta tensors (None otherwise: calls on meta tensors
# are only shaped)
_recorder = None


_PLAIN_TYPES = (_Tensor, _PARAMETER)


def _plain_tensor(t) -> bool:
    """A tensor or parameter itself (subclasses take the checked path: their data may not be plain memory)."""
    return type(t) in _PLAIN_TYPES


def _signature(x, w, b, stride, padding, dilation, groups, algo, settings):
    """The key of a CUDA call (``dispatch.call_key`` of its tensors' shapes, strides, dtypes and devices, and of
    the float32 precision and ``settings``' values its layer depends on) whose arguments are all plain, else
    None."""
    dtype = x.dtype
    return call_key((x.shape, x.stride(), dtype, x.get_device(), w.shape, w.stride(), w.dtype, w.get_device(),
                     None if b is None else (b.shape, b.dtype, b.get_device())), stride, padding, dilation, groups,
                    algo, (torch_precision() if dtype is torch.float32 else None, settings.workspace_limit,
                           settings.benchmark, settings.benchmark_cache))


def _signature_of(x_shape, x_stride, dtype, index: int, w_shape, w_stride, b_shape, stride, padding, dilation,
                  groups, algo, workspace_limit: int, benchmark: bool, benchmark_cache: str = None):
    """``_signature`` of a call on CUDA device ``index`` with tensors of these shapes and strides, all of
    ``dtype`` (``b_shape`` False: no bias): the key ``warmup`` keeps a layer under."""
    return call_key((torch.Size(x_shape), tuple(x_stride), dtype, index, torch.Size(w_shape), tuple(w_stride), dtype,
                     index, None if b_shape is False else (torch.Size(b_shape), dtype, index)), stride, padding,
                    dilation, groups, algo,
                    (torch_precision() if dtype is torch.float32 else None, workspace_limit, benchmark,
                     benchmark_cache))


def _layer(x, w, b, spec: ConvSpec, algo: str, precision: str, settings) -> "_bridge.Layer":
    """A new layer for validated tensors, made on the input's device."""
    device = x.device
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        with torch.cuda.device(device.index):
            return _layer(x, w, b, spec, algo, precision, settings)
    # (inside a torch.func transform the tensors' strides are not theirs to ask: an NCHW layer)
    plain = not _transforms_active()
    return _bridge.Layer(spec, x.dtype, device, precision, algo, b is not None, tuple(x.shape), settings.benchmark,
                         settings.workspace_limit,
                         channels_last=plain and _layout.result_channels_last(x, w, device.type == "cuda"),
                         w_channels_last=plain and _only_channels_last(w), benchmark_cache=settings.benchmark_cache)


# ----------------------------------------------------------------------------------------------------------
# Eager: an autograd.Function over a layer
# ----------------------------------------------------------------------------------------------------------
def _save(ctx, x, w, layer) -> None:
    need_x, need_w, _, _ = ctx.needs_input_grad
    ctx.layer = layer
    ctx.save_for_backward(x if need_w else None, w if need_x else None)
    if _forward_ad._current_level >= 0:  # (a dual level is open: jvp may be asked)
        ctx.save_for_forward(x, w)


def _backward(ctx, dy):
    x, w = ctx.saved_tensors
    need_x, need_w, need_b, _ = ctx.needs_input_grad
    if _transforms_active() or _forward_ad._current_level >= 0:
        # a backward under a transform (vmap over it, as jacrev runs it) or recorded for forward-mode AD
        # (forward-over-reverse): the Functions with vmap rules and jvp
        grad = _transforms.GradT.apply
        layer = ctx.layer
        return (grad(x, w, dy, layer, "x") if need_x else None, grad(x, w, dy, layer, "w") if need_w else None,
                grad(x, w, dy, layer, "b") if need_b else None, None)
    if _grad_enabled() or _is_batched(dy):
        # create_graph=True: the custom ops, whose own formulas autograd records; a batch of grad_outputs
        # (``autograd.grad(is_grads_batched=True)``, gradcheck's ``check_batched_grad``: torch's legacy vmap, no
        # transform active): the custom ops, which its fallback runs sample by sample
        return _backward_ops(ctx.layer, x, w, dy, need_x, need_w, need_b) + (None,)
    dx, dw, db = ctx.layer.backward(dy, x, w, need_x, need_w, need_b, True)
    return dx, dw, db, None


def _jvp(ctx, x_t, w_t, b_t, _):
    x, w = ctx.saved_tensors
    layer = ctx.layer
    unbatched = len(layer.x_shape) == 3
    geometry = _op_geometry(layer) + (layer.algo, layer.precision)

    def conv(a, b):
        a = a.unsqueeze(0) if unbatched else a
        y = torch.ops.cuconv.conv2d(a.contiguous(), b.contiguous(), None, *geometry)
        return y.squeeze(0) if unbatched else y

    y_t = None
    if x_t is not None:
        y_t = conv(x_t, w)
    if w_t is not None:
        y_t = conv(x, w_t) if y_t is None else y_t + conv(x, w_t)
    if b_t is not None:
        shape = (-1, 1, 1) if unbatched else (1, -1, 1, 1)
        y_t = (torch.zeros(layer.out_shape, dtype=b_t.dtype, device=b_t.device) if y_t is None else y_t) \
            + b_t.reshape(shape)
    return y_t


class _Conv2d(torch.autograd.Function):
    """y = conv2d(x, w) + b through ``layer``; backward: dgrad, wgrad and the bias sum as needed; forward-mode
    AD: the tangent conv2d(ẋ, w) + conv2d(x, ẇ) + ḃ.

    The forward takes ``ctx`` (no ``setup_context``): ``Function.apply`` of a class with ``setup_context`` binds
    its arguments through ``inspect.signature`` on every call. While a ``torch.func`` transform is active the
    functions of ``_transforms`` run instead (setup_context, vmap rules, every derivative one of them)."""

    @staticmethod
    def forward(ctx, x, w, b, layer):
        _save(ctx, x, w, layer)
        return layer.forward(x, w, b, True)

    backward = staticmethod(_backward)
    jvp = staticmethod(_jvp)


try:  # (the legacy vmap's batched tensors: autograd's is_grads_batched)
    _is_batched = torch._C._functorch.is_legacy_batchedtensor
except AttributeError:  # pragma: no cover - a torch without it
    def _is_batched(t) -> bool:
        return False

try:
    _transforms_active = torch._C._are_functorch_transforms_active
except AttributeError:  # pragma: no cover - a torch without functorch
    def _transforms_active() -> bool:
        return False


def _op_geometry(layer) -> tuple:
    """The layer's geometry as the custom ops take it: stride, four-sided padding, dilation, groups."""
    spec = layer.spec
    return list(spec.stride), list(spec.pad), list(spec.dilation), spec.groups


def _backward_ops(layer, x, w, dy, need_x: bool, need_w: bool, need_b: bool) -> tuple:
    """dx, dw, db through the custom ops, on 4-D tensors (for a backward that records a graph)."""
    spec = layer.spec
    unbatched = len(layer.x_shape) == 3
    if unbatched:
        dy = dy.unsqueeze(0)
        x = None if x is None else x.unsqueeze(0)
    geometry = _op_geometry(layer)
    dx = dw = db = None
    if need_x:
        dx = torch.ops.cuconv.conv2d_input(list(spec.input_shape), w, dy, *geometry,
                                           _bridge.backward_algo(layer.algo, "dgrad"), layer.precision)
        dx = dx.squeeze(0) if unbatched else dx
    if need_w:
        dw = torch.ops.cuconv.conv2d_weight(x, list(spec.weight_shape), dy, *geometry,
                                            _bridge.backward_algo(layer.algo, "wgrad"), layer.precision)
    if need_b:
        db = torch.ops.cuconv.conv2d_bias_grad(dy)
    return dx, dw, db


def _run_layer(layer, x, w, b):
    """The layer's forward on the device it belongs to, with autograd where a tensor needs a gradient."""
    if layer.index >= 0 and layer.index != _current_device():
        with torch.cuda.device(layer.index):
            return _run_layer(layer, x, w, b)
    if _transforms_active():  # (torch.func: tensors that may be batched or wrapped, laid out inside the Function)
        return _transforms.Conv2dT.apply(x, w, b, layer)
    if layer.x_format is not None:  # (a channels-last forward in place)
        if not x.is_contiguous(memory_format=layer.x_format):
            x = x.contiguous(memory_format=layer.x_format)
    elif not x.is_contiguous() and not layer.channels_last:  # (a channels-last layer's forward copies x itself)
        x = x.contiguous()
    if layer.w_format is not None:  # (a channels-last weight the layer's plans read where it is)
        if not w.is_contiguous(memory_format=layer.w_format):
            w = w.contiguous(memory_format=layer.w_format)
    elif not w.is_contiguous():
        w = w.contiguous()
    if b is not None and not b.is_contiguous():
        b = b.contiguous()
    if ((_grad_enabled() and (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)))
            or _forward_ad._current_level >= 0):
        # ``Function.apply`` itself, less its Python preamble (no setup_context to bind arguments for, no
        # transform active): the tensors unwrapped where a finished ``torch.func`` transform left them wrapped
        return _conv2d_apply(_unwrap_if_dead(x), _unwrap_if_dead(w), None if b is None else _unwrap_if_dead(b),
                             layer)
    return layer.forward(x, w, b, True)  # (it reads data pointers only: the result records no autograd history)


_conv2d_apply = super(torch.autograd.Function, _Conv2d).apply  # (torch._C._FunctionBase.apply, bound to _Conv2d)
try:
    from torch._C._functorch import unwrap_if_dead as _unwrap_if_dead
except ImportError:  # pragma: no cover - a torch without functorch
    def _unwrap_if_dead(t):
        return t


try:
    _current_device = torch._C._cuda_getDevice
except AttributeError:  # pragma: no cover - a torch built without CUDA
    def _current_device() -> int:
        return torch.cuda.current_device()


# ----------------------------------------------------------------------------------------------------------
# Traced (torch.compile): custom ops on the same layers. Geometry arrives normalised: stride/dilation pairs,
# four-sided padding.
# ----------------------------------------------------------------------------------------------------------
def _traced_layer(x, w, has_bias, stride, padding, dilation, groups, algo, precision, x_shape=None,
                  channels_last: bool = False, w_channels_last: bool = False):
    x_shape = tuple(x.shape) if x_shape is None else tuple(x_shape)
    w_shape = tuple(w) if isinstance(w, (list, tuple)) else tuple(w.shape)
    dtype = x.dtype if isinstance(x, _Tensor) else w.dtype
    settings = _settings()  # (a custom op is an entry point: it reads the configuration once)
    stride, padding, dilation = tuple(stride), tuple(padding), tuple(dilation)
    key = call_key(("traced", x_shape, dtype, str(x.device), w_shape, has_bias), stride, padding, dilation, groups,
                   algo, (precision, settings.workspace_limit, settings.benchmark, settings.benchmark_cache,
                          channels_last, w_channels_last))
    layer = _layers.get(key) if key is not None else None
    if layer is None:
        n, c, h, wd = x_shape
        k, _, r, s = w_shape
        spec = ConvSpec(n, c, h, wd, k, r, s, stride, padding, dilation, groups)
        layer = _bridge.Layer(spec, dtype, x.device, precision, algo, has_bias, x_shape, settings.benchmark,
                              settings.workspace_limit, channels_last=channels_last, w_channels_last=w_channels_last,
                              benchmark_cache=settings.benchmark_cache)
        if key is not None:
            _remember(key, layer)
    return layer


# The custom ops follow torch's memory formats (``_layout.result_channels_last``): a channels-last result where the
# input or the weight is (conv2d), where grad_output or the weight is (conv2d_input); conv2d_weight's dW is
# contiguous (its op sees the weight's size, not its strides). Their fake implementations give the same strides.
def _op_channels_last(activation, weight) -> bool:
    return activation.dim() == 4 and _layout.result_channels_last(activation, weight, activation.device.type == "cuda")


_only_channels_last = _layout.only_channels_last


def _layer_weight(layer, w):
    """``w`` in the memory format the layer's plans read it in."""
    if layer.w_format is not None:
        return w if w.is_contiguous(memory_format=layer.w_format) else w.contiguous(memory_format=layer.w_format)
    return w.contiguous()


def _like_result(t, shape, channels_last: bool):
    """A new tensor of ``shape`` like ``t``: dense channels-last where ``channels_last``, else contiguous."""
    if channels_last:
        return t.new_empty_strided(shape, _layout.nhwc_strides(shape))
    return t.new_empty(shape)


def _remember(key, layer) -> None:
    if len(_layers) >= _LAYERS_MAX:
        _layers.clear()
    _layers[key] = layer


@torch.library.custom_op("cuconv::conv2d", mutates_args=())
def _conv2d_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: List[int],
               padding: List[int], dilation: List[int], groups: int, algo: str,
               precision: str) -> torch.Tensor:
    cl = _op_channels_last(x, weight)
    if not cl:
        x = x.contiguous()
    bias = None if bias is None else bias.contiguous()
    layer = _traced_layer(x, weight, bias is not None, stride, padding, dilation, groups, algo, precision,
                          channels_last=cl, w_channels_last=cl and _only_channels_last(weight))
    return layer.forward(x, _layer_weight(layer, weight), bias)


@_conv2d_op.register_fake
def _(x, weight, bias, stride, padding, dilation, groups, algo, precision):
    p = output_size(x.shape[2], weight.shape[2], stride[0], padding[0], padding[1], dilation[0])
    q = output_size(x.shape[3], weight.shape[3], stride[1], padding[2], padding[3], dilation[1])
    return _like_result(x, (x.shape[0], weight.shape[0], p, q), _op_channels_last(x, weight))


@torch.library.custom_op("cuconv::conv2d_input", mutates_args=())
def _conv2d_input_op(input_size: List[int], weight: torch.Tensor, grad_output: torch.Tensor,
                     stride: List[int], padding: List[int], dilation: List[int], groups: int, algo: str,
                     precision: str) -> torch.Tensor:
    cl = len(input_size) == 4 and _op_channels_last(grad_output, weight)
    if not cl:
        grad_output = grad_output.contiguous()
    layer = _traced_layer(grad_output, weight, False, stride, padding, dilation, groups, algo, precision,
                          x_shape=input_size, channels_last=cl, w_channels_last=cl and _only_channels_last(weight))
    # (the plans read grad_output as the spec's output: a size recorded by jit.trace for other inputs, or a wrong
    # one, would be read past its end)
    check_grad_output(grad_output, layer.spec, len(input_size) == 3)
    return layer.dgrad(grad_output, _layer_weight(layer, weight))


@_conv2d_input_op.register_fake
def _(input_size, weight, grad_output, stride, padding, dilation, groups, algo, precision):
    return _like_result(grad_output, input_size, len(input_size) == 4 and _op_channels_last(grad_output, weight))


@torch.library.custom_op("cuconv::conv2d_weight", mutates_args=())
def _conv2d_weight_op(x: torch.Tensor, weight_size: List[int], grad_output: torch.Tensor,
                      stride: List[int], padding: List[int], dilation: List[int], groups: int, algo: str,
                      precision: str) -> torch.Tensor:
    cl = _op_channels_last(x, x)  # (dW contiguous either way: the op sees no weight strides)
    if not cl:
        x, grad_output = x.contiguous(), grad_output.contiguous()
    layer = _traced_layer(x, weight_size, False, stride, padding, dilation, groups, algo, precision, channels_last=cl)
    check_grad_output(grad_output, layer.spec, x.dim() == 3)
    return layer.wgrad(x, grad_output)


@_conv2d_weight_op.register_fake
def _(x, weight_size, grad_output, stride, padding, dilation, groups, algo, precision):
    return x.new_empty(weight_size)


@torch.library.custom_op("cuconv::conv2d_bias_grad", mutates_args=())
def _bias_grad_op(grad_output: torch.Tensor) -> torch.Tensor:
    """Σ over (N, P, Q) of grad_output, accumulated in fp32 for half precisions."""
    return _bridge.bias_grad(grad_output)


@_bias_grad_op.register_fake
def _(grad_output):
    return grad_output.new_empty((grad_output.shape[1],))


def _setup_context(ctx, inputs, output):
    x, weight, bias, stride, padding, dilation, groups, algo, precision = inputs
    ctx.save_for_backward(x, weight)
    ctx.geometry = (stride, padding, dilation, groups, algo, precision)


def _backward_geometry(geometry, pass_: str):
    """The forward's geometry and algo for a backward pass; ``auto`` if that algo has no such pass."""
    stride, padding, dilation, groups, algo, precision = geometry
    return stride, padding, dilation, groups, _bridge.backward_algo(algo, pass_), precision


def _backward_formula(ctx, grad_output):
    x, weight = ctx.saved_tensors  # (grad_output in any memory format: each op takes it as its layer reads it)
    dx = dw = db = None
    if ctx.needs_input_grad[0]:
        dx = torch.ops.cuconv.conv2d_input(list(x.shape), weight, grad_output,
                                           *_backward_geometry(ctx.geometry, "dgrad"))
    if ctx.needs_input_grad[1]:
        dw = torch.ops.cuconv.conv2d_weight(x, list(weight.shape), grad_output,
                                            *_backward_geometry(ctx.geometry, "wgrad"))
    if ctx.needs_input_grad[2]:
        db = torch.ops.cuconv.conv2d_bias_grad(grad_output)
    return dx, dw, db, None, None, None, None, None, None


torch.library.register_autograd("cuconv::conv2d", _backward_formula, setup_context=_setup_context)


# Double backward: dgrad and wgrad are linear in both their tensors, and each of their derivatives is again one of
# the three convolutions. With dx = dgrad(w, dy): <g, dx> = <conv2d(g, w), dy>, so d/d(dy) = conv2d(g, w) and
# d/dw = wgrad(g, dy). With dw = wgrad(x, dy): <gw, dw> = <conv2d(x, gw), dy>, so d/d(dy) = conv2d(x, gw) and
# d/dx = dgrad(gw, dy). The formulas call the ops, which have formulas too: every order is differentiable.
def _save_geometry(ctx, inputs, output):
    _, first, second, stride, padding, dilation, groups, algo, precision = inputs
    ctx.save_for_backward(first, second)
    ctx.geometry = (stride, padding, dilation, groups)
    ctx.algo, ctx.precision = algo, precision


def _dgrad_formula(ctx, g):
    w, dy = ctx.saved_tensors
    g = g.contiguous()
    d_w = d_dy = None
    if ctx.needs_input_grad[1]:
        d_w = torch.ops.cuconv.conv2d_weight(g, list(w.shape), dy, *ctx.geometry,
                                             _bridge.backward_algo(ctx.algo, "wgrad"), ctx.precision)
    if ctx.needs_input_grad[2]:
        d_dy = torch.ops.cuconv.conv2d(g, w, None, *ctx.geometry, ctx.algo, ctx.precision)
    return None, d_w, d_dy, None, None, None, None, None, None


def _wgrad_formula(ctx, g):
    x, dy = ctx.saved_tensors
    g = g.contiguous()
    d_x = d_dy = None
    if ctx.needs_input_grad[0]:
        d_x = torch.ops.cuconv.conv2d_input(list(x.shape), g, dy, *ctx.geometry,
                                            _bridge.backward_algo(ctx.algo, "dgrad"), ctx.precision)
    if ctx.needs_input_grad[2]:
        d_dy = torch.ops.cuconv.conv2d(x, g, None, *ctx.geometry, ctx.algo, ctx.precision)
    return d_x, None, d_dy, None, None, None, None, None, None


def _wgrad_setup(ctx, inputs, output):
    x, size, dy, *rest = inputs
    _save_geometry(ctx, (size, x, dy, *rest), output)


def _bias_grad_setup(ctx, inputs, output):
    ctx.shape = inputs[0].shape


def _bias_grad_formula(ctx, g):
    """db = Σ dy over (N, P, Q): d/d(dy) of <g, db> is g in every position of its channel."""
    return g.reshape(1, -1, 1, 1).expand(ctx.shape)


torch.library.register_autograd("cuconv::conv2d_input", _dgrad_formula, setup_context=_save_geometry)
torch.library.register_autograd("cuconv::conv2d_weight", _wgrad_formula, setup_context=_wgrad_setup)
torch.library.register_autograd("cuconv::conv2d_bias_grad", _bias_grad_formula, setup_context=_bias_grad_setup)


# ----------------------------------------------------------------------------------------------------------
# The public function
# ----------------------------------------------------------------------------------------------------------
_LOWER = {torch.float16: _Tensor.half, torch.bfloat16: _Tensor.bfloat16}  # (cheaper to call than ``.to(dtype)``)


def lower_of(low: torch.dtype):
    """The cast of a tensor to autocast's lower precision ``low``."""
    return _LOWER.get(low) or (lambda t: t.to(low))


def _autocast(input, weight, bias, device_type: str):
    """The tensors as torch's autocast casts a convolution's: floating-point tensors of the autocast device type,
    but float64 ones, to autocast's lower precision."""
    low = torch.get_autocast_dtype(device_type)
    lower = lower_of(low)
    return (_cast(input, low, lower, device_type), _cast(weight, low, lower, device_type),
            None if bias is None else _cast(bias, low, lower, device_type))


def _cast(t, low, lower, device_type: str):
    if (isinstance(t, _Tensor) and t.dtype is not low and t.is_floating_point() and t.dtype is not torch.float64
            and (t.is_cuda if device_type == "cuda" else t.device.type == device_type)):
        return lower(t)
    return t


def conv2d(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, stride=1,
           padding=0, dilation=1, groups=1, *, algo: str = "auto", activation: Optional[str] = None,
           negative_slope: float = 0.01, residual: Optional[torch.Tensor] = None,
           residual_position: str = "before") -> torch.Tensor:
    """``torch.nn.functional.conv2d`` computed by cuconv, with autograd.

    Same signature and semantics as torch's (``padding`` may be ``"same"``/``"valid"``), plus ``algo`` and an
    epilogue as ``cuconv.conv2d``'s: ``activation`` (``"relu"``, ``"relu6"``, ``"leaky_relu"`` with
    ``negative_slope``, ``"silu"``, ``"gelu"``, ``"gelu_tanh"``, ``"hardswish"``, ``"hardsigmoid"``, ``"sigmoid"``)
    and a ``residual`` tensor added before it (``residual_position="before"``) or after it (``"after"``), with
    torch's type promotion; today torch's elementwise operations after the convolution, differentiable.
    float32 follows torch's TF32 switch for convolutions (``torch.backends.cudnn.allow_tf32`` and, where
    torch has it, ``torch.backends.cudnn.conv.fp32_precision``), exactly as ``torch.nn.Conv2d`` would. Under
    ``torch.autocast`` the tensors are cast to its lower precision first, as torch casts its convolution
    (float64 ones are left alone); gradients come back in the original dtypes. CUDA tensors run on their
    device and torch's current stream; CPU tensors on cuconv's CPU path. Non-contiguous and channels-last
    tensors are made contiguous; the result is contiguous.

    Raises
    ------
    TypeError, ValueError
        In torch's wording, before any kernel runs.

    Examples
    --------
    >>> import torch, cuconv.nn.functional as F
    >>> x = torch.randn(1, 2, 5, 6, dtype=torch.float64, requires_grad=True)
    >>> w = torch.randn(4, 2, 3, 3, dtype=torch.float64)
    >>> F.conv2d(x, w, padding="same").sum().backward(); x.grad.shape
    torch.Size([1, 2, 5, 6])
    """
    if activation is not None or residual is not None:
        return _with_epilogue(input, weight, bias, stride, padding, dilation, groups, algo, activation,
                              negative_slope, residual, residual_position)
    if (type(input) is _Tensor and input.is_cuda and not _is_compiling() and not _is_tracing()
            and not _transforms_active()):
        # the path of a layer seen before: its signature, one lookup, its launches
        settings = _settings()
        if _autocast_enabled("cuda"):
            input, weight, bias = _autocast(input, weight, bias, "cuda")
        if type(weight) in _PLAIN_TYPES and (bias is None or type(bias) in _PLAIN_TYPES):
            key = _signature(input, weight, bias, stride, padding, dilation, groups, algo, settings)
            layer = _layers.get(key) if key is not None else None
            if layer is not None:
                return _run_layer(layer, input, weight, bias)
        return _checked(input, weight, bias, stride, padding, dilation, groups, algo, settings, autocast_done=True)
    return _checked(input, weight, bias, stride, padding, dilation, groups, algo, None)


def _with_epilogue(input, weight, bias, stride, padding, dilation, groups, algo, activation, slope, residual,
                   position):
    if (isinstance(input, _Tensor) and input.is_cuda and not _is_compiling() and not _is_tracing()
            and _forward_ad._current_level < 0
            and not (_grad_enabled()
                     and any(t is not None and t.requires_grad for t in (input, weight, bias, residual)))):
        # inference on CUDA: the convolution and its epilogue as one plan of one layer (kept per signature)
        y = _fused_inference(input, weight, bias, stride, padding, dilation, groups, algo, activation, slope,
                             residual, position)
        if y is not None:
            return y
    from .fuse import apply_epilogue

    ep = _check_epilogue(input, weight, bias, stride, padding, dilation, groups, activation, slope, residual,
                         position)
    y = conv2d(input, weight, bias, stride, padding, dilation, groups, algo=algo)
    return apply_epilogue(y, ep.activation, ep.alpha, residual, ep.residual)


def _check_epilogue(input, weight, bias, stride, padding, dilation, groups, activation, slope, residual, position):
    """The ``Epilogue`` of these arguments (``checks.epilogue_of``), the residual's type and size against the
    result's checked too, before anything runs."""
    ep = epilogue_of(bias is not None, activation, slope, residual is not None, position)
    if residual is not None and not isinstance(residual, _Tensor):
        raise TypeError(f"conv2d(): argument 'residual' must be Tensor, not {type(residual).__name__}")
    if residual is not None and isinstance(input, _Tensor) and isinstance(weight, _Tensor) and \
            input.dim() in (3, 4) and weight.dim() == 4:  # (the residual's size checked before anything runs)
        batched = input.dim() == 4
        x_shape = tuple(input.shape) if batched else (1, *input.shape)
        out_shape = _output_shape(x_shape, _spec_of(x_shape, tuple(weight.shape), stride, padding, dilation, groups))
        shape = out_shape if batched else out_shape[1:]
        if tuple(residual.shape) != tuple(shape):
            raise ValueError(f"conv2d(): expected residual of size {list(shape)}, but got residual of size "
                             f"{list(residual.shape)}")
    return ep


def _fused_inference(input, weight, bias, stride, padding, dilation, groups, algo, activation, slope, residual,
                     position):
    """The forward with its epilogue through a layer whose plan holds it (``_bridge.Layer.epilogue``), or None where
    that does not apply (``fused_layer``)."""
    found = fused_layer(input, weight, bias, stride, padding, dilation, groups, algo, activation, slope, residual,
                        position)
    if found is None:
        return None
    layer, input, weight, bias = found
    return run_fused(layer, input, weight, bias, residual)


def fused_layer(input, weight, bias, stride, padding, dilation, groups, algo, activation, slope, residual, position):
    """``(layer, input, weight, bias)``: the layer whose plan holds the convolution with this epilogue
    (``_bridge.Layer.epilogue``) and the tensors as its forward takes them (autocast's casts made, the weight laid out
    as the plans read it), for ``run_fused``; or None where that does not apply (tensors not plain, a residual of
    another dtype, device or layout than the plain path takes). A signature seen before (the epilogue and the
    residual's shape, strides and dtype in it) costs a lookup; a new one every check first. For CUDA calls
    without gradients recorded (``_with_epilogue``'s condition)."""
    settings = _settings()
    if _autocast_enabled("cuda"):
        input, weight, bias = _autocast(input, weight, bias, "cuda")
    if not (type(input) is _Tensor and _plain_tensor(weight) and (bias is None or _plain_tensor(bias))
            and (residual is None or type(residual) is _Tensor)):
        return None
    base = _signature(input, weight, bias, stride, padding, dilation, groups, algo, settings)
    key = None if base is None or type(activation) not in (str, type(None)) or type(position) is not str else (
        base, activation, slope, position, None if residual is None else (residual.shape, residual.stride(),
                                                                           residual.dtype, residual.get_device()))
    layer = _layers.get(key) if key is not None else None
    if layer is None:
        ep = _check_epilogue(input, weight, bias, stride, padding, dilation, groups, activation, slope, residual,
                             position)
        if residual is not None and (residual.dtype != input.dtype or residual.device != input.device):
            return None
        plain = _checked_layer(input, weight, bias, stride, padding, dilation, groups, algo, settings)
        if plain is None or plain.index < 0:
            return None
        with torch.cuda.device(input.device.index):  # (its choice and plans are made on the input's device)
            layer = _bridge.Layer(plain.spec, input.dtype, input.device, plain.precision, algo, bias is not None,
                                  tuple(input.shape), settings.benchmark, settings.workspace_limit,
                                  channels_last=plain.channels_last, w_channels_last=_only_channels_last(weight),
                                  benchmark_cache=settings.benchmark_cache, epilogue=ep)
        if key is not None:
            _remember(key, layer)
    return (layer, input) + _laid_out(layer, weight, bias)


def plain_layer(input, weight, bias, stride, padding, dilation, groups, algo):
    """``(layer, input, weight, bias)``: the layer of a CUDA call without an epilogue, after every check of
    ``_checked`` (which raises in torch's wording), and the tensors as ``run_layer`` takes them (autocast's casts
    made, the weight and bias laid out as the layer's plans read them); None where the call's path is not a
    layer's (tensors not plain, a transform active: ``conv2d``'s checked path). For calls without gradients
    recorded."""
    settings = _settings()
    if _autocast_enabled("cuda"):
        input, weight, bias = _autocast(input, weight, bias, "cuda")
    if not (type(input) is _Tensor and input.is_cuda and _plain_tensor(weight) and (bias is None or _plain_tensor(bias))
            and not _transforms_active()):
        return None
    layer = _checked_layer(input, weight, bias, stride, padding, dilation, groups, algo, settings)
    if layer is None or layer.index < 0:
        return None
    return (layer, input) + _laid_out(layer, weight, bias)


def layer_operands(layer, weight, bias) -> tuple:
    """(weight, bias) as ``layer``'s forward takes them, from the module's own (``plain_layer``'s): autocast's casts
    where it is on, the weight laid out as the plans read it, the bias contiguous."""
    if _autocast_enabled("cuda"):
        _, weight, bias = _autocast(None, weight, bias, "cuda")
    return _laid_out(layer, weight, bias)


def _laid_out(layer, weight, bias) -> tuple:
    """(weight, bias) as ``layer``'s plans read them: the weight channels-last where they take it so, else
    contiguous; the bias contiguous."""
    if layer.w_format is not None:
        weight = weight.contiguous(memory_format=layer.w_format)
    elif not weight.is_contiguous():
        weight = weight.contiguous()
    return weight, None if bias is None else bias.contiguous()


run_layer = _run_layer  # (plain_layer's layer and tensors: the forward on its device, with autograd where needed)


def run_fused(layer, x, w, b, residual) -> torch.Tensor:
    """``layer``'s forward with its epilogue (``fused_layer``'s tensors) on the device it belongs to."""
    if layer.index != _current_device():
        with torch.cuda.device(layer.index):
            return layer.forward(x, w, b, True, residual)
    return layer.forward(x, w, b, True, residual)


def _checked_layer(input, weight, bias, stride, padding, dilation, groups, algo, settings):
    """The plain layer of these arguments after every check of ``_checked`` (which raises in torch's wording), made
    and kept as a plain call's would be; None where its path is not a layer's (traced or meta tensors)."""
    key = _signature(input, weight, bias, stride, padding, dilation, groups, algo, settings)
    layer = _layers.get(key) if key is not None else None
    if layer is None:
        _checked(input, weight, bias, stride, padding, dilation, groups, algo, settings, autocast_done=True,
                 run=False)
        layer = _layers.get(key) if key is not None else None
    return layer


def _spec_of(x_shape: tuple, w_shape: tuple, stride, padding, dilation, groups) -> ConvSpec:
    """``ConvSpec.from_args`` of a call's 4-D shapes and arguments (torch's checks). While compiling or exporting
    the batch is taken as 1: no check reads it, and a spec (of ints) would specialise a dynamic batch to the
    example's value (under dynamo a symbolic size passes for an int), while the custom ops' fake kernels carry it
    through symbolically; and the spec is made without the memo, whose being empty or not dynamo would guard
    (a second graph)."""
    if not (_is_compiling() or any(type(v) is not int for v in x_shape)):
        return ConvSpec.from_args(x_shape, w_shape, stride, padding, dilation, groups)
    _, c, h, w = x_shape
    if not (isinstance(h, torch.SymInt) or isinstance(w, torch.SymInt)):  # (jit.trace's sizes are 0-d tensors)
        return ConvSpec.from_args((1, c, h, w), w_shape, stride, padding, dilation, groups, memo=False)
    # Symbolic spatial sizes (torch.compile(dynamic=True), torch.export with dynamic dimensions): an int would
    # specialise them as it would the batch. The spec is made of placeholders, the smallest size the dilated
    # kernel fits (every other check reads no spatial size), and the one check that does, an output of at least
    # one position, is torch's symbolic assertion on the real sizes.
    dilation_hw = pair(dilation, "dilation")
    placeholder = [d * (int(k) - 1) + 1 if isinstance(v, torch.SymInt) else v
                   for v, k, d in zip((h, w), w_shape[2:], dilation_hw)]
    spec = ConvSpec.from_args((1, c, *placeholder), w_shape, stride, padding, dilation, groups, memo=False)
    for axis, size in enumerate((h, w)):
        if isinstance(size, torch.SymInt):
            lo, hi = spec.pad[2 * axis], spec.pad[2 * axis + 1]
            extent = spec.dilation[axis] * ((spec.r, spec.s)[axis] - 1) + 1
            torch._check(size + lo + hi >= extent, lambda: "Kernel size can't be greater than actual input size")
    return spec


def _output_shape(x_shape: tuple, spec: ConvSpec) -> tuple:
    """(N, K, P, Q) of a call on 4-D ``x_shape`` (whose sizes may be symbolic, where ``spec``'s are placeholders:
    ``_spec_of``)."""
    n, _, h, w = x_shape
    p = output_size(h, spec.r, spec.stride[0], spec.pad[0], spec.pad[1], spec.dilation[0])
    q = output_size(w, spec.s, spec.stride[1], spec.pad[2], spec.pad[3], spec.dilation[1])
    return (n, spec.k, p, q)


def _weight_dim_error(input, weight, stride, padding) -> ConvValueError:
    """torch's refusal of a weight that is not 4-D, in its words: its convolution takes the weight's dimensions for
    the convolution's (a 3-D weight makes a 1-D convolution, whose stride has one value)."""
    d = weight.dim()
    if d < 3:
        return ConvValueError("weight should have at least three dimensions")
    if isinstance(padding, str):
        return ConvValueError(f"Expected {d}-dimensional input for {d}-dimensional weight{list(weight.shape)}, but "
                              f"got {input.dim()}-dimensional input of size {list(input.shape)} instead")
    try:
        shown = list(pair(stride, "stride"))
    except (TypeError, ValueError):
        shown = stride
    return ConvValueError(f"expected stride to be a single integer value or a list of {d - 2} values to match the "
                          f"convolution dimensions, but got stride={shown}")


def _check_arguments(op: str, input, weight, bias, algo) -> None:
    """torch's refusal of arguments that are not tensors, in its words for ``op``; ``algo`` a str."""
    for name, t in (("input", input), ("weight", weight), ("bias", bias)):
        if not isinstance(t, _Tensor) and not (name == "bias" and t is None):
            raise TypeError(f"{op}(): argument '{name}' must be Tensor, not {type(t).__name__}")
    if not isinstance(algo, str):
        raise TypeError(f"{op}(): argument 'algo' must be str, not {type(algo).__name__}")


def _check_dtypes(input, weight, bias) -> None:
    """The same dtype for every tensor (torch refuses a mismatch first, an integer input with a floating bias too),
    one device, and a dtype cuconv computes in."""
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != input.dtype:
            raise ConvTypeError(f"Input type ({input.dtype}) and {name} type ({t.dtype}) should be the same")
        if t is not None and t.device != input.device:
            raise ConvValueError(f"Expected all tensors to be on the same device, but found input on "
                                 f"{input.device} and {name} on {t.device}")
    if input.dtype not in _TORCH_DTYPES:
        raise ConvTypeError(f"cuconv: input dtype {input.dtype} is not supported; expected one of "
                            f"{', '.join(map(str, _TORCH_DTYPES))}")


def _checked(input, weight, bias, stride, padding, dilation, groups, algo, settings, autocast_done=False, run=True):
    """Every check of torch's, in its wording, then the layer (made and kept for CUDA tensors) under ``settings``
    (``_config.Settings``; None: read here, past the traced path, which reads none: a custom op reads them when it
    runs)."""
    _check_arguments("conv2d", input, weight, bias, algo)
    if not autocast_done:
        device_type = input.device.type
        if device_type in ("cuda", "cpu") and torch.is_autocast_enabled(device_type):
            input, weight, bias = _autocast(input, weight, bias, device_type)
    if input.dim() not in (3, 4):
        raise ConvValueError(f"Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of "
                             f"size: {list(input.shape)}")
    if weight.dim() != 4:
        raise _weight_dim_error(input, weight, stride, padding)
    _check_dtypes(input, weight, bias)
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise ConvValueError(f"Given weight of size {list(weight.shape)}, expected bias to be 1-dimensional with "
                             f"{weight.shape[0]} elements, but got bias of size {list(bias.shape)} instead")
    if algo != "auto" and algo not in algorithms():
        raise ValueError(f"cuconv: unknown algo {algo!r}; expected 'auto' or one of {algorithms()}")
    unbatched = input.dim() == 3
    x_shape = (1,) + tuple(input.shape) if unbatched else tuple(input.shape)
    spec = _spec_of(x_shape, tuple(weight.shape), stride, padding, dilation, groups)
    precision = torch_precision()
    if (torch.compiler.is_compiling() or _is_tracing() or input.device.type not in ("cuda", "cpu")
            or type(input) is not _Tensor):
        # compiled, jit-traced, meta or subclass tensors: the custom op (its fake implementation where there is no
        # data)
        if _recorder is not None and input.device.type == "meta":  # (``warmup``'s shape run)
            _recorder(input, weight, bias, spec, stride, padding, dilation, groups, algo, precision)
        x = input.unsqueeze(0) if unbatched else input
        y = torch.ops.cuconv.conv2d(x, weight, bias, list(spec.stride), list(spec.pad), list(spec.dilation),
                                    spec.groups, algo, precision)
        return y.squeeze(0) if unbatched else y
    if settings is None:
        settings = _settings()
    layer = _layer(input, weight, bias, spec, algo, precision, settings)
    if input.is_cuda and _plain_tensor(weight) and (bias is None or _plain_tensor(bias)) and not _transforms_active():
        key = _signature(input, weight, bias, stride, padding, dilation, groups, algo, settings)
        if key is not None:
            _remember(key, layer)
    if not run:  # (the layer alone: ``_checked_layer``, and the fused training block's convolution)
        return layer
    return _run_layer(layer, input, weight, bias)


def conv_transpose2d(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, stride=1,
                     padding=0, output_padding=0, groups: int = 1, dilation=1, *, algo: str = "auto") -> torch.Tensor:
    """``torch.nn.functional.conv_transpose2d`` computed by cuconv, with autograd: the dgrad of the convolution it
    transposes (``cuconv.variants``), through the custom op ``cuconv::conv2d_input`` (its derivatives are the
    forward and the wgrad; compile, export and CUDA graphs as for conv2d), the bias added after it. ``algo``
    names the algorithm of that dgrad (``auto`` where the one named has none). Autocast and float32's TF32 switch
    as for :func:`conv2d`."""
    _check_arguments("conv_transpose2d", input, weight, bias, algo)
    if algo != "auto" and algo not in algorithms():
        raise ValueError(f"cuconv: unknown algo {algo!r}; expected 'auto' or one of {algorithms()}")
    device_type = input.device.type
    if device_type in ("cuda", "cpu") and torch.is_autocast_enabled(device_type):
        input, weight, bias = _autocast(input, weight, bias, device_type)
    shape, (stride, padding, output_padding, dilation) = _variants.transposed_output_shape(
        tuple(input.shape), tuple(weight.shape), None if bias is None else tuple(bias.shape), stride, padding,
        output_padding, groups, dilation)
    _check_dtypes(input, weight, bias)
    unbatched = input.dim() == 3
    x = input.unsqueeze(0) if unbatched else input
    shape = [v if isinstance(v, (int, torch.SymInt)) else int(v) for v in shape]  # (jit.trace's sizes: 0-d tensors)
    sizes, pads, fill = _variants.transposed_plan(tuple(x.shape[2:]), tuple(shape[2:]), tuple(weight.shape[2:]),
                                                  stride, padding, output_padding, dilation)
    algo_dgrad, precision = _bridge.backward_algo(algo, "dgrad"), torch_precision()
    if _transforms_active() or _forward_ad._current_level >= 0:
        # under a torch.func transform or forward-mode AD: the dgrad Function with vmap rules and jvp
        layer = _traced_layer(x, weight, False, stride, pads, dilation, int(groups), algo_dgrad, precision,
                              x_shape=[*shape[:2], *sizes])
        y = _transforms.GradT.apply(None, weight, x, layer, "x")
    else:
        y = torch.ops.cuconv.conv2d_input([*shape[:2], *sizes], weight, x, list(stride), list(pads), list(dilation),
                                          int(groups), algo_dgrad, precision)
    if any(fill):  # (output positions no kernel window reaches: an output padding up to the dilation)
        y = torch.nn.functional.pad(y, (0, fill[1], 0, fill[0]))
    if bias is not None:  # (a pass after the dgrad, whose plans take no bias)
        y = y + bias.reshape(1, -1, 1, 1)
    return y.squeeze(0) if unbatched else y


def conv1d(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, stride=1, padding=0,
           dilation=1, groups: int = 1, *, algo: str = "auto") -> torch.Tensor:
    """``torch.nn.functional.conv1d`` computed by cuconv, with autograd: :func:`conv2d` over a plane of height one
    (``input`` ``(N, C, L)`` or ``(C, L)``, ``weight`` ``(K, C / groups, S)``; ``padding`` an int, ``"same"`` or
    ``"valid"``)."""
    _check_arguments("conv1d", input, weight, bias, algo)
    stride2, padding2, dilation2 = _variants.conv1d_args(tuple(input.shape), tuple(weight.shape), stride, padding,
                                                         dilation, groups)
    return conv2d(input.unsqueeze(-2), weight.unsqueeze(-2), bias, stride2, padding2, dilation2, groups,
                  algo=algo).squeeze(-2)


def conv3d(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, stride=1, padding=0,
           dilation=1, groups: int = 1, *, algo: str = "auto", activation: Optional[str] = None,
           negative_slope: float = 0.01) -> torch.Tensor:
    """``torch.nn.functional.conv3d`` computed by cuconv, with autograd: one :func:`conv2d` over the depth's columns
    (``cuconv.variants.depth_columns``: the T input planes each output plane reads, the batch and the output depth
    folded together) against the weight with its taps folded into its channels; the gather, its gradient and the
    layout changes are torch's. ``input`` ``(N, C, D, H, W)`` or ``(C, D, H, W)``; ``padding`` an int, a triple,
    ``"same"`` or ``"valid"``. The result is channels_last_3d where the input or the weight is, as torch's. An
    ``activation`` (as :func:`conv2d`'s) is applied in that 2-D convolution's epilogue."""
    _check_arguments("conv3d", input, weight, bias, algo)
    geometry = _variants.conv3d_args(tuple(input.shape), tuple(weight.shape), stride, padding, dilation, groups)
    unbatched = input.dim() == 4
    x = input.unsqueeze(0) if unbatched else input
    cl = any(t.is_contiguous(memory_format=torch.channels_last_3d) and not t.is_contiguous() for t in (x, weight))
    n, k, taps = x.shape[0], weight.shape[0], weight.shape[2]
    cols = _variants.depth_columns(torch, x, geometry, taps, weight.shape[1])
    cols = cols.contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)
    y = conv2d(cols, _variants.folded_weight(weight), bias, geometry["stride"][1:], geometry["padding_hw"],
               geometry["dilation"][1:], geometry["groups"], algo=algo, activation=activation,
               negative_slope=negative_slope)  # (N·D_out, K, P, Q)
    y = y.reshape(n, geometry["depth"], k, y.shape[2], y.shape[3]).permute(0, 2, 1, 3, 4)
    y = y.contiguous(memory_format=torch.channels_last_3d if cl else torch.contiguous_format)
    return y.squeeze(0) if unbatched else y
