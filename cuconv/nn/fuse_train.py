"""A fused block in train mode: convolution -> BatchNorm2d on the batch's statistics -> [residual] -> activation ->
[residual] as one autograd node (``conv_bn_train``).

Forward: the convolution (cuconv's layer, as ``cuconv.nn.functional.conv2d`` runs it), then torch's own BatchNorm
kernel (``native_batch_norm``: the batch's mean and 1/std, the running statistics updated in place as the module's
forward updates them, the normalisation and affine), the residual and the activation. Saved: the convolution's input,
weight and output, the mean and 1/std, the residual; the activation's input is recomputed in the backward from the
convolution's output (the BatchNorm's output and the activation's input, two tensors the size of the output, are not
kept per block).

Backward: the activation's derivative at the recomputed input (torch's own, through autograd on that one
expression), BatchNorm's backward (torch's kernel: its two per-channel sums and the elementwise dy), then the
convolution's dgrad and wgrad (cuconv's, as its eager backward runs them). A backward that records a graph
(``create_graph=True``: a gradient penalty) recomputes the block from its saved inputs as torch's differentiable
operations instead, so every higher derivative is torch's.

On CUDA (float32 and the half types, BatchNorm's parameters and statistics float32) the BatchNorm and the epilogue
are cuconv's kernels instead (``blocks/batch_norm``): forward, the statistics' sums by chunks of rows, a finalize
(mean, 1/std, the running update, the scale and shift of each channel) and one pass for the normalisation, the
residual and the activation in fp32 rounded once; backward, the activation's derivative and BatchNorm's two sums in
one pass over dz and y (a residual before the activation takes its gradient from it), a finalize, and the dy pass.
Saved there: the input, weight, y, the residual, four floats a channel. float64 on CUDA takes torch's kernel.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import functional as F

__all__ = ["conv_bn_train", "BlockArgs"]

_nnF = torch.nn.functional


class BlockArgs:
    """What one call of a training block needs besides its tensors: the convolution's layer, BatchNorm's ``eps`` and
    the factor of this batch in its running statistics (``momentum``; None: not updated), the statistics to update
    (or None), the activation (and leaky_relu's slope) and where a residual is added ("before" or "after" the
    activation; None: none). The geometry for a recomputed backward: ``conv`` (stride, padding, dilation, groups,
    algo)."""

    __slots__ = ("layer", "eps", "momentum", "running_mean", "running_var", "activation", "slope", "position",
                 "conv", "kernels", "cumulative", "num_batches_tracked")

    def __init__(self, layer, eps: float, momentum: Optional[float], running_mean, running_var, activation, slope,
                 position, conv: tuple, kernels: bool = False, cumulative: bool = False, num_batches_tracked=None):
        self.layer, self.eps, self.momentum = layer, float(eps), momentum
        self.running_mean, self.running_var = running_mean, running_var
        self.activation, self.slope, self.position, self.conv = activation, float(slope), position, conv
        # (cuconv's kernels on CUDA: ``batch_norm``'s; ``cumulative``: torch's momentum=None, the factor
        # 1/num_batches_tracked read on the device from ``num_batches_tracked``)
        self.kernels, self.cumulative, self.num_batches_tracked = kernels, cumulative, num_batches_tracked


def _activate(pre: torch.Tensor, activation, slope: float) -> torch.Tensor:
    from .fuse import _apply_activation  # (fuse imports this module)

    return _apply_activation(pre, activation, slope)


def _per_channel(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(1, -1, 1, 1)


class _ConvBNTrain(torch.autograd.Function):
    """out = epilogue(γ·(y - μ)/σ + β) with y = conv(x, w) + b and (μ, σ²) y's per-channel batch statistics."""

    @staticmethod
    def forward(ctx, x, w, b, gamma, beta, residual, args: BlockArgs):
        y = F._run_layer(args.layer, x, w, b)
        if args.kernels:
            if y.device.index != torch.cuda.current_device():  # (launches prepared and enqueued on y's device)
                with torch.cuda.device(y.device):
                    return _forward_kernels(ctx, x, w, b, gamma, beta, residual, args, y)
            return _forward_kernels(ctx, x, w, b, gamma, beta, residual, args, y)
        # (torch's own BatchNorm kernel for the statistics, the running ones' update and the normalisation: the
        # numbers of the unfused graph, in one pass over y less than its kernel and two elementwise calls)
        u, mean, invstd = torch.native_batch_norm(y, gamma, beta, args.running_mean, args.running_var, True,
                                                  0.0 if args.momentum is None else args.momentum, args.eps)
        pre = u + residual if args.position == "before" else u
        out = _activate(pre, args.activation, args.slope)
        if args.position == "after":
            out = out + residual
        ctx.args = args
        ctx.res_dtype = None if residual is None else residual.dtype
        ctx.save_for_backward(x, w, b, gamma, beta, residual, y, mean, invstd)
        return out

    @staticmethod
    def backward(ctx, dout):
        x, w, b, gamma, beta, residual, y, mean, invstd = ctx.saved_tensors[:9]
        args = ctx.args
        need_x, need_w, need_b, need_g, need_beta, need_res, _ = ctx.needs_input_grad
        if torch.is_grad_enabled():
            return _recomputed_backward(ctx, dout, x, w, b, gamma, beta, residual)
        if args.kernels:
            if y.device.index != torch.cuda.current_device():
                with torch.cuda.device(y.device):
                    return _backward_kernels(ctx, dout, x, w, gamma, beta, residual, y, mean, invstd)
            return _backward_kernels(ctx, dout, x, w, gamma, beta, residual, y, mean, invstd)
        d_res = dout if args.position == "after" and need_res else None
        if args.activation is None:
            d_pre = dout
        else:  # (the activation's input recomputed from y and the statistics: one expression, torch's derivative)
            scale = invstd if gamma is None else invstd * gamma.to(invstd.dtype)
            shift = -mean * scale if beta is None else beta.to(invstd.dtype) - mean * scale
            u = torch.addcmul(_per_channel(shift), y, _per_channel(scale)).to(y.dtype)
            with torch.enable_grad():
                pre = (u + residual if args.position == "before" else u).detach().requires_grad_()
                d_pre, = torch.autograd.grad(_activate(pre, args.activation, args.slope), pre, dout)
        if args.position == "before" and need_res:
            d_res = d_pre
        if d_res is not None and d_res.dtype != ctx.res_dtype:
            d_res = d_res.to(ctx.res_dtype)
        need_y = need_x or need_w or need_b
        d_y, d_gamma, d_beta = torch.ops.aten.native_batch_norm_backward(
            d_pre.to(y.dtype), y, gamma, None, None, mean, invstd, True, args.eps,
            [need_y, need_g and gamma is not None, need_beta and beta is not None])
        dx = dw = db = None
        if need_y:
            dx, dw, db = args.layer.backward(d_y, x if need_w else None, w if need_x else None, need_x, need_w,
                                             need_b, True)
        return dx, dw, db, d_gamma if need_g else None, d_beta if need_beta else None, d_res, None


