"""The one place that chooses: which algorithm runs a problem, and with which of its knobs.

- ``choose(problem, env, algo="auto") -> Choice``: the algorithm (``auto``: the first of the rules' candidates,
  ``rules.preference`` / ``rules.preference_nhwc``, that can implement the problem; a forced name: itself, or
  ``NotImplementedError`` with its reason) and its knobs (``knobs``). On channels-last activations the answer
  may be None: no algorithm serves the pass in place, and the caller runs it on NCHW copies.
- ``select_algorithm``, ``select_nhwc``, ``resolve``, ``reason_unsupported``: the same questions asked with
  loose arguments, for the public ``cuconv.select_algorithm`` and for tests; their limits default to the
  current device's and ``cuconv.config.workspace_limit``.
- ``autotune``: ``config.benchmark``'s timings, which may overrule ``auto``'s algorithm.

Everything here is a pure function of its arguments (memoized): the device's limits arrive as a
``cuconv._plan.Limits`` (an ``Env`` serves as one), never read from the device or the config inside.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Tuple

from .. import _plan, algos as _algorithms
from ..problem import PASSES, PLAIN, Problem
from ..spec import ConvSpec
from . import depthwise as _depthwise, implicit_gemm as _implicit_gemm, rules

__all__ = ["algorithms", "Choice", "choose", "algorithm", "knobs", "can_implement", "select_algorithm", "select_nhwc", "resolve",
           "reason_unsupported", "rules"]


class Choice(NamedTuple):
    """What runs a problem: an algorithm's name and the keywords of its ``plan`` (a tuple of pairs: hashable)."""

    name: str
    knobs: tuple = ()


def _limits(limits) -> "_plan.Limits":
    return _plan.Limits(limits.smem_limit, limits.wgmma, limits.workspace_limit)


@functools.lru_cache(maxsize=8192)
def _can_implement(name: str, problem: Problem, limits: "_plan.Limits") -> Optional[str]:
    return _algorithms.get(name).can_implement(problem, limits)


def can_implement(name: str, problem: Problem, limits) -> Optional[str]:
    """``algorithms.get(name).can_implement(problem, limits)``, memoized (a layer called again costs a lookup)."""
    return _can_implement(name, problem, _limits(limits))


@functools.lru_cache(maxsize=8192)
def _algorithm(problem: Problem, limits: "_plan.Limits", algo: str) -> Optional[str]:
    if algo != "auto":
        reason = _can_implement(algo, problem, limits)
        if reason is None:
            return algo
        if problem.layout == "nhwc":
            return None
        raise NotImplementedError(f"cuconv: algo {algo!r} cannot run this {problem.pass_}: {reason}")
    spec, dtype, precision, pass_ = problem.spec, problem.dtype, problem.precision, problem.pass_
    candidates = (rules.preference_nhwc(spec, dtype, precision, pass_, limits.wgmma, problem.epilogue)
                  if problem.layout == "nhwc"
                  else rules.preference(spec, dtype, precision, pass_, limits.wgmma, problem.epilogue))
    for name in candidates:
        if _can_implement(name, problem, limits) is None:
            return name
    if problem.layout == "nhwc":
        return None
    # (im2col_gemm serves every geometry within a workspace limit of a few output rows' columns)
    raise NotImplementedError(f"cuconv: no algorithm supports {spec} in {dtype} for {pass_} under "
                              f"cuconv.config.workspace_limit={limits.workspace_limit}: im2col_gemm: "
                              f"{_can_implement('im2col_gemm', problem, limits)}")


def algorithm(problem: Problem, limits, algo: str = "auto") -> Optional[str]:
    """The algorithm that runs ``problem`` for a call asking for ``algo`` (see the module's docstring)."""
    return _algorithm(problem, _limits(limits), algo)


# An algorithm with knobs -> the rule that chooses them (``select/<name>.py``): (problem, env) -> a dict of its
# ``plan``'s keywords. An algorithm without an entry runs with its defaults.
_KNOB_RULES = {"implicit_gemm": _implicit_gemm.knobs, "depthwise": _depthwise.knobs}


def knobs(name: str, problem: Problem, env: "_plan.Env") -> tuple:
    """The knobs algorithm ``name`` runs ``problem`` with on ``env`` (sorted pairs of ``plan``'s keywords; ``()``:
    the algorithm's defaults)."""
    rule = _KNOB_RULES.get(name)
    return () if rule is None else tuple(sorted(rule(problem, env).items()))


