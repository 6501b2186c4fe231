"""The rules ``auto`` chooses an algorithm by: candidates best first, for NCHW and for channels-last activations.

Each threshold is a named constant beside the rule that uses it, drawn between measured points; the
measurements are in docs/perf-notes.md ("Why auto chooses what it chooses"). The rules ask the algorithms
only what their modules publish about a problem (whether a 1x1 layer folds over the batch, whether a tile
serves it); ``cuconv.select`` takes the first candidate that can implement the problem.
"""

from __future__ import annotations

import numpy

from .. import algos as _algorithms
from ..algos import grouped_mma, im2col_gemm, implicit_gemm
from . import implicit_gemm as implicit_gemm_knobs
from ..spec import ConvSpec

__all__ = ["preference", "preference_nhwc"]


# A 1x1 NCHW forward's activation in implicit_gemm's store, or im2col_gemm's GEMM per sample and a pass over the
# output after it: measured (H200, bf16, batch 64, the 1x1 layers of ResNet-50, MobileNetV3, RegNetY-800MF; GPU
# time, CUDA-graph replay; docs/perf-notes.md "Fused blocks"), implicit_gemm's fused store takes 0.57-1.01x the
# time of the GEMM and its pass on up to 320 input channels (0.78x at the median: an expansion layer's output,
# 4-6x its input, crosses memory once instead of three times) and 0.94-1.78x from 480 (1.17x at the median: its
# k loop over the longer reduction is slower than cuBLAS's by more than the pass costs). With a residual it is
# slower at every width measured but three (0.85-0.94x; elsewhere 1.04-2.2x): with a residual its NCHW store
# takes the layer 1.2-3.1x (1.9x at the median) its time without an epilogue. On channels-last tensors im2col_gemm's one GEMM over every pixel and
# its pass won at most layers (implicit_gemm 0.73-2.3x their time, 1.3x at the median), so those stay the GEMM;
# measured so before the TMA store compiled its loop per activation; see _epilogue_in_kernels_nhwc for after.
_EPILOGUE_IN_KERNELS_MAX_CHANNELS = 400

# A channels-last 1x1 forward with an activation and no residual, on a device that runs wgmma, in float16 or
# bfloat16: implicit_gemm applies the activation in its store, im2col_gemm's one GEMM over every pixel is followed
# by a pass over the output. Measured layer by layer in the models' fused calls (H200, bf16, batch 64, GPU time as
# CUDA-graph replays; benchmarks/fused_layers.py on ResNet-50, MobileNetV3-Large, EfficientNet-B0, RegNetY-800MF;
# docs/perf-notes.md "Fused blocks"): with a ReLU implicit_gemm takes about its plain time, 0.28-0.79x the GEMM
# and its pass on planes from 112x112 to 14x14 (256->64@56x56 39.6 us against 85.0; one exception, 24->72@56x56,
# 1.06x), but 1.11x on 7x7 planes of 2048 channels; ReLU6 and LeakyReLU (a clamp, a multiply) go with ReLU,
# not measured on their own. The activations with a transcendental or a division (SiLU, Hardswish, Sigmoid,
# GELU) cost its store 2-6x its plain time: from 28x28 down it still wins (0.71-0.96x; 112->672@14x14 SiLU
# 1.06x), on 56x56 and 112x112 planes it loses (SiLU 1.34-1.46x). Those stay the GEMM and the pass.
_EPILOGUE_NHWC_CHEAP = ("relu", "relu6", "leaky_relu")  # activations that cost the store little
_EPILOGUE_NHWC_MAX_PIXELS = 28 * 28  # the other activations: planes up to this
_EPILOGUE_NHWC_SMALL_PLANE = 7 * 7
_EPILOGUE_NHWC_SMALL_PLANE_MAX_CHANNELS = 672  # (from this many input channels on such planes: the GEMM)


def _epilogue_in_kernels(spec: ConvSpec, pass_: str, epilogue) -> bool:
    """An NCHW forward on a 1x1 stride-1 unpadded layer of up to ``_EPILOGUE_IN_KERNELS_MAX_CHANNELS`` input
    channels whose epilogue has an activation and no residual, but squeeze-excitation's (on 1x1 planes the whole
    batch is one short GEMM, 2-3x faster than implicit_gemm's tiles, and its pass after is one small launch):
    implicit_gemm applies the activation where it stores, where im2col_gemm's GEMM per sample would be followed
    by a pass over the output."""
    return (pass_ == "fprop" and epilogue is not None and epilogue.activation is not None
            and epilogue.residual is None and spec.c <= _EPILOGUE_IN_KERNELS_MAX_CHANNELS
            and spec.is_pointwise_identity and not im2col_gemm.pixel_folded(spec))


