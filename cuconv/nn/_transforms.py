"""The convolution and its gradients as autograd Functions in the form ``torch.func``'s transforms take them:
``setup_context``, ``jvp`` and a ``vmap`` rule each, every derivative again one of them, so that ``grad``, ``vmap``,
``jvp``, ``jacfwd``, ``jacrev``, ``hessian`` and their compositions (per-sample gradients: ``vmap(grad(...))``) work
to any order. ``functional._run_layer`` takes this path while a transform is active; outside one the lighter
``functional._Conv2d`` runs.

``Conv2dT(x, w, b, layer)`` is ``layer``'s forward; ``GradT(x, w, dy, layer, which)`` one of its backward passes:
``"x"`` dx = dgrad(w, dy), ``"w"`` dW = wgrad(x, dy), ``"b"`` db = Σ dy. Each is linear in each tensor, so its
derivatives are these passes again: with dx = dgrad(w, dy), <g, dx> = <conv2d(g, w), dy>, so d/d(dy) =
conv2d(g, w) and d/dw = wgrad(g, dy); with dW = wgrad(x, dy), d/d(dy) = conv2d(x, g) and d/dx = dgrad(g, dy).

The vmap rules: a forward over a batch of inputs alone folds that batch into the convolution's (one call of a
layer of B·N samples, through ``functional.conv2d``: shapes and layers are that function's); anything else (a batch
of weights, of grad_outputs, of several operands) runs the pass once per batch entry and stacks the results.
"""

from __future__ import annotations

import torch


def _formatted(layer, x, w, b):
    """x, w and b laid out as ``layer``'s plans read them (as ``functional._run_layer`` lays them out)."""
    if x is not None:
        if layer.x_format is not None:
            x = x.contiguous(memory_format=layer.x_format)
        elif not layer.channels_last:
            x = x.contiguous()
    if w is not None:
        w = w.contiguous(memory_format=layer.w_format) if layer.w_format is not None else w.contiguous()
    return x, w, None if b is None else b.contiguous()


def _add(a, b):
    return b if a is None else a if b is None else a + b


def _no_bias(layer, like):
    """The bias argument of a convolution through ``layer`` that adds none: None, or zeros where the layer's plans
    were made for a bias (they read its pointer)."""
    return torch.zeros(layer.spec.k, dtype=like.dtype, device=like.device) if layer.bias else None


def _zeros_of(layer, which: str, like):
    """A zero result of ``GradT``'s pass ``which`` (a tangent none of whose inputs' tangents reaches it)."""
    spec = layer.spec
    shape = {"x": layer.x_shape, "w": spec.weight_shape, "b": (spec.k,)}[which]
    return torch.zeros(shape, dtype=like.dtype, device=like.device)


def _loop(fn, info, in_dims, args) -> tuple:
    """A vmap rule by a loop: ``fn`` on each batch entry of ``args`` (their batch dimensions ``in_dims``; None: the
    same argument for every entry), the results stacked along dimension 0."""
    results = []
    for i in range(info.batch_size):
        results.append(fn(*(a.select(d, i) if d is not None else a for a, d in zip(args, in_dims))))
    return torch.stack(results), 0


class Conv2dT(torch.autograd.Function):
    """y = conv2d(x, w) + b through ``layer`` (see the module's docstring)."""

    @staticmethod
    def forward(x, w, b, layer):
        x, w, b = _formatted(layer, x, w, b)
        return layer.forward(x, w, b, True)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, _, layer = inputs
        ctx.layer = layer
        ctx.save_for_backward(x, w)
        ctx.save_for_forward(x, w)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        need_x, need_w, need_b, _ = ctx.needs_input_grad
        layer = ctx.layer
        return (GradT.apply(x, w, g, layer, "x") if need_x else None,
                GradT.apply(x, w, g, layer, "w") if need_w else None,
                GradT.apply(x, w, g, layer, "b") if need_b else None, None)

    @staticmethod
    def jvp(ctx, x_t, w_t, b_t, _):
        x, w = ctx.saved_tensors
        layer = ctx.layer
        y_t = None
        if x_t is not None:
            y_t = Conv2dT.apply(x_t, w, _no_bias(layer, x), layer)
        if w_t is not None:
            y_t = _add(y_t, Conv2dT.apply(x, w_t, _no_bias(layer, x), layer))
        if b_t is not None:
            shape = (-1, 1, 1) if len(layer.x_shape) == 3 else (1, -1, 1, 1)
            y_t = _add(y_t, b_t.reshape(shape).expand(layer.out_shape))
        return y_t if y_t is not None else torch.zeros(layer.out_shape, dtype=x.dtype, device=x.device)

    @staticmethod
    def vmap(info, in_dims, x, w, b, layer):
        x_dim, w_dim, b_dim, _ = in_dims
        if x_dim is not None and w_dim is None and b_dim is None and len(layer.x_shape) == 4:
            folded = _folded_forward(x.movedim(x_dim, 0), w, b, layer)
            if folded is not None:
                return folded, 0
        return _loop(lambda x_, w_, b_: Conv2dT.apply(x_, w_, b_, layer), info, in_dims[:3], (x, w, b))