_RES_CODES = {None: 0, "before": 1, "after": 2}


def _layout_of(y: torch.Tensor):
    """(channels_last, y dense in that layout): NCHW where y is contiguous (a 1×1 plane is both), else channels-last."""
    if y.is_contiguous():
        return False, y
    if y.is_contiguous(memory_format=torch.channels_last):
        return True, y
    return False, y.contiguous()


def _like(t: torch.Tensor, channels_last: bool, dtype=None) -> torch.Tensor:
    """``t`` dense in the layout of the block's y (and of ``dtype``): itself where it already is."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    return t if t.is_contiguous(memory_format=fmt) else t.contiguous(memory_format=fmt)


def _launches(args: BlockArgs, y: torch.Tensor, channels_last: bool):
    from ..blocks import batch_norm

    n, c, h, w = y.shape
    return batch_norm.launches(batch_norm_dtype(y.dtype), channels_last, n, c, h * w, args.activation,
                               _RES_CODES[args.position], args.slope, args.eps,
                               None if args.cumulative else (0.0 if args.momentum is None else args.momentum))



def batch_norm_dtype(dtype: torch.dtype):
    """The NumPy dtype the kernels name for a torch dtype (None: none of theirs)."""
    from .. import _dtypes

    return _dtypes.by_name(str(dtype).rsplit(".", 1)[-1])


def _ptr(t) -> int:
    return 0 if t is None else t.data_ptr()


def _forward_kernels(ctx, x, w, b, gamma, beta, residual, args: BlockArgs, y):
    """The forward's statistics, running update and epilogue as ``batch_norm``'s three kernels on y's stream."""
    channels_last, y = _layout_of(y)
    launches = _launches(args, y, channels_last)
    c = y.shape[1]
    res = None if residual is None else _like(residual, channels_last, y.dtype)
    parts = torch.empty((2, launches.chunks, c), dtype=torch.float32, device=y.device)
    stats = torch.empty((4, c), dtype=torch.float32, device=y.device)  # (mean, invstd, scale, shift)
    out = torch.empty_like(y)
    stream = torch.cuda.current_stream(y.device).cuda_stream
    launches.stats(stream, y.data_ptr(), parts[0].data_ptr(), parts[1].data_ptr())
    update = args.running_mean is not None
    launches.finalize(stream, parts[0].data_ptr(), parts[1].data_ptr(), y.data_ptr(), _ptr(gamma), _ptr(beta),
                      _ptr(args.running_mean) if update else 0, _ptr(args.running_var) if update else 0,
                      _ptr(args.num_batches_tracked), stats[0].data_ptr(), stats[1].data_ptr(), stats[2].data_ptr(),
                      stats[3].data_ptr())
    launches.apply(stream, y.data_ptr(), _ptr(res), stats[2].data_ptr(), stats[3].data_ptr(), out.data_ptr())
    ctx.args, ctx.channels_last = args, channels_last
    ctx.res_dtype = None if residual is None else residual.dtype
    # (the residual as given, not its copy in y's layout: a recomputed backward differentiates through it)
    ctx.save_for_backward(x, w, b, gamma, beta, residual, y, stats[0], stats[1], stats)
    return out