def _epilogue_in_kernels_nhwc(spec: ConvSpec, dtype, pass_: str, epilogue) -> bool:
    """A channels-last forward on a 1x1 stride-1 unpadded layer of one group, in a 16-bit type, whose epilogue has
    an activation and no residual (a residual takes implicit_gemm's store from shared memory, which costs the
    layer 1.3-11x its plain time), but on small planes of many channels, squeeze-excitation's 1x1 planes (the
    batch is one short GEMM there) and, for activations other than the ReLUs, planes over
    ``_EPILOGUE_NHWC_MAX_PIXELS``: implicit_gemm applies the activation where it stores, where im2col_gemm's GEMM
    would be followed by a pass over the output."""
    if not (pass_ == "fprop" and epilogue is not None and epilogue.activation is not None
            and epilogue.residual is None and numpy.dtype(dtype).itemsize == 2
            and im2col_gemm.pointwise_nhwc(spec) and spec.h * spec.w > 1):
        return False
    pixels = spec.p * spec.q
    if pixels <= _EPILOGUE_NHWC_SMALL_PLANE and spec.c >= _EPILOGUE_NHWC_SMALL_PLANE_MAX_CHANNELS:
        return False
    return epilogue.activation in _EPILOGUE_NHWC_CHEAP or pixels <= _EPILOGUE_NHWC_MAX_PIXELS


# A channels-last 1x1 forward (stride 1 or not) with a residual, on a device that runs wgmma, in float16 or bfloat16:
# implicit_gemm's TMA store copies the residual's box and adds it in its store, where im2col_gemm's GEMM is followed
# by a pass reading the output and the residual and writing the output again. Measured layer by layer in the models'
# fused calls (H200, bf16, batch 64, CUDA-graph replays; benchmarks/fused_layers.py on ResNet-50, MobileNetV3-Large,
# EfficientNet-B0, RegNetY-800MF; docs/perf-notes.md "Fused blocks"), of 23 distinct residual layers the 15 this
# rule takes run 0.37-0.97x the GEMM and its pass (ResNet-50's 64->256@56x56 with a ReLU 71.0 us against 174.5,
# RegNet's strided projections 0.37-0.71x) but 240->40@28x28, 1.04x; where the channels are not whole 16-channel
# k tiles (72, 120, 184, 200: no TMA tile, the store from shared memory) 1.19-1.76x, on 7x7 planes from 672
# channels on 1.07-1.54x.
_RESIDUAL_NHWC_CHANNELS = 16  # a TMA tile's k tile: whole taps of this many channels


def _residual_in_kernels_nhwc(spec: ConvSpec, dtype, pass_: str, epilogue) -> bool:
    """A channels-last forward on a 1x1 unpadded layer of one group (any stride), in a 16-bit type, whose epilogue
    adds a residual, with channels in whole 16-channel k tiles and filters in whole 16-byte pixels, but on small
    planes of many channels and squeeze-excitation's 1x1 planes: implicit_gemm adds the residual where its TMA store
    writes the output, where im2col_gemm's GEMM would be followed by a pass over the output."""
    if not (pass_ == "fprop" and epilogue is not None and epilogue.residual is not None
            and numpy.dtype(dtype).itemsize == 2 and spec.h * spec.w > 1
            and (im2col_gemm.pointwise_nhwc(spec) or im2col_gemm.strided_pointwise_nhwc(spec))
            and spec.c % _RESIDUAL_NHWC_CHANNELS == 0 and spec.k % 8 == 0):
        return False
    return not (spec.p * spec.q <= _EPILOGUE_NHWC_SMALL_PLANE and spec.c >= _EPILOGUE_NHWC_SMALL_PLANE_MAX_CHANNELS)


