"""Algorithm ``winograd_fused``: Python twin of ``kernels_cu/winograd_fused.cu``, a 3x3 convolution (stride 1,
dilation 1, one group) in float32 as Winograd F(2x2, 3x3) in one kernel: each block transforms its input
tiles into shared memory, runs the 16 point-wise GEMMs over the input channels in registers (FFMA) and
transforms its 2x2 output tiles back, so no transformed operand goes through global memory (``winograd``
writes and re-reads ``V`` and ``M``: for ``square_3x3_1024``, 16 input channels and 128 filters, ``M`` is 36
values per 16 outputs, 19 GB of traffic per pass). 16 products per 4 outputs and channel instead of 36.

A call transforms the weights once (``winograd_fused_weight``, into a ``(16, C, K)`` workspace padded to
the tile) and launches one kernel; nothing else. Its epilogue computes an output that comes out NaN or Inf (a
tile with a non-finite input spoils all its outputs) again directly from its window, from the weights as given.
Float32 only, any ``precision`` (the arithmetic is IEEE FFMA either way; tensor-core precisions are faster on
``implicit_gemm``). Its transforms hold only 0, ±1 and ±1/2, so integer-valued inputs of moderate size are summed
exactly, like a direct sum.

Tiles (``Tile``): ``bk`` filters × ``bt`` tiles (a row of ``bt`` 2x2 tiles: 2 output rows × 2·bt columns)
per block of ``warps`` warps, ``cc`` input channels per chunk (two chunks in flight). The 16 points split
over the warps; a lane keeps 128 accumulators (8 filters × 8 or 4 tiles × 2 or 4 points).

dgrad at stride 1 is the forward convolution of ``dy`` (``dgrad_forward``), so it serves that too.
"""

from __future__ import annotations

import dataclasses

import numpy

from .. import _loader, _plan
from ..blocks import dgrad_forward, elementwise
from ..spec import ConvSpec
from ..problem import Problem
from .base import Algorithm
from .winograd import _round_up

__all__ = ["ALGORITHM", "WinogradFused", "prepare", "forward_gpu", "dgrad_gpu", "reason_unsupported", "plan", "Plan", "Tile", "TILES",
           "NAME_EXPRESSIONS", "STEM", "EXACT_ON_INTEGERS"]

STEM = "winograd_fused"
EXACT_ON_INTEGERS = True  # transforms of 0, ±1 and ±1/2: integer inputs give multiples of 1/4, held exactly

_POINTS = 16
_MAX_GRID_X = 2**31 - 1
_WEIGHT_THREADS = 256


@dataclasses.dataclass(frozen=True)
class Tile:
    """Template arguments of one instance of ``winograd_fused_3x3``."""

    bk: int  # filters per block
    bt: int  # 2x2 output tiles per block, along a row
    warps: int
    cc: int  # input channels per chunk
    min_blocks: int  # per SM: caps the registers a thread may use
    # M's shared memory beside the staging buffers: a block runs items in turn (a block per SM), the next
    # item's first chunk arriving while this one's outputs are transformed and stored
    overlap: bool = False

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def smem_bytes(self) -> int:
        """Two chunk buffers of U (16 × cc × bk), V (16 × cc × bt) and the input rows (cc × 4 × the 2·bt + 2
        columns rounded up to 32), and half the filters' M (16 × bk / 2 × (bt + 4)) beside them (``overlap``) or
        over them (``Config::kSmemFloats`` in the kernel)."""
        raw_pitch = _round_up(2 * self.bt + 2, 32)
        staging = 2 * (_POINTS * self.cc * (self.bk + self.bt) + self.cc * 4 * raw_pitch)
        m_half = _POINTS * self.bk // 2 * (self.bt + 4)
        return 4 * (staging + m_half if self.overlap else max(staging, m_half))

    @property
    def kernel_name(self) -> str:
        overlap = "true" if self.overlap else "false"
        return f"winograd_fused_3x3<{self.bk},{self.bt},{self.warps},{self.cc},{self.min_blocks},{overlap}>"


