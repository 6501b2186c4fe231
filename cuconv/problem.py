"""The one description of a convolution pass that every algorithm, the selector and the plan cache take.

``Problem`` is the geometry (``ConvSpec``) plus everything else that decides what a pass computes and how its
operands lie in memory: the pass, the dtype, float32's precision, the activations' and the weight's memory
layouts and the ``Epilogue``. It is frozen and hashable: the key of chosen algorithms and of plans. The device
and the limits a plan is made under travel beside it, as ``cuconv._plan.Env`` / ``Limits``.

Layouts. Activations (x, out, dy, dx): ``"nchw"`` (C-contiguous ``(N, C, H, W)``) or ``"nhwc"`` (channels-last:
``(N, C, H, W)`` in shape, ``(N, H, W, C)`` in memory). The weight (and wgrad's dW): ``"kcrs"`` (C-contiguous
``(K, C/groups, R, S)``) or ``"krsc"`` (``(K, R, S, C/groups)`` in memory), the second with ``"nhwc"`` activations
only.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy

from .spec import ConvSpec

__all__ = ["PASSES", "LAYOUTS", "WEIGHT_LAYOUTS", "ACTIVATIONS", "RESIDUALS", "Epilogue", "Problem", "PLAIN",
           "BIAS"]

PASSES = ("fprop", "dgrad", "wgrad")
LAYOUTS = ("nchw", "nhwc")
WEIGHT_LAYOUTS = ("kcrs", "krsc")
# The activations an epilogue may apply, by torch's module names in lower case; "gelu_tanh" is GELU's tanh
# approximation, "leaky_relu" takes its negative slope as ``Epilogue.alpha``.
ACTIVATIONS = ("relu", "relu6", "leaky_relu", "silu", "gelu", "gelu_tanh", "hardswish", "hardsigmoid", "sigmoid")
# Where a residual tensor (of the output's shape and layout) is added: before the activation or after it.
RESIDUALS = ("before", "after")


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """What a forward does to its fp32 accumulators before the one rounding to the output's dtype, in this order:
    ``scale`` times the sum, plus the bias (``bias``: the call passes one), plus the residual where ``residual`` is
    ``"before"``, the ``activation`` (None: none), plus the residual where it is ``"after"``.

    An algorithm implements the epilogues it declares (``Algorithm.activations``, ``Algorithm.residual``,
    ``Algorithm.scale``) and refuses the others through ``can_implement``. Backward passes have no epilogue."""

    bias: bool = False
    activation: Optional[str] = None
    alpha: float = 0.0            # leaky_relu's negative slope
    residual: Optional[str] = None
    scale: float = 1.0

    def __post_init__(self):
        if self.activation is not None and self.activation not in ACTIVATIONS:
            raise ValueError(f"cuconv: unknown activation {self.activation!r}; expected None or one of {ACTIVATIONS}")
        if self.residual is not None and self.residual not in RESIDUALS:
            raise ValueError(f"cuconv: residual must be None or one of {RESIDUALS}, got {self.residual!r}")

    @property
    def fused(self) -> bool:
        """Whether it does more than add a bias (an activation, a residual or a scale)."""
        return self.activation is not None or self.residual is not None or self.scale != 1.0


PLAIN = Epilogue()
BIAS = Epilogue(bias=True)


@dataclasses.dataclass(frozen=True)
class Problem:
    """One pass of one convolution (see the module's docstring). Build it with ``Problem.of`` (dtype normalised,
    the fields checked)."""

    spec: ConvSpec
    dtype: numpy.dtype
    precision: str = "ieee"   # float32's arithmetic: "ieee" or "tf32"; other dtypes ignore it
    pass_: str = "fprop"
    layout: str = "nchw"
    weights: str = "kcrs"
    epilogue: Epilogue = PLAIN

    @classmethod
    def of(cls, spec: ConvSpec, dtype, precision: str = "ieee", pass_: str = "fprop", layout: str = "nchw",
           weights: str = "kcrs", epilogue: Epilogue = PLAIN) -> "Problem":
        """The problem, its fields checked (an unknown pass, layout or weight layout raises ``ValueError``)."""
        if pass_ not in PASSES:
            raise ValueError(f"cuconv: unknown pass {pass_!r}; expected one of {PASSES}")
        if layout not in LAYOUTS:
            raise ValueError(f"cuconv: unknown layout {layout!r}; expected one of {LAYOUTS}")
        if weights not in WEIGHT_LAYOUTS or (weights == "krsc" and layout != "nhwc"):
            raise ValueError(f"cuconv: {weights!r} weights do not go with {layout!r} activations (channels-last "
                             "weights, 'krsc', go with channels-last activations, 'nhwc')")
        if pass_ != "fprop" and epilogue != PLAIN:
            raise ValueError(f"cuconv: a {pass_} has no epilogue, got {epilogue}")
        return cls(spec, numpy.dtype(dtype), precision, pass_, layout, weights, epilogue)

    @property
    def bias(self) -> bool:
        return self.epilogue.bias

    @property
    def ffma(self) -> bool:
        """Whether the arithmetic is plain FMA (float64, float32 at "ieee"), not tensor cores."""
        return self.dtype == numpy.float64 or (self.dtype == numpy.float32 and self.precision == "ieee")

    def with_(self, **changes) -> "Problem":
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)
