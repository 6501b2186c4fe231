"""What the three front doors share (``cuconv.conv2d``, ``cuconv.conv2d_input`` / ``conv2d_weight`` and the torch
bridge): a problem's plan, made once per (algorithm, problem, environment, knobs) and kept.

A plan (``cuconv._plan.Plan``) only launches: ``plan.run(ptrs, stream, workspace)``.
"""

from __future__ import annotations

import functools

from . import _plan, algos as _algorithms, select as _select
from .problem import BIAS, PLAIN, Problem

__all__ = ["plan", "prepare", "choose_and_plan"]


@functools.lru_cache(maxsize=4096)
def plan(name: str, problem: Problem, env: "_plan.Env", knobs: tuple = None) -> "_plan.Plan":
    """Algorithm ``name``'s plan of ``problem`` on ``env`` (made on ``env.device``, the current device) with
    ``knobs`` (pairs of ``plan``'s keywords; None: the selector's, ``select.knobs``), memoized per signature."""
    if knobs is None:
        knobs = _select.knobs(name, problem, env)
    return _algorithms.get(name).plan(problem, env, **dict(knobs))


def prepare(name: str, pass_: str, spec, dtype, precision: str, env: "_plan.Env", bias: bool = False,
            layout: str = "nchw", weights: str = "kcrs") -> "_plan.Plan":
    """``plan`` of the problem these arguments describe (``Problem.of``), the selector's knobs; an algorithm that
    does not read the layouts asked for raises ``ValueError``."""
    problem = Problem.of(spec, dtype, precision, pass_, layout, weights, BIAS if bias else PLAIN)
    algorithm = _algorithms.get(name)
    if layout not in algorithm.layouts or weights not in algorithm.weight_layouts:
        raise ValueError(f"cuconv: {name} takes no {weights!r} weights with {layout!r} activations")
    return plan(name, problem, env)


def choose_and_plan(problem: Problem, env: "_plan.Env", algo: str = "auto"):
    """(the name, the plan) of what runs ``problem`` on ``env`` for ``algo`` (``select.choose``), or None where no
    algorithm serves a channels-last problem in place."""
    choice = _select.choose(problem, env, algo)
    if choice is None:
        return None
    return choice.name, plan(choice.name, problem, env, choice.knobs)