# wide: 64 filters × 32 tiles (64 columns), 8 warps, one block per SM; with overlap (192 KB of shared memory:
# H100/H200) a block per SM runs the items in turn, else (120 KB: A100) a block per item;
# narrow: 64 × 16 tiles, 4 warps, 96 KB (registers capped for two blocks per SM where the shared memory allows
# two), for devices with less shared memory (sm_86/sm_89: one block per SM).
# (An 8-warp tile of 64 x 16 tiles, 64 accumulators a lane at two blocks per SM, ran 15.2 ms against the wide
# tile's 13.9 on square_3x3_1024: dropped, docs/perf-notes.md.)
TILES = (Tile(bk=64, bt=32, warps=8, cc=8, min_blocks=1, overlap=True),
         Tile(bk=64, bt=32, warps=8, cc=8, min_blocks=1),
         Tile(bk=64, bt=16, warps=4, cc=8, min_blocks=2))
_TILE_NAMES = ("wide_overlap", "wide", "narrow")  # (a knob's text)
_WEIGHT_KERNEL = "winograd_fused_weight"
NAME_EXPRESSIONS = (_WEIGHT_KERNEL,) + tuple(t.kernel_name for t in TILES)

# FusedTiles in winograd_fused.cu: the fused kernel's argument beside the cuconv::ConvGeometry.
FUSED_TILES_DTYPE = numpy.dtype([("c_pad", numpy.int64), ("k_pad", numpy.int64), ("tiles_h", numpy.int32),
                                 ("col_blocks", numpy.int32), ("k_blocks", numpy.int32), ("items", numpy.int32)])


@dataclasses.dataclass(frozen=True)
class Plan:
    """One problem's tile, its padded channel counts (U's shape is ``(16, c_pad, k_pad)``) and work items (a
    block's worth each; ``blocks`` of them)."""

    tile: Tile
    c_pad: int
    k_pad: int
    tiles_h: int
    col_blocks: int
    k_blocks: int
    items: int

    @property
    def u_bytes(self) -> int:
        return 4 * _POINTS * self.c_pad * self.k_pad


