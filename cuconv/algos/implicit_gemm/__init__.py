"""Algorithm ``implicit_gemm``: tensor-core implicit GEMM, one engine a file pair (``kernels_cu/implicit_gemm/<engine>.cu``
and its twin here, ``<engine>.py``).

Forward, dgrad (at stride 1 the forward convolution of ``dy``, ``dgrad_forward``; at a larger stride one forward
convolution of dy per phase of the stride, ``phase_specs``) and wgrad (the forward convolution of x by dy with
samples and channels swapped, ``transposed_spec``) for float32 at ``precision="tf32"``, float16 and bfloat16, fp32
accumulation; grouped forward and dgrad where the pass's channels per group fill 16-byte vectors, grouped wgrad
at any group size (groups are blocks of the filter grid). Per chunk of samples:

1. ``pack_nhwc`` (``pack_nhwc_narrow`` for few channels) copies the input to NHWC with channels padded to
   ``cp`` (a multiple of one 16-byte vector), rounding float32 to TF32 on the way (the workspace:
   ``n·H·W·cp`` elements per chunk, bounded by the workspace limit, after the packed weight);
2. ``implicit_gemm_fprop`` computes ``out (n·P·Q, K) = A (n·P·Q, R·S·cp) @ Wpᵀ`` without ever writing A:
   each block gathers its A tile with cp.async straight from the packed input, feeds ``mma.sync`` through
   ``ldmatrix`` and writes NCHW rows through shared memory, bias fused. On compute capability 9.0,
   ``implicit_gemm_wgmma`` does the same with warpgroup MMAs reading both tiles from shared memory
   (the loader compiles the file for sm_90a there).

The weight is packed once per call, by the first chunk's packing launch ((Kp, R·S·cp) zero-padded to
whole tiles). On compute capability 9.0 ``implicit_gemm_wgmma_nchw`` (an ``NchwTile``) skips both packs:
it gathers the NCHW input and the KCRS weight itself, through registers, which pays where the pack weighs
most (1x1 layers; float32 with few filters and taps: ``prefers_nchw``). Tiles (``Tile``, ``WgmmaTile``,
``NchwTile``) are template instances; which one runs is the selector's choice (``cuconv.select.implicit_gemm``:
``tile_for``, from the device, the filters and the reduction length), the plan's ``tile`` knob; ``tiles_for``
lists the ones a problem offers the autotuner. The launches of a problem are planned once (``_launches``) and prepared
(``_loader.PreparedLaunch``): a call costs two launches per chunk and one allocation of host time, an
NchwTile one launch per chunk and no allocation.
float32 "ieee" and float64 are refused (they need FFMA arithmetic: ``direct_smem`` / ``im2col_gemm``), as are dilated
dgrads at a stride above 1. Where the grid would leave SMs idle the GEMM is split over k ranges (the selector's
``splits_for``):
fp32 partial sums that ``sum_splits`` adds in a fixed order with the bias.

The package: ``tiles`` (the instances of every engine, ``Plan``, split-K), ``launch`` (a kernel fetched from the
file that holds it, ``Geometry``), the engines' twins ``pack``, ``mma_sync``, ``wgmma``, ``wgmma_nchw``,
``wgmma_tma`` and ``wgrad_tma``, and the passes' planning: ``forward`` (with the stride-1 dgrad), ``wgrad`` and
``dgrad_phases``; here ``prepare``, the reasons and the Algorithm.
"""

from __future__ import annotations

import dataclasses

import numpy

from ... import _plan, _tma  # noqa: F401  (_tma: tests reach it as implicit_gemm._tma)
from ...blocks import dgrad_forward
from ...blocks.epilogue import NO_EPILOGUE, epilogue_codes
from ...problem import ACTIVATIONS, PASSES, Epilogue, Problem
from ...spec import ConvSpec
from ..base import Algorithm, with_epilogue
from .tiles import (
    NchwTile, Plan, TILES, TMA_ROWS_TILES, TMA_TILES, Tile, WGRAD_TMA_TILES, WgmmaTile, WgmmaTmaRowsTile,
    WgmmaTmaTile, WgradTmaTile, _INT_MAX, _MAX_GRID_Y, resident_blocks, tile_name, wgmma_available)
from .launch import EPILOGUE_DTYPE, GEOMETRY_DTYPE, choice, kernel_stem
from .pack import (
    BLOCK_DIAGONAL_DTYPE, PACK_SHAPE_DTYPE, PHASE_WEIGHTS_DTYPE, SPLIT_SUM_DTYPE, SWAP_SHAPE_DTYPE, division_magic,
    pack_operands)
