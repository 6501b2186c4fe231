"""``cuconv.nn.functional.conv2d``: torch's ``F.conv2d`` on cuconv kernels, autograd-aware.

The computation is three ``torch.library.custom_op`` s (``cuconv::conv2d``, ``cuconv::conv2d_input``,
``cuconv::conv2d_weight``) with fake implementations, so ``torch.compile(fullgraph=True)`` traces through
them, and an autograd formula that calls our dgrad/wgrad. Tensors cross into CuPy/NumPy zero-copy and
every kernel runs on torch's current stream (see ``_bridge``).
"""

from __future__ import annotations

from typing import List, Optional

import torch

from .. import backward as _backward
from ..conv import forward_spec
from ..registry import algorithms
from ..spec import ConvSpec, output_size
from . import _bridge

__all__ = ["conv2d", "torch_precision"]

_TORCH_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@torch.compiler.assume_constant_result
def torch_precision() -> str:
    """The float32 precision ``torch.nn.Conv2d`` would use now: cuDNN's TF32 switch, as torch reads it.

    Under ``torch.compile`` it is read once, when the graph is traced (dynamo cannot trace torch's flag
    object); eager calls read it every time.
    """
    conv = getattr(torch.backends.cudnn, "conv", None)
    fp32 = getattr(conv, "fp32_precision", None) if conv is not None else None
    if fp32 in ("tf32", "ieee"):
        return fp32
    return "tf32" if torch.backends.cudnn.allow_tf32 else "ieee"


def _spec(x: torch.Tensor, w: torch.Tensor, stride, pad4, dilation, groups) -> ConvSpec:
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    return ConvSpec(n, c, h, wd, k, r, s, tuple(stride), tuple(pad4), tuple(dilation), groups)


# ----------------------------------------------------------------------------------------------------------
# The ops. Geometry arrives normalised: 4-D tensors, stride/dilation pairs, four-sided padding.
# ----------------------------------------------------------------------------------------------------------
@torch.library.custom_op("cuconv::conv2d", mutates_args=())
def _conv2d_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: List[int],
               padding: List[int], dilation: List[int], groups: int, algo: str,
               precision: str) -> torch.Tensor:
    spec = _spec(x, weight, stride, padding, dilation, groups)
    out = torch.empty(spec.output_shape, dtype=x.dtype, device=x.device)
    with _bridge.on_torch_stream(x.device):
        b = None if bias is None else _bridge.as_array(bias)
        forward_spec(_bridge.as_array(x), _bridge.as_array(weight), b, spec, _bridge.as_array(out), algo,
                     precision)
    return out


@_conv2d_op.register_fake
def _(x, weight, bias, stride, padding, dilation, groups, algo, precision):
    p = output_size(x.shape[2], weight.shape[2], stride[0], padding[0], padding[1], dilation[0])
    q = output_size(x.shape[3], weight.shape[3], stride[1], padding[2], padding[3], dilation[1])
    return x.new_empty((x.shape[0], weight.shape[0], p, q))


@torch.library.custom_op("cuconv::conv2d_input", mutates_args=())
def _conv2d_input_op(input_size: List[int], weight: torch.Tensor, grad_output: torch.Tensor,
                     stride: List[int], padding: List[int], dilation: List[int], groups: int, algo: str,
                     precision: str) -> torch.Tensor:
    x_meta = torch.empty(input_size, device="meta")
    spec = _spec(x_meta, weight, stride, padding, dilation, groups)
    with _bridge.on_torch_stream(grad_output.device):
        dx = _backward.dgrad_spec(_bridge.as_array(weight), _bridge.as_array(grad_output), spec, algo,
                                  precision)
        return _to_tensor(dx, grad_output)


@_conv2d_input_op.register_fake
def _(input_size, weight, grad_output, stride, padding, dilation, groups, algo, precision):
    return grad_output.new_empty(input_size)


@torch.library.custom_op("cuconv::conv2d_weight", mutates_args=())
def _conv2d_weight_op(x: torch.Tensor, weight_size: List[int], grad_output: torch.Tensor,
                      stride: List[int], padding: List[int], dilation: List[int], groups: int, algo: str,
                      precision: str) -> torch.Tensor:
    w_meta = torch.empty(weight_size, device="meta")
    spec = _spec(x, w_meta, stride, padding, dilation, groups)
    with _bridge.on_torch_stream(x.device):
        dw = _backward.wgrad_spec(_bridge.as_array(x), _bridge.as_array(grad_output), spec, algo, precision)
        return _to_tensor(dw, x)


@_conv2d_weight_op.register_fake
def _(x, weight_size, grad_output, stride, padding, dilation, groups, algo, precision):
    return x.new_empty(weight_size)