def preference_nhwc(spec: ConvSpec, dtype, precision: str, pass_: str, wgmma: bool, epilogue=None):
    """Candidates on channels-last activations, best first: 1x1 stride-1 unpadded layers of one group as one GEMM
    over every pixel (``im2col_gemm``: no swap, no per-sample batch, the bias in cuBLASLt's epilogue), and so every
    pass of strided ones over the pixels they read (gathered into, or spread from, a column matrix: 1.1-4x
    implicit_gemm's passes on the strided 1x1 layers of ResNet-50 and RegNet, whose wgrad swaps all of x and dy
    first), and the wgrad of wider k x k layers of one group as one GEMM of dy by their column matrix
    (``_columns_wgrad_nhwc``), then the NCHW order (``preference``) among the families that serve
    NHWC. Before that column matrix, on compute capability 9.0, the wgrad of overlapping k x k windows where
    ``implicit_gemm``'s TMA wgrad serves it (``_wgrad_by_tma``), and grouped forwards of 16, 32 or 64 channels a
    group through a block-diagonal weight (``implicit_gemm.block_diagonal_tile``). A 1x1 forward's activation or
    residual (``epilogue``, a ``cuconv.problem.Epilogue``; None: the bias at most) runs in a pass after its GEMM,
    but on a device that runs wgmma, in the half types, an activation alone or a residual, which ``implicit_gemm``
    applies in its TMA store (``_epilogue_in_kernels_nhwc``, ``_residual_in_kernels_nhwc``)."""
    if pass_ == "wgrad" and wgmma and _wgrad_by_tma(spec, dtype):
        yield "implicit_gemm"
    if pass_ == "fprop" and wgmma and implicit_gemm.block_diagonal_tile(spec, dtype) is not None:
        yield "implicit_gemm"  # (groups of 16-64 channels through a block-diagonal weight, before grouped_mma)
    if wgmma and (_epilogue_in_kernels_nhwc(spec, dtype, pass_, epilogue)
                  or _residual_in_kernels_nhwc(spec, dtype, pass_, epilogue)):
        yield "implicit_gemm"
    if (im2col_gemm.pointwise_nhwc(spec) or im2col_gemm.strided_pointwise_nhwc(spec)
            or pass_ == "wgrad" and _columns_wgrad_nhwc(spec, dtype)):
        yield "im2col_gemm"
    yield from preference(spec, dtype, precision, pass_, wgmma, epilogue)


# k x k wgrads on channels-last tensors through the column matrix: the GEMM's work per byte of the column matrix
# is K multiply-adds, and implicit_gemm's wgrad swaps all of x and dy first and reduces a strided layer's pixels
# poorly. Measured (H200, bfloat16, ResNet-18/50, ConvNeXt, VGG-11 layers; docs/perf-notes.md): 1.2-2.9x where the
# layer has 128 filters or more at a stride, or 256 or more at stride 1, with a column matrix of up to 256 MiB;
# 0.6-0.9x below those filters or beyond that size. In float32 (TF32 GEMMs over twice the bytes) 0.55-1.2x, but
# for non-overlapping patches (a kernel no larger than its stride: the column matrix holds no more than x), which
# gain 1.1-1.6x in float32 too.
_COLUMNS_WGRAD_MIN_FILTERS = (128, 256)  # at a stride, at stride 1
_COLUMNS_WGRAD_MAX_BYTES = 256 << 20


def _columns_wgrad_nhwc(spec: ConvSpec, dtype) -> bool:
    """A k x k (or padded, or dilated 1x1) layer of one group whose channels-last wgrad ``auto`` runs as one GEMM
    of dy by the column matrix (``_COLUMNS_WGRAD_*``)."""
    if spec.groups != 1 or im2col_gemm.pointwise_nhwc(spec) or im2col_gemm.strided_pointwise_nhwc(spec):
        return False
    if spec.k < _COLUMNS_WGRAD_MIN_FILTERS[0]:
        return False
    if spec.r <= spec.stride[0] and spec.s <= spec.stride[1] and spec.dilation == (1, 1):
        return True
    return (numpy.dtype(dtype).itemsize == 2 and spec.k >= _COLUMNS_WGRAD_MIN_FILTERS[spec.stride == (1, 1)]
            and im2col_gemm.column_bytes(spec, dtype) <= _COLUMNS_WGRAD_MAX_BYTES)


