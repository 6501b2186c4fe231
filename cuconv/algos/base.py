"""The contract every algorithm implements, and the plans of problems with nothing to compute.

An algorithm is one object (a subclass of ``Algorithm``, one instance in ``cuconv.algos.ALGORITHMS``) that
declares what it serves and answers three questions:

- ``can_implement(problem, limits) -> str | None``: why it cannot run ``problem`` (a ``cuconv.problem.Problem``)
  under ``limits`` (``cuconv._plan.Limits``: shared memory, wgmma, workspace limit), or None. The declared
  ``passes``, ``layouts``, ``weight_layouts`` and epilogue scale are checked here, then the algorithm's own
  ``reason``. Nothing is probed; ``plan`` never refuses what ``can_implement`` accepted.
- ``knobs(problem, env) -> tuple of dicts``: the settings of its own choices (tiles, variants) that can run
  ``problem`` on ``env`` (``cuconv._plan.Env``), as data, the one ``auto`` runs first: the selector's rules
  (``cuconv.select``) choose one, ``config.benchmark`` times them all. ``{}`` means "the selector's choice"; an
  algorithm without knobs has only that. ``knob_text(knobs)`` names a setting (the autotuner's cache file).
- ``plan(problem, env, **knobs) -> cuconv._plan.Plan``: the launches of one pass, made once, run many times.

Problems with nothing to compute are planned here, the same for every algorithm: an empty output, a forward
with no input channels (the bias or zeros), a backward pass with an empty batch, no filters or no channels
(zeros). So is an epilogue (activation, residual) an algorithm does not apply in its own kernels
(``activations``, ``residual``): its plan of the convolution with the bias, then one pass of ``blocks.epilogue``
over the output.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy

from .. import _plan
from ..blocks import bias as _bias, elementwise, epilogue as _epilogue
from ..problem import PASSES, Epilogue, Problem

__all__ = ["Algorithm", "degenerate"]


class Algorithm:
    """An algorithm: what it serves (class attributes) and the contract's three methods (see the module)."""

    name: str = ""
    passes: tuple = PASSES
    layouts: tuple = ("nchw",)           # activations' layouts it reads and writes in place
    weight_layouts: tuple = ("kcrs",)    # weight layouts its channels-last plans read (and wgrad writes)
    activations: tuple = ()              # Epilogue.activation values its kernels apply (of ACTIVATIONS)
    residual: bool = False               # whether its kernels add a residual tensor (others: a pass after them)
    epilogue_dtypes: tuple = None        # dtypes in which its kernels apply the two (None: every dtype it runs)
    scale: bool = False                  # whether it scales the sum
    exact_on_integers: bool = True       # integer-valued inputs give exact sums (no fractional transforms)
    # The family's own limits, ``check(spec, dtype, pass_, precision, limits) -> reason | None``: on any activations,
    # and (asked first) on channels-last ones; None: none beyond the declarations.
    nchw_limits = None
    nhwc_limits = None

    def can_implement(self, problem: Problem, limits: "_plan.Limits") -> Optional[str]:
        """Why this algorithm cannot run ``problem`` under ``limits``, or None."""
        if problem.pass_ not in self.passes:
            return f"it implements no {problem.pass_}"
        if problem.layout not in self.layouts:
            return "it reads and writes NCHW activations only"
        if problem.weights not in self.weight_layouts:
            return f"it reads no {problem.weights!r} weights"
        ep = problem.epilogue
        if ep.scale != 1.0 and not self.scale:
            return "its epilogue scales no sum"
        return self.reason(problem, limits)

    def reason(self, problem: Problem, limits: "_plan.Limits") -> Optional[str]:
        """The algorithm's own limits beyond what it declares (``can_implement`` asks after those): its
        ``nhwc_limits`` on channels-last activations, then its ``nchw_limits``."""
        checks = (self.nhwc_limits, self.nchw_limits) if problem.layout == "nhwc" else (self.nchw_limits,)
        for check in checks:
            if check is not None:
                reason = check(problem.spec, problem.dtype, problem.pass_, problem.precision, limits)
                if reason is not None:
                    return reason
        return None

    def knobs(self, problem: Problem, env: "_plan.Env") -> tuple:
        """Settings of the algorithm's own choices that can run ``problem`` on ``env`` (dicts of ``plan``'s
        keywords; ``can_implement`` accepted the problem)."""
        return ({},)

    def knob_text(self, knobs: dict) -> str:
        """``knobs`` as text, the same in every process (``""``: none)."""
        return ",".join(f"{k}={v}" for k, v in sorted(knobs.items()))

    def fuses(self, problem: Problem) -> bool:
        """Whether its kernels apply ``problem``'s epilogue (activation, residual) themselves: those it declares
        (``activations``, ``residual``), in the dtypes it declares (``epilogue_dtypes``; None: every dtype)."""
        ep = problem.epilogue
        return ((ep.activation is None or ep.activation in self.activations) and (ep.residual is None or self.residual)
                and (self.epilogue_dtypes is None or problem.dtype in self.epilogue_dtypes))

    def plan(self, problem: Problem, env: "_plan.Env", **knobs) -> "_plan.Plan":
        """The plan of ``problem`` on ``env.device`` with ``knobs`` (``{}``: the algorithm's defaults)."""
        ep = problem.epilogue
        if ep.fused and not self.fuses(problem):  # the convolution with its bias, then the epilogue in a pass after
            inner = self.plan(dataclasses.replace(problem, epilogue=Epilogue(bias=ep.bias)), env, **knobs)
            return with_epilogue(self.name, problem, env, inner)
        nothing = degenerate(self.name, problem, env)
        if nothing is not None:  # (the bias, or zeros, alone: the activation and the residual in a pass after)
            return with_epilogue(self.name, problem, env, nothing) if ep.fused else nothing
        return self.build(problem, env, **knobs)

    def build(self, problem: Problem, env: "_plan.Env", **knobs) -> "_plan.Plan":
        """``plan`` of a problem with something to compute (subclasses)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<algorithm {self.name}>"


def with_epilogue(name: str, problem: Problem, env: "_plan.Env", inner: "_plan.Plan") -> "_plan.Plan":
    """``inner`` (the forward with its bias) followed by ``problem``'s activation and residual in one pass over the
    output in place (``blocks.epilogue``; the residual lies as the output does)."""
    spec, ep = problem.spec, problem.epilogue
    b = _plan.Builder("fprop", env)
    offset = b.take(inner.workspace)[1] if inner.workspace else 0
    b.steps.append(_plan.Nested(inner, offset))
    count = spec.n * spec.k * spec.p * spec.q
    if count:
        launch = _epilogue.launch(problem.dtype, count, ep.activation, ep.residual, ep.alpha)
        b.launch(launch, b.ref("out"), b.ref("residual") if ep.residual else _plan.NULL, b.ref("out"))
    return b.plan(name)


def degenerate(name: str, problem: Problem, env: "_plan.Env") -> Optional["_plan.Plan"]:
    """The plan of a problem with nothing to compute (see the module), or None where there is something."""
    spec, dtype, pass_ = problem.spec, problem.dtype, problem.pass_
    b = _plan.Builder(pass_, env)
    if pass_ == "fprop":
        if spec.n * spec.k * spec.p * spec.q == 0:
            return b.plan(name)
        if spec.crs_per_group == 0:
            if problem.bias:  # NCHW: planes of P·Q pixels per filter; NHWC: N·P·Q "planes" of one pixel per filter
                n, pq = (spec.n, spec.p * spec.q) if problem.layout == "nchw" else (spec.n * spec.p * spec.q, 1)
                fill = _bias.fill_launch(dtype, n, spec.k, pq, aligned=b.base_aligned(b.ref("out")))
                b.launch(fill, b.ref("out"), b.ref("bias"))
            else:
                b.launch(elementwise.fill(dtype, spec.n * spec.k * spec.p * spec.q), b.ref("out"))
            return b.plan(name)
        return None
    if spec.n == 0 or spec.k == 0 or spec.crs_per_group == 0:
        result = spec.input_shape if pass_ == "dgrad" else spec.weight_shape
        count = int(numpy.prod(result))
        if count:
            b.launch(elementwise.fill(dtype, count), b.ref("dx" if pass_ == "dgrad" else "dw"))
        return b.plan(name)
    return None