@torch.library.custom_op("cuconv::conv2d_bias_grad", mutates_args=())
def _bias_grad_op(grad_output: torch.Tensor) -> torch.Tensor:
    """Σ over (N, P, Q) of grad_output, accumulated in fp32 for half precisions."""
    with _bridge.on_torch_stream(grad_output.device):
        dy = _bridge.as_array(grad_output)
        acc = "float32" if dy.dtype.itemsize == 2 else dy.dtype
        db = dy.sum(axis=(0, 2, 3), dtype=acc).astype(dy.dtype)
        return _to_tensor(db, grad_output)


@_bias_grad_op.register_fake
def _(grad_output):
    return grad_output.new_empty((grad_output.shape[1],))


def _to_tensor(a, like: torch.Tensor) -> torch.Tensor:
    """An array produced inside ``on_torch_stream`` back as a tensor (zero-copy on the GPU)."""
    if like.is_cuda:
        if like.dtype == torch.bfloat16:
            return torch.from_dlpack(a.view("int16")).view(torch.bfloat16)
        return torch.from_dlpack(a)
    if like.dtype == torch.bfloat16:
        return torch.from_numpy(a.view("int16")).view(torch.bfloat16)
    return torch.from_numpy(a)


def _setup_context(ctx, inputs, output):
    x, weight, bias, stride, padding, dilation, groups, algo, precision = inputs
    ctx.save_for_backward(x, weight)
    ctx.geometry = (stride, padding, dilation, groups, algo, precision)


def _backward_geometry(geometry, pass_: str):
    """The forward's geometry and algo for a backward pass; ``auto`` if that algo has no such pass."""
    stride, padding, dilation, groups, algo, precision = geometry
    if algo != "auto" and algo not in algorithms(pass_):
        algo = "auto"
    return stride, padding, dilation, groups, algo, precision


def _backward_formula(ctx, grad_output):
    x, weight = ctx.saved_tensors
    grad_output = grad_output.contiguous()
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


# ----------------------------------------------------------------------------------------------------------
# The public function: torch's argument checks and wording, then the op.
# ----------------------------------------------------------------------------------------------------------
def conv2d(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, stride=1,
           padding=0, dilation=1, groups=1, *, algo: str = "auto") -> torch.Tensor:
    """``torch.nn.functional.conv2d`` computed by cuconv, with autograd.

    Same signature and semantics as torch's (``padding`` may be ``"same"``/``"valid"``), plus ``algo``.
    float32 follows torch's TF32 switch for convolutions (``torch.backends.cudnn.allow_tf32`` and, where
    torch has it, ``torch.backends.cudnn.conv.fp32_precision``), exactly as ``torch.nn.Conv2d`` would.
    CUDA tensors run on their device and torch's current stream; CPU tensors on cuconv's CPU path.

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
    for name, t in (("input", input), ("weight", weight), ("bias", bias)):
        if not isinstance(t, torch.Tensor) and not (name == "bias" and t is None):
            raise TypeError(f"conv2d(): argument '{name}' must be Tensor, not {type(t).__name__}")
    if not isinstance(algo, str):
        raise TypeError(f"conv2d(): argument 'algo' must be str, not {type(algo).__name__}")
    if input.dim() not in (3, 4):
        raise ValueError(f"Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of "
                         f"size: {list(input.shape)}")
    if weight.dim() != 4:
        raise ValueError(f"Expected 4D weight (out_channels, in_channels/groups, kH, kW) for conv2d, but got "
                         f"weight of size: {list(weight.shape)}")
    if input.dtype not in _TORCH_DTYPES:
        raise TypeError(f"cuconv: input dtype {input.dtype} is not supported; expected one of "
                        f"{', '.join(map(str, _TORCH_DTYPES))}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != input.dtype:
            raise TypeError(f"Input type ({input.dtype}) and {name} type ({t.dtype}) should be the same")
        if t is not None and t.device != input.device:
            raise ValueError(f"Expected all tensors to be on the same device, but found input on "
                             f"{input.device} and {name} on {t.device}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != weight.shape[0]):
        raise ValueError(f"Given weight of size {list(weight.shape)}, expected bias to be 1-dimensional with "
                         f"{weight.shape[0]} elements, but got bias of size {list(bias.shape)} instead")
    if algo != "auto" and algo not in algorithms():
        raise ValueError(f"cuconv: unknown algo {algo!r}; expected 'auto' or one of {algorithms()}")
    if torch.is_autocast_enabled(input.device.type):
        # autocast casts convolutions to its lower precision, as it does for torch.nn.Conv2d
        low = torch.get_autocast_dtype(input.device.type)
        input, weight = input.to(low), weight.to(low)
        bias = None if bias is None else bias.to(low)
    unbatched = input.dim() == 3
    x = input.unsqueeze(0) if unbatched else input
    spec = ConvSpec.from_args(x.shape, weight.shape, stride, padding, dilation, groups)
    y = torch.ops.cuconv.conv2d(x, weight, bias, list(spec.stride), list(spec.pad), list(spec.dilation),
                                spec.groups, algo, torch_precision())
    return y.squeeze(0) if unbatched else y
