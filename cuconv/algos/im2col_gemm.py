"""Algorithm ``im2col_gemm``: gather the column matrix (``kernels_cu/im2col.cu``), multiply with cuBLAS.

For each sample n and group g (row-major shapes)::

    out[n, g] (K/g, P·Q) = W[g] (K/g, C/g·R·S) @ col[n, g] (C/g·R·S, P·Q)

written straight into the NCHW output: no transpose pass. The column buffer is bounded by
the workspace limit (``Env.workspace_limit``): chunks of whole samples when a sample fits, else chunks of output
rows of one sample (``plan_chunks``). A 1x1 stride-1 unpadded convolution needs no gather at all: each sample's
input planes already are its column matrix. The CPU path is the same structure in NumPy (``cuconv.cpu.reference``).

Backward, same family (names as CUDA engineers use them)::

    dgrad:  col[n, g] (CRS/g, P·Q) = W[g]ᵀ (CRS/g, K/g) @ dY[n, g] (K/g, P·Q),  then col2im → dx
    wgrad:  dW[g] (K/g, CRS/g)    = Σ_n dY[n, g] (K/g, P·Q) @ col[n, g]ᵀ
            (one group, few outputs: per-sample products in one batched GEMM, then summed by one launch;
            otherwise both operands gathered with the samples interleaved row by row, so that one GEMM
            reduces over N·P·Q; where even two samples do not fit the workspace, β = 1 over samples)

Half-precision dgrad keeps its column matrix in fp32 and wgrad accumulates in fp32: one rounding each.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy

from ..spec import ConvSpec
from ..problem import PASSES, Problem
from .base import Algorithm
from .. import _backend, _cublas, _plan
from ..blocks import elementwise, gemm_ptrs
from ..blocks import col2im as _col2im
from ..blocks import im2col as _im2col
from ..blocks.bias import fill_launch as bias_fill_launch
from ..blocks.im2col import row_pitch

__all__ = ["ALGORITHM", "Im2colGemm", "ChunkPlan", "plan_chunks", "chunk_bytes", "wgrad_partial_samples", "pixel_folded", "batch_foldable",
           "batch_folded", "BATCH_FOLD_MAX_PIXELS", "prepare", "forward_gpu", "dgrad_gpu", "wgrad_gpu", "pointwise_nhwc",
           "strided_pointwise_nhwc", "column_bytes", "reason_unsupported_nhwc"]


# Below this many column-buffer bytes a problem runs as one chunk: splitting it would cost more in
# launches than overlapping the gather with the GEMM can save.
_OVERLAP_MIN_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
    """How im2col_gemm walks a problem: ``samples`` × ``rows`` output rows per chunk, ``buffers``
    column buffers of ``samples * C*R*S * rows*Q`` elements each (0: no gather needed)."""

    samples: int
    rows: int
    buffers: int

    def chunks(self, spec: ConvSpec):
        """(first sample, samples, first output row, rows) of every chunk, in order."""
        for n0 in range(0, spec.n, self.samples):
            for p0 in range(0, spec.p, self.rows):
                yield n0, min(self.samples, spec.n - n0), p0, min(self.rows, spec.p - p0)


@functools.lru_cache(maxsize=1024)  # a layer called again costs a lookup (host time per call)
def plan_chunks(spec: ConvSpec, itemsize: int, limit: int, overlap: bool = True) -> ChunkPlan:
    """Chunking that keeps all column buffers together ≤ ``limit`` bytes.

    With ``overlap`` (forward), several chunks use two buffers of ``limit / 2`` so that the gather of chunk
    i+1 (side stream) overlaps the GEMM of chunk i (caller's stream), and a problem whose whole column
    matrix fits in ``limit`` but is large still gets four chunks for that overlap. Without it (backward),
    one buffer of up to ``limit``. Raises ``ValueError`` when even one output row of one sample needs more
    than ``limit``.
    """
    n, p = max(spec.n, 1), max(spec.p, 1)
    if spec.is_pointwise_identity:
        return ChunkPlan(n, p, 0)
    sample_bytes = chunk_bytes(spec, 1, spec.p, itemsize)
    total = sample_bytes * spec.n
    if chunk_bytes(spec, 1, 1, itemsize) > limit:
        raise ValueError(f"cuconv: workspace_limit={limit} bytes is too small for im2col_gemm: one "
                         f"output row needs {chunk_bytes(spec, 1, 1, itemsize)} bytes of column buffer; "
                         f"raise cuconv.config.workspace_limit or choose another algorithm")
    if total <= min(limit, _OVERLAP_MIN_BYTES) or (not overlap and total <= limit):
        return ChunkPlan(n, p, 1)
    buffers = 2 if overlap and chunk_bytes(spec, 1, 1, itemsize) <= limit // 2 else 1
    per_buffer = limit // buffers
    target = min(per_buffer, -(-total // 4)) if total <= limit else per_buffer
    if sample_bytes <= target:
        return ChunkPlan(_balanced(n, target // sample_bytes), p, buffers)
    rows = max(1, _rows_within(spec, target, itemsize))
    return ChunkPlan(1, _balanced(p, rows), buffers)


def chunk_bytes(spec: ConvSpec, samples: int, rows: int, itemsize: int) -> int:
    """Bytes of the column buffer for ``samples`` × ``rows`` output rows (rows padded to their pitch)."""
    return samples * spec.crs * row_pitch(rows * spec.q, itemsize) * itemsize


def _rows_within(spec: ConvSpec, budget: int, itemsize: int) -> int:
    vec = 16 // itemsize
    max_pitch = budget // (spec.crs * itemsize) // vec * vec
    return max_pitch // spec.q


def _balanced(total: int, at_most: int) -> int:
    """Chunk size ≤ at_most that splits ``total`` into equal parts (912 + 110 becomes 511 + 511)."""
    parts = -(-total // max(1, at_most))
    return -(-total // parts)


def _accumulation_dtype(dtype) -> numpy.dtype:
    """dtype in which backward sums partial results: fp32 for half precisions, else the dtype itself."""
    dtype = numpy.dtype(dtype)
    return numpy.dtype(numpy.float32) if dtype.itemsize == 2 else dtype


# Per-sample partial sums of wgrad take at most this much memory (and what workspace_limit leaves beside the
# column buffer); more samples per chunk run in turns.
_WGRAD_PARTIALS_BYTES = 64 << 20
# ... and serve layers whose K x CRS outputs are at most about one wave of 128 x 128 tiles on an H100/H200
# (132 SMs): larger ones take the interleaved single GEMM, and partials would only add traffic.
_WGRAD_PARTIALS_MAX_OUTPUTS = 1 << 21


def wgrad_partial_samples(spec: ConvSpec, plan: ChunkPlan, acc_itemsize: int, col_bytes: int, limit: int) -> int:
    """How many samples' partial sums one-group wgrad keeps at a time, or 0 where batching the samples' GEMMs
    does not pay or does not fit: several groups, K x CRS above ``_WGRAD_PARTIALS_MAX_OUTPUTS``, or room for
    fewer than two samples in ``_WGRAD_PARTIALS_BYTES`` and what the workspace limit (``limit``) leaves beside the
    column buffer (``col_bytes``)."""
    outputs = spec.k * spec.crs
    if spec.groups != 1 or plan.samples < 2 or not 0 < outputs <= _WGRAD_PARTIALS_MAX_OUTPUTS:
        return 0
    budget = min(_WGRAD_PARTIALS_BYTES, limit - col_bytes)
    samples = min(plan.samples, budget // (outputs * acc_itemsize))
    return samples if samples >= 2 else 0


# ----------------------------------------------------------------------------------------------------------
# GPU plans (``_plan``): every pass as prepared launches and cuBLAS GEMMs on raw pointers
# ----------------------------------------------------------------------------------------------------------
def prepare(pass_: str, spec: ConvSpec, dtype, precision: str, env: "_plan.Env", bias: bool = False,
            layout: str = "nchw", weights: str = "kcrs") -> "_plan.Plan":
    """The plan of ``pass_`` (see ``cuconv._plan``); ``bias``: whether the forward adds one. ``layout="nhwc"``:
    x, out, dy and dx channels-last in memory, layers of one group (``reason_unsupported_nhwc``), the weight and
    wgrad's dW KCRS or, with ``weights="krsc"``, channels-last too."""
    b = _plan.Builder(pass_, env)
    dtype = numpy.dtype(dtype)
    if layout == "nhwc":
        reason = _nhwc_shape_reason(spec, pass_)
        if reason is not None:
            raise NotImplementedError(f"cuconv: im2col_gemm cannot run this {pass_}: {reason}")
        _nhwc_steps(b, pass_, spec, dtype, precision, bias, weights == "krsc")
        return b.plan("im2col_gemm")
    if pass_ == "fprop":
        _forward_steps(b, spec, dtype, precision, bias)
    elif pass_ == "dgrad":
        _dgrad_steps(b, spec, dtype, precision)
    else:
        _wgrad_steps(b, spec, dtype, precision)
    return b.plan("im2col_gemm")


def pointwise_nhwc(spec: ConvSpec) -> bool:
    """A 1×1 layer of one group at stride 1, dilation 1, no padding: on channels-last tensors every pass is one
    GEMM over the N·H·W pixels."""
    return ((spec.r, spec.s) == (1, 1) and spec.stride == (1, 1) and spec.dilation == (1, 1)
            and spec.pad == (0, 0, 0, 0) and spec.groups == 1)


def strided_pointwise_nhwc(spec: ConvSpec) -> bool:
    """A 1×1 layer of one group at a stride above 1, no padding: on channels-last tensors every pass is one GEMM
    over the N·P·Q pixels the layer reads, gathered into a column matrix (N·P·Q, C) first (forward, wgrad) or
    scattered from one with the pixels it skips zeroed (dgrad)."""
    return ((spec.r, spec.s) == (1, 1) and spec.stride != (1, 1) and spec.pad == (0, 0, 0, 0)
            and spec.groups == 1)


_GEMM_DIM_MAX = 2**31 - 1  # cuBLAS's int dimensions and leading dimensions
def column_bytes(spec: ConvSpec, dtype) -> int:
    """The workspace of a channels-last pass through a column matrix: (N·P·Q, R·S·C) elements."""
    return spec.n * spec.p * spec.q * spec.r * spec.s * spec.c * numpy.dtype(dtype).itemsize


def _nhwc_shape_reason(spec: ConvSpec, pass_: str):
    if spec.groups != 1:
        return "on channels-last tensors it runs layers of one group only"
    if not (pointwise_nhwc(spec) or strided_pointwise_nhwc(spec)) and pass_ != "wgrad":
        return "on channels-last tensors it runs unpadded 1x1 layers, and the wgrad of others, only"
    if max(spec.n * spec.h * spec.w, spec.n * spec.p * spec.q, spec.r * spec.s * spec.c, spec.k) > _GEMM_DIM_MAX:
        return "its channels-last GEMM has N·H·W rows, beyond cuBLAS's 32-bit dimensions"
    return None


def _wgrad_sum_bytes(spec: ConvSpec, dtype) -> int:
    """The workspace a chunked wgrad keeps its running sum of dW in: fp32 (or fp64) room for the half types, none
    where dW holds the sums' type (rounded up to the workspace's alignment)."""
    acc = _accumulation_dtype(numpy.dtype(dtype))
    if acc == numpy.dtype(dtype):
        return 0
    return -(-spec.k * spec.crs_per_group * acc.itemsize // _plan.ALIGNMENT) * _plan.ALIGNMENT


def reason_unsupported(spec: ConvSpec, dtype, pass_: str = "fprop", precision: str = "ieee", limits=None):
    """Why im2col_gemm cannot run ``pass_`` under ``limits``' workspace limit, or None: a pass through column
    buffers needs one output row's columns at least (``plan_chunks``; the dgrad's in its fp32 sums for the half
    types), and a chunked wgrad of the half types its fp32 running sum of dW besides; 1x1 layers folded over the
    pixels or the batch (``pixel_folded``, ``batch_folded``) and unpadded 1x1 layers at stride 1 need none."""
    dtype = numpy.dtype(dtype)
    limit = (limits or _plan.current_limits()).workspace_limit
    if pixel_folded(spec) or batch_folded(spec, dtype.itemsize, limit):
        return None
    col_item = _accumulation_dtype(dtype).itemsize if pass_ == "dgrad" else dtype.itemsize
    need = 0 if spec.is_pointwise_identity else chunk_bytes(spec, 1, 1, col_item)
    if pass_ == "wgrad":
        need += _wgrad_sum_bytes(spec, dtype)
    if need > limit:
        return (f"its column buffer for one output row{' and the fp32 sums of dW' if pass_ == 'wgrad' else ''} "
                f"{'need' if pass_ == 'wgrad' else 'needs'} {need} bytes, more than cuconv.config.workspace_limit "
                f"({limit})")
    return None


def reason_unsupported_nhwc(spec: ConvSpec, dtype, pass_: str = "fprop", precision: str = "ieee", limits=None):
    """Why im2col_gemm cannot run ``pass_`` on channels-last activations in place, or None. Layers of one group,
    each pass one GEMM over pixels (cuBLAS's 32-bit dimensions): unpadded 1x1 layers at stride 1
    (``pointwise_nhwc``) every pass on the tensors as they are, at a larger stride (``strided_pointwise_nhwc``)
    every pass through a column matrix of the pixels read; any other layer's wgrad through its column matrix
    (N·P·Q, R·S·C). The column matrix lives in the workspace."""
    reason = _nhwc_shape_reason(spec, pass_)
    if reason is None and not pointwise_nhwc(spec):
        limit = (limits or _plan.current_limits()).workspace_limit
        need = column_bytes(spec, dtype)
        if _sums_by_images(pass_, spec, dtype):
            need //= max(1, spec.n)  # (one image's at a time at least)
        if need > limit:
            return f"its column matrix needs {need} bytes of workspace (> {limit})"
    return reason


def _sums_by_images(pass_: str, spec: ConvSpec, dtype) -> bool:
    """Whether a channels-last pass may take its column matrix a run of images at a time: a float32 or float64
    wgrad, dW summing one GEMM after another in place (beta 1); a 16-bit dW would round each partial sum."""
    return pass_ == "wgrad" and numpy.dtype(dtype).itemsize >= 4 and not pointwise_nhwc(spec)


def _wgrad_by_images(pass_: str, spec: ConvSpec, dtype, limit: int):
    """The images a channels-last wgrad's column matrix takes at a time where all of them do not fit ``limit``
    bytes (``_sums_by_images``), or None: one matrix of every image."""
    whole = column_bytes(spec, dtype)
    if whole <= limit or not _sums_by_images(pass_, spec, dtype):
        return None
    return max(1, limit // (whole // spec.n))


def _nhwc_steps(b, pass_: str, spec: ConvSpec, dtype, precision: str, bias: bool, krsc: bool) -> None:
    """One GEMM per pass on channels-last tensors, as cuBLAS's column-major products over the pixels:
    fprop outᵀ (K × pixels) = Wᵀ-op (K × C) · xᵀ (C × pixels), the bias in the epilogue;
    dgrad dxᵀ (C × pixels) = W (C × K, as stored) · dyᵀ (K × pixels);
    wgrad dWᵀ (R·S·C × K) = colᵀ (R·S·C × pixels) · dy-op (pixels × K): the reduction over every pixel in
    one GEMM, no per-sample partial sums (but in float32 and float64 where the column matrix does not fit the
    workspace: ``_nhwc_wgrad_by_images``).
    A 1x1 layer at stride 1 reads x and writes dx as they are (pixels = N·H·W). Elsewhere the pixels are the
    N·P·Q outputs' and x comes through the column matrix in the workspace (``im2col_nhwc``: a row's taps in (r, s,
    c) order for a channels-last dW, (c, r, s) for a KCRS one); a strided 1x1 dgrad writes there and then spreads
    it over dx with zeros between its pixels (``col2im_pixels_nhwc``)."""
    images = _wgrad_by_images(pass_, spec, dtype, b.env.workspace_limit)
    if images is not None:
        _nhwc_wgrad_by_images(b, spec, dtype, precision, krsc, images)
        return
    k, pixels, row = spec.k, spec.n * spec.p * spec.q, spec.c
    x, dx = b.ref("x") if pass_ != "dgrad" else None, b.ref("dx") if pass_ == "dgrad" else None
    if not pointwise_nhwc(spec):
        col = b.take(column_bytes(spec, dtype))
        if pass_ == "dgrad":
            dx = col
        else:
            channel_major = spec.r * spec.s > 1 and not krsc
            b.launch(_im2col.im2col_nhwc_launch(spec, dtype, b.base_aligned(x), channel_major), x, col)
            x, row = col, spec.r * spec.s * spec.c
    if pass_ == "fprop":
        operands = (dtype, precision, k, pixels, row, b.ref("w"), row, 0, x, row, 0, b.ref("out"), k, 0, 1)
        if bias and b.gemm(*operands, 0.0, trans_a="T", bias=b.ref("bias")) is not None:
            return
        if bias:  # (no epilogue for this bias pointer or shape: out filled with it, each pixel a "plane" of K)
            b.launch(bias_fill_launch(dtype, pixels, k, 1, aligned=b.base_aligned(b.ref("out"))), b.ref("out"),
                     b.ref("bias"))
        b.gemm(*operands, 1.0 if bias else 0.0, trans_a="T")
    elif pass_ == "dgrad":
        b.gemm(dtype, precision, row, pixels, k, b.ref("w"), row, 0, b.ref("dy"), k, 0, dx, row, 0, 1)
        if dx != b.ref("dx"):
            b.launch(_col2im.pixels_nhwc_launch(spec, dtype, b.base_aligned(b.ref("dx"))), dx, b.ref("dx"))
    else:
        b.gemm(dtype, precision, row, k, pixels, x, row, 0, b.ref("dy"), k, 0, b.ref("dw"), row, 0, 1, trans_b="T")


def _nhwc_wgrad_by_images(b, spec: ConvSpec, dtype, precision: str, krsc: bool, images: int) -> None:
    """A channels-last wgrad whose column matrix does not fit the workspace (``_wgrad_by_images``): for each run of
    ``images`` images, their column matrix, then dWᵀ += its GEMM with their dy (the first run's overwrites)."""
    row, item = spec.r * spec.s * spec.c, numpy.dtype(dtype).itemsize
    col = b.take(column_bytes(dataclasses.replace(spec, n=images), dtype))
    for n0 in range(0, spec.n, images):
        part = dataclasses.replace(spec, n=min(images, spec.n - n0))
        x = b.ref("x", n0 * spec.h * spec.w * spec.c * item)
        aligned = b.base_aligned(x) and x[1] % 16 == 0
        b.launch(_im2col.im2col_nhwc_launch(part, dtype, aligned, spec.r * spec.s > 1 and not krsc), x, col)
        b.gemm(dtype, precision, row, spec.k, part.n * spec.p * spec.q, col, row, 0,
               b.ref("dy", n0 * spec.p * spec.q * spec.k * item), spec.k, 0, b.ref("dw"), row, 0, 1,
               0.0 if n0 == 0 else 1.0, trans_b="T")


class _BatchedGemm:
    """A step: ``cublasGemmBatchedEx`` over pointer arrays in the workspace (built by the step before)."""

    __slots__ = ("args", "refs")

    def __init__(self, args: tuple, refs: tuple):
        self.args, self.refs = args, refs

    def __call__(self, bases, stream: int) -> None:
        dtype, precision, m, n, k, lda, ldb, ldc, batch, beta, trans_b, c_dtype = self.args
        a, b, c = (bases[i] + o for i, o in self.refs)
        _cublas.gemm_batched(dtype, precision, m, n, k, a, lda, b, ldb, c, ldc, batch, beta, trans_b=trans_b,
                             c_dtype=c_dtype, stream=stream)


def _pair_gemm(b, dtype, precision, spec, nb, m, n, k, a, lda, a_sample, a_group, w_ref, ldb, w_group, c, ldc,
               c_sample, c_group, beta=0.0, trans_b="N", c_dtype=None):
    """A GEMM over the (sample, group) pairs of ``nb`` samples, strides in bytes: one strided batch over the
    samples (one group) or the groups (one sample), else a batch of pointer arrays built on the device."""
    g = spec.groups
    item = numpy.dtype(dtype).itemsize
    c_item = item if c_dtype is None else numpy.dtype(c_dtype).itemsize
    if g == 1 or nb == 1:
        by_sample = g == 1
        b.gemm(dtype, precision, m, n, k, a, lda, (a_sample if by_sample else a_group) // item,
               w_ref, ldb, 0 if by_sample else w_group // item,
               c, ldc, (c_sample if by_sample else c_group) // c_item, nb if by_sample else g, beta,
               trans_b=trans_b, c_dtype=c_dtype)
        return
    count = nb * g
    arrays = b.take(3 * 8 * count)
    a_ptrs, b_ptrs, c_ptrs = arrays, (arrays[0], arrays[1] + 8 * count), (arrays[0], arrays[1] + 16 * count)
    b.launch(gemm_ptrs.pointers_launch(nb, g, a_sample, a_group, w_group, c_sample, c_group),
             a_ptrs, b_ptrs, c_ptrs, a, w_ref, c)
    b.steps.append(_BatchedGemm((dtype, precision, m, n, k, lda, ldb, ldc, count, beta, trans_b, c_dtype),
                                (a_ptrs, b_ptrs, c_ptrs)))


def _forward_gemm(b, dtype, precision, spec, nb, length, col, col_ld, out, beta, append=True):
    """out[n, g] (K/g, L) = W[g] (K/g, CRS/g) @ col[n, g] (CRS/g, L) for the nb samples of a chunk.

    Column-major for cuBLAS: out[n, g]ᵀ (L × K/g, ld P·Q) = col[n, g]ᵀ (L × CRS/g, ld col_ld) @ W[g]ᵀ."""
    item = dtype.itemsize
    kg, crs_g, pq = spec.k_per_group, spec.crs_per_group, spec.p * spec.q
    if not append:  # (one strided GEMM: the overlapped chunks hold their steps themselves)
        return b.gemm(dtype, precision, length, kg, crs_g, col, col_ld, spec.crs * col_ld, b.ref("w"), crs_g, 0,
                      out, pq, spec.k * pq, nb, beta, append=False)
    _pair_gemm(b, dtype, precision, spec, nb, length, kg, crs_g, col, col_ld, spec.crs * col_ld * item,
               crs_g * col_ld * item, b.ref("w"), crs_g, kg * crs_g * item, out, pq, spec.k * pq * item,
               kg * pq * item, beta)


def pixel_folded(spec: ConvSpec) -> bool:
    """A 1x1 stride-1 unpadded layer of one group on 1x1 planes (squeeze-excitation's): x (N, C), dy (N, K) and
    w (K, C) are plain matrices, and each pass is one GEMM over the batch instead of a batch of GEMMs of one
    column or of outer products."""
    return spec.is_pointwise_identity and spec.groups == 1 and spec.h * spec.w == 1


# 1x1 layers on planes of fewer pixels than this: the batch's (N, C, P·Q) swapped to (C, N·P·Q), so that each
# pass is one GEMM over the batch (a strided batch of GEMMs P·Q columns wide runs cuBLAS's slowest tiles).
BATCH_FOLD_MAX_PIXELS = 14 * 14


def batch_foldable(spec: ConvSpec) -> bool:
    """A 1x1 stride-1 unpadded one-group layer on small planes (2 to ``BATCH_FOLD_MAX_PIXELS`` - 1 pixels): its
    passes can run as one GEMM over the batch between two ``swap_planes`` (``batch_folded``)."""
    return spec.is_pointwise_identity and spec.groups == 1 and 1 < spec.h * spec.w < BATCH_FOLD_MAX_PIXELS


def batch_folded(spec: ConvSpec, itemsize: int, workspace_limit: int) -> bool:
    """Whether a pass of a ``batch_foldable`` layer runs so: its operands swapped to (C, N·P·Q) in the workspace,
    both within ``workspace_limit``, below 2^30 elements for the swaps' 32-bit grid-stride loop."""
    if not batch_foldable(spec):
        return False
    pixels = spec.n * spec.h * spec.w
    elements = max(spec.c, spec.k) * pixels
    return elements < 2**30 and (spec.c + spec.k) * pixels * itemsize + _plan.ALIGNMENT <= workspace_limit


def _forward_batch_folded(b, spec: ConvSpec, dtype, precision: str, bias: bool) -> None:
    """out = conv(x, w) + bias as xt (C, N·P·Q) = x swapped, outt (K, N·P·Q) = W @ xt (onto the bias, broadcast
    along outt's rows), out = outt swapped back."""
    item, pq = dtype.itemsize, spec.p * spec.q
    npq = spec.n * pq
    xt, outt = b.take(spec.c * npq * item), b.take(spec.k * npq * item)
    b.launch(elementwise.swap_planes(dtype, spec.n, spec.c, pq), b.ref("x"), xt)
    beta = 0.0
    if bias:
        b.launch(bias_fill_launch(dtype, 1, spec.k, npq, aligned=True), outt, b.ref("bias"))  # the workspace
        beta = 1.0
    # column-major: outtᵀ (N·PQ × K, ld N·PQ) = xtᵀ (N·PQ × C, ld N·PQ) @ Wᵀ (C × K, ld C)
    b.gemm(dtype, precision, npq, spec.k, spec.c, xt, npq, 0, b.ref("w"), spec.c, 0, outt, npq, 0, 1, beta)
    b.launch(elementwise.swap_planes(dtype, spec.k, spec.n, pq), outt, b.ref("out"))


def _forward_steps(b, spec: ConvSpec, dtype, precision: str, bias: bool) -> None:
    """conv(x, w) + bias into out. With a bias, out is first filled with it and every GEMM accumulates onto it
    (beta = 1), but on 1x1 planes (one GEMM, the filters its rows), where cuBLASLt's epilogue adds it. 1x1
    stride-1 unpadded: one GEMM on the input planes as they are. Otherwise chunks of im2col
    + GEMM; with two column buffers (large problems) the gather of chunk i+1 runs on a side stream while
    the GEMM of chunk i runs (``_Overlapped``)."""
    item = dtype.itemsize
    pq = spec.p * spec.q
    if batch_folded(spec, item, b.env.workspace_limit):
        _forward_batch_folded(b, spec, dtype, precision, bias)
        return
    if pixel_folded(spec):  # column-major: out (K × N, ld K) = op(w) (K × C; stored C × K, ld C) @ x (C × N, ld C)
        operands = (dtype, precision, spec.k, spec.n, spec.c, b.ref("w"), spec.c, 0, b.ref("x"), spec.c, 0,
                    b.ref("out"), spec.k, 0, 1)
        # the bias (one per row: per filter) in cuBLASLt's epilogue, one launch; else filled in first
        if bias and b.gemm(*operands, 0.0, trans_a="T", bias=b.ref("bias")) is not None:
            return
        if bias:
            b.launch(bias_fill_launch(dtype, spec.n, spec.k, pq, aligned=b.base_aligned(b.ref("out"))),
                     b.ref("out"), b.ref("bias"))
        b.gemm(*operands, 1.0 if bias else 0.0, trans_a="T")
        return
    chunks_plan = plan_chunks(spec, item, b.env.workspace_limit)
    beta = 0.0
    if bias:
        b.launch(bias_fill_launch(dtype, spec.n, spec.k, pq, aligned=b.base_aligned(b.ref("out"))),
                     b.ref("out"), b.ref("bias"))
        beta = 1.0
    if chunks_plan.buffers == 0:
        _forward_gemm(b, dtype, precision, spec, spec.n, pq, b.ref("x"), pq, b.ref("out"), beta)
        return
    chunks = list(chunks_plan.chunks(spec))
    buf_bytes = chunk_bytes(spec, chunks_plan.samples, chunks_plan.rows, item)
    buffers = [b.take(buf_bytes) for _ in range(chunks_plan.buffers)]
    overlap = chunks_plan.buffers == 2 and len(chunks) > 1 and spec.groups == 1
    pairs = []
    for i, (n0, nb, p0, rows) in enumerate(chunks):
        col = buffers[i % len(buffers)]
        x_ref = b.ref("x", n0 * spec.c * spec.h * spec.w * item)
        out_ref = b.ref("out", (n0 * spec.k * pq + p0 * spec.q) * item)
        gather = b.launch(_im2col.im2col_launch(spec, dtype, nb, p0, rows), x_ref, col, append=not overlap)
        if overlap:
            pairs.append((gather, _forward_gemm(b, dtype, precision, spec, nb, rows * spec.q, col,
                                                row_pitch(rows * spec.q, item), out_ref, beta, append=False)))
        else:
            _forward_gemm(b, dtype, precision, spec, nb, rows * spec.q, col, row_pitch(rows * spec.q, item), out_ref,
                          beta)
    if overlap:
        b.steps.append(_Overlapped(tuple(pairs), b.env.device))


class _Overlapped:
    """A step: chunks of (gather, GEMM) with two column buffers, the gather of chunk i+1 on a side stream
    while the GEMM of chunk i runs on the call's stream. Events are made per call (two calls on two streams
    never share one); the side stream joins the call's stream at the end, so a CUDA-graph capture of the
    call stays one graph."""

    __slots__ = ("pairs", "device")

    def __init__(self, pairs: tuple, device: int):
        self.pairs, self.device = pairs, device

    def __call__(self, bases, stream: int) -> None:
        runtime = _backend.cupy_or_none().cuda.runtime
        side = _side_stream(self.device)
        events = []

        def record(on: int) -> int:
            event = runtime.eventCreateWithFlags(runtime.eventDisableTiming)
            events.append(event)
            runtime.eventRecord(event, on)
            return event

        try:
            runtime.streamWaitEvent(side, record(stream), 0)  # the inputs are ready on the call's stream
            gemm_done = [None, None]
            for i, (gather, gemm) in enumerate(self.pairs):
                if gemm_done[i % 2] is not None:  # the GEMM that read this buffer has finished
                    runtime.streamWaitEvent(side, gemm_done[i % 2], 0)
                gather(bases, side)
                runtime.streamWaitEvent(stream, record(side), 0)
                gemm(bases, stream)
                gemm_done[i % 2] = record(stream)
        finally:
            for event in events:  # (destroying a recorded event is legal: it is released once it completes)
                runtime.eventDestroy(event)


_side_streams = {}


def _side_stream(device: int) -> int:
    """One non-blocking stream per device for the gathers that run ahead of the GEMMs."""
    stream = _side_streams.get(device)
    if stream is None:
        runtime = _backend.cupy_or_none().cuda.runtime
        stream = _side_streams[device] = runtime.streamCreateWithFlags(runtime.streamNonBlocking)
    return stream


def _dgrad_steps(b, spec: ConvSpec, dtype, precision: str) -> None:
    """dx = conv2d_input(dy, w): per chunk, col (CRS/g, L) = W[g]ᵀ @ dY[n, g] in fp32 for the half types
    (``_accumulation_dtype``), then col2im sums each input pixel's taps into dx. 1x1 stride-1 unpadded: the GEMM
    writes dx directly (one rounding, no col2im)."""
    col_dtype = _accumulation_dtype(dtype)
    item, col_item = dtype.itemsize, col_dtype.itemsize
    pq = spec.p * spec.q
    if pixel_folded(spec):  # column-major: dx (C × N, ld C) = w (C × K, ld C) @ dy (K × N, ld K)
        b.gemm(dtype, precision, spec.c, spec.n, spec.k, b.ref("w"), spec.c, 0, b.ref("dy"), spec.k, 0, b.ref("dx"),
               spec.c, 0, 1)
        return
    if batch_folded(spec, item, b.env.workspace_limit):  # dyt (K, N·PQ) = dy swapped; dxt (C, N·PQ) = Wᵀ @ dyt
        npq = spec.n * pq
        dyt, dxt = b.take(spec.k * npq * item), b.take(spec.c * npq * item)
        b.launch(elementwise.swap_planes(dtype, spec.n, spec.k, pq), b.ref("dy"), dyt)
        # column-major: dxtᵀ (N·PQ × C, ld N·PQ) = dytᵀ (N·PQ × K, ld N·PQ) @ W (K × C; stored C × K, ld C)
        b.gemm(dtype, precision, npq, spec.c, spec.k, dyt, npq, 0, b.ref("w"), spec.c, 0, dxt, npq, 0, 1,
               trans_b="T")
        b.launch(elementwise.swap_planes(dtype, spec.c, spec.n, pq), dxt, b.ref("dx"))
        return
    chunks_plan = plan_chunks(spec, col_item, b.env.workspace_limit, overlap=False)
    if chunks_plan.buffers == 0:
        _dgrad_gemm(b, dtype, precision, spec, spec.n, pq, b.ref("dy"), b.ref("dx"), pq, dtype)
        return
    col = b.take(chunk_bytes(spec, chunks_plan.samples, chunks_plan.rows, col_item))
    row_chunks = chunks_plan.rows < spec.p
    if row_chunks:  # chunks add into the input rows they touch
        b.launch(elementwise.fill(dtype, spec.n * spec.c * spec.h * spec.w), b.ref("dx"))
    for n0, nb, p0, rows in chunks_plan.chunks(spec):
        length = rows * spec.q
        pitch = row_pitch(length, col_item)
        _dgrad_gemm(b, dtype, precision, spec, nb, length, b.ref("dy", (n0 * spec.k * pq + p0 * spec.q) * item), col,
                    pitch, col_dtype)
        b.launch(_col2im.col2im_launch(spec, dtype, col_dtype, nb, p0, rows, pitch, row_chunks), col,
                 b.ref("dx", n0 * spec.c * spec.h * spec.w * item))


def _dgrad_gemm(b, dtype, precision, spec, nb, length, dy, col, col_ld, col_dtype):
    """col[n, g] (CRS/g, L) = W[g]ᵀ @ dY[n, g] (K/g, L) for nb samples, in one GEMM call.

    Column-major: col[n, g]ᵀ (L × CRS/g, ld col_ld) = dY[n, g]ᵀ (L × K/g, ld P·Q) @ W[g] (K/g × CRS/g),
    W[g] being the transpose of its row-major (K/g, CRS/g) storage read column-major."""
    item, col_item = dtype.itemsize, numpy.dtype(col_dtype).itemsize
    kg, crs_g, pq = spec.k_per_group, spec.crs_per_group, spec.p * spec.q
    _pair_gemm(b, dtype, precision, spec, nb, length, crs_g, kg, dy, pq, spec.k * pq * item, kg * pq * item,
               b.ref("w"), crs_g, kg * crs_g * item, col, col_ld, spec.crs * col_ld * col_item,
               crs_g * col_ld * col_item, trans_b="T", c_dtype=col_dtype)


def _wgrad_steps(b, spec: ConvSpec, dtype, precision: str) -> None:
    """dw = conv2d_weight(x, dy), summed in fp32 for the half types (then rounded once into dw).

    One group and few outputs: each chunk's samples are one strided-batched GEMM into per-sample partial
    sums (``wgrad_partial_samples``, within the workspace limit), then one launch adds them up in fp32 (or
    fp64) onto the running sum, rounding into dw at the last turn (``elementwise.sum_partials``). A sample's
    own GEMM has only K × C·R·S outputs to spread over the GPU (resnet_1x1_256: two 128 x 128 tiles), so one
    GEMM per sample in turn left it idle (0.75 ms against cuDNN's 0.066 at TF32). Otherwise (several groups,
    outputs enough to fill the GPU, or partial sums that take more than one turn): ``_wgrad_interleaved_steps``
    where two samples fit the workspace, else
    one GEMM per sample, batched over the groups, the first writing (β = 0) and every later one adding
    (β = 1), then one rounding into dw. All sum in a fixed order: the result is deterministic."""
    acc_dtype = _accumulation_dtype(dtype)
    item, acc_item = dtype.itemsize, acc_dtype.itemsize
    pq = spec.p * spec.q
    outputs = spec.k * spec.crs_per_group
    dw = b.ref("dw")
    if pixel_folded(spec):  # column-major: dw (C × K, ld C) = x (C × N, ld C) @ dyᵀ, dy stored (K × N, ld K)
        b.gemm(dtype, precision, spec.c, spec.k, spec.n, b.ref("x"), spec.c, 0, b.ref("dy"), spec.k, 0, dw, spec.c,
               0, 1, trans_b="T")
        return
    if batch_folded(spec, item, b.env.workspace_limit):  # xt (C, N·PQ), dyt (K, N·PQ): dw (K, C) = dyt @ xtᵀ
        npq = spec.n * pq
        xt, dyt = b.take(spec.c * npq * item), b.take(spec.k * npq * item)
        b.launch(elementwise.swap_planes(dtype, spec.n, spec.c, pq), b.ref("x"), xt)
        b.launch(elementwise.swap_planes(dtype, spec.n, spec.k, pq), b.ref("dy"), dyt)
        # column-major: dw (C × K, ld C) = op(xt) (C × N·PQ; stored N·PQ × C) @ dyt (N·PQ × K), ld N·PQ both
        b.gemm(dtype, precision, spec.c, spec.k, npq, xt, npq, 0, dyt, npq, 0, dw, spec.c, 0, 1, trans_a="T")
        return
    # the column buffer and the partial sums within what the fp32 running sum leaves of the limit
    limit = b.env.workspace_limit - _wgrad_sum_bytes(spec, dtype)
    chunks_plan = plan_chunks(spec, item, limit, overlap=False)
    col_bytes = chunk_bytes(spec, chunks_plan.samples, chunks_plan.rows, item) if chunks_plan.buffers else 0
    samples = wgrad_partial_samples(spec, chunks_plan, acc_item, col_bytes, limit)
    one_turn = samples == spec.n and chunks_plan.rows == spec.p
    if not one_turn and _wgrad_interleaved_steps(b, spec, dtype, precision):
        return
    col_buf = b.take(col_bytes) if col_bytes else None
    chunks = list(chunks_plan.chunks(spec))
    turns = [s0 for _, nb, _, _ in chunks for s0 in range(0, nb, samples)] if samples else []
    # the running sum: dw itself where it holds the sums' type, else fp32 room (unless one turn writes dw)
    acc = dw if acc_dtype == dtype or len(turns) == 1 else b.take(outputs * acc_item)
    sums = b.take(samples * outputs * acc_item) if samples else None
    beta = 0.0
    turn = 0
    for n0, nb, p0, rows in chunks:
        length = rows * spec.q
        if col_buf is None:  # 1x1, stride 1, unpadded: the input planes are the column matrix
            col, col_ld = b.ref("x", n0 * spec.c * pq * item), pq
        else:
            col, col_ld = col_buf, row_pitch(length, item)
            b.launch(_im2col.im2col_launch(spec, dtype, nb, p0, rows), b.ref("x", n0 * spec.c * spec.h * spec.w * item),
                     col)
        dy = b.ref("dy", (n0 * spec.k * pq + p0 * spec.q) * item)
        if samples:
            for s0 in range(0, nb, samples):
                sb = min(samples, nb - s0)
                # sums[i]ᵀ (CRS × K, ld CRS) = col[i] read as (L × CRS)ᵀ @ dY[i]ᵀ (L × K), for sb samples
                b.gemm(dtype, precision, spec.crs, spec.k, length,
                       (col[0], col[1] + s0 * spec.crs * col_ld * item), col_ld, spec.crs * col_ld,
                       (dy[0], dy[1] + s0 * spec.k * pq * item), pq, spec.k * pq,
                       sums, spec.crs, outputs, sb, 0.0, trans_a="T", c_dtype=acc_dtype)
                last = turn == len(turns) - 1
                # running sum (+)= Σ of the sb partial sums, in order; the last turn rounds into dw
                b.launch(elementwise.sum_partials(acc_dtype, dtype if last else acc_dtype, outputs, sb), sums,
                         _plan.NULL if turn == 0 else acc, dw if last else acc)
                turn += 1
            continue
        for ni in range(nb):
            _wgrad_gemm(b, dtype, precision, spec, length, (col[0], col[1] + ni * spec.crs * col_ld * item), col_ld,
                        (dy[0], dy[1] + ni * spec.k * pq * item), pq, acc, acc_dtype, beta)
            beta = 1.0
    if not samples and acc != dw:
        b.launch(elementwise.cast(acc_dtype, dtype, outputs), acc, dw)


def _wgrad_interleaved_steps(b, spec: ConvSpec, dtype, precision: str) -> bool:
    """wgrad as one GEMM per chunk of samples reducing over (sample, position) together: x's column matrix and
    dy (its 1x1 gather) both gathered ``interleaved``, ``(rows, nb, pitch)`` with zeros past each sample's
    P·Q, so that row i of either is one contiguous run of nb·pitch values. The GEMM is batched over groups
    and runs K × C·R·S outputs over a reduction nb times longer than a sample's; chunks after the first add
    onto an fp32 sum (half types) or dw. False (nothing added) where two samples' gathers do not fit the
    workspace limit."""
    acc_dtype = _accumulation_dtype(dtype)
    item, acc_item = dtype.itemsize, acc_dtype.itemsize
    pitch = row_pitch(spec.p * spec.q, item)
    per_sample = (spec.crs + spec.k) * pitch * item
    outputs = spec.k * spec.crs_per_group
    budget = b.env.workspace_limit - outputs * acc_item
    nb = min(spec.n, budget // per_sample if per_sample else spec.n, (2**31 - 1) // max(pitch, 1))
    if nb < 2 or spec.p * spec.q == 0 or spec.crs == 0:
        return False
    nb = _balanced(spec.n, nb)
    chunks = [(n0, min(nb, spec.n - n0)) for n0 in range(0, spec.n, nb)]
    dw = b.ref("dw")
    acc = dw if acc_dtype == dtype or len(chunks) == 1 else b.take(outputs * acc_item)
    col = b.take(nb * spec.crs * pitch * item)
    dy_col = b.take(nb * spec.k * pitch * item)
    dy_spec = ConvSpec(spec.n, spec.k, spec.p, spec.q, 1, 1, 1)  # dy's gather: a 1x1 stride-1 "convolution"
    for i, (n0, count) in enumerate(chunks):
        b.launch(_im2col.im2col_launch(spec, dtype, count, 0, spec.p, interleaved=True),
                 b.ref("x", n0 * spec.c * spec.h * spec.w * item), col)
        b.launch(_im2col.im2col_launch(dy_spec, dtype, count, 0, spec.p, interleaved=True),
                 b.ref("dy", n0 * spec.k * spec.p * spec.q * item), dy_col)
        _wgrad_gemm(b, dtype, precision, spec, count * pitch, col, count * pitch, dy_col, count * pitch,
                    acc, acc_dtype if acc != dw else None, 0.0 if i == 0 else 1.0)
    if acc != dw:
        b.launch(elementwise.cast(acc_dtype, dtype, outputs), acc, dw)
    return True


def _wgrad_gemm(b, dtype, precision, spec, length, col, col_ld, dy, dy_ld, acc, acc_dtype, beta):
    """dW[g] (K/g, CRS/g) (+)= dY[g] (K/g, L) @ col[g]ᵀ (L, CRS/g), all groups: one sample's, or a chunk's
    interleaved (``_wgrad_interleaved_steps``; L then runs over its samples too).

    Column-major: dW[g]ᵀ (CRS/g × K/g, ld CRS/g) = op_T(col[g] read as (L × CRS/g), ld col_ld)
    @ dY[g]ᵀ (L × K/g, ld dy_ld); batched over groups."""
    g, kg, crs_g = spec.groups, spec.k_per_group, spec.crs_per_group
    b.gemm(dtype, precision, crs_g, kg, length, col, col_ld, crs_g * col_ld, dy, dy_ld, kg * dy_ld,
           acc, crs_g, kg * crs_g, g, beta, trans_a="T", c_dtype=acc_dtype)


def forward_gpu(x, w, bias, spec: ConvSpec, out, precision: str) -> None:
    """out = conv(x, w) + bias on C-contiguous CuPy arrays, CuPy's current stream (``prepare`` and run)."""
    _plan.run_on_arrays(prepare, "fprop", spec, precision, x, w, bias, out)


def dgrad_gpu(dy, w, spec: ConvSpec, dx, precision: str) -> None:
    """dx = conv2d_input(dy, w) into C-contiguous CuPy ``dx`` (N, C, H, W), on CuPy's current stream."""
    _plan.run_on_arrays(prepare, "dgrad", spec, precision, dy, w, dx)


def wgrad_gpu(x, dy, spec: ConvSpec, dw, precision: str) -> None:
    """dw = conv2d_weight(x, dy) into C-contiguous CuPy ``dw`` (K, C/g, R, S), on CuPy's current stream."""
    _plan.run_on_arrays(prepare, "wgrad", spec, precision, x, dy, dw)


class Im2colGemm(Algorithm):
    """``im2col_gemm`` behind the algorithm contract (``cuconv.algos.base``)."""

    name = "im2col_gemm"
    passes = PASSES
    layouts = ("nchw", "nhwc")
    weight_layouts = ("kcrs", "krsc")
    nchw_limits = staticmethod(reason_unsupported)
    nhwc_limits = staticmethod(reason_unsupported_nhwc)

    def reason(self, problem: Problem, limits: "_plan.Limits"):
        """On channels-last activations its own limits only (its passes there take no NCHW column buffers)."""
        if problem.layout == "nhwc":
            return reason_unsupported_nhwc(problem.spec, problem.dtype, problem.pass_, problem.precision, limits)
        return reason_unsupported(problem.spec, problem.dtype, problem.pass_, problem.precision, limits)

    def build(self, p: Problem, env: "_plan.Env", **knobs) -> "_plan.Plan":
        return prepare(p.pass_, p.spec, p.dtype, p.precision, env, p.bias, p.layout, p.weights)


ALGORITHM = Im2colGemm()