# The TMA wgrad reduces over the output pixels N·P·Q in 64-pixel k tiles; with fewer than this many, where
# im2col_gemm's column matrix serves the layer, cuBLAS's GEMM over the short reduction is faster (H200, bf16,
# ResNet-50 at batch 8: 256@14², 512@7² and the strided layers onto them 10.6-11.4 µs against 12.2-14.2; at
# batch 32, 1568 pixels, 512@7² about equal: 24.0 against 23.3).
_WGRAD_TMA_MIN_PIXELS = 2048


def _wgrad_by_tma(spec: ConvSpec, dtype) -> bool:
    """A channels-last wgrad for ``implicit_gemm``'s TMA wgrad (``implicit_gemm.wgrad_tma_tile``): windows that
    overlap (a kernel wider than its stride, or dilated), where a column matrix would copy each pixel of x once a
    tap that reads it; 1x1 layers and patchify kernels no wider than their stride stay one GEMM of im2col_gemm
    (their columns are x itself, or a gather of it), and so do layers of fewer than ``_WGRAD_TMA_MIN_PIXELS``
    output pixels that its column matrix serves."""
    if spec.r <= spec.stride[0] and spec.s <= spec.stride[1] and spec.dilation == (1, 1):
        return False
    if spec.n * spec.p * spec.q < _WGRAD_TMA_MIN_PIXELS and _columns_wgrad_nhwc(spec, dtype):
        return False
    return implicit_gemm_knobs.wgrad_tma_tile(spec, dtype) is not None


# The rules of _preference and their thresholds were drawn between measured points; the measurements are in
# docs/perf-notes.md ("Why auto chooses what it chooses").

# winograd_fused's tile holds 64 filters: with fewer most of it idles and winograd is faster.
_WINOGRAD_FUSED_MIN_FILTERS = 64
# Its products cost 16 per 4 outputs and channel against winograd's 36 per 16 (F(4x4, 3x3)), whose price is the
# traffic of its transformed operands: with few channels that traffic wins, with more the products do.
_WINOGRAD_FUSED_MAX_CHANNELS = 32

# 1x1 stride-1 forwards at tensor-core precisions: cuBLASLt's GEMM per sample (im2col_gemm) runs as fast as cuDNN
# on large planes, where implicit_gemm's NCHW kernel does not; on small planes batches of short GEMMs are slow
# and the NCHW kernel wins. The GEMM takes planes of at least
_POINTWISE_GEMM_MIN_PIXELS = 14 * 14
# and squeeze-excitation's 1x1 planes, where the whole batch is one short GEMM (2-3x faster than any tile of
# implicit_gemm's): fewer output pixels (N·P·Q) than
_POINTWISE_IMPLICIT_MIN_OUTPUTS = 1024


# 1x1 stride-1 wgrads: where the planes are large, im2col_gemm's GEMMs read x and dy as they are, while
# implicit_gemm packs both first; from these planes on the GEMMs are faster (the reverse of the forward's order:
# the half types pack half the bytes), and in the half types from 14x14 where the weight is small (C·K below
# the second number: the packs' cost is not earned back).
_POINTWISE_WGRAD_GEMM_MIN_PIXELS_HALF = (28 * 28, 14 * 14, 90000)
_POINTWISE_WGRAD_GEMM_MIN_PIXELS_TF32 = 14 * 14


# 1x1 wgrads at a stride: implicit_gemm packs all of x, of which the GEMM reads one pixel in stride², while
# im2col_gemm gathers only those; on large input planes that wins (H100, RegNet and ResNet-50 downsampling layers:
# TF32 2x on 56x56 and 112x112 planes, bfloat16 2x on 112x112, even on 56x56; on 28x28 and below implicit_gemm).
_STRIDED_POINTWISE_WGRAD_GEMM_MIN_PIXELS = {4: 56 * 56, 2: 112 * 112}  # itemsize -> H·W


# 1x1 layers of one group on planes below 14x14 (``im2col_gemm.batch_foldable``): im2col_gemm runs each pass as
# one GEMM over the batch between swaps of (N, C). Measured against implicit_gemm on 7x7 planes: its forward wins
# where the layer does not widen (C >= K; widening ones have too short a reduction for the swaps' cost), its dgrad
# where the layer does not narrow (K >= C), its wgrad below C·K = 2^20 (7x7 at batch 32, TF32 and bf16).
_BATCH_FOLDED_WGRAD_MAX_WEIGHT = 1 << 20


