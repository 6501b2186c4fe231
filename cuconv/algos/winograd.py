"""Algorithm ``winograd``: Python twin of ``kernels_cu/winograd.cu``, a Winograd (Toom-Cook) convolution in
plain float32 / float64 arithmetic with cuBLAS GEMMs (not fused: the transformed operands live in the
workspace).

Per axis a kernel of ``r`` taps gets output tiles of ``m`` positions, F(m, r), from ``m + r - 1`` input
positions (``TILE_BY_TAPS``): 6 points for 2 to 5 taps, 7 for 6 and 8 for 7; an axis of 1 tap is left
alone. A 5x7 kernel thus runs F(2x2, 5x7): 48 products per 2x2 outputs instead of 4·35 = 140 (2.9x fewer
multiplications), 3x3 runs F(4x4, 3x3) (4x fewer), 1x7 runs F(1x2, 1x7) (1.75x fewer). Per chunk of whole
tile rows, three steps on the current stream:

1. ``winograd_input``: every input tile (halo and padding included) to ``V (A, C, tiles)``, ``A = AH·AW``;
2. cuBLAS: ``M[a] (K, tiles) = U[a] (K, C) @ V[a] (C, tiles)`` for the ``A`` points, one strided-batched
   GEMM (``U``: the weights transformed once per call by ``winograd_weight``);
3. ``winograd_output``: ``M`` back to output tiles, bias added, written to ``out`` (NCHW); an output that
   comes out NaN or Inf is computed again directly from its window, so that non-finite inputs spoil exactly
   the outputs they spoil in a direct sum (a tile's transforms mix all its inputs).

Where it pays: many input and output channels (the GEMMs reduce over C and write K rows per point) and
large images. Its traffic is ``A·(C + K)`` values per output tile against ``K·m_h·m_w`` outputs, so it
loses to direct kernels where C or K is small.

Accuracy: the transforms multiply by fractions (1/2, 1/6, 1/180, ...), so errors grow with the number of
points, and like any sum with the number of channels summed (about as their square root). Normwise
relative errors in float32 against float64 on an H200, C = K = 512: 4.5e-6 (3x3), 5.1e-6 (5x5), 8.1e-6
(6x6), 1.07e-5 (7x7; 1.53e-5 with 1024 channels), against 0.5-1e-6 for a direct sum; rect_5x7's dgrad
(128 channels) 3.7e-6. float32 is therefore served up to ``FLOAT32_MAX_CHANNELS`` input channels per
point count of the larger axis (512 with 6 points, 192 with 7, 128 with 8), where the error stays near
half of cuconv's 1e-5; float64 stays near 1e-14 at any size. Integer-valued inputs are not summed exactly
(the fractions), unlike every other algorithm. float32 runs its GEMMs in IEEE fp32 whatever ``precision``
says (TF32 on top of the transforms would leave the tf32 error budget); half precisions are refused.

dgrad at stride 1 is the forward convolution of ``dy`` (``dgrad_forward``), so ``winograd`` serves it too.
"""

from __future__ import annotations

import dataclasses

import numpy

from .. import _dtypes, _loader, _plan
from ..blocks import dgrad_forward
from .im2col_gemm import _balanced
from ..spec import ConvSpec
from ..problem import Problem
from .base import Algorithm

__all__ = ["ALGORITHM", "Winograd", "prepare", "forward_gpu", "dgrad_gpu", "reason_unsupported", "plan", "Plan", "TILE_BY_TAPS",
           "FLOAT32_MAX_CHANNELS", "NAME_EXPRESSIONS", "STEM", "EXACT_ON_INTEGERS"]

STEM = "winograd"
EXACT_ON_INTEGERS = False  # the transforms hold fractions: see the module docstring

# Output positions per tile along an axis, by the axis's taps: F(m, r) on m + r - 1 <= 8 points.
TILE_BY_TAPS = {1: 1, 2: 5, 3: 4, 4: 3, 5: 2, 6: 2, 7: 2}
# float32: most input channels per GEMM, by the points of the kernel's larger axis (errors above).
FLOAT32_MAX_CHANNELS = {6: 512, 7: 192, 8: 128}
_MAX_GRID_Y = 65535  # channels are blockIdx.y
_LD_ALIGN = 32  # elements: the GEMM operands' leading dimension, 128 bytes in float32
_MAX_INT = 2**31 - 1

_CTYPES = ("float", "double")
_KERNELS = ("winograd_weight", "winograd_input", "winograd_output")


def _names(ctype: str, r: int, s: int) -> tuple:
    mh, mw = TILE_BY_TAPS[r], TILE_BY_TAPS[s]
    return tuple(f"{kernel}<{ctype},{mh},{r},{mw},{s}>" for kernel in _KERNELS)


