"""Algorithm ``grouped_mma``: Python twin of ``kernels_cu/grouped_mma.cu``, the forward of grouped layers of 16
channels and 16 filters a group on tensor cores (float16, bfloat16, float32 as TF32), NCHW in and out, or
channels-last in and out (``layout="nhwc"``), in one launch; its dgrad at stride 1 is the same kernel on ``dy``
reading the weight transposed and flipped (``dgrad_forward.forward_spec``), also one launch.

A block stages a band of output rows' input rows for four groups in shared memory and a warp a group
runs m16n8 MMAs over its 16-pixel tiles, the group's weight held in registers (``kernels_cu/grouped_mma.cu``).
"""

from __future__ import annotations

import numpy

from .. import _dtypes, _loader, _plan
from ..spec import ConvSpec
from ..problem import Problem
from .base import Algorithm
from ..blocks import dgrad_forward

__all__ = ["ALGORITHM", "GroupedMma", "prepare", "reason_unsupported", "reason_unsupported_nhwc", "tiling", "blocks", "GROUPED_MMA_TILING_DTYPE",
           "NAME_EXPRESSIONS", "STEM", "WIDTH"]

STEM = "grouped_mma"
WIDTH = 16             # channels and filters a group (kWidth)
GROUPS_PER_BLOCK = 4   # kGroupsPerBlock
MAX_TAPS = 9           # kMaxTaps: the weight's B fragments are registers
_TYPES = ("__half", "__nv_bfloat16", "float")
# (kNhwc, kKrsc): NCHW; channels-last activations with a KCRS weight; with a channels-last weight
_FORMS = ((False, False), (True, False), (True, True))
NAME_EXPRESSIONS = tuple(f"grouped_mma<{t},{str(d).lower()},{str(nhwc).lower()},{str(krsc).lower()}>"
                         for t in _TYPES for d in (False, True) for nhwc, krsc in _FORMS)
GROUPED_MMA_TILING_DTYPE = numpy.dtype([(f, numpy.int32) for f in (
    "rows", "halo_rows", "halo_cols", "phase_cols", "plane", "m_tiles")])
# Output pixels a block aims at (its bands are whole output rows) and the shared memory it keeps below where
# it can (several blocks per SM hide the staging's latency).
_TARGET_PIXELS = 128
_SMEM_TARGET = 64 << 10