def _pointwise_wgrad_by_gemm(spec: ConvSpec, dtype) -> bool:
    """A 1x1 unpadded wgrad for im2col_gemm: at stride 1 on squeeze-excitation's 1x1 planes of one group (x, dy
    and dw are plain matrices: one GEMM over the batch, 2-3x faster than implicit_gemm's split tiles), on planes
    below 14x14 of one group and a weight below ``_BATCH_FOLDED_WGRAD_MAX_WEIGHT`` (one GEMM over the batch
    between swaps), and on large planes (``_POINTWISE_WGRAD_GEMM_MIN_PIXELS_*``); at a stride on large input
    planes of one group (``_STRIDED_POINTWISE_WGRAD_GEMM_MIN_PIXELS``; the layers measured had one)."""
    if (spec.r, spec.s, spec.pad) == (1, 1, (0, 0, 0, 0)) and spec.stride != (1, 1) and spec.dilation == (1, 1):
        return spec.groups == 1 and spec.h * spec.w >= _STRIDED_POINTWISE_WGRAD_GEMM_MIN_PIXELS.get(
            numpy.dtype(dtype).itemsize, 1 << 62)
    if not spec.is_pointwise_identity:
        return False
    if im2col_gemm.pixel_folded(spec):
        return True
    if im2col_gemm.batch_foldable(spec):
        return spec.c * spec.k < _BATCH_FOLDED_WGRAD_MAX_WEIGHT
    pixels = spec.p * spec.q
    if numpy.dtype(dtype).itemsize != 2:
        return pixels >= _POINTWISE_WGRAD_GEMM_MIN_PIXELS_TF32 and not _pointwise_by_implicit_tf32(spec, "wgrad")
    large, small, small_weight = _POINTWISE_WGRAD_GEMM_MIN_PIXELS_HALF
    return pixels >= large or (pixels >= small and spec.c * spec.k_per_group < small_weight)


# 1x1 stride-1 dgrads: cuBLASLt's GEMMs of dx (C x H·W) per sample are fast but on small planes; there, with
# many channels and filters, implicit_gemm's forward of dy (one launch over the batch, split over k) is up to
# 2x faster (7x7 planes at batch 32: 1.1-2x; 14x14 and larger, squeeze-excitation's 1x1 planes, or few
# channels x filters: the GEMMs win).
# TF32 1x1 layers on planes from 14x14 to below 28x28 with a large weight: cuBLAS's batch of per-sample GEMMs
# (196-row matrices) runs its tiles a third empty, and wgrad's per-sample partial sums of K·C each outweigh the
# GEMM, where implicit_gemm reduces over N·P·Q in one pass: faster from C·K = 2^19 in wgrad, and in the forward
# from 1024 channels (narrower ones, 512->2048 or 768->768, stay faster on the GEMM; docs/perf-notes.md).
_POINTWISE_IMPLICIT_TF32_PIXELS = (14 * 14, 28 * 28)  # P·Q from, below
_POINTWISE_IMPLICIT_TF32_MIN_WEIGHT = 1 << 19         # C·K
_POINTWISE_IMPLICIT_TF32_MIN_CHANNELS = 1024          # forward


# TF32 forwards that narrow the channels at least this many times on the planes im2col_gemm folds over the batch
# (below 14x14): the swaps move the wide input twice for a GEMM with few filters, and implicit_gemm's NchwTile,
# which reads the input once, is faster (1152->192 and 960->160 at 7x7; 2048->512 and 672->160 stay faster folded).
_POINTWISE_IMPLICIT_TF32_MIN_NARROWING = 5


def _pointwise_by_implicit_tf32(spec: ConvSpec, pass_: str) -> bool:
    """A float32 (TF32) 1x1 stride-1 layer of one group whose ``pass_`` (forward or wgrad) runs faster on
    implicit_gemm than on im2col_gemm's GEMMs (see the constants above): on 14x14 to 27x27 planes with a large
    weight, and forwards folded over the batch that narrow the channels ``_POINTWISE_IMPLICIT_TF32_MIN_NARROWING``
    times or more."""
    if (pass_ == "fprop" and spec.is_pointwise_identity and im2col_gemm.batch_foldable(spec)
            and spec.c >= _POINTWISE_IMPLICIT_TF32_MIN_NARROWING * spec.k):
        return True
    low, high = _POINTWISE_IMPLICIT_TF32_PIXELS
    if not (spec.is_pointwise_identity and spec.groups == 1 and low <= spec.p * spec.q < high
            and spec.c * spec.k >= _POINTWISE_IMPLICIT_TF32_MIN_WEIGHT):
        return False
    return pass_ == "wgrad" or (pass_ == "fprop" and spec.c >= _POINTWISE_IMPLICIT_TF32_MIN_CHANNELS)