# Every instance this module launches: (R, S) in 1..7 (but 1x1), float and double. Each kernel is
# compiled on first use, alone (``_loader.get_function``), so a process builds only the
# sizes it runs; CI compiles them all.
_SIZES = tuple((r, s) for r in TILE_BY_TAPS for s in TILE_BY_TAPS if r * s > 1)
NAME_EXPRESSIONS = tuple(n for t in _CTYPES for r, s in _SIZES for n in _names(t, r, s))

# WinoChunk in winograd.cu: a launch's chunk of tiles (winograd_input's and winograd_output's argument beside the
# cuconv::ConvGeometry).
WINO_CHUNK_DTYPE = numpy.dtype([(f, numpy.int64) for f in ("tiles_h", "tiles_w", "row0", "tiles", "ld")])


@dataclasses.dataclass(frozen=True)
class Plan:
    """Tiles of one problem and how they are chunked: ``m_h x m_w`` outputs per tile from ``a_h x a_w``
    inputs, ``tiles_h x tiles_w`` tiles per image, ``rows`` tile rows (of every sample, in order) per chunk;
    ``ld`` is the padded column count of the chunk's V and M."""

    m_h: int
    m_w: int
    a_h: int
    a_w: int
    tiles_h: int
    tiles_w: int
    rows: int
    ld: int
    u_bytes: int
    chunk_bytes: int

    @property
    def points(self) -> int:
        return self.a_h * self.a_w


