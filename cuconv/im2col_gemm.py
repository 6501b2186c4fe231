"""Algorithm ``im2col_gemm``: gather the column matrix (``kernels_cu/im2col.cu``), multiply with cuBLAS.

For each sample n and group g (row-major shapes)::

    out[n, g] (K/g, P·Q) = W[g] (K/g, C/g·R·S) @ col[n, g] (C/g·R·S, P·Q)

written straight into the NCHW output: no transpose pass. The column buffer is bounded by
``cuconv.config.workspace_limit``: chunks of whole samples when a sample fits, else chunks of output rows
of one sample (``plan_chunks``). A 1x1 stride-1 unpadded convolution needs no gather at all: each sample's
input planes already are its column matrix. The CPU path is the same structure in NumPy.

Backward, same family (names as CUDA engineers use them)::

    dgrad:  col[n, g] (CRS/g, P·Q) = W[g]ᵀ (CRS/g, K/g) @ dY[n, g] (K/g, P·Q),  then col2im → dx
    wgrad:  dW[g] (K/g, CRS/g)    = Σ_n dY[n, g] (K/g, P·Q) @ col[n, g]ᵀ
            (one group: per-sample products in one batched GEMM, summed by a GEMM with ones; several
            groups: β = 1 over samples)

Half-precision dgrad keeps its column matrix in fp32 and wgrad accumulates in fp32: one rounding each.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy

from ._config import config
from .spec import ConvSpec
from . import _cublas
from . import col2im as _col2im
from . import im2col as _im2col
from .gemm_ptrs import batched_pointers
from .im2col import row_pitch

__all__ = ["ChunkPlan", "plan_chunks", "chunk_bytes", "wgrad_partial_samples", "forward_gpu", "forward_cpu",
           "dgrad_gpu", "dgrad_cpu", "wgrad_gpu", "wgrad_cpu"]


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


_side_streams = {}


def _side_stream(cupy):
    """One non-blocking stream per device for the gathers that run ahead of the GEMMs."""
    dev = cupy.cuda.runtime.getDevice()
    stream = _side_streams.get(dev)
    if stream is None:
        stream = _side_streams[dev] = cupy.cuda.Stream(non_blocking=True)
    return stream


def forward_gpu(x, w, bias, spec: ConvSpec, out, precision: str) -> None:
    """Write conv(x, w) + bias into ``out``; all CuPy, C-contiguous, on the current device and stream.

    With a bias, ``out`` is first filled with it and every GEMM accumulates onto it (beta = 1).
    """
    item = x.dtype.itemsize
    pq = spec.p * spec.q
    plan = plan_chunks(spec, item, config.workspace_limit)
    beta = 0.0
    if bias is not None:
        from .bias import bias_fill_gpu

        bias_fill_gpu(out, bias)
        beta = 1.0
    if plan.buffers == 0:  # 1x1 stride 1 unpadded: one GEMM on the input planes as they are (one chunk)
        _gemm_chunk(_cublas, x.dtype, precision, spec, spec.n, pq, x.data.ptr, pq, w.data.ptr, out.data.ptr, beta)
        return
    import cupy

    chunks = list(plan.chunks(spec))
    main = cupy.cuda.get_current_stream()
    side = _side_stream(cupy) if plan.buffers == 2 and len(chunks) > 1 else None
    buf_len = chunk_bytes(spec, plan.samples, plan.rows, item) // item
    buffers = [cupy.empty(buf_len, dtype=x.dtype) for _ in range(plan.buffers)]
    gemm_done = [None] * len(buffers)
    if side is not None:
        side.wait_event(main.record())  # x, w and the buffers are ready on the caller's stream
    for i, (n0, nb, p0, rows) in enumerate(chunks):
        length = rows * spec.q
        b = i % len(buffers)
        pitch = row_pitch(length, item)
        col = buffers[b][: nb * spec.crs * pitch].reshape(nb, spec.crs, pitch)
        if side is None:
            _im2col.im2col_gpu(x[n0:n0 + nb], spec, p0, rows, col)
        else:
            if gemm_done[b] is not None:
                side.wait_event(gemm_done[b])  # the GEMM that read this buffer has finished
            with side:
                _im2col.im2col_gpu(x[n0:n0 + nb], spec, p0, rows, col)
            main.wait_event(side.record())
        col_ptr, col_ld = col.data.ptr, pitch
        out_ptr = out.data.ptr + (n0 * spec.k * pq + p0 * spec.q) * item
        _gemm_chunk(_cublas, x.dtype, precision, spec, nb, length, col_ptr, col_ld, w.data.ptr, out_ptr,
                    beta)
        if side is not None:
            gemm_done[i % len(buffers)] = main.record()


def _gemm_chunk(cublas, dtype, precision, spec, nb, length, col_ptr, col_ld, w_ptr, out_ptr, beta):
    """out[n, g] (K/g, L) = W[g] (K/g, CRS/g) @ col[n, g] (CRS/g, L) for the nb samples of a chunk.

    Column-major for cuBLAS: out[n, g]ᵀ (L × K/g, ld P·Q) = col[n, g]ᵀ (L × CRS/g, ld col_ld) @ W[g]ᵀ.
    One GEMM call: strided over samples (one group) or groups (one sample), else over (sample, group) pairs
    through device-built pointer arrays.
    """
    item = numpy.dtype(dtype).itemsize
    g, kg, crs_g, pq = spec.groups, spec.k_per_group, spec.crs_per_group, spec.p * spec.q
    sample_col = spec.crs * col_ld
    if g == 1 or nb == 1:
        by_sample = g == 1
        cublas.gemm(dtype, precision, length, kg, crs_g,
                    col_ptr, col_ld, sample_col if by_sample else crs_g * col_ld,
                    w_ptr, crs_g, 0 if by_sample else kg * crs_g,
                    out_ptr, pq, spec.k * pq if by_sample else kg * pq, nb if by_sample else g, beta)
        return
    a, b, c = batched_pointers(nb, g, col_ptr, sample_col * item, crs_g * col_ld * item,
                               w_ptr, kg * crs_g * item, out_ptr, spec.k * pq * item, kg * pq * item)
    cublas.gemm_batched(dtype, precision, length, kg, crs_g, a.data.ptr, col_ld, b.data.ptr, crs_g,
                        c.data.ptr, pq, nb * g, beta)


def _compute_dtype(dtype: numpy.dtype) -> numpy.dtype:
    # Half precisions accumulate in float32, as on the GPU; float32 and float64 compute in themselves.
    return numpy.dtype(numpy.float64) if dtype == numpy.float64 else numpy.dtype(numpy.float32)


def forward_cpu(x: numpy.ndarray, w: numpy.ndarray, bias, spec: ConvSpec, out: numpy.ndarray) -> None:
    """NumPy twin of :func:`forward_gpu` (``precision`` has no effect: float32 is always IEEE here)."""
    cdt = _compute_dtype(x.dtype)
    g, kg, crs_g = spec.groups, spec.k_per_group, spec.crs_per_group
    w_g = w.reshape(g, kg, crs_g).astype(cdt, copy=False)
    out_v = out.reshape(spec.n, g, kg, spec.p, spec.q)
    plan = plan_chunks(spec, numpy.dtype(cdt).itemsize, config.workspace_limit)
    for n0, nb, p0, rows in plan.chunks(spec):
        col = _im2col.im2col_cpu(x[n0:n0 + nb], spec, p0, rows).astype(cdt, copy=False)
        col = col.reshape(nb, g, crs_g, rows * spec.q)
        # (nb, g, K/g, L) = (g, K/g, CRS/g) @ (nb, g, CRS/g, L)
        res = numpy.matmul(w_g, col)
        if bias is not None:  # added before the one rounding to out.dtype, as on the GPU
            res += bias.astype(cdt).reshape(1, g, kg, 1)
        out_v[n0:n0 + nb, :, :, p0:p0 + rows, :] = res.reshape(nb, g, kg, rows, spec.q)


def _accumulation_dtype(dtype) -> numpy.dtype:
    """dtype in which backward sums partial results: fp32 for half precisions, else the dtype itself."""
    dtype = numpy.dtype(dtype)
    return numpy.dtype(numpy.float32) if dtype.itemsize == 2 else dtype


def dgrad_gpu(dy, w, spec: ConvSpec, dx, precision: str) -> None:
    """dx = conv2d_input(dy, w) into C-contiguous CuPy ``dx`` (N, C, H, W), on the current stream."""
    import cupy

    dtype = dx.dtype
    col_dtype = _accumulation_dtype(dtype)
    g, kg, crs_g, pq = spec.groups, spec.k_per_group, spec.crs_per_group, spec.p * spec.q
    item, col_item = dtype.itemsize, col_dtype.itemsize
    plan = plan_chunks(spec, col_item, config.workspace_limit, overlap=False)
    if plan.buffers == 0:
        # 1x1, stride 1, unpadded: dx[n, g] (C/g, P·Q) = W[g]ᵀ (C/g, K/g) @ dY[n, g] — one rounding, no col2im.
        _dgrad_gemm(_cublas, dtype, precision, spec, spec.n, pq, dy.data.ptr, dx.data.ptr, pq, w.data.ptr,
                    dtype)
        return
    col_buf = cupy.empty(chunk_bytes(spec, plan.samples, plan.rows, col_item) // col_item, dtype=col_dtype)
    row_chunks = plan.rows < spec.p
    if row_chunks:
        dx.fill(0)  # chunks add into the input rows they touch
    for n0, nb, p0, rows in plan.chunks(spec):
        length = rows * spec.q
        pitch = row_pitch(length, col_item)
        col = col_buf[: nb * spec.crs * pitch].reshape(nb, spec.crs, pitch)
        _dgrad_gemm(_cublas, dtype, precision, spec, nb, length,
                    dy.data.ptr + (n0 * spec.k * pq + p0 * spec.q) * item, col.data.ptr, pitch, w.data.ptr,
                    col_dtype)
        _col2im.col2im_gpu(col, spec, p0, rows, dx[n0:n0 + nb], accumulate=row_chunks)


def _dgrad_gemm(cublas, dtype, precision, spec, nb, length, dy_ptr, col_ptr, col_ld, w_ptr, col_dtype):
    """col[n, g] (CRS/g, L) = W[g]ᵀ @ dY[n, g] (K/g, L) for nb samples, in one GEMM call.

    Column-major: col[n, g]ᵀ (L × CRS/g, ld col_ld) = dY[n, g]ᵀ (L × K/g, ld P·Q) @ W[g] (K/g × CRS/g),
    W[g] being the transpose of its row-major (K/g, CRS/g) storage read column-major.
    """
    item, col_item = numpy.dtype(dtype).itemsize, numpy.dtype(col_dtype).itemsize
    g, kg, crs_g, pq = spec.groups, spec.k_per_group, spec.crs_per_group, spec.p * spec.q
    sample_col = spec.crs * col_ld
    if g == 1 or nb == 1:
        by_sample = g == 1
        cublas.gemm(dtype, precision, length, crs_g, kg,
                    dy_ptr, pq, spec.k * pq if by_sample else kg * pq,
                    w_ptr, crs_g, 0 if by_sample else kg * crs_g,
                    col_ptr, col_ld, sample_col if by_sample else crs_g * col_ld, nb if by_sample else g,
                    trans_b="T", c_dtype=col_dtype)
        return
    a, b, c = batched_pointers(nb, g, dy_ptr, spec.k * pq * item, kg * pq * item, w_ptr, kg * crs_g * item,
                               col_ptr, sample_col * col_item, crs_g * col_ld * col_item)
    cublas.gemm_batched(dtype, precision, length, crs_g, kg, a.data.ptr, pq, b.data.ptr, crs_g,
                        c.data.ptr, col_ld, nb * g, trans_b="T", c_dtype=col_dtype)


def wgrad_gpu(x, dy, spec: ConvSpec, dw, precision: str) -> None:
    """dw = conv2d_weight(x, dy) into C-contiguous CuPy ``dw`` (K, C/g, R, S), on the current stream.

    One group and few outputs: each chunk's samples are one strided-batched GEMM into per-sample partial
    sums (``_wgrad_partials``, within ``workspace_limit``), then one GEMM with a vector of ones adds them up
    in fp32 (or fp64) onto the result. A sample's own GEMM has only K × C·R·S outputs to spread over the GPU
    (resnet_1x1_256: two 128 x 128 tiles), so one GEMM per sample in turn left it idle (0.75 ms against
    cuDNN's 0.066 at TF32). Otherwise (several groups, or outputs enough to fill the GPU): one GEMM per
    sample, batched over the groups, the first writing (β = 0) and every later one adding (β = 1). Both sum
    in a fixed order: the result is deterministic.
    """
    import cupy

    dtype = x.dtype
    acc_dtype = _accumulation_dtype(dtype)
    acc = dw if acc_dtype == dtype else cupy.empty(dw.shape, dtype=acc_dtype)
    item = dtype.itemsize
    pq = spec.p * spec.q
    plan = plan_chunks(spec, item, config.workspace_limit, overlap=False)
    col_buf = None
    if plan.buffers:
        col_buf = cupy.empty(chunk_bytes(spec, plan.samples, plan.rows, item) // item, dtype=dtype)
    partials = _wgrad_partials(spec, plan, acc_dtype, 0 if col_buf is None else col_buf.nbytes)
    beta = 0.0
    for n0, nb, p0, rows in plan.chunks(spec):
        length = rows * spec.q
        if col_buf is None:  # 1x1, stride 1, unpadded: the input planes are the column matrix
            col_ptr, col_ld = x.data.ptr + n0 * spec.c * pq * item, pq
        else:
            pitch = row_pitch(length, item)
            col = col_buf[: nb * spec.crs * pitch].reshape(nb, spec.crs, pitch)
            _im2col.im2col_gpu(x[n0:n0 + nb], spec, p0, rows, col)
            col_ptr, col_ld = col.data.ptr, pitch
        dy_ptr = dy.data.ptr + (n0 * spec.k * pq + p0 * spec.q) * item
        if partials is not None:
            sums, ones = partials
            per_sample = spec.k * spec.crs
            for s0 in range(0, nb, ones.size):
                sb = min(ones.size, nb - s0)
                # sums[i]ᵀ (CRS × K, ld CRS) = col[i] read as (L × CRS)ᵀ @ dY[i]ᵀ (L × K), for sb samples
                _cublas.gemm(dtype, precision, spec.crs, spec.k, length,
                             col_ptr + s0 * spec.crs * col_ld * item, col_ld, spec.crs * col_ld,
                             dy_ptr + s0 * spec.k * pq * item, pq, spec.k * pq,
                             sums.data.ptr, spec.crs, per_sample, sb, 0.0, trans_a="T", c_dtype=acc_dtype)
                # dW (K·CRS) (+)= sums (K·CRS × sb) @ ones (sb): plain fp32/fp64 arithmetic, never TF32
                _cublas.gemm(acc_dtype, "ieee", per_sample, 1, sb, sums.data.ptr, per_sample, 0,
                             ones.data.ptr, sb, 0, acc.data.ptr, per_sample, 0, 1, beta)
                beta = 1.0
            continue
        for ni in range(nb):
            _wgrad_gemm(_cublas, dtype, precision, spec, length,
                        col_ptr + ni * spec.crs * col_ld * item, col_ld,
                        dy_ptr + ni * spec.k * pq * item, acc, beta)
            beta = 1.0
    if spec.n == 0 or spec.p == 0:
        acc.fill(0)
    if acc is not dw:
        dw[...] = acc.astype(dtype)


# Per-sample partial sums of wgrad take at most this much memory (and what workspace_limit leaves beside the
# column buffer); more samples per chunk run in turns.
_WGRAD_PARTIALS_BYTES = 64 << 20
# ... and serve layers whose K x CRS outputs are at most about one wave of 128 x 128 tiles on an H100/H200
# (132 SMs): larger ones fill the GPU sample by sample already, and the partials would only add traffic (review,
# H200, TF32, 8 x 1024 -> 1024 3x3 at 14 x 14, one sample's partials per turn: 3.07 ms against 0.71).
_WGRAD_PARTIALS_MAX_OUTPUTS = 1 << 21


def wgrad_partial_samples(spec: ConvSpec, plan: ChunkPlan, acc_itemsize: int, col_bytes: int) -> int:
    """How many samples' partial sums one-group wgrad keeps at a time, or 0 where batching the samples' GEMMs
    does not pay or does not fit: several groups, K x CRS above ``_WGRAD_PARTIALS_MAX_OUTPUTS``, or room for
    fewer than two samples in ``_WGRAD_PARTIALS_BYTES`` and what ``workspace_limit`` leaves beside the column
    buffer (``col_bytes``)."""
    outputs = spec.k * spec.crs
    if spec.groups != 1 or plan.samples < 2 or not 0 < outputs <= _WGRAD_PARTIALS_MAX_OUTPUTS:
        return 0
    budget = min(_WGRAD_PARTIALS_BYTES, config.workspace_limit - col_bytes)
    samples = min(plan.samples, budget // (outputs * acc_itemsize))
    return samples if samples >= 2 else 0


def _wgrad_partials(spec: ConvSpec, plan: ChunkPlan, acc_dtype, col_bytes: int):
    """(room for the partial sums of ``wgrad_partial_samples`` samples, that many ones), or None."""
    samples = wgrad_partial_samples(spec, plan, numpy.dtype(acc_dtype).itemsize, col_bytes)
    if not samples:
        return None
    import cupy

    return cupy.empty(samples * spec.k * spec.crs, dtype=acc_dtype), cupy.ones(samples, dtype=acc_dtype)


def _wgrad_gemm(cublas, dtype, precision, spec, length, col_ptr, col_ld, dy_ptr, acc, beta):
    """dW[g] (K/g, CRS/g) (+)= dY[n, g] (K/g, L) @ col[n, g]ᵀ (L, CRS/g) for one sample, all groups.

    Column-major: dW[g]ᵀ (CRS/g × K/g, ld CRS/g) = op_T(col[n, g] read as (L × CRS/g), ld col_ld)
    @ dY[n, g]ᵀ (L × K/g, ld P·Q); batched over groups.
    """
    item = numpy.dtype(dtype).itemsize
    g, kg, crs_g, pq = spec.groups, spec.k_per_group, spec.crs_per_group, spec.p * spec.q
    cublas.gemm(dtype, precision, crs_g, kg, length,
                col_ptr, col_ld, crs_g * col_ld,
                dy_ptr, pq, kg * pq,
                acc.data.ptr, crs_g, kg * crs_g, g, beta,
                trans_a="T", c_dtype=acc.dtype)


def dgrad_cpu(dy: numpy.ndarray, w: numpy.ndarray, spec: ConvSpec, dx: numpy.ndarray) -> None:
    """NumPy twin of :func:`dgrad_gpu`."""
    cdt = _compute_dtype(dx.dtype)
    g, kg, crs_g = spec.groups, spec.k_per_group, spec.crs_per_group
    w_t = w.reshape(g, kg, crs_g).transpose(0, 2, 1).astype(cdt, copy=False)  # (g, CRS/g, K/g)
    acc = numpy.zeros(spec.input_shape, dtype=cdt)
    plan = plan_chunks(spec, numpy.dtype(cdt).itemsize, config.workspace_limit, overlap=False)
    for n0, nb, p0, rows in plan.chunks(spec):
        d = dy[n0:n0 + nb, :, p0:p0 + rows, :].astype(cdt).reshape(nb, g, kg, rows * spec.q)
        col = numpy.matmul(w_t, d)  # (nb, g, CRS/g, L) = (g, CRS/g, K/g) @ (nb, g, K/g, L)
        _col2im.col2im_cpu(col.reshape(nb, spec.crs, rows * spec.q), spec, p0, rows, acc[n0:n0 + nb])
    dx[...] = acc


def wgrad_cpu(x: numpy.ndarray, dy: numpy.ndarray, spec: ConvSpec, dw: numpy.ndarray) -> None:
    """NumPy twin of :func:`wgrad_gpu`."""
    cdt = _compute_dtype(x.dtype)
    g, kg, crs_g = spec.groups, spec.k_per_group, spec.crs_per_group
    acc = numpy.zeros((g, kg, crs_g), dtype=cdt)
    plan = plan_chunks(spec, numpy.dtype(cdt).itemsize, config.workspace_limit, overlap=False)
    for n0, nb, p0, rows in plan.chunks(spec):
        col = _im2col.im2col_cpu(x[n0:n0 + nb], spec, p0, rows).astype(cdt, copy=False)
        col = col.reshape(nb, g, crs_g, rows * spec.q)
        d = dy[n0:n0 + nb, :, p0:p0 + rows, :].astype(cdt).reshape(nb, g, kg, rows * spec.q)
        # (g, K/g, CRS/g) += Σ_n (nb, g, K/g, L) @ (nb, g, L, CRS/g)
        acc += numpy.einsum("ngkl,ngcl->gkc", d, col)
    dw[...] = acc.reshape(dw.shape)
