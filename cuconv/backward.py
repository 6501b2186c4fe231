"""``cuconv.conv2d_input`` (dgrad) and ``cuconv.conv2d_weight`` (wgrad), mirroring ``torch.nn.grad``.

Same semantics, dtypes, groups, workspace bound and error wording as :func:`cuconv.conv2d`; NumPy arrays
run on the CPU path, CuPy arrays on their GPU and CuPy's current stream.
"""

from __future__ import annotations

from typing import Optional

import numpy

from ._types import Array, IntOrPair, Padding, Shape
from . import _backend, _layout, algos as _algorithms, dispatch, select as _select
from .checks import (array_kind, check_dtypes, check_grad_output, check_grad_output_rank, check_same_device,
                     resolve_precision, size)
from .cpu import reference
from .select import autotune
from ._config import config
from ._errors import ConvValueError
from .dispatch import empty_nhwc, nhwc_operand, nhwc_view
from .problem import Problem
from .spec import ConvSpec

__all__ = ["conv2d_input", "conv2d_weight", "dgrad_of", "dgrad_spec", "wgrad_spec"]


def conv2d_input(input_size: Shape, weight: Array, grad_output: Array, stride: IntOrPair = 1, padding: Padding = 0,
                 dilation: IntOrPair = 1, groups: int = 1, *, algo: str = "auto",
                 precision: Optional[str] = None) -> Array:
    """Gradient of :func:`cuconv.conv2d` with respect to its input (dgrad).

    Parameters
    ----------
    input_size : tuple of int
        ``(N, C, H, W)`` (or ``(C, H, W)``) of the forward input.
    weight : array ``(K, C/groups, R, S)``
    grad_output : array ``(N, K, P, Q)`` (or ``(K, P, Q)``), same library and dtype as ``weight``.
    stride, padding, dilation, groups, algo, precision
        As in :func:`cuconv.conv2d`.

    Returns
    -------
    array ``input_size`` of the arrays' library and dtype: channels-last (NHWC in memory) where ``grad_output``
    or ``weight`` is (a batched call; float64 on the GPU stays NCHW, as torch's), else C-contiguous.

    Raises
    ------
    TypeError, ValueError
        As :func:`cuconv.conv2d`, plus a ``grad_output`` whose shape does not match the convolution.

    Examples
    --------
    >>> import numpy as np, cuconv
    >>> w = np.ones((4, 2, 3, 3)); dy = np.ones((1, 4, 3, 4))
    >>> cuconv.conv2d_input((1, 2, 5, 6), w, dy)[0, 0, 2]
    array([12., 24., 36., 36., 24., 12.])
    """
    return dgrad_of(input_size, weight, grad_output, lambda shape: ConvSpec.from_args(
        shape, weight.shape, stride, padding, dilation, groups, backward=True), algo, precision)


def dgrad_of(input_size: Shape, weight: Array, grad_output: Array, spec_of, algo: str = "auto",
             precision: Optional[str] = None, grad_output_name: str = "grad_output") -> Array:
    """:func:`conv2d_input` of the convolution ``spec_of(batched input size)`` (a ``ConvSpec``; the transposed
    convolution's passes one with four-sided padding), after the checks of the arrays, in torch's order
    (``convolution_backward``): the geometry (``spec_of``'s), the ranks, then the dtypes and grad_output's size.
    ``grad_output_name``: what a dtype refusal calls ``grad_output`` (the transposed convolution's input)."""
    settings = config.settings()
    kind = array_kind(grad_output, "grad_output")
    if array_kind(weight, "weight") != kind:
        raise TypeError("conv2d_input(): weight and grad_output must come from the same library")
    input_size = size(input_size, "input_size")
    if weight.ndim != 4:
        raise ConvValueError(f"Expected 4D weight (out_channels, in_channels/groups, kH, kW), but got weight "
                             f"of size: {list(weight.shape)}")
    unbatched = len(input_size) == 3
    if unbatched:
        input_size = (1,) + tuple(input_size)
        grad_output = grad_output[None] if grad_output.ndim == 3 else grad_output
    spec = spec_of(tuple(input_size))
    if not unbatched:
        check_grad_output_rank(grad_output)
    check_dtypes(grad_output, weight, None, first=grad_output_name)
    check_grad_output(grad_output, spec, False)
    precision = resolve_precision(precision, settings.precision)
    result_shape = input_size[1:] if unbatched else input_size
    channels_last = not unbatched and _layout.result_channels_last(grad_output, weight, kind == "cupy")
    if kind == "cupy":
        check_same_device(grad_output, "grad_output", weight=weight)
        with grad_output.device:
            return dgrad_spec(weight, grad_output, spec, algo, precision, channels_last, settings).reshape(
                result_shape)
    return dgrad_spec(weight, grad_output, spec, algo, precision, channels_last, settings).reshape(result_shape)