def _backward_kernels(ctx, dout, x, w, gamma, beta, residual, y, mean, invstd):
    """The backward's activation and BatchNorm as ``batch_norm``'s three kernels, then the convolution's passes."""
    args, channels_last = ctx.args, ctx.channels_last
    stats = ctx.saved_tensors[-1]
    res = None if residual is None else _like(residual, channels_last, y.dtype)
    need_x, need_w, need_b, need_g, need_beta, need_res, _ = ctx.needs_input_grad
    launches = _launches(args, y, channels_last)
    c = y.shape[1]
    dz = _like(dout, channels_last, y.dtype)
    parts = torch.empty((2, launches.chunks, c), dtype=torch.float32, device=y.device)
    sums = torch.empty((4, c), dtype=torch.float32, device=y.device)  # (dβ, dγ, Σd/M, Σd·x̂/M)
    d_res = torch.empty_like(y) if args.position == "before" and need_res else None
    stream = torch.cuda.current_stream(y.device).cuda_stream
    scale, shift = stats[2], stats[3]
    launches.backward_sums(stream, dz.data_ptr(), y.data_ptr(), _ptr(res), scale.data_ptr(), shift.data_ptr(),
                           mean.data_ptr(), invstd.data_ptr(), parts[0].data_ptr(), parts[1].data_ptr(), _ptr(d_res))
    launches.backward_finalize(stream, parts[0].data_ptr(), parts[1].data_ptr(), sums[0].data_ptr(),
                               sums[1].data_ptr(), sums[2].data_ptr(), sums[3].data_ptr())
    dx = dw = db = None
    if need_x or need_w or need_b:
        dy = torch.empty_like(y)
        launches.backward_dy(stream, dz.data_ptr(), y.data_ptr(), _ptr(res), scale.data_ptr(), shift.data_ptr(),
                             mean.data_ptr(), invstd.data_ptr(), sums[2].data_ptr(), sums[3].data_ptr(),
                             dy.data_ptr())
        dx, dw, db = args.layer.backward(dy, x if need_w else None, w if need_x else None, need_x, need_w, need_b,
                                         True)
    if args.position == "after" and need_res:
        d_res = dout
    if d_res is not None and d_res.dtype != ctx.res_dtype:
        d_res = d_res.to(ctx.res_dtype)
    d_gamma = sums[1].clone() if need_g and gamma is not None else None
    d_beta = sums[0].clone() if need_beta and beta is not None else None
    return dx, dw, db, d_gamma, d_beta, d_res, None


def _recomputed_backward(ctx, dout, x, w, b, gamma, beta, residual):
    """The block's gradients as torch's differentiable operations on its saved inputs (``create_graph=True``):
    the convolution (cuconv's, whose backward ops have formulas of their own) and BatchNorm on the batch's
    statistics, recomputed, then ``autograd.grad`` with a graph, so every higher derivative is torch's."""
    args = ctx.args
    stride, padding, dilation, groups, algo = args.conv
    with torch.enable_grad():
        # (views: a residual that is the input itself, as a ResNet's identity is, must take the gradient of its own
        # use, not the sum of both that autograd.grad gives a tensor named twice)
        inputs = tuple(t if t is None else t.view_as(t) for t in (x, w, b, gamma, beta, residual))
        x, w, b, gamma, beta, residual = inputs
        y = F.conv2d(x, w, b, stride, padding, dilation, groups, algo=algo)
        u = _nnF.batch_norm(y, None, None, gamma, beta, True, 0.0, args.eps)
        pre = u + residual if args.position == "before" else u
        out = _activate(pre, args.activation, args.slope)
        if args.position == "after":
            out = out + residual
        wanted = [t for t, need in zip(inputs, ctx.needs_input_grad) if need]
        grads = iter(torch.autograd.grad(out, wanted, dout, create_graph=True, allow_unused=True))
    return tuple(next(grads) if need else None for need in ctx.needs_input_grad[:6]) + (None,)


def conv_bn_train(x, w, b, gamma, beta, residual, args: BlockArgs) -> torch.Tensor:
    """The block's output, one autograd node; updates ``args``' running statistics in place."""
    return _ConvBNTrain.apply(x, w, b, gamma, beta, residual, args)
