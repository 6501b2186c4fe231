"""Algorithm ``direct_smem``: Python twin of ``kernels_cu/direct_smem.cu``, direct convolution from
shared-memory tiles with a register tile per thread.

A block of 256 threads computes ``TK`` output channels × ``TP`` output rows × ``TQ`` output columns of one
sample and group. Per chunk of ``ct`` input channels it stages the input window those outputs read (halo,
stride and dilation included) and the chunk's ``TK × R × S`` weights in shared memory, then each thread
accumulates a ``KT × QT`` tile in registers: per tap ``QT`` input loads and ``KT/4`` (float) 16-byte
weight loads feed ``KT·QT`` FMAs. No workspace besides a transposed copy of the weights.

Tile (template arguments, per accumulation type; two blocks per SM)::

    float accumulation (half, bfloat16, float): KT=16, QT=4, WK=2 -> TK=32, TP=4, TQ=128
    double:                                     KT=8,  QT=2, WK=4 -> TK=32, TP=2, TQ=64

Why these, for the large problems (K/groups = 64 or 128, Q = 250..1022, R·S = 9..45): per tap a warp of
16 × 4 tiles issues 4 conflict-free loads of x and 4 broadcast 16-byte loads of w (one shared-memory
wavefront each) for 64 FFMA: 8 FFMA per wavefront, twice the 4 at which an SM's shared memory (one
wavefront per clock) and FFMA pipes (four warp instructions per clock) balance, so the loop is FFMA-bound;
it fits 128 registers without spills (2 blocks of 256 threads per SM). TK = 32 divides K/groups = 64 and
128, and 128 columns waste at most 3% of Q there. Double keeps 16 accumulators per thread (8 × 2): 8 × 4
spills at the 128-register cap. Measured (fp32, docs/perf-notes.md): 128-accumulator tiles at one block per
SM (16 × 8, 32 × 4; up to 250 registers) are 7-10% slower: eight warps per SM hide less latency.

Pipeline (``plan``): up to three shared-memory buffers of ``ct`` input channels each, so that staging chunk
i + 2 (cp.async) overlaps the arithmetic of chunk i. The buffers of one block stay within ``_BLOCK_SMEM``
so that two blocks share an SM; ``ct`` is small enough that the chunks outnumber the buffers twice over
(a pipeline that is mostly prologue hides nothing). Where one channel's window needs more than a third
(half) of that budget, fewer buffers; past it, one buffer of one channel up to the device's limit, staged
and computed in turn; past the device's limit, ``reason_unsupported`` says so.
"""

from __future__ import annotations

import dataclasses

import numpy

from .. import _dtypes, _loader, _plan
from ..blocks import dgrad_forward
from ..spec import ConvSpec
from ..problem import Problem
from .base import Algorithm

__all__ = ["ALGORITHM", "DirectSmem", "prepare", "forward_gpu", "dgrad_gpu", "reason_unsupported", "plan", "Plan", "Tile", "TILES",
           "DIRECT_SMEM_TILING_DTYPE", "NAME_EXPRESSIONS", "STEM"]

STEM = "direct_smem"
_THREADS = _loader.THREADS  # kThreads in direct_smem.cu
# DirectSmemTiling in direct_smem.cu: the plan's tiling, the struct argument beside the ConvGeometry.
DIRECT_SMEM_TILING_DTYPE = numpy.dtype([(f, numpy.int64) for f in (
    "tiles_p", "tiles_q", "tiles_k", "ct_max", "stages", "stage_elems", "x_rows", "x_cols", "x_phase_cols")])
_WARPS = _THREADS // 32
_MAX_GRID_X = 2**31 - 1
_MAX_GRID_Y = 65535
_MAX_POSITION = 2**31 - 1  # positions inside a plane are int in the kernel
_MAX_STAGES = 3  # the kernel waits on cp.async groups for 1, 2 or 3 buffers
_BLOCK_SMEM = 112 << 10  # two blocks per SM (228 KB per SM on H100/H200, 1 KB of it reserved per block)



@dataclasses.dataclass(frozen=True)
class Tile:
    """Template arguments of one kernel instance: a thread computes ``kt`` output channels × ``qt`` output
    columns (32 apart); ``warps_k`` warps split the block's channels, the other warps take a row each."""

    kt: int
    qt: int
    warps_k: int
    min_blocks: int = 2  # blocks per SM the kernel's registers must allow

    @property
    def tk(self) -> int:
        """Output channels per block."""
        return self.warps_k * self.kt

    @property
    def tp(self) -> int:
        """Output rows per block."""
        return _WARPS // self.warps_k

    @property
    def tq(self) -> int:
        """Output columns per block."""
        return 32 * self.qt

    def kernel_name(self, ctype: str) -> str:
        return f"direct_smem<{ctype},{self.kt},{self.qt},{self.warps_k},{self.min_blocks}>"


