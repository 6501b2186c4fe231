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

FusedConv2d takes this node for CPU tensors in eager mode; on CUDA a train-mode block runs link by link (cuDNN's
BatchNorm among them) until the statistics and the normalisation are kernels of cuconv's, in its epilogues.
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
                 "conv")

    def __init__(self, layer, eps: float, momentum: Optional[float], running_mean, running_var, activation, slope,
                 position, conv: tuple):
        self.layer, self.eps, self.momentum = layer, float(eps), momentum
        self.running_mean, self.running_var = running_mean, running_var
        self.activation, self.slope, self.position, self.conv = activation, float(slope), position, conv


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
        x, w, b, gamma, beta, residual, y, mean, invstd = ctx.saved_tensors
        args = ctx.args
        need_x, need_w, need_b, need_g, need_beta, need_res, _ = ctx.needs_input_grad
        if torch.is_grad_enabled():
            return _recomputed_backward(ctx, dout, x, w, b, gamma, beta, residual)
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
