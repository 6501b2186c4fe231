"""Algorithm ``grouped_direct``: Python twin of ``kernels_cu/grouped_direct.cu``, the forward of grouped layers with
few channels and filters per group, FFMA out of shared memory; its dgrad at stride 1 is that forward on ``dy``
(``dgrad_forward``).

A block holds one group's whole weight and a band of its input rows in shared memory and computes every output
of that band; each thread FK filters (up to 8) of PX neighbouring columns. The arithmetic is FFMA in float32
(float64 for double), so tensor-core precisions get a more exact result than they ask for.
"""

from __future__ import annotations

import numpy

from .. import _dtypes, _loader, _plan
from ..spec import ConvSpec
from ..problem import Problem
from .base import Algorithm
from ..blocks import dgrad_forward

__all__ = ["ALGORITHM", "GroupedDirect", "prepare", "reason_unsupported", "tiling", "GROUPED_TILING_DTYPE", "NAME_EXPRESSIONS", "STEM",
           "MAX_GROUP_WIDTH"]

STEM = "grouped_direct"
FILTERS_PER_THREAD = (8, 4, 2, 1)  # (16 a thread ran slower: more registers, fewer blocks)
COLUMNS_PER_THREAD = (4, 2, 1)
NAME_EXPRESSIONS = tuple(f"grouped_direct<{t},{fk},{px}>" for t in _dtypes.ALL_CTYPE_NAMES
                         for fk in FILTERS_PER_THREAD for px in COLUMNS_PER_THREAD)
GROUPED_TILING_DTYPE = numpy.dtype([(f, numpy.int32) for f in ("rows", "col_blocks", "filter_blocks", "chunk",
                                                                 "in_rows", "in_cols")])
MAX_GROUP_WIDTH = 64  # channels and filters per group: wider groups are GEMM-sized
_SMEM = _loader.SMEM_DEFAULT  # (no opt-in: several blocks per SM)
_THREADS = _loader.THREADS  # at most: the kernel's __launch_bounds__


def tiling(spec: ConvSpec, dtype):
    """(FK, PX, GroupedTiling values, threads (whole warps), shared-memory bytes) of the forward, or None where
    one group's weight and one input row band do not fit the shared memory of a block."""
    acc = 8 if numpy.dtype(dtype) == numpy.float64 else 4
    kg, cg, rs = spec.k_per_group, spec.c_per_group, spec.r * spec.s
    fk = next(f for f in FILTERS_PER_THREAD if kg % f == 0)
    px = next(c for c in COLUMNS_PER_THREAD if spec.q >= 4 * c) if spec.q >= 4 else 1
    col_blocks = -(-spec.q // px)
    filter_blocks = kg // fk
    per_row = col_blocks * filter_blocks
    if per_row > _THREADS:
        return None
    (sh, sw), (dh, dw) = spec.stride, spec.dilation
    in_cols = (col_blocks * px - 1) * sw + (spec.s - 1) * dw + 1
    w_bytes = (-(-cg * rs * kg // 4) * 4) * acc
    rows = min(spec.p, _THREADS // per_row)
    while rows >= 1:
        row_blocks = -(-spec.p // rows)
        rows = -(-spec.p // row_blocks)  # (bands of even height)
        in_rows = (rows - 1) * sh + (spec.r - 1) * dh + 1
        chunk = min(cg, (_SMEM - w_bytes) // (in_rows * in_cols * acc)) if _SMEM > w_bytes else 0
        if chunk >= 1:
            threads = -(-rows * per_row // 32) * 32  # (whole warps: the band's loads go a warp per row)
            return (fk, px, (rows, col_blocks, filter_blocks, chunk, in_rows, in_cols), threads,
                    w_bytes + chunk * in_rows * in_cols * acc)
        rows //= 2
    return None


def reason_unsupported(spec: ConvSpec, dtype, pass_: str = "fprop", precision: str = "ieee", limits=None):
    """Why ``grouped_direct`` cannot run this case, or None: groups of up to ``MAX_GROUP_WIDTH`` channels and
    filters (several groups, not depthwise ones), a group's weight and an input band within a block's shared
    memory, a batch and group count within a grid's 65535; dgrad at stride 1 only (as a forward of dy), its
    flipped weight within the workspace limit."""
    if pass_ == "wgrad":
        return "it implements no wgrad"
    if pass_ == "dgrad":
        fspec = dgrad_forward.forward_spec(spec)
        if fspec is None:
            return "its dgrad is a forward convolution of dy: stride 1 and padding within the dilated kernel only"
        need, limit = dgrad_forward.flipped_bytes(spec, dtype), (limits or _plan.current_limits()).workspace_limit
        if need > limit:
            return f"its dgrad's flipped weight needs {need} bytes, more than cuconv.config.workspace_limit ({limit})"
        spec = fspec
    if spec.groups < 2 or spec.c_per_group < 2:
        return "it serves grouped layers of at least two groups and two channels per group"
    if max(spec.c_per_group, spec.k_per_group) > MAX_GROUP_WIDTH:
        return f"groups wider than {MAX_GROUP_WIDTH} channels or filters are GEMM-sized"
    if spec.n > 65535 or spec.groups > 65535:
        return "more than 65535 samples or groups (a grid dimension)"
    if max(spec.h * spec.w, spec.p * spec.q, spec.c * spec.h * spec.w, spec.k * spec.p * spec.q) >= 2**31:
        return "a sample of 2^31 elements or more"
    if tiling(spec, dtype) is None:
        return "a group's weight and one band of input rows do not fit a block's shared memory"
    return None


def prepare(pass_: str, spec: ConvSpec, dtype, precision: str, env: "_plan.Env", bias: bool = False) -> "_plan.Plan":
    """The plan of ``pass_`` (see ``cuconv._plan``): the forward is one launch; the dgrad the weight's flip
    and the forward of dy (``dgrad_forward``)."""
    reason = reason_unsupported(spec, dtype, pass_, precision, env)
    if reason is not None:
        raise ValueError(f"grouped_direct cannot run this {pass_}: {reason}")
    if pass_ == "dgrad":
        return dgrad_forward.prepare(prepare, spec, dtype, precision, env)
    b = _plan.Builder(pass_, env)
    if spec.n * spec.k * spec.p * spec.q:
        fk, px, values, threads, smem = tiling(spec, dtype)
        rows = values[0]
        grid = (-(-spec.p // rows), spec.groups, spec.n)
        name = f"grouped_direct<{_dtypes.ctype_of(dtype)},{fk},{px}>"
        b.launch(_loader.prepare(STEM, NAME_EXPRESSIONS, name, grid, (threads, 1, 1), 4,
                                 (_loader.conv_geometry(spec), numpy.array(values, dtype=GROUPED_TILING_DTYPE)[()]),
                                 smem),
                 b.ref("x"), b.ref("w"), b.ref("bias"), b.ref("out"))
    return b.plan(STEM)


class GroupedDirect(Algorithm):
    """``grouped_direct`` behind the algorithm contract (``cuconv.algos.base``)."""

    name = "grouped_direct"
    passes = ("fprop", "dgrad")
    nchw_limits = staticmethod(reason_unsupported)

    def build(self, p: Problem, env: "_plan.Env", **knobs) -> "_plan.Plan":
        return prepare(p.pass_, p.spec, p.dtype, p.precision, env, p.bias)


ALGORITHM = GroupedDirect()
