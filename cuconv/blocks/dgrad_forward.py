"""dgrad of a stride-1 convolution as a forward convolution of ``dy``, for algorithms with a fast forward.

With stride 1, ``dx = conv2d(dy, w')`` where ``w'`` swaps each group's input and output channels and flips
the kernel in both axes, and the padding is the complement of the forward padding inside the dilated
kernel (``dilation·(R-1) - pad`` per side). The GEMM this forward runs reduces over ``K/g·R·S`` instead of
``dgrad``'s short ``K/g``, so forward engines (direct_smem, implicit_gemm, winograd) serve dgrad at their
forward speed. Strided convolutions (dx has holes no forward convolution of dy produces) and padding wider than
the dilated kernel return None: callers use a gather instead.
"""

from __future__ import annotations

from typing import Optional

import numpy

from .. import _dtypes, _loader, _plan
from ..spec import ConvSpec

__all__ = ["forward_spec", "forward_weight", "prepare", "reason_unsupported", "NAME_EXPRESSIONS", "STEM"]

STEM = "blocks/dgrad_forward"
NAME_EXPRESSIONS = tuple(f"{kernel}<{t}>" for kernel in ("flip_weight", "flip_weight_elementwise")
                         for t in _dtypes.ALL_CTYPE_NAMES)
# Groups with fewer filters or channels than this take flip_weight_elementwise: the tiled transpose's 32 x 32
# tiles would be mostly empty blocks.
_TILE = 32


def forward_spec(spec: ConvSpec) -> Optional[ConvSpec]:
    """The forward convolution of ``dy`` whose output is ``dx`` for ``spec``, or None where none exists."""
    (pt, pb, pl, pr), (dh, dw) = spec.pad, spec.dilation
    pads = (dh * (spec.r - 1) - pt, dh * (spec.r - 1) - pb, dw * (spec.s - 1) - pl, dw * (spec.s - 1) - pr)
    if spec.stride != (1, 1) or min(pads) < 0:
        return None
    return ConvSpec(spec.n, spec.k, spec.p, spec.q, spec.c, spec.r, spec.s, (1, 1), pads, spec.dilation,
                    spec.groups)


def forward_weight(w, spec: ConvSpec):
    """``w'`` (C, K/g, R, S): per group, input and output channels swapped, the kernel flipped; contiguous (an
    array of ``w``'s library: the NumPy twin of ``flip_weight``)."""
    g = spec.groups
    w5 = w.reshape(g, spec.k_per_group, spec.c_per_group, spec.r, spec.s)[:, :, :, ::-1, ::-1]
    return w5.transpose(0, 2, 1, 3, 4).copy().reshape(spec.c, spec.k_per_group, spec.r, spec.s)


FLIP_SHAPE_DTYPE = numpy.dtype([(f, numpy.int32) for f in ("groups", "kg", "cg", "rs", "c_tiles", "unused")])