def _folded_forward(x, w, b, layer):
    """The forward of a batch (B, N, C, H, W) of inputs as one of B·N samples (``functional.conv2d``), or None
    where the layer's padding is not one torch's arguments can give (four-sided)."""
    from . import functional

    spec = layer.spec
    top, bottom, left, right = spec.pad
    if top != bottom or left != right:
        return None
    batch = x.shape[0]
    y = functional.conv2d(x.reshape((-1,) + tuple(x.shape[2:])), w, b, spec.stride, (top, left), spec.dilation,
                          spec.groups, algo=layer.algo)
    return y.reshape((batch, -1) + tuple(y.shape[1:]))


class GradT(torch.autograd.Function):
    """One backward pass of ``layer`` (``which``: "x", "w" or "b"; see the module's docstring)."""

    @staticmethod
    def forward(x, w, dy, layer, which):
        need = (which == "x", which == "w", which == "b")
        x, w, _ = _formatted(layer, x if need[1] else None, w if need[0] else None, None)
        return layer.backward(dy, x, w, *need, True)[need.index(True)]

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, dy, layer, which = inputs
        ctx.layer, ctx.which, ctx.dy_shape = layer, which, tuple(dy.shape)
        ctx.save_for_backward(x, w, dy)
        ctx.save_for_forward(x, w, dy)

    @staticmethod
    def backward(ctx, g):
        x, w, dy = ctx.saved_tensors
        need_x, need_w, need_dy = ctx.needs_input_grad[:3]
        layer, which = ctx.layer, ctx.which
        d_x = d_w = d_dy = None
        if which == "x":  # dx = dgrad(w, dy)
            d_w = GradT.apply(g, w, dy, layer, "w") if need_w else None
            d_dy = Conv2dT.apply(g, w, _no_bias(layer, g), layer) if need_dy else None
        elif which == "w":  # dW = wgrad(x, dy)
            d_x = GradT.apply(x, g, dy, layer, "x") if need_x else None
            d_dy = Conv2dT.apply(x, g, _no_bias(layer, g), layer) if need_dy else None
        elif need_dy:  # db = Σ dy over all but the channels
            shape = (-1, 1, 1) if len(ctx.dy_shape) == 3 else (1, -1, 1, 1)
            d_dy = g.reshape(shape).expand(ctx.dy_shape)
        return d_x, d_w, d_dy, None, None

    @staticmethod
    def jvp(ctx, x_t, w_t, dy_t, _, __):
        x, w, dy = ctx.saved_tensors
        layer, which = ctx.layer, ctx.which
        out = None
        if which == "x":
            if w_t is not None:
                out = GradT.apply(x, w_t, dy, layer, "x")
            if dy_t is not None:
                out = _add(out, GradT.apply(x, w, dy_t, layer, "x"))
        elif which == "w":
            if x_t is not None:
                out = GradT.apply(x_t, w, dy, layer, "w")
            if dy_t is not None:
                out = _add(out, GradT.apply(x, w, dy_t, layer, "w"))
        elif dy_t is not None:
            out = GradT.apply(x, w, dy_t, layer, "b")
        return out if out is not None else _zeros_of(layer, which, dy)

    @staticmethod
    def vmap(info, in_dims, x, w, dy, layer, which):
        return _loop(lambda x_, w_, dy_: GradT.apply(x_, w_, dy_, layer, which), info, in_dims[:3], (x, w, dy))