_POINTWISE_DGRAD_IMPLICIT_PIXELS = (1024, 4096)  # N·H·W from, below
_POINTWISE_DGRAD_IMPLICIT_MIN_WEIGHT = 150000    # C·K


def _pointwise_dgrad_by_implicit(spec: ConvSpec) -> bool:
    if im2col_gemm.batch_foldable(spec) and spec.k >= spec.c:
        return False
    low, high = _POINTWISE_DGRAD_IMPLICIT_PIXELS
    return low <= spec.n * spec.h * spec.w < high and spec.c * spec.k_per_group >= _POINTWISE_DGRAD_IMPLICIT_MIN_WEIGHT


# implicit_gemm's narrowest tile holds 64 filters: with fewer than 32 in the pass most of it idles.
_IMPLICIT_GEMM_MIN_FILTERS = 32

_GROUPED_DIRECT_MAX_CHANNELS = 8
_GROUPED_DIRECT_MIN_PIXELS = 28 * 28

# grouped_mma (groups of 16 channels and 16 filters on tensor cores, one launch, no packing) against
# implicit_gemm's narrow packed tiles: faster on every such layer measured in the half types, in TF32 where the
# pass runs at stride 1 onto small planes (at a stride, or onto larger planes, implicit_gemm's TF32 tiles win);
# either way with enough blocks to fill the device (a batch of one does not).
_GROUPED_MMA_TF32_MAX_PIXELS = 14 * 14
_GROUPED_MMA_MIN_BLOCKS = 256


