"""depthwise's knobs: which forward kernel runs a layer (its ``kernel=``), on NCHW and on channels-last activations.

The algorithm (``cuconv.algos.depthwise``) says which kernels can serve a problem (``forward_kernels``,
``_nhwc_tile``) and builds the plan of the one it is given; the choice is made here. The stride-1 dgrad runs the
same kernels as the forward of dy, chosen the same way. The measurements behind the order are in
docs/perf-notes.md ("Depthwise").
"""

from __future__ import annotations

from .._plan import Env
from ..algos.depthwise.nchw_fwd import forward_kernels
from ..algos.depthwise.nhwc import _NHWC_Q_PIXELS, _nhwc_tile
from ..blocks import dgrad_forward
from ..problem import Problem
from ..spec import ConvSpec

__all__ = ["knobs", "forward_kernel", "nhwc_kernel"]


def knobs(problem: Problem, env: Env) -> dict:
    """The selector's rule (``cuconv.select.knobs``): ``{"kernel": ...}`` for the forward on NCHW activations
    (``forward_kernel``; the stride-1 dgrad's is chosen the same way, inside its plan) and for the forward and
    stride-1 dgrad on channels-last ones (``nhwc_kernel``); ``{}`` for the passes with one kernel."""
    spec, dtype = problem.spec, problem.dtype
    if problem.layout == "nhwc":
        fspec = spec if problem.pass_ == "fprop" else (dgrad_forward.forward_spec(spec) if problem.pass_ == "dgrad"
                                                        else None)
        return {} if fspec is None else {"kernel": nhwc_kernel(fspec, dtype)}
    if problem.pass_ != "fprop":
        return {}
    usable = forward_kernels(spec, dtype, env.smem_limit, env.aligned, env.aligned)
    return {"kernel": forward_kernel(spec, usable)} if usable else {}


# The NCHW forward kernels by preference: the kernels that stage rows or planes of the input (``rows``: rows of
# 16-byte vectors; ``plane``: whole padded planes in shared memory) beat the strips of registers, which beat a
# thread per output (``gather``), which beats the 32x64 output tiles; at a stride or dilation above 1 the gather
# comes first (the staging kernels run at stride 1 only, and the tiles read a window per output again).
_STRIDE_1_ORDER = ("rows", "plane", "strips", "gather", "tiles")
_STRIDED_ORDER = ("gather", "rows", "plane", "strips", "tiles")


def forward_kernel(spec: ConvSpec, usable: tuple) -> str:
    """The first kernel of ``usable`` (``algos.depthwise.forward_kernels``) by the preference above."""
    order = _STRIDE_1_ORDER if spec.stride == (1, 1) and spec.dilation == (1, 1) else _STRIDED_ORDER
    return next(k for k in order if k in usable)


# depthwise_nhwc_fwd_q (output pixels a thread) measured faster than depthwise_nhwc_fwd for 5x5 kernels at unit
# stride and dilation only; depthwise_nhwc_fwd_tile (16-bit types, square 3x3-7x7 at stride 1 or 2) wherever it
# applies.
_NHWC_Q_AUTO = (5,)


def nhwc_kernel(spec: ConvSpec, dtype) -> str:
    """The channels-last forward kernel auto runs on ``spec`` (a forward, or a stride-1 dgrad's forward of dy):
    ``"nhwc_tile"`` where ``_nhwc_tile`` applies, else ``"nhwc_q"`` for 5x5 kernels at unit stride and dilation,
    else ``"nhwc"``."""
    if _nhwc_tile(spec, dtype) is not None:
        return "nhwc_tile"
    if (spec.r == spec.s and spec.r in _NHWC_Q_AUTO and spec.r in _NHWC_Q_PIXELS and spec.stride == (1, 1)
            and spec.dilation == (1, 1)):
        return "nhwc_q"
    return "nhwc"