def flip_launch(spec: ConvSpec, dtype) -> "_loader.PreparedLaunch":
    """A launch writing ``forward_weight``'s w' (pointers: w, w'); None for an empty weight. Groups of at least
    32 filters and 32 channels: 32 x 32 tiles through shared memory; narrower ones: a thread per element."""
    total = spec.k * spec.crs_per_group
    if total == 0:
        return None
    c_tiles, k_tiles = -(-spec.c_per_group // _TILE), -(-spec.k_per_group // _TILE)
    shape = numpy.array((spec.groups, spec.k_per_group, spec.c_per_group, spec.r * spec.s, c_tiles, 0),
                        dtype=FLIP_SHAPE_DTYPE)[()]
    ctype = _dtypes.ctype_of(dtype)
    if min(spec.k_per_group, spec.c_per_group) < _TILE and total < 2**30:  # (32-bit grid-stride loop)
        return _loader.prepare(STEM, NAME_EXPRESSIONS, f"flip_weight_elementwise<{ctype}>",
                               (_loader.blocks(total), 1, 1), (_loader.THREADS, 1, 1), 2, (shape,))
    return _loader.prepare(STEM, NAME_EXPRESSIONS, f"flip_weight<{ctype}>",
                           (c_tiles * spec.groups, k_tiles, spec.r * spec.s), (32, 8, 1), 2, (shape,))


def flipped_bytes(spec: ConvSpec, dtype) -> int:
    """The workspace w' takes at its start: the weight's bytes, rounded up to the workspace's alignment."""
    return -(-spec.k * spec.crs_per_group * numpy.dtype(dtype).itemsize // _plan.ALIGNMENT) * _plan.ALIGNMENT


def prepare(forward_prepare, spec: ConvSpec, dtype, precision: str, env: "_plan.Env", **options) -> "_plan.Plan":
    """The dgrad plan of an algorithm whose forward plan ``forward_prepare`` makes (the caller checked that
    :func:`forward_spec` exists): w' is written to the start of the workspace, then the forward plan of
    ``forward_spec`` runs with dy as its input, w' as its weight and dx as its output, planned within what w'
    leaves of the workspace limit."""
    fspec = forward_spec(spec)
    room = env._replace(workspace_limit=max(0, env.workspace_limit - flipped_bytes(spec, dtype)))
    forward = forward_prepare("fprop", fspec, dtype, precision, room, bias=False, **options)
    b = _plan.Builder("dgrad", env)
    flipped = b.take(spec.k * spec.crs_per_group * numpy.dtype(dtype).itemsize)
    b.launch(flip_launch(spec, dtype), b.ref("w"), flipped)
    b.steps.append(_Forward(forward, flipped[1], b.take(forward.workspace)[1]))
    return b.plan(forward.algo)


class _Forward:
    """A step: a forward plan run on dgrad's operands (dy as x, the flipped weight, no bias, dx as out) and its
    part of dgrad's workspace."""

    __slots__ = ("forward", "weight", "workspace")

    def __init__(self, forward: "_plan.Plan", weight: int, workspace: int):
        self.forward, self.weight, self.workspace = forward, weight, workspace

    def __call__(self, bases, stream: int) -> None:
        dy, dx, ws = bases[0], bases[2], bases[3]
        self.forward.run((dy, ws + self.weight, 0, dx), stream, ws + self.workspace)


def reason_unsupported(spec: ConvSpec, dtype, pass_: str, precision: str, forward_reason,
                       limits: "_plan.Limits" = None, flips: bool = True) -> Optional[str]:
    """``reason_unsupported`` of an algorithm with a forward pass (checked by ``forward_reason(spec, dtype,
    precision, limits)``) that serves dgrad as a forward convolution of dy and has no wgrad; ``limits``
    defaults to the current device's (``_plan.current_limits``). ``flips``: its dgrad runs through ``prepare``
    (the flipped weight w' first in the workspace, the forward within the rest of the limit); an algorithm that
    flips the weight itself passes False."""
    limits = limits or _plan.current_limits()
    if pass_ == "dgrad":
        fspec = forward_spec(spec)
        if fspec is None:
            return ("its dgrad is a forward convolution of grad_output, which needs stride 1 and padding no "
                    "wider than the dilated kernel")
        if spec.k * spec.crs_per_group >= 2**31 or spec.r * spec.s > 65535 or -(-spec.k_per_group // 32) > 65535:
            return ("its dgrad flips the weight with 32-bit offsets, a grid z per kernel tap and one y per 32 "
                    "filters of a group: fewer than 2^31 elements, 65536 taps and 2^21 filters")
        if not flips:
            return forward_reason(fspec, dtype, precision, limits)
        need = flipped_bytes(spec, dtype)
        if need > limits.workspace_limit:
            return (f"its dgrad's flipped weight needs {need} bytes, more than cuconv.config.workspace_limit "
                    f"({limits.workspace_limit})")
        return forward_reason(fspec, dtype, precision, limits._replace(workspace_limit=limits.workspace_limit - need))
    if pass_ != "fprop":
        return f"it implements no {pass_}"
    return forward_reason(spec, dtype, precision, limits)
