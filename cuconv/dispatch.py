"""What the three front doors share (``cuconv.conv2d``, ``cuconv.conv2d_input`` / ``conv2d_weight`` and the torch
bridge): the key of a call's signature, a problem's plan, made once per (algorithm, problem, environment, knobs)
and kept, and running a plan on arrays.

A plan (``cuconv._plan.Plan``) only launches: ``plan.run(ptrs, stream, workspace)``. Nothing here reads the
configuration: the doors pass its values (``cuconv._config.Settings``) in.
"""

from __future__ import annotations

import functools

from . import _layout, _plan, algos as _algorithms, select as _select
from .problem import BIAS, PLAIN, Problem
from .spec import _plain

__all__ = ["call_key", "plan", "prepare", "run_arrays", "array_env", "nhwc_view", "nhwc_operand",
           "empty_nhwc"]


def call_key(operands: tuple, stride, padding, dilation, groups, algo, settings: tuple):
    """The key of a door's call seen before: ``operands`` (what the door reads of its arrays or tensors: shapes,
    strides, dtypes, devices), the geometry arguments, ``algo`` and ``settings`` (the precision and configuration
    values the checks and the choice read); None where a geometry argument or ``algo`` is not of a plain type
    (``spec._plain``: values of exact types only, so that 1, 1.0 and True, equal as keys, never share a plan)."""
    if not (_plain(stride) and _plain(padding) and _plain(dilation) and type(groups) is int and type(algo) is str):
        return None
    return (*operands, stride, padding, dilation, groups, algo, *settings)


@functools.lru_cache(maxsize=4096)
def plan(name: str, problem: Problem, env: "_plan.Env", knobs: tuple = None) -> "_plan.Plan":
    """Algorithm ``name``'s plan of ``problem`` on ``env`` (made on ``env.device``, the current device) with
    ``knobs`` (pairs of ``plan``'s keywords; None: the selector's, ``select.knobs``), memoized per signature."""
    if knobs is None:
        knobs = _select.knobs(name, problem, env)
    return _algorithms.get(name).plan(problem, env, **dict(knobs))


def prepare(name: str, pass_: str, spec, dtype, precision: str, env: "_plan.Env", bias: bool = False,
            layout: str = "nchw", weights: str = "kcrs", knobs: tuple = None, epilogue=None) -> "_plan.Plan":
    """``plan`` of the problem these arguments describe (``Problem.of``; ``epilogue``: a forward's whole
    ``Epilogue``, its bias flag included, else the bias alone) with ``knobs`` (None: the selector's); an algorithm
    that does not read the layouts asked for raises ``ValueError``."""
    problem = Problem.of(spec, dtype, precision, pass_, layout, weights, epilogue or (BIAS if bias else PLAIN))
    algorithm = _algorithms.get(name)
    if layout not in algorithm.layouts or weights not in algorithm.weight_layouts:
        raise ValueError(f"cuconv: {name} takes no {weights!r} weights with {layout!r} activations")
    return plan(name, problem, env, knobs)



# ---- plans on CuPy arrays (the array doors) ---------------------------------------------------------------------
run_arrays = _plan.run_arrays  # (plan, *arrays): on CuPy's current stream, a workspace from CuPy's pool


def array_env(arrays, workspace_limit: int) -> "_plan.Env":
    """The environment of a call on CuPy ``arrays`` (None entries ignored) on the current device."""
    return _plan.current_env(*arrays, workspace_limit=workspace_limit)


def nhwc_view(xp, a):
    """``a`` (N, C, H, W) as a dense channels-last array of the same shape: itself where it already lies so,
    else a copy."""
    if _layout.dense_nhwc(a.shape, _layout.element_strides(a) or ()):
        return a
    return xp.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def nhwc_operand(xp, a):
    """``a`` (a CuPy array) as a dense channels-last array on a ``_layout.VECTOR_ALIGNMENT`` boundary, as the
    in-place channels-last passes read it: itself where it lies so, else a copy."""
    a = nhwc_view(xp, a)
    if a.data.ptr % _layout.VECTOR_ALIGNMENT:
        a = a.transpose(0, 2, 3, 1).copy().transpose(0, 3, 1, 2)
    return a


def empty_nhwc(xp, shape, dtype):
    """A new dense channels-last array of shape (N, C, H, W)."""
    n, c, h, w = shape
    return xp.empty((n, h, w, c), dtype=dtype).transpose(0, 3, 1, 2)
