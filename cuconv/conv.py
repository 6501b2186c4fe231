"""``cuconv.conv2d``: the public forward entry point on NumPy (CPU) and CuPy (GPU) arrays.

Arguments are checked here, once, in PyTorch's wording and before any kernel runs; the geometry becomes a
:class:`~cuconv.spec.ConvSpec` and the chosen algorithm gets contiguous arrays of one backend.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy

from ._types import Array, IntOrPair, Padding
from . import _backend, _layout, _plan, algos as _algos, dispatch, select as _select
from .blocks import epilogue
from .checks import check_arrays, check_out, check_residual, epilogue_of, resolve_precision
from .cpu import reference
from .select import autotune
from ._config import config
from .dispatch import call_key, empty_nhwc, nhwc_operand, nhwc_view
from .problem import BIAS, PLAIN, Epilogue, Problem
from .spec import ConvSpec

__all__ = ["conv2d"]


def conv2d(x: Array, weight: Array, bias: Optional[Array] = None, stride: IntOrPair = 1, padding: Padding = 0,
           dilation: IntOrPair = 1, groups: int = 1, *, algo: str = "auto", precision: Optional[str] = None,
           out: Optional[Array] = None, activation: Optional[str] = None, negative_slope: float = 0.01,
           residual: Optional[Array] = None, residual_position: str = "before") -> Array:
    """2-D convolution (cross-correlation) with the semantics of ``torch.nn.functional.conv2d``, optionally
    followed by an activation and a residual add (the epilogue of a fused block).

    Parameters
    ----------
    x : numpy.ndarray or cupy.ndarray
        Input ``(N, C, H, W)`` or unbatched ``(C, H, W)``; float16, float32, float64 (bfloat16 where
        ``ml_dtypes`` is installed). CuPy arrays run on their GPU, NumPy arrays on the CPU.
    weight : array of the same library and dtype
        ``(K, C / groups, R, S)``.
    bias : array, optional
        ``(K,)``.
    stride, dilation : int or (int, int)
    padding : int, (int, int), ``"same"`` or ``"valid"``
        ``"same"`` pads ``total // 2`` before and the rest after on each axis, as torch does.
    groups : int
        ``C`` and ``K`` must both be divisible by it.
    algo : str
        ``"auto"`` or one of :func:`cuconv.algos`.
    precision : None, ``"ieee"`` or ``"tf32"``
        float32 arithmetic; ``None`` takes ``cuconv.config.precision``. Other dtypes ignore it.
    out : array, optional
        Preallocated result of the output's shape and dtype, written in place and returned.
    activation : None or str
        Applied to the convolution plus bias: ``"relu"``, ``"relu6"``, ``"leaky_relu"`` (slope
        ``negative_slope``), ``"silu"``, ``"gelu"``, ``"gelu_tanh"`` (GELU's tanh approximation), ``"hardswish"``,
        ``"hardsigmoid"`` or ``"sigmoid"``, each torch's formula.
    residual : array, optional
        Added to the result, of its shape, dtype, library and device: before the activation
        (``residual_position="before"``: ResNet's ``relu(conv(x) + identity)``) or after it (``"after"``).
        The epilogue is computed in float32 (float64 for float64) and rounded once.

    Returns
    -------
    array of the input's library and dtype
        ``(N, K, P, Q)`` (or ``(K, P, Q)`` for unbatched input) with
        ``P = (H + pad_h - dilation_h·(R-1) - 1) // stride_h + 1`` and likewise ``Q``.

    Raises
    ------
    TypeError
        Non-array arguments, unsupported or mismatched dtypes, mixing NumPy and CuPy.
    ValueError
        Wrong ranks or shapes, bad stride/padding/dilation/groups, an empty output, arrays on
        different GPUs, ``out`` of the wrong shape.
    NotImplementedError
        A forced ``algo`` that cannot serve this convolution.

    Examples
    --------
    >>> import numpy as np, cuconv
    >>> x = np.random.default_rng(0).standard_normal((1, 2, 5, 6))
    >>> w = np.random.default_rng(1).standard_normal((4, 2, 3, 3))
    >>> cuconv.conv2d(x, w, padding=(1, 0), stride=(2, 1)).shape
    (1, 4, 3, 4)
    """
    ep = None  # the epilogue (an Epilogue, its bias flag included) where one is asked for, its arguments checked
    if activation is not None or residual is not None:
        ep = epilogue_of(bias is not None, activation, negative_slope, residual is not None, residual_position)
    settings = config.settings()  # (the one read of the configuration: passed down from here)
    operands = _operands(x, weight, bias, out, residual)
    key = (call_key(operands, stride, padding, dilation, groups, algo,
                    (precision, settings.precision, settings.workspace_limit, ep))
           if operands is not None and (precision is None or type(precision) is str) else None)
    plan = _plans.get(key) if key is not None else None
    if plan is not None:  # a GPU call whose signature was checked before: nothing to check or choose again
        return _run(_backend.cupy_or_none(), plan, x[None] if plan.unbatched else x, weight, bias, out, algo,
                    settings, residual)
    kind = check_arrays(x, weight, bias, out)
    if kind == "cupy":
        import cupy

        if x.data.device_id != cupy.cuda.runtime.getDevice():  # choose and run on the input's device
            with x.device:
                return conv2d(x, weight, bias, stride, padding, dilation, groups, algo=algo, precision=precision,
                              out=out, activation=activation, negative_slope=negative_slope, residual=residual,
                              residual_position=residual_position)
    unbatched = x.ndim == 3
    if unbatched:
        x = x[None]
    spec = ConvSpec.from_args(x.shape, weight.shape, stride, padding, dilation, groups)
    precision = resolve_precision(precision, settings.precision)
    workspace_limit = settings.workspace_limit
    on_gpu = kind == "cupy"
    # torch's rule for the result's memory format: channels-last where the input or the weight is; on the GPU
    # computed so in place where an algorithm serves channels-last activations for this call's ``algo``
    channels_last = _layout.result_channels_last(x, weight, on_gpu)
    name = (_select.select_nhwc(algo, spec, x.dtype, precision, "fprop", workspace_limit, ep)
            if channels_last and on_gpu else None)
    layout = "nchw" if name is None else "nhwc"
    if name is None:
        name = _select.resolve(algo, spec, x.dtype, precision, on_gpu, "fprop", workspace_limit, ep)
    result_shape = spec.output_shape[1:] if unbatched else spec.output_shape
    if out is not None:
        check_out(out, result_shape, x.dtype)
    if residual is not None:
        check_residual(residual, result_shape, x)
    if not on_gpu:
        return _run(numpy, _Plan(spec, name, precision, result_shape, unbatched, channels_last=channels_last,
                                 epilogue=ep), x, weight, bias, out, algo, settings, residual)
    env = _plan.env(x.data.device_id, workspace_limit)
    # (a dense channels-last weight is read where it lies by the channels-last plans that take one, as the torch
    # door reads it: a C-contiguous copy of it each call was a launch and the weight's bytes twice more)
    weights = "krsc" if layout == "nhwc" and _layout.only_channels_last(weight) and _algos.takes_krsc(name) else "kcrs"
    plan = _Plan(spec, name, precision, result_shape, unbatched, env,
                 dispatch.prepare(name, "fprop", spec, x.dtype, precision, env, bias is not None, layout, weights,
                                  epilogue=ep),
                 channels_last, layout, ep, weights)
    if key is not None:
        if len(_plans) >= _PLANS_MAX:
            _plans.clear()
        _plans[key] = plan
    # (the input's device is current: above)
    return _run(_backend.cupy_or_none(), plan, x, weight, bias, out, algo, settings, residual)


def _same_layout(a, b) -> bool:
    """Whether ``a`` and ``b`` (one shape) lie alike in memory, densely (one elementwise pass serves both)."""
    return a.strides == b.strides and (a.flags.c_contiguous or _layout.dense_nhwc(a.shape, _layout.element_strides(a)
                                                                                   or ()))


def _like(xp, a, y):
    """``a`` in ``y``'s memory layout (itself where it already lies so)."""
    if _same_layout(a, y):
        return a
    if y.flags.c_contiguous:
        return xp.ascontiguousarray(a)
    return nhwc_view(xp, a) if a.ndim == 4 else xp.ascontiguousarray(a)


class _Plan(NamedTuple):
    """What checking a call's arguments decided; the same for every call of the same signature."""

    spec: ConvSpec
    name: str  # the algorithm; for "auto" the heuristic's choice (the benchmark setting may time another)
    precision: str  # resolved: never None
    result_shape: tuple  # spec.output_shape, without the batch axis for unbatched input
    unbatched: bool
    gpu_env: "_plan.Env" = None  # GPU calls: the environment of aligned operands on the input's device
    gpu: "_plan.Plan" = None     # ... and the algorithm's plan in it (with a bias where the signature has one)
    channels_last: bool = False  # the result channels-last (torch's rule: the input or the weight is)
    layout: str = "nchw"         # the activations as the plan reads and writes them ("nhwc": channels-last)
    epilogue: "Epilogue" = None  # an activation and a residual after the convolution (None: none)
    weights: str = "kcrs"        # the weight as the plan reads it ("krsc": dense channels-last, where it lies)



# A GPU call's signature (``dispatch.call_key`` of ``_operands``) -> its _Plan. The checks, the spec and the choice
# of algorithm cost as much host time as the launch they precede on a small layer; a layer called again skips them.
# Bounded: cleared when full, like ConvSpec's memo.
_plans: dict = {}
_PLANS_MAX = 4096


def _operands(x, weight, bias, out, residual=None):
    """What the signature of a call on CuPy arrays on the current device reads of its arrays (``call_key``'s
    operands: shapes, strides, dtypes, devices), None for any other call, which is checked in full. The strides
    decide the memory format of the result and of the computation. Only ``cupy.ndarray`` itself is admitted
    (subclasses are checked)."""
    cupy = _backend.cupy_or_none()
    if cupy is None:
        return None
    nd = cupy.ndarray
    if type(x) is not nd or type(weight) is not nd:
        return None
    device = x.data.device_id
    if device != cupy.cuda.runtime.getDevice() or weight.data.device_id != device:
        return None
    optional = []  # bias, out and residual: absent, or (shape, dtype, strides) of an array on the same device
    for a in (bias, out, residual):
        if a is None:
            optional.append(None)
        elif type(a) is nd and a.data.device_id == device:
            optional.append((a.shape, a.dtype, a.strides))
        else:
            return None
    return (device, x.shape, x.strides, x.dtype, weight.shape, weight.strides, weight.dtype, *optional)


def _run(xp, plan: _Plan, x, weight, bias, out, requested: str, settings, residual=None):
    """Run ``plan`` on 4-D ``x`` under ``settings`` (``_config.Settings``): into ``out`` (of the plan's result
    shape) when given, else a new array (channels-last where ``plan.channels_last``); ``residual``: the epilogue's
    (of the result's shape)."""
    spec = plan.spec
    nhwc = plan.layout == "nhwc"
    # Compute into `out` directly when it lies as the plan writes (C-contiguous, or dense channels-last for a
    # channels-last plan) and shares no memory with an operand (the kernels read the operands while they write:
    # an aliased out would feed them what they already wrote), else into a fresh array copied over at the end.
    direct = (out is not None
              and (_dense_nhwc_out(out, spec) and out.data.ptr % _layout.VECTOR_ALIGNMENT == 0 if nhwc
                   else out.flags.c_contiguous)
              and not _overlaps(xp, out, x, weight, bias, residual))
    if direct:  # a view costs host time (microseconds a call): built only when the shape differs
        y = out if out.shape == spec.output_shape else out.reshape(spec.output_shape)
    elif nhwc:
        y = empty_nhwc(xp, spec.output_shape, x.dtype)
    else:
        y = xp.empty(spec.output_shape, dtype=x.dtype)
    if y.size:
        if bias is not None:
            bias = xp.ascontiguousarray(bias)
        x = nhwc_operand(xp, x) if nhwc else xp.ascontiguousarray(x)
        weight = weight if plan.weights == "krsc" else xp.ascontiguousarray(weight)
        if residual is not None:  # (4-D, lying as y does: the epilogue is one pass over both)
            residual = _like(xp, residual if residual.ndim == 4 else residual[None], y)
        if xp is numpy:
            reference.forward(x, weight, bias, spec, y, numpy.matmul, settings.workspace_limit)
            ep = plan.epilogue
            if ep is not None:
                epilogue.apply_numpy(y, residual, ep.activation, ep.residual, ep.alpha, y)
        else:
            _run_gpu(plan, requested, x, weight, bias, y, settings, residual)
    if out is None:
        if plan.channels_last and not nhwc:  # (an NCHW computation of a channels-last result)
            y = nhwc_view(xp, y)
        return y if y.shape == plan.result_shape else y.reshape(plan.result_shape)
    if not direct:
        out[...] = y if y.shape == out.shape else y.reshape(out.shape)
    return out


def _dense_nhwc_out(out, spec: ConvSpec) -> bool:
    """Whether ``out`` (3-D for an unbatched call) is the output as a dense channels-last array."""
    strides = _layout.element_strides(out)
    if strides is None:
        return False
    if out.ndim == 3:
        shape, strides = spec.output_shape, (0,) + strides
    else:
        shape = tuple(out.shape)
    return _layout.dense_nhwc(shape, strides)


def _overlaps(xp, out, *operands) -> bool:
    """Whether ``out`` may share memory with an operand (NumPy's and CuPy's bounds check)."""
    return any(a is not None and xp.may_share_memory(out, a) for a in operands)


def _run_gpu(plan: _Plan, requested: str, x, weight, bias, y, settings, residual=None) -> None:
    """The forward on C-contiguous CuPy arrays: the plan kept for the signature where every pointer is
    aligned (``_plan.ALIGNMENT``) and nothing is tuned (``settings.benchmark``), else the plan (``dispatch``) of
    what runs."""
    name, precision, spec, ep = plan.name, plan.precision, plan.spec, plan.epilogue
    aligned = _plan.is_aligned(x.data.ptr, weight.data.ptr, 0 if bias is None else bias.data.ptr, y.data.ptr,
                               0 if residual is None else residual.data.ptr)
    if plan.layout == "nhwc":  # (one channels-last candidate: nothing to time)
        gpu = plan.gpu if aligned else dispatch.prepare(
            name, "fprop", spec, x.dtype, precision, _plan.env(plan.gpu_env.device, plan.gpu_env.workspace_limit,
                                                               False), bias is not None, "nhwc", plan.weights,
            epilogue=ep)
        dispatch.run_arrays(gpu, x, weight, bias, y, residual=residual)
        return
    if requested == "auto" and settings.benchmark:
        env = _plan.env(plan.gpu_env.device, plan.gpu_env.workspace_limit, aligned)
        problem = Problem.of(spec, x.dtype, precision, "fprop", epilogue=ep or (PLAIN if bias is None else BIAS))

        def run(choice):
            dispatch.run_arrays(dispatch.plan(choice.name, problem, env, choice.knobs), x, weight, bias, y,
                                residual=residual)

        choice = autotune.pick(requested, name, problem, env, settings, run)
        run(choice)
        return
    if name == plan.name and aligned:
        gpu = plan.gpu
    else:
        env = _plan.env(plan.gpu_env.device, plan.gpu_env.workspace_limit, aligned)
        gpu = dispatch.prepare(name, "fprop", spec, x.dtype, precision, env, bias is not None, epilogue=ep)
    dispatch.run_arrays(gpu, x, weight, bias, y, residual=residual)