from .mma_sync import PHASE_GEMMS_DTYPE
from .wgmma_nchw import nchw_fits
from .wgmma_tma import block_diagonal_bytes, block_diagonal_tile, rows_reason, tma_reason
from .wgrad_tma import WGRAD_TMA_GEOMETRY_DTYPE, wgrad_tma_reason
from .forward import (
    _arithmetic_reason, _forward_plan, _forward_reason, _nhwc_forward_plan, _nhwc_forward_spec,
    nhwc_in_place, plan, takes_block_diagonal)
from .wgrad import _wgrad_prepare, _wgrad_reason, _wgrad_sizes, transposed_spec
from .dgrad_phases import _phases_prepare, _phases_reason, phase_specs

__all__ = ["ALGORITHM", "ImplicitGemm", "forward_gpu", "dgrad_gpu", "wgrad_gpu", "wgrad_tma_reason", "WgradTmaTile",
           "WGRAD_TMA_TILES", "block_diagonal_tile", "reason_unsupported", "reason_unsupported_nhwc", "nhwc_in_place",
           "Tile", "WgmmaTile", "WgmmaTmaTile", "WgmmaTmaRowsTile", "NchwTile", "TILES", "TMA_TILES", "TMA_ROWS_TILES",
           "tma_reason", "rows_reason", "transposed_spec", "phase_specs", "resident_blocks", "wgmma_available",
           "nchw_fits", "Plan", "plan", "pack_operands", "prepare", "division_magic", "PACK_SHAPE_DTYPE",
           "GEOMETRY_DTYPE", "EPILOGUE_DTYPE",
           "SPLIT_SUM_DTYPE", "PHASE_WEIGHTS_DTYPE", "PHASE_GEMMS_DTYPE", "SWAP_SHAPE_DTYPE",
           "WGRAD_TMA_GEOMETRY_DTYPE", "BLOCK_DIAGONAL_DTYPE", "kernel_stem", "choice", "tile_name", "tiles_for"]


def reason_unsupported(spec: ConvSpec, dtype, pass_: str = "fprop", precision: str = "ieee",
                       limits: "_plan.Limits" = None):
    """Why ``implicit_gemm`` cannot run this case under ``limits`` (default: the current device's), or None."""
    if pass_ == "wgrad":
        return _wgrad_reason(spec, dtype, precision, limits or _plan.current_limits())
    if pass_ == "dgrad" and dgrad_forward.forward_spec(spec) is None:
        return _phases_reason(spec, dtype, precision, limits or _plan.current_limits())
    # (flips=False: the packed dgrad's pack flips the weight; an NchwTile's flipped copy is all its workspace, and
    # the rules take a packed tile where that copy would not fit: select.implicit_gemm.tile_for)
    return dgrad_forward.reason_unsupported(spec, dtype, pass_, precision, _forward_reason, limits, flips=False)


def prepare(pass_: str, spec: ConvSpec, dtype, precision: str, env: "_plan.Env", bias: bool = False,
            tile: Tile = None, splits: int = None, layout: str = "nchw", weights: str = "kcrs",
            epilogue: Epilogue = None) -> "_plan.Plan":
    """The plan of ``pass_`` (see ``cuconv._plan``): per chunk, the packing launch and the GEMM (an NchwTile:
    the GEMM alone, reading x and w as they are); dgrad as the forward convolution of dy
    (``dgrad_forward.forward_spec``), its packing launch reading the weight transposed and flipped (an
    NchwTile, which reads the weight in place, takes ``dgrad_forward``'s flipped copy), or at a stride above 1
    one per phase of the stride (``phase_specs``); wgrad as the forward convolution of x by dy, samples and
    channels swapped (``transposed_spec``), split over ``splits`` k ranges (default ``wgrad_splits``). The
    workspace holds the packed weight, then one chunk's packed input. ``tile`` forces one of ``TILES`` (tests).
    float32 computes TF32. ``layout="nhwc"``: the activations channels-last in memory (``reason_unsupported_nhwc``):
    the forward and the stride-1 dgrad in place where ``nhwc_in_place`` holds, else packed from channels-last
    pixels; the phases and wgrad's packs read channels-last pixels. ``weights="krsc"`` (with channels-last
    activations): the weight, and wgrad's dW, channels-last too ((K, R, S, C/groups) in memory). ``epilogue``: a
    forward's activation and residual (``Epilogue``; its bias flag is ``bias``), applied where the GEMM or the sum
    of its splits writes the output."""
    nhwc = layout == "nhwc"
    codes = epilogue_codes(epilogue) if pass_ == "fprop" else NO_EPILOGUE
    if weights not in ("kcrs", "krsc") or (weights == "krsc" and not nhwc):
        raise ValueError(f"implicit_gemm: weights {weights!r} with {layout!r} activations; channels-last weights "
                         "('krsc') go with channels-last activations ('nhwc')")
    krsc = weights == "krsc"
    if pass_ == "wgrad":
        return _wgrad_prepare(spec, numpy.dtype(dtype), env, tile, splits, nhwc, krsc)
    if nhwc:
        if pass_ == "dgrad" and dgrad_forward.forward_spec(spec) is None:
            return _phases_prepare(spec, dtype, env, tile, nhwc=True, krsc=krsc)
        return _nhwc_forward_plan(pass_, spec, numpy.dtype(dtype), env, tile, bias, krsc, splits, codes)
    if tile is not None and tile.wgmma and not env.wgmma:
        raise ValueError(f"implicit_gemm: tile {tile} needs a device of compute capability 9.0 (wgmma)")
    if pass_ == "dgrad":
        fspec = dgrad_forward.forward_spec(spec)
        if fspec is None:
            return _phases_prepare(spec, dtype, env, tile)
        tile = tile or choice().tile_for(pass_, spec, dtype, False, env, splits)
        if tile.nchw:
            return dgrad_forward.prepare(prepare, spec, dtype, precision, env, tile=tile, splits=splits)
        return _forward_plan(pass_, fspec, numpy.dtype(dtype), env, tile, splits, ("dy", "w", None, "dx"))
    return _forward_plan(pass_, spec, numpy.dtype(dtype), env,
                         tile or choice().tile_for(pass_, spec, dtype, False, env, splits), splits,
                         ("x", "w", "bias", "out"), codes=codes)