def _round_up(v: int, to: int) -> int:
    return -(-v // to) * to


def plan(spec: ConvSpec, dtype, workspace_limit: int) -> Plan:
    """Tiles and chunks for ``spec`` in ``dtype``: as many tile rows per chunk as the workspace limit holds
    beside the transformed weights (at most every tile row of the batch), or 0 where not even one fits."""
    limit = workspace_limit
    item = numpy.dtype(dtype).itemsize
    m_h, m_w = TILE_BY_TAPS.get(spec.r, 1), TILE_BY_TAPS.get(spec.s, 1)
    a_h, a_w = m_h + spec.r - 1, m_w + spec.s - 1
    tiles_h, tiles_w = -(-spec.p // m_h), -(-spec.q // m_w)
    points = a_h * a_w
    u_bytes = points * spec.k * spec.c * item
    per_column = points * (spec.c + spec.k) * item  # one tile's V and M
    total_rows = spec.n * tiles_h
    rows = 0
    if total_rows:
        fit = min((limit - u_bytes) // per_column, _MAX_INT - _LD_ALIGN)  # columns
        rows = max(0, min(total_rows, fit // tiles_w))
        while rows and _round_up(rows * tiles_w, _LD_ALIGN) > fit:
            rows -= 1
        if rows:  # as few chunks as that allows, of equal length where they divide the rows
            rows = _balanced(total_rows, rows)
    ld = _round_up(rows * tiles_w, _LD_ALIGN)
    return Plan(m_h, m_w, a_h, a_w, tiles_h, tiles_w, rows, ld, u_bytes, ld * per_column)


def reason_unsupported(spec: ConvSpec, dtype, pass_: str = "fprop", precision: str = "ieee",
                       limits: "_plan.Limits" = None):
    """Why ``winograd`` cannot run this case under ``limits`` (default: the current device's), or None."""
    return dgrad_forward.reason_unsupported(spec, dtype, pass_, precision, _forward_reason, limits)


def _forward_reason(spec: ConvSpec, dtype, precision: str, limits: "_plan.Limits"):
    dtype = numpy.dtype(dtype)
    if dtype not in (numpy.float32, numpy.float64):
        return f"it computes in float32 or float64, not {dtype} (its transforms need the bits)"
    if dtype == numpy.float32 and precision != "ieee":
        return "it runs float32 at precision 'ieee' only: TF32 on top of its transforms' error leaves tf32's budget"
    if spec.stride != (1, 1) or spec.dilation != (1, 1):
        return "it needs stride 1 and dilation 1"
    if spec.groups != 1:
        return "it needs groups=1"
    if spec.r not in TILE_BY_TAPS or spec.s not in TILE_BY_TAPS or spec.r * spec.s == 1:
        return f"its kernels are 1 to 7 taps per axis and not 1x1, not {spec.r}x{spec.s}"
    if max(spec.c, spec.k) > _MAX_GRID_Y:
        return f"its grids put channels on blockIdx.y (at most {_MAX_GRID_Y}), not C={spec.c}, K={spec.k}"
    pl = plan(spec, dtype, limits.workspace_limit)
    if dtype == numpy.float32:
        cap = FLOAT32_MAX_CHANNELS[max(pl.a_h, pl.a_w, 6)]
        if spec.c > cap:
            return (f"in float32 its error with {spec.c} input channels would approach cuconv's 1e-5 (at most "
                    f"{cap} with a {spec.r}x{spec.s} kernel); float64 has no such limit")
    if spec.n and pl.rows == 0:
        row = _round_up(pl.tiles_w, _LD_ALIGN) * pl.points * (spec.c + spec.k) * dtype.itemsize
        return (f"its transformed weights ({pl.u_bytes} bytes) and one row of {pl.tiles_w} tiles ({row} bytes) "
                f"exceed cuconv.config.workspace_limit={limits.workspace_limit}")
    return None


def prepare(pass_: str, spec: ConvSpec, dtype, precision: str, env: "_plan.Env", bias: bool = False) -> "_plan.Plan":
    """The plan of ``pass_`` (see ``cuconv._plan``): U = the transformed weights, then per chunk of tile rows the
    input transform into V, one GEMM per transform point (batched, IEEE arithmetic) into M, and the output
    transform with the bias; U, V and M live in the workspace. dgrad as the forward convolution of dy
    (``dgrad_forward``)."""
    if pass_ == "dgrad":
        return dgrad_forward.prepare(prepare, spec, dtype, precision, env)
    b = _plan.Builder(pass_, env)
    if spec.n * spec.k * spec.p * spec.q == 0:
        return b.plan(STEM)
    dtype = numpy.dtype(dtype)
    item = dtype.itemsize
    pl = plan(spec, dtype, env.workspace_limit)
    names = _names(_dtypes.ctype_of(dtype), spec.r, spec.s)
    i64 = numpy.int64
    block = (_loader.THREADS, 1, 1)
    geometry = _loader.conv_geometry(spec)

    def kernel(name, grid, n_pointers, scalars):
        return _loader.prepare(STEM, names, name, grid, block, n_pointers, scalars)

    u = b.take(pl.points * spec.k * spec.c * item)
    v = b.take(pl.points * spec.c * pl.ld * item)
    m = b.take(pl.points * spec.k * pl.ld * item)
    b.launch(kernel(names[0], (_loader.blocks(spec.k * spec.c), 1, 1), 2,
                    (i64(spec.k), i64(spec.c))), b.ref("w"), u)
    total_rows = spec.n * pl.tiles_h
    for row0 in range(0, total_rows, pl.rows):
        tiles = min(pl.rows, total_rows - row0) * pl.tiles_w
        chunk = (geometry, numpy.array((pl.tiles_h, pl.tiles_w, row0, tiles, pl.ld), dtype=WINO_CHUNK_DTYPE)[()])
        b.launch(kernel(names[1], (_loader.blocks(tiles, None), spec.c, 1), 2, chunk), b.ref("x"), v)
        # column-major: M[a]ᵀ (tiles × K) = V[a]ᵀ (tiles × C) @ U[a]ᵀ (C × K)
        b.gemm(dtype, "ieee", tiles, spec.k, spec.c, v, pl.ld, spec.c * pl.ld, u, spec.c, spec.k * spec.c,
               m, pl.ld, spec.k * pl.ld, pl.points)
        b.launch(kernel(names[2], (_loader.blocks(tiles, None), spec.k, 1), 5, chunk),
                 m, b.ref("bias"), b.ref("out"), b.ref("x"), b.ref("w"))
    return b.plan(STEM)


def forward_gpu(x, w, bias, spec: ConvSpec, out, precision: str) -> None:
    """out = conv(x, w) + bias on C-contiguous CuPy arrays, current stream (float32 GEMMs in IEEE fp32)."""
    _plan.run_on_arrays(prepare, "fprop", spec, precision, x, w, bias, out)


def dgrad_gpu(dy, w, spec: ConvSpec, dx, precision: str) -> None:
    """dx = conv2d_input(dy, w) as this algorithm's forward convolution of dy (stride 1; ``dgrad_forward``)."""
    _plan.run_on_arrays(prepare, "dgrad", spec, precision, dy, w, dx)


class Winograd(Algorithm):
    """``winograd`` behind the algorithm contract (``cuconv.algos.base``)."""

    name = "winograd"
    passes = ("fprop", "dgrad")
    exact_on_integers = EXACT_ON_INTEGERS
    nchw_limits = staticmethod(reason_unsupported)

    def build(self, p: Problem, env: "_plan.Env", **knobs) -> "_plan.Plan":
        return prepare(p.pass_, p.spec, p.dtype, p.precision, env, p.bias)


ALGORITHM = Winograd()