def conv2d_weight(x: Array, weight_size: Shape, grad_output: Array, stride: IntOrPair = 1, padding: Padding = 0,
                  dilation: IntOrPair = 1, groups: int = 1, *, algo: str = "auto",
                  precision: Optional[str] = None) -> Array:
    """Gradient of :func:`cuconv.conv2d` with respect to its weight (wgrad).

    Parameters
    ----------
    x : array ``(N, C, H, W)`` (or ``(C, H, W)``): the forward input.
    weight_size : tuple of int
        ``(K, C/groups, R, S)``.
    grad_output : array ``(N, K, P, Q)`` (or ``(K, P, Q)``), same library and dtype as ``x``.
    stride, padding, dilation, groups, algo, precision
        As in :func:`cuconv.conv2d`.

    Returns
    -------
    array ``weight_size`` of the arrays' library and dtype; the batch is summed in a fixed order. Channels-last
    ((K, R, S, C/groups) in memory) where ``x`` is (a batched call; float64 on the GPU stays KCRS, as torch's),
    else C-contiguous.

    Raises
    ------
    TypeError, ValueError
        As :func:`cuconv.conv2d`, plus a ``grad_output`` whose shape does not match the convolution.

    Examples
    --------
    >>> import numpy as np, cuconv
    >>> x = np.ones((2, 1, 4, 4)); dy = np.ones((2, 3, 2, 2))
    >>> cuconv.conv2d_weight(x, (3, 1, 3, 3), dy).shape
    (3, 1, 3, 3)
    """
    settings = config.settings()
    kind = array_kind(x, "input")
    if array_kind(grad_output, "grad_output") != kind:
        raise TypeError("conv2d_weight(): input and grad_output must come from the same library")
    weight_size = size(weight_size, "weight_size", ranks=(4,))
    if x.ndim not in (3, 4):
        raise ConvValueError(f"Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of "
                             f"size: {list(x.shape)}")
    batched = x.ndim == 4
    channels_last = batched and _layout.result_channels_last(x, x, kind == "cupy")
    if not batched:
        x = x[None]
        grad_output = grad_output[None] if grad_output.ndim == 3 else grad_output
    # (torch's order, convolution_backward's: the geometry, the ranks, then the dtypes and grad_output's size)
    spec = ConvSpec.from_args(x.shape, weight_size, stride, padding, dilation, groups, backward=True)
    if batched:
        check_grad_output_rank(grad_output)
    check_dtypes(x, grad_output, None, second="grad_output")
    check_grad_output(grad_output, spec, False)
    precision = resolve_precision(precision, settings.precision)
    if kind == "cupy":
        check_same_device(x, grad_output=grad_output)
        with x.device:
            return wgrad_spec(x, grad_output, spec, algo, precision, channels_last, settings)
    return wgrad_spec(x, grad_output, spec, algo, precision, channels_last, settings)


def dgrad_spec(weight, grad_output, spec: ConvSpec, algo: str, precision: str, channels_last: bool, settings):
    """dgrad for validated 4-D arrays of one library whose geometry is ``spec``, under ``settings``
    (``_config.Settings``); returns a new array (channels-last with ``channels_last``)."""
    return _run_pass("dgrad", spec.input_shape, grad_output, weight, spec, algo, precision, channels_last, settings)


