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

from .spec import ConvSpec

__all__ = ["forward_spec", "forward_weight", "run", "reason_unsupported"]


def forward_spec(spec: ConvSpec) -> Optional[ConvSpec]:
    """The forward convolution of ``dy`` whose output is ``dx`` for ``spec``, or None where none exists."""
    (pt, pb, pl, pr), (dh, dw) = spec.pad, spec.dilation
    pads = (dh * (spec.r - 1) - pt, dh * (spec.r - 1) - pb, dw * (spec.s - 1) - pl, dw * (spec.s - 1) - pr)
    if spec.stride != (1, 1) or min(pads) < 0:
        return None
    return ConvSpec(spec.n, spec.k, spec.p, spec.q, spec.c, spec.r, spec.s, (1, 1), pads, spec.dilation,
                    spec.groups)


def forward_weight(w, spec: ConvSpec):
    """``w'`` (C, K/g, R, S): per group, input and output channels swapped, the kernel flipped; contiguous."""
    g = spec.groups
    w5 = w.reshape(g, spec.k_per_group, spec.c_per_group, spec.r, spec.s)[:, :, :, ::-1, ::-1]
    return w5.transpose(0, 2, 1, 3, 4).copy().reshape(spec.c, spec.k_per_group, spec.r, spec.s)


def run(forward_gpu, dy, w, spec: ConvSpec, dx, precision: str) -> None:
    """dx = conv2d_input(dy, w) through ``forward_gpu`` (the caller checked :func:`forward_spec` exists)."""
    fspec = forward_spec(spec)
    forward_gpu(dy, forward_weight(w, spec), None, fspec, dx, precision)


def reason_unsupported(spec: ConvSpec, dtype, pass_: str, precision: str, forward_reason) -> Optional[str]:
    """``reason_unsupported`` of an algorithm with a forward pass (checked by ``forward_reason(spec, dtype,
    precision)``) that serves dgrad as a forward convolution of dy and has no wgrad."""
    if pass_ == "dgrad":
        fspec = forward_spec(spec)
        if fspec is None:
            return ("its dgrad is a forward convolution of grad_output, which needs stride 1 and padding no "
                    "wider than the dilated kernel")
        return forward_reason(fspec, dtype, precision)
    if pass_ != "fprop":
        return f"it implements no {pass_}"
    return forward_reason(spec, dtype, precision)