# By accumulation type: the half types accumulate in float.
TILES = {"float": Tile(kt=16, qt=4, warps_k=2), "double": Tile(kt=8, qt=2, warps_k=4)}


def _acc_ctype(ctype: str) -> str:
    return "double" if ctype == "double" else "float"


NAME_EXPRESSIONS = tuple([TILES[_acc_ctype(t)].kernel_name(t) for t in _dtypes.ALL_CTYPE_NAMES]
                         + [f"transpose_weight<{t}>" for t in _dtypes.ALL_CTYPE_NAMES])


@dataclasses.dataclass(frozen=True)
class Plan:
    """How ``direct_smem`` walks one problem: its tile, the input channels staged per chunk (``ct``), the
    number of chunk buffers in flight (``stages``), the staged input window (``x_rows`` × ``x_cols``, halo
    included) and the grid."""

    tile: Tile
    ct: int
    stages: int
    x_rows: int
    x_cols: int
    x_phase_cols: int  # a staged row holds stride_w phases of this many columns (x_cols with stride 1)
    channel_bytes: int  # shared memory of one staged input channel: TK×R×S weights and its input window
    tiles_p: int
    tiles_q: int
    tiles_k: int
    grid: tuple

    acc_size: int  # bytes of the arithmetic type staged in shared memory

    taps: int  # R·S
    x_pitch: int  # elements of one staged row: stride_w · x_phase_cols

    @property
    def stage_elems(self) -> int:
        """Elements of one chunk buffer: ws, then xs rounded up to 16 bytes so that every buffer's ws (read
        as 16-byte vectors) stays aligned."""
        ws = self.ct * self.taps * self.tile.tk
        xs = self.ct * self.x_rows * self.x_pitch
        per_vector = 16 // self.acc_size
        return ws + -(-xs // per_vector) * per_vector

    @property
    def smem_bytes(self) -> int:
        return self.stages * self.stage_elems * self.acc_size


def plan(spec: ConvSpec, dtype, smem_limit: int) -> Plan:
    """The tile of ``dtype``; as many chunk buffers (up to three) as fit the block budget (``_BLOCK_SMEM``,
    or less where the device allows less) with one channel each; then as many input channels per chunk as
    fit, at most a ``2·stages``-th of the channels; then the smallest chunk that needs no more chunks than
    that (the kernel walks chunks of ``ct`` with a shorter last one: C/groups = 16 with room for 7 in one
    buffer becomes 6 + 6 + 4, not 7 + 7 + 2)."""
    dtype = numpy.dtype(dtype)
    acc_size = 8 if dtype == numpy.float64 else 4
    tile = TILES["double" if acc_size == 8 else "float"]
    (sh, sw), (dh, dw) = spec.stride, spec.dilation
    x_rows = (tile.tp - 1) * sh + (spec.r - 1) * dh + 1
    x_cols = (tile.tq - 1) * sw + (spec.s - 1) * dw + 1
    x_phase_cols = -(-x_cols // sw)
    channel_bytes = (spec.r * spec.s * tile.tk + x_rows * sw * x_phase_cols) * acc_size
    cpg = max(1, spec.c_per_group)
    # 64 bytes of slack for the 16-byte rounding of each buffer
    budget = min(_BLOCK_SMEM, smem_limit - 64)
    stages = max(1, min(_MAX_STAGES, budget // channel_bytes))
    ct = max(1, min(cpg, budget // (stages * channel_bytes), -(-cpg // (2 * stages))))
    ct = -(-cpg // -(-cpg // ct))
    tiles_p, tiles_q, tiles_k = -(-spec.p // tile.tp), -(-spec.q // tile.tq), -(-spec.k_per_group // tile.tk)
    grid = (spec.n * tiles_p * tiles_q, spec.groups * tiles_k, 1)
    return Plan(tile, ct, stages, x_rows, x_cols, x_phase_cols, channel_bytes, tiles_p, tiles_q, tiles_k, grid,
                acc_size, spec.r * spec.s, sw * x_phase_cols)


def reason_unsupported(spec: ConvSpec, dtype, pass_: str = "fprop", precision: str = "ieee",
                       limits: "_plan.Limits" = None):
    """Why ``direct_smem`` cannot run this case under ``limits`` (default: the current device's), or None."""
    return dgrad_forward.reason_unsupported(spec, dtype, pass_, precision, _forward_reason, limits)


def _forward_reason(spec: ConvSpec, dtype, precision: str, limits: "_plan.Limits"):
    weight_bytes = spec.k * spec.crs_per_group * numpy.dtype(dtype).itemsize
    if weight_bytes > limits.workspace_limit:
        return (f"its transposed weight needs {weight_bytes} bytes, more than cuconv.config.workspace_limit "
                f"({limits.workspace_limit})")
    pl = plan(spec, dtype, limits.smem_limit)
    limit = limits.smem_limit
    if pl.smem_bytes > limit:
        return (f"one input channel's tile needs {pl.smem_bytes} bytes of shared memory (an {pl.x_rows}x"
                f"{pl.x_cols} input window and {pl.tile.tk}x{spec.r}x{spec.s} weights); the device allows "
                f"{limit}")
    if pl.grid[0] > _MAX_GRID_X or pl.grid[1] > _MAX_GRID_Y:
        return f"its grid {pl.grid} exceeds the CUDA limits ({_MAX_GRID_X}, {_MAX_GRID_Y}, 1)"
    if max(spec.h + spec.pad[0] + spec.pad[1] + pl.x_rows,
           spec.w + spec.pad[2] + spec.pad[3] + pl.x_cols) > _MAX_POSITION:
        return "the padded input is too large for the kernel's 32-bit positions inside a plane"
    return None


def prepare(pass_: str, spec: ConvSpec, dtype, precision: str, env: "_plan.Env", bias: bool = False) -> "_plan.Plan":
    """The plan of ``pass_`` (see ``cuconv._plan``): the weight transposed into the workspace (``transpose_weight``,
    (groups, C/g·R·S, K/g): one tap's k tile contiguous), then one launch (``precision``: FFMA, nothing to
    choose; half types sum in float32); dgrad as the forward convolution of dy (``dgrad_forward``)."""
    if pass_ == "dgrad":
        return dgrad_forward.prepare(prepare, spec, dtype, precision, env)
    dtype = numpy.dtype(dtype)
    b = _plan.Builder(pass_, env)
    if spec.n * spec.k * spec.p * spec.q == 0:
        return b.plan(STEM)
    pl = plan(spec, dtype, env.smem_limit)
    ctype = _dtypes.ctype_of(dtype)
    i64 = numpy.int64
    w_gck = b.take(spec.k * spec.crs_per_group * dtype.itemsize)
    total = spec.k * spec.crs_per_group
    name = f"transpose_weight<{ctype}>"
    b.launch(_loader.prepare(STEM, NAME_EXPRESSIONS, name, (_loader.blocks(total), 1, 1),
                             (_THREADS, 1, 1), 2, (i64(spec.groups), i64(spec.k_per_group), i64(spec.crs_per_group))),
             b.ref("w"), w_gck)
    name = pl.tile.kernel_name(ctype)
    tiling = numpy.array((pl.tiles_p, pl.tiles_q, pl.tiles_k, pl.ct, pl.stages, pl.stage_elems, pl.x_rows, pl.x_cols,
                          pl.x_phase_cols), dtype=DIRECT_SMEM_TILING_DTYPE)[()]
    b.launch(_loader.prepare(STEM, NAME_EXPRESSIONS, name, pl.grid, (_THREADS, 1, 1), 4,
                             (_loader.conv_geometry(spec), tiling), pl.smem_bytes),
             b.ref("x"), w_gck, b.ref("bias"), b.ref("out"))
    return b.plan(STEM)


def forward_gpu(x, w, bias, spec: ConvSpec, out, precision: str) -> None:
    """out = conv(x, w) + bias on C-contiguous CuPy arrays, current stream (``prepare`` and run)."""
    _plan.run_on_arrays(prepare, "fprop", spec, precision, x, w, bias, out)


def dgrad_gpu(dy, w, spec: ConvSpec, dx, precision: str) -> None:
    """dx = conv2d_input(dy, w) as this algorithm's forward convolution of dy (stride 1; ``dgrad_forward``)."""
    _plan.run_on_arrays(prepare, "dgrad", spec, precision, dy, w, dx)


class DirectSmem(Algorithm):
    """``direct_smem`` behind the algorithm contract (``cuconv.algos.base``)."""

    name = "direct_smem"
    passes = ("fprop", "dgrad")
    nchw_limits = staticmethod(reason_unsupported)

    def build(self, p: Problem, env: "_plan.Env", **knobs) -> "_plan.Plan":
        return prepare(p.pass_, p.spec, p.dtype, p.precision, env, p.bias)


ALGORITHM = DirectSmem()