def plan(spec: ConvSpec, tile: Tile = None, smem_limit: int = None) -> Plan:
    """The tile (unless given, the first of ``TILES`` whose shared memory, at most ``smem_limit``, a block gets)
    and grid."""
    if tile is None:
        tile = next((t for t in TILES if t.smem_bytes <= smem_limit), TILES[-1])
    tiles_h, tiles_w = -(-spec.p // 2), -(-spec.q // 2)
    col_blocks = -(-tiles_w // tile.bt)
    k_pad = _round_up(spec.k, tile.bk)
    k_blocks = k_pad // tile.bk
    return Plan(tile, _round_up(spec.c, tile.cc), k_pad, tiles_h, col_blocks, k_blocks,
                spec.n * tiles_h * col_blocks * k_blocks)


def reason_unsupported(spec: ConvSpec, dtype, pass_: str = "fprop", precision: str = "ieee",
                       limits: "_plan.Limits" = None):
    """Why ``winograd_fused`` cannot run this case under ``limits`` (default: the current device's), or None."""
    return dgrad_forward.reason_unsupported(spec, dtype, pass_, precision, _forward_reason, limits)


def _forward_reason(spec: ConvSpec, dtype, precision: str, limits: "_plan.Limits", tile: Tile = None):
    """Why the forward of ``spec`` cannot run on ``tile`` (None: the largest that fits) under ``limits``, or None."""
    dtype = numpy.dtype(dtype)
    if dtype != numpy.float32:
        return (f"it computes in float32 only, not {dtype} (a thread's 128 accumulators would take 256 registers "
                f"in float64; winograd serves float64)")
    if (spec.r, spec.s) != (3, 3) or spec.stride != (1, 1) or spec.dilation != (1, 1):
        return "it needs a 3x3 kernel, stride 1 and dilation 1"
    if spec.groups != 1:
        return "it needs groups=1"
    pl = plan(spec, tile, smem_limit=limits.smem_limit)
    limit = limits.smem_limit
    if pl.tile.smem_bytes > limit:
        return f"its tile needs {pl.tile.smem_bytes} bytes of shared memory; the device allows {limit}"
    if pl.items > _MAX_GRID_X:
        return f"its {pl.items} work items exceed the 31-bit item numbers of its grid ({_MAX_GRID_X})"
    if pl.u_bytes > limits.workspace_limit:
        return (f"its transformed weights ({pl.u_bytes} bytes) exceed cuconv.config.workspace_limit="
                f"{limits.workspace_limit}")
    return None


def prepare(pass_: str, spec: ConvSpec, dtype, precision: str, env: "_plan.Env", bias: bool = False,
            tile: Tile = None, grid: int = None) -> "_plan.Plan":
    """The plan of ``pass_`` (see ``cuconv._plan``): the transformed weights U (16 points × c_pad × k_pad, zero
    padded) into the workspace, then one launch (FFMA at any precision); dgrad as the forward convolution of dy
    (``dgrad_forward``). ``tile`` forces one of ``TILES`` and ``grid`` the blocks an ``overlap`` tile's items
    are shared among (tests; default a block per SM)."""
    if pass_ == "dgrad":
        return dgrad_forward.prepare(prepare, spec, dtype, precision, env, tile=tile, grid=grid)
    b = _plan.Builder(pass_, env)
    if spec.n * spec.k * spec.p * spec.q == 0:
        return b.plan(STEM)
    pl = plan(spec, tile, env.smem_limit)
    i64 = numpy.int64
    u_count = _POINTS * pl.c_pad * pl.k_pad
    u = b.take(u_count * 4)
    b.launch(elementwise.fill(numpy.float32, u_count), u)
    if spec.c:
        weight_grid = (_loader.blocks(spec.k * spec.c, threads=_WEIGHT_THREADS), 1, 1)
        b.launch(_loader.prepare(STEM, NAME_EXPRESSIONS, _WEIGHT_KERNEL, weight_grid, (_WEIGHT_THREADS, 1, 1), 2,
                                 (i64(spec.k), i64(spec.c), i64(pl.c_pad), i64(pl.k_pad))),
                 b.ref("w"), u)
    t = pl.tile
    tiles = numpy.array((pl.c_pad, pl.k_pad, pl.tiles_h, pl.col_blocks, pl.k_blocks, pl.items),
                        dtype=FUSED_TILES_DTYPE)
    scalars = (_loader.conv_geometry(spec), tiles[()])
    if not t.overlap:
        blocks = pl.items
    else:  # its shared memory allows one block per SM
        blocks = min(pl.items, env.sm_count if grid is None else grid)
    b.launch(_loader.prepare(STEM, NAME_EXPRESSIONS, t.kernel_name, (blocks, 1, 1), (t.threads, 1, 1), 5, scalars,
                             t.smem_bytes),
             b.ref("x"), u, b.ref("bias"), b.ref("out"), b.ref("w"))
    return b.plan(STEM)


def forward_gpu(x, w, bias, spec: ConvSpec, out, precision: str, tile: Tile = None, grid: int = None) -> None:
    """out = conv(x, w) + bias on C-contiguous float32 CuPy arrays, current stream (FFMA at any precision);
    ``tile`` and ``grid`` as in ``prepare`` (tests)."""
    _plan.run_on_arrays(prepare, "fprop", spec, precision, x, w, bias, out, tile=tile, grid=grid)


def dgrad_gpu(dy, w, spec: ConvSpec, dx, precision: str) -> None:
    """dx = conv2d_input(dy, w) as this algorithm's forward convolution of dy (stride 1; ``dgrad_forward``)."""
    _plan.run_on_arrays(prepare, "dgrad", spec, precision, dy, w, dx)


class WinogradFused(Algorithm):
    """``winograd_fused`` behind the algorithm contract (``cuconv.algos.base``)."""

    name = "winograd_fused"
    passes = ("fprop", "dgrad")
    exact_on_integers = EXACT_ON_INTEGERS
    nchw_limits = staticmethod(reason_unsupported)

    def knobs(self, p: Problem, env: "_plan.Env") -> tuple:
        """``{}`` (the first of ``TILES`` that fits a block's shared memory: what the device allows, no measured
        choice), then ``{"tile": t}`` for the other tiles that can run the problem (the autotuner times them)."""
        fspec = p.spec if p.pass_ == "fprop" else dgrad_forward.forward_spec(p.spec)
        default = plan(fspec, smem_limit=env.smem_limit).tile
        return ({},) + tuple({"tile": t} for t in TILES
                             if t is not default and _forward_reason(fspec, p.dtype, p.precision, env, t) is None)

    def knob_text(self, knobs: dict) -> str:
        return ",".join(f"{k}={_TILE_NAMES[TILES.index(v)] if k == 'tile' else v}" for k, v in sorted(knobs.items()))

    def build(self, p: Problem, env: "_plan.Env", **knobs) -> "_plan.Plan":
        return prepare(p.pass_, p.spec, p.dtype, p.precision, env, p.bias, **knobs)


ALGORITHM = WinogradFused()