def wgrad_spec(x, grad_output, spec: ConvSpec, algo: str, precision: str, channels_last: bool, settings):
    """wgrad for validated 4-D arrays of one library whose geometry is ``spec``, under ``settings``
    (``_config.Settings``); returns a new array (channels-last with ``channels_last``)."""
    return _run_pass("wgrad", spec.weight_shape, x, grad_output, spec, algo, precision, channels_last, settings)


def _run_pass(pass_: str, result_shape, first, second, spec: ConvSpec, algo: str, precision: str,
              channels_last: bool, settings):
    """Run ``pass_`` (operands ``(first, second, result)``, ``_plan.OPERANDS``) into a new array, channels-last
    with ``channels_last``: on the GPU in place where an algorithm serves the pass on channels-last activations
    (``select.select_nhwc``; wgrad's dW written channels-last by those that can, ``algos.takes_krsc``), else
    computed on C-contiguous copies and returned as a channels-last copy."""
    on_gpu = _backend.is_cupy_array(first)
    xp = _backend.cupy_or_none() if on_gpu else numpy
    dtype = first.dtype
    limit = settings.workspace_limit
    nhwc = _select.select_nhwc(algo, spec, dtype, precision, pass_, limit) if channels_last and on_gpu else None
    if nhwc is not None:
        return _run_nhwc(xp, pass_, nhwc, result_shape, first, second, spec, precision, limit)
    result = _run_nchw(xp, on_gpu, pass_, result_shape, first, second, spec, algo, precision, settings)
    return nhwc_view(xp, result) if channels_last else result


def _run_nhwc(xp, pass_: str, name: str, result_shape, first, second, spec: ConvSpec, precision: str,
              workspace_limit: int):
    """``pass_`` by ``name`` on channels-last activations in place (dgrad: dy, dx; wgrad: x, dy), the weight KCRS,
    dW channels-last where ``name`` writes it so."""
    dtype = first.dtype
    krsc = pass_ == "wgrad" and _algorithms.takes_krsc(name)
    if pass_ == "dgrad":
        first, second = nhwc_operand(xp, first), xp.ascontiguousarray(second)
        result = empty_nhwc(xp, result_shape, dtype)
    else:
        first, second = nhwc_operand(xp, first), nhwc_operand(xp, second)
        result = empty_nhwc(xp, result_shape, dtype) if krsc else xp.empty(result_shape, dtype=dtype)
    env = dispatch.array_env((first, second, result), workspace_limit)
    dispatch.run_arrays(dispatch.prepare(name, pass_, spec, dtype, precision, env, False, "nhwc",
                                         "krsc" if krsc else "kcrs"), first, second, result)
    return result if pass_ == "dgrad" or krsc else nhwc_view(xp, result)


def _run_nchw(xp, on_gpu: bool, pass_: str, result_shape, first, second, spec: ConvSpec, algo: str, precision: str,
              settings):
    """``pass_`` on C-contiguous operands (copies where they are not) into a new C-contiguous array, under
    ``settings`` (``config.benchmark``: the autotuner's choice)."""
    dtype = first.dtype
    workspace_limit = settings.workspace_limit
    name = _select.resolve(algo, spec, dtype, precision, on_gpu, pass_, workspace_limit)
    result = xp.empty(result_shape, dtype=dtype)
    first, second = xp.ascontiguousarray(first), xp.ascontiguousarray(second)
    if on_gpu:
        env = dispatch.array_env((first, second, result), workspace_limit)

        problem = Problem.of(spec, dtype, precision, pass_)

        def run(choice):
            dispatch.run_arrays(dispatch.plan(choice.name, problem, env, choice.knobs), first, second, result)

        run(autotune.pick(algo, name, problem, env, settings, run))
    else:
        getattr(reference, pass_)(first, second, spec, result, numpy.matmul, workspace_limit)
    return result