def reason_unsupported_nhwc(spec: ConvSpec, dtype, pass_: str = "fprop", precision: str = "ieee", limits=None):
    """Why ``implicit_gemm`` cannot run ``pass_`` on channels-last activations, or None (the NCHW checks,
    ``reason_unsupported``, apply too): every pass, as on NCHW ones, its packs reading channels-last pixels. The
    forward, and the dgrad at stride 1 as the forward of dy (``dgrad_forward.forward_spec``), read their input
    in place where ``nhwc_in_place`` holds, in one GEMM whose input and output index in 32 bits; the phases of a
    strided dgrad read grad_output in place where its groups' channels fill whole vectors."""
    dtype = numpy.dtype(dtype)
    limits = limits or _plan.current_limits()
    fspec = _nhwc_forward_spec(spec, pass_)
    if fspec is not None and nhwc_in_place(fspec, dtype):
        if fspec.n * fspec.p * fspec.q * fspec.k >= _INT_MAX or fspec.n * fspec.h * fspec.w * fspec.c >= _INT_MAX:
            return "its channels-last GEMM reading its input in place indexes its input and output in 32 bits"
        pl = plan(fspec, dtype, choice().choose_tile(fspec, dtype, limits.wgmma, nchw=False), limits.workspace_limit)
        if pl.weight_bytes(dtype.itemsize) > limits.workspace_limit:
            return (f"its packed weight needs {pl.weight_bytes(dtype.itemsize)} bytes, more than "
                    f"cuconv.config.workspace_limit ({limits.workspace_limit})")
    elif fspec is not None and _arithmetic_reason(dtype, precision) is None:
        pl = plan(fspec, dtype, choice().choose_tile(fspec, dtype, limits.wgmma, nchw=False), limits.workspace_limit)
        need = pl.sample_bytes(fspec, dtype.itemsize) + pl.weight_bytes(dtype.itemsize)
        if need > limits.workspace_limit:
            return (f"one sample packed from channels-last pixels and the packed weight need {need} bytes, more "
                    f"than cuconv.config.workspace_limit ({limits.workspace_limit})")
    if pass_ == "wgrad":
        tile = choice().wgrad_tile(spec, dtype, limits.wgmma)
        pl = _wgrad_sizes(spec, dtype, tile, 1)[0]
        if -(-pl.cp // 32) > _MAX_GRID_Y:
            return f"its channels-last packs run 32 samples per grid y (at most {_MAX_GRID_Y})"
    return None


def forward_gpu(x, w, bias, spec: ConvSpec, out, precision: str, tile: Tile = None, splits: int = None) -> None:
    """out = conv(x, w) + bias on C-contiguous CuPy arrays, current stream (float32 computes TF32)."""
    _plan.run_on_arrays(prepare, "fprop", spec, precision, x, w, bias, out, tile=tile, splits=splits)


def dgrad_gpu(dy, w, spec: ConvSpec, dx, precision: str, tile: Tile = None) -> None:
    """dx = conv2d_input(dy, w) as forward convolutions of dy: one (stride 1; ``dgrad_forward``), or one per
    phase of the stride (``phase_specs``)."""
    _plan.run_on_arrays(prepare, "dgrad", spec, precision, dy, w, dx, tile=tile)


def wgrad_gpu(x, dy, spec: ConvSpec, dw, precision: str, tile: Tile = None, splits: int = None) -> None:
    """dw = conv2d_weight(x, dy) into C-contiguous ``dw`` (``transposed_spec``); float32 computes TF32."""
    _plan.run_on_arrays(prepare, "wgrad", spec, precision, x, dy, dw, tile=tile, splits=splits)



# The tiles a problem's knobs offer besides the one auto runs (the autotuner times them all): the shapes auto
# chooses between for the engine of each pass and device.
_PACKED_WGMMA = ("wg64x128", "wg64x128s3", "wg128x128r", "wg128x256")
_MMA_SYNC = ("128x128", "128x64", "128x64_k64")
_WGRAD_WGMMA = ("wg64x128", "wg128x256")
_PHASES_WGMMA = ("wg64x128", "wg128x128r")


def tiles_for(p: Problem, env: "_plan.Env") -> tuple:
    """The tiles that can run ``p`` on ``env`` (``can_implement`` accepted it): first the one auto runs
    (``cuconv.select.implicit_gemm.tile_for``), then the other shapes of its engine: the packed wgmma or mma.sync
    tiles, the NchwTile where it fits, the TMA tile and the TMA wgrad's tiles where they serve. A packed tile whose
    weight and one sample's packed input would not fit the workspace limit is left out; several groups of up to
    32 filters run only the narrow tile auto takes."""
    spec, dtype, nhwc = p.spec, p.dtype, p.layout == "nhwc"
    rule = choice().tile_for(p.pass_, spec, dtype, nhwc, env)
    if choice().narrow_group_tile(spec) is not None and p.pass_ != "wgrad":
        return (rule,)
    if p.pass_ == "wgrad":
        others = [TILES[n] for n in (_WGRAD_WGMMA if env.wgmma else _MMA_SYNC)]
        others = [t for t in others if _wgrad_reason(spec, dtype, p.precision, env, t) is None]
        if nhwc and env.wgmma and env.aligned:
            others += [t for t in WGRAD_TMA_TILES.values() if wgrad_tma_reason(spec, dtype, t) is None]
    else:
        fspec = spec if p.pass_ == "fprop" else dgrad_forward.forward_spec(spec)
        if fspec is None:  # the phases of a strided dgrad
            others = [TILES[n] for n in (_PHASES_WGMMA if env.wgmma else _MMA_SYNC[:2])]
            others = [t for t in others if _phases_reason(spec, dtype, p.precision, env, t) is None]
        else:
            others = [TILES[n] for n in (_PACKED_WGMMA if env.wgmma else _MMA_SYNC)]
            if env.wgmma:
                tma = choice().tma_tile(fspec, dtype, rows=False)
                others += [] if tma is None else [tma]
            others = [t for t in others if _forward_reason(fspec, dtype, p.precision, env, t) is None]
            if env.wgmma and not nhwc and nchw_fits(fspec, dtype):
                others += [TILES["nchw64"], TILES["nchw128"]]
    return tuple(dict.fromkeys([rule] + others))


class ImplicitGemm(Algorithm):
    """``implicit_gemm`` behind the algorithm contract (``cuconv.algos.base``)."""

    name = "implicit_gemm"
    passes = PASSES
    layouts = ("nchw", "nhwc")
    weight_layouts = ("kcrs", "krsc")
    nchw_limits = staticmethod(reason_unsupported)
    nhwc_limits = staticmethod(reason_unsupported_nhwc)
    activations = ACTIVATIONS
    residual = True

    def knobs(self, p: Problem, env: "_plan.Env") -> tuple:
        """``{"tile": t}`` for each of ``tiles_for`` (the GEMMs' splits follow from the tile: ``splits_for``)."""
        return tuple({"tile": t} for t in tiles_for(p, env))

    def knob_text(self, knobs: dict) -> str:
        return ",".join(f"{k}={tile_name(v) if k == 'tile' else v}" for k, v in sorted(knobs.items()))

    def build(self, p: Problem, env: "_plan.Env", **knobs) -> "_plan.Plan":
        if p.epilogue.fused and _block_diagonal(p, env, knobs.get("tile"), knobs.get("splits")):
            # (its fix-up of sums another group made non-finite reads back the stored, bias-only outputs)
            inner = dataclasses.replace(p, epilogue=Epilogue(bias=p.bias))
            return with_epilogue(self.name, p, env, self.build(inner, env, **knobs))
        return prepare(p.pass_, p.spec, p.dtype, p.precision, env, p.bias, layout=p.layout, weights=p.weights,
                       epilogue=p.epilogue, **knobs)


def _block_diagonal(p: Problem, env: "_plan.Env", tile, splits) -> bool:
    """Whether ``p`` runs through the block-diagonal grouped forward with ``tile`` (``_nhwc_forward_plan``'s test)."""
    return p.pass_ == "fprop" and p.layout == "nhwc" and p.spec.groups != 1 and takes_block_diagonal(
        p.spec, p.dtype, tile or choice().tile_for("fprop", p.spec, p.dtype, True, env, splits))


ALGORITHM = ImplicitGemm()