def choose(problem: Problem, env: "_plan.Env", algo: str = "auto") -> Optional[Choice]:
    """The algorithm and knobs that run ``problem`` on ``env`` for a call asking for ``algo`` (None: no algorithm
    serves a channels-last problem in place)."""
    name = algorithm(problem, env, algo)
    return None if name is None else Choice(name, knobs(name, problem, env))


# ---- the same questions with loose arguments ------------------------------------------------------------------

def _check_pass(pass_: str) -> None:
    if pass_ not in PASSES:
        raise ValueError(f"cuconv: unknown pass {pass_!r}; expected one of {PASSES}")


def algorithms(pass_: str = "fprop") -> Tuple[str, ...]:
    """Names of the algorithms that implement ``pass_`` ("fprop", "dgrad" or "wgrad")."""
    _check_pass(pass_)
    return _algorithms.names(pass_)


def reason_unsupported(name: str, spec: ConvSpec, dtype, pass_: str = "fprop", precision: str = "ieee",
                       workspace_limit: int = None, layout: str = "nchw") -> Optional[str]:
    """Why algorithm ``name`` cannot run this case (float32 at ``precision``, activations in ``layout``) on the
    current device under ``workspace_limit`` (default ``cuconv.config.workspace_limit``), or None."""
    return can_implement(name, Problem.of(spec, dtype, precision, pass_, layout),
                         _plan.current_limits(workspace_limit))


def select_algorithm(spec: ConvSpec, dtype, precision: str = "ieee", on_gpu: bool = True,
                     pass_: str = "fprop", workspace_limit: int = None) -> str:
    """The algorithm ``algo="auto"`` runs for this problem and pass on NCHW arrays: a pure function of its
    arguments and of the current device's limits and ``workspace_limit`` (default
    ``cuconv.config.workspace_limit``)."""
    return algorithm(Problem.of(spec, dtype, precision, pass_), _plan.current_limits(workspace_limit))


def select_nhwc(algo: str, spec: ConvSpec, dtype, precision: str = "ieee", pass_: str = "fprop",
                workspace_limit: int = None, epilogue=None) -> Optional[str]:
    """The algorithm that runs ``pass_`` on channels-last activations in place for a call asking for ``algo``
    (``"auto"``: the first of ``rules.preference_nhwc`` that serves it; a forced name: itself where it serves
    it), or None: the call then runs ``algo`` on NCHW copies. ``epilogue``: a forward's (``Epilogue``; None: the
    bias at most), which the choice weighs (``rules.preference``)."""
    if algo != "auto" and algo not in _algorithms.names():
        return None
    problem = Problem.of(spec, dtype, precision, pass_, "nhwc", epilogue=epilogue or PLAIN)
    return algorithm(problem, _plan.current_limits(workspace_limit), algo)


def resolve(algo: str, spec: ConvSpec, dtype, precision: str, on_gpu: bool, pass_: str = "fprop",
            workspace_limit: int = None, epilogue=None) -> str:
    """Validate a user's ``algo=`` and turn ``"auto"`` into a concrete name for ``pass_`` under
    ``workspace_limit`` (default ``cuconv.config.workspace_limit``); ``epilogue``: as ``select_nhwc``'s. A forced
    algorithm that cannot run the problem raises ``NotImplementedError``, on the CPU as on the GPU."""
    if not isinstance(algo, str):
        raise TypeError(f"conv2d(): argument 'algo' must be str, not {type(algo).__name__}")
    if algo != "auto" and algo not in _algorithms.names():
        raise ValueError(f"cuconv: unknown algo {algo!r}; expected 'auto' or one of {_algorithms.names()}")
    # (the CPU path computes every problem one way, but a forced algorithm is checked as on the GPU, against the
    # current device's limits, or planning's own without one: a call fails or runs on both alike)
    return algorithm(Problem.of(spec, dtype, precision, pass_, epilogue=epilogue or PLAIN),
                     _plan.current_limits(workspace_limit), algo)


def _clear() -> None:
    """Forget every memoized answer (tests that change the rules' constants)."""
    _can_implement.cache_clear()
    _algorithm.cache_clear()