def preference(spec: ConvSpec, dtype, precision: str, pass_: str, wgmma: bool = False, epilogue=None):
    """Candidates, best first, from what each family is good at. "In the pass": a dgrad at stride 1 is a forward
    convolution of dy with C/groups filters over K/groups channels (``dgrad_forward``).

    - depthwise layers: ``depthwise`` (memory-bound; a GEMM per group is several times slower);
    - float32 at "ieee", 3x3, stride 1, no dilation, one group, at least 64 filters and 16 to 32 input channels
      in the pass: ``winograd_fused`` (F(2x2, 3x3) in one kernel, no transformed operand in memory, the error
      of a direct sum);
    - FFMA arithmetic (fp32 "ieee", fp64), stride 1, no dilation, one group, kernels up to 7x7, at least 16
      input channels and 16 filters in the pass (and float32's cap on input channels, for its error):
      ``winograd`` (1.7-4x fewer multiplications; with fewer channels im2col_gemm is faster);
    - FFMA arithmetic on large layers with at least 25 taps and up to 128 filters per group: ``direct_smem``
      (no column matrix; with fewer taps cuBLAS's GEMM wins); with tensor cores FFMA kernels are out of the
      race;
    - groups of up to ``_GROUPED_DIRECT_MAX_CHANNELS`` channels in the pass, stride 1, planes of at least
      ``_GROUPED_DIRECT_MIN_PIXELS``: ``grouped_direct`` (a group's weight and input band in shared memory, FFMA:
      faster than the tensor-core tiles on groups this narrow, slower from 16 channels and at a stride);
    - tensor-core arithmetic, groups of 16 channels and 16 filters, forward and stride-1 dgrad, in the half types,
      or in TF32 at stride 1 onto planes up to ``_GROUPED_MMA_TF32_MAX_PIXELS``, with at least
      ``_GROUPED_MMA_MIN_BLOCKS`` blocks: ``grouped_mma`` (MMAs out of a staged band of input rows, no packing);
    - tensor-core arithmetic (float32 "tf32", float16, bfloat16), forward and stride-1 dgrad with at least
      32 filters in the pass or several groups (im2col_gemm's GEMM per group is many times slower), except 1x1
      stride-1 unpadded layers (a plain GEMM for im2col_gemm) unless, on a device that runs wgmma, the pass is a
      forward on small planes (``_POINTWISE_GEMM_MIN_PIXELS``) but squeeze-excitation's 1x1 ones
      (``_POINTWISE_IMPLICIT_MIN_OUTPUTS``) and the non-widening ones im2col_gemm folds over the batch
      (``im2col_gemm.batch_foldable``), where implicit_gemm's NchwTile reads them as they are, a dgrad on
      small planes with many channels and filters (``_pointwise_dgrad_by_implicit``), or a TF32 forward on
      14x14 to 27x27 planes with a large weight or on smaller planes narrowing the channels 5x or more
      (``_pointwise_by_implicit_tf32``), or a forward on few channels whose ``epilogue`` has an activation
      and no residual (``_epilogue_in_kernels``): ``implicit_gemm``, which never writes the column matrix;
    - tensor-core arithmetic, wgrad (grouped ones too: all groups in one launch), except 1x1 stride-1 unpadded
      layers on large planes (in TF32 but large weights on planes below 28x28), on 1x1 planes, or folded over the
      batch, and strided 1x1 ones on large input planes (``_pointwise_wgrad_by_gemm``):
      ``implicit_gemm`` (the forward kernels
      on x and dy with samples and channels swapped, split over the reduction: no column matrix, no per-sample
      partial sums);
    - otherwise ``im2col_gemm``.
    """
    depthwise = spec.groups == spec.c and spec.groups > 1 and spec.c_per_group == 1
    if depthwise:
        yield "depthwise"
    dtype = numpy.dtype(dtype)
    ffma = dtype == numpy.float64 or (dtype == numpy.float32 and precision == "ieee")
    # the pass's output: a dgrad is a forward convolution producing dx
    pixels = spec.n * (spec.h * spec.w if pass_ == "dgrad" else spec.p * spec.q)
    large = pixels >= (1 << 19)
    filters = {"fprop": spec.k_per_group, "dgrad": spec.c_per_group}.get(pass_)
    channels = {"fprop": spec.c_per_group, "dgrad": spec.k_per_group}.get(pass_)
    pointwise = spec.is_pointwise_identity and not (
        _epilogue_in_kernels(spec, pass_, epilogue)
        or (wgmma and pass_ == "fprop" and implicit_gemm.nchw_fits(spec, dtype)
         and spec.p * spec.q < _POINTWISE_GEMM_MIN_PIXELS
         and spec.n * spec.p * spec.q >= _POINTWISE_IMPLICIT_MIN_OUTPUTS
         and not (im2col_gemm.batch_foldable(spec) and spec.c >= spec.k))
        or (wgmma and pass_ == "dgrad" and _pointwise_dgrad_by_implicit(spec))
        or (wgmma and pass_ == "fprop" and dtype == numpy.float32 and precision == "tf32"
            and _pointwise_by_implicit_tf32(spec, pass_)))
    many_filters = filters is not None and (filters >= _IMPLICIT_GEMM_MIN_FILTERS or spec.groups > 1)
    plane = spec.h * spec.w if pass_ == "dgrad" else spec.p * spec.q
    if (filters is not None and spec.groups > 1 and not depthwise and channels <= _GROUPED_DIRECT_MAX_CHANNELS
            and spec.stride == (1, 1) and plane >= _GROUPED_DIRECT_MIN_PIXELS):
        yield "grouped_direct"
    if (filters is not None and not ffma and spec.groups > 1 and channels == filters == grouped_mma.WIDTH
            and grouped_mma.blocks(spec, pass_) >= _GROUPED_MMA_MIN_BLOCKS
            and (dtype.itemsize == 2 or ((pass_ == "dgrad" or spec.stride == (1, 1))
                                         and plane <= _GROUPED_MMA_TF32_MAX_PIXELS))):
        yield "grouped_mma"
    if not ffma and many_filters and not pointwise:
        yield "implicit_gemm"
    if not ffma and pass_ == "wgrad" and not _pointwise_wgrad_by_gemm(spec, dtype):
        yield "implicit_gemm"
    if (filters is not None and ffma and dtype == numpy.float32 and filters >= _WINOGRAD_FUSED_MIN_FILTERS
            and 16 <= channels <= _WINOGRAD_FUSED_MAX_CHANNELS):
        yield "winograd_fused"
    if filters is not None and ffma and min(filters, channels) >= 16:
        yield "winograd"
    if filters is not None and ffma and large and spec.r * spec.s >= 25 and filters <= 128:
        yield "direct_smem"
    yield "im2col_gemm"
    yield from _algorithms.names()  # anything else that serves the case