def _even_bands(p: int, rows: int) -> int:
    """Rows of the bands of even height that cover ``p`` output rows in bands of at most ``rows`` (1 for none)."""
    return -(-p // -(-p // rows)) if p else 1


def _target_rows(spec: ConvSpec) -> int:
    """Output rows a block aims at: ``_TARGET_PIXELS`` of them, in bands of even height."""
    return _even_bands(spec.p, max(1, min(spec.p, _TARGET_PIXELS // max(1, spec.q))))


def blocks(spec: ConvSpec, pass_: str = "fprop") -> int:
    """The blocks of ``pass_``'s launch where shared memory leaves the bands their target height (0 for a dgrad
    it does not serve: at a stride)."""
    fspec = _forward(spec, pass_)
    if fspec is None:
        return 0
    return fspec.n * -(-fspec.groups // GROUPS_PER_BLOCK) * -(-fspec.p // _target_rows(fspec))


def tiling(spec: ConvSpec, dtype, smem_limit: int):
    """(GroupedMmaTiling values, threads, shared-memory bytes) of the forward ``spec``, or None where one output
    row's input rows for four groups do not fit ``smem_limit``."""
    per = 2 if numpy.dtype(dtype).itemsize == 2 else 1
    planes = GROUPS_PER_BLOCK * WIDTH // per
    (sh, sw), (dh, dw) = spec.stride, spec.dilation
    halo_cols = (spec.q - 1) * sw + (spec.s - 1) * dw + 1
    phase_cols = -(-halo_cols // sw)
    rows = _target_rows(spec)
    while True:
        rows = _even_bands(spec.p, rows)
        halo_rows = (rows - 1) * sh + (spec.r - 1) * dh + 1
        words = halo_rows * sw * phase_cols
        plane = words + (8 - words) % 32
        smem = planes * plane * 4
        if smem <= min(_SMEM_TARGET, smem_limit) or (rows == 1 and smem <= smem_limit):
            break
        if rows == 1:
            return None
        rows //= 2
    values = (rows, halo_rows, halo_cols, phase_cols, plane, -(-rows * spec.q // 16))
    return values, 32 * GROUPS_PER_BLOCK, smem


def _forward(spec: ConvSpec, pass_: str):
    return dgrad_forward.forward_spec(spec) if pass_ == "dgrad" else spec


def reason_unsupported(spec: ConvSpec, dtype, pass_: str = "fprop", precision: str = "ieee", limits=None):
    """Why ``grouped_mma`` cannot run this case, or None: tensor-core arithmetic (float16, bfloat16, float32 at
    "tf32"), several groups of 16 channels and 16 filters, kernels of up to 9 taps, four groups' input rows of
    one output row within a block's shared memory, batch and group count within a grid dimension; dgrad at
    stride 1 only (the forward of dy)."""
    if pass_ == "wgrad":
        return "it implements no wgrad"
    dtype = numpy.dtype(dtype)
    if not (dtype.itemsize == 2 or (dtype == numpy.float32 and precision == "tf32")):
        return "it computes on tensor cores: float16, bfloat16 or float32 at precision 'tf32'"
    fspec = _forward(spec, pass_)
    if fspec is None:
        return "its dgrad is a forward convolution of dy: stride 1 and padding within the dilated kernel only"
    if spec.groups < 2 or spec.c_per_group != WIDTH or spec.k_per_group != WIDTH:
        return f"it serves layers of several groups of {WIDTH} channels and {WIDTH} filters"
    if spec.r * spec.s > MAX_TAPS:
        return f"kernels of more than {MAX_TAPS} taps"
    if spec.n > 65535 or -(-spec.groups // GROUPS_PER_BLOCK) > 65535:
        return "more than 65535 samples or groups of four groups (a grid dimension)"
    if max(spec.c * spec.h * spec.w, spec.k * spec.p * spec.q) >= 2**31:
        return "a sample of 2^31 elements or more"
    limits = limits or _plan.current_limits()
    if tiling(fspec, dtype, limits.smem_limit) is None:
        return "one output row's input rows of four groups do not fit a block's shared memory"
    return None


def reason_unsupported_nhwc(spec: ConvSpec, dtype, pass_: str = "fprop", precision: str = "ieee", limits=None):
    """Why ``grouped_mma`` cannot run ``pass_`` on channels-last activations, or None: the cases it serves on NCHW
    ones (``reason_unsupported``), whose pixels of 16-channel groups are whole 16-byte vectors."""
    return None


def prepare(pass_: str, spec: ConvSpec, dtype, precision: str, env: "_plan.Env", bias: bool = False,
            layout: str = "nchw", weights: str = "kcrs") -> "_plan.Plan":
    """The plan of ``pass_`` (see ``cuconv._plan``): one launch, the forward's or (dgrad) the forward of dy's with
    the weight read transposed and flipped; ``layout="nhwc"``: the activations channels-last in memory, the weight
    KCRS or (``weights="krsc"``) channels-last too, read where it is."""
    reason = reason_unsupported(spec, dtype, pass_, precision, env)
    if reason is not None:
        raise ValueError(f"grouped_mma cannot run this {pass_}: {reason}")
    if layout not in ("nchw", "nhwc"):
        raise ValueError(f"grouped_mma: unknown layout {layout!r}")
    if weights not in ("kcrs", "krsc") or (weights == "krsc" and layout != "nhwc"):
        raise ValueError(f"grouped_mma: no {weights!r} weights with {layout!r} activations")
    b = _plan.Builder(pass_, env)
    fspec = _forward(spec, pass_)
    if fspec.n * fspec.k * fspec.p * fspec.q:
        values, threads, smem = tiling(fspec, dtype, env.smem_limit)
        grid = (-(-fspec.p // values[0]), -(-fspec.groups // GROUPS_PER_BLOCK), fspec.n)
        dgrad = pass_ == "dgrad"
        nhwc, krsc = layout == "nhwc", weights == "krsc"
        name = (f"grouped_mma<{_dtypes.ctype_of(dtype)},{str(dgrad).lower()},{str(nhwc).lower()},"
                f"{str(krsc).lower()}>")
        launch = _loader.prepare(STEM, NAME_EXPRESSIONS, name, grid, (threads, 1, 1), 4,
                                 (_loader.conv_geometry(fspec),
                                  numpy.array(values, dtype=GROUPED_MMA_TILING_DTYPE)[()]), smem)
        if dgrad:
            b.launch(launch, b.ref("dy"), b.ref("w"), _plan.NULL, b.ref("dx"))
        else:
            b.launch(launch, b.ref("x"), b.ref("w"), b.ref("bias"), b.ref("out"))
    return b.plan(STEM)



class GroupedMma(Algorithm):
    """``grouped_mma`` behind the algorithm contract (``cuconv.algos.base``)."""

    name = "grouped_mma"
    passes = ("fprop", "dgrad")
    layouts = ("nchw", "nhwc")
    weight_layouts = ("kcrs", "krsc")
    nchw_limits = staticmethod(reason_unsupported)
    nhwc_limits = staticmethod(reason_unsupported_nhwc)

    def build(self, p: Problem, env: "_plan.Env", **knobs) -> "_plan.Plan":
        return prepare(p.pass_, p.spec, p.dtype, p.precision, env, p.bias, p.layout, p.weights)


ALGORITHM = GroupedMma()
