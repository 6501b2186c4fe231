"""im2col_gemm's chunk planning (plan_chunks / ChunkPlan): the column buffers stay under workspace_limit and
the chunks tile the problem; wgrad's partial sums stay within their budget. And the GEMM arguments of its 1x1
plans, run on the CPU with cuBLAS's GEMM emulated on host memory."""

import numpy
import pytest

from cuconv.algos.im2col_gemm import ChunkPlan, chunk_bytes, plan_chunks
from cuconv.problems import PROBLEMS, SUITES
from cuconv.spec import ConvSpec

GiB = 1 << 30
DEFAULT_LIMIT = GiB  # cuconv.config.workspace_limit's default


def _row_bytes(spec, itemsize):
    """Column-buffer bytes of one output row of one sample (its pitch included)."""
    return chunk_bytes(spec, 1, 1, itemsize)


def check_plan(spec, itemsize, limit, plan):
    """Every invariant a plan must satisfy; returns the list of chunks."""
    chunks = list(plan.chunks(spec))
    # Buffers: each holds the largest chunk's column matrix (rows padded to their pitch), and all of
    # them fit together.
    assert plan.buffers in (0, 1, 2)
    buffer_bytes = chunk_bytes(spec, plan.samples, plan.rows, itemsize)
    assert buffer_bytes >= plan.samples * spec.crs * plan.rows * spec.q * itemsize
    assert plan.buffers * buffer_bytes <= limit
    for _, nb, _, rows in chunks:
        assert 1 <= nb <= plan.samples and 1 <= rows <= plan.rows
    # Coverage: every (sample, output row) exactly once, chunks in (sample, row) order.
    covered = [(n, p) for n0, nb, p0, rows in chunks for n in range(n0, n0 + nb) for p in range(p0, p0 + rows)]
    assert sorted(covered) == [(n, p) for n in range(spec.n) for p in range(spec.p)]
    starts = [(n0, p0) for n0, _, p0, _ in chunks]
    assert starts == sorted(starts)
    # One split axis at a time: whole samples, or rows of one sample.
    assert plan.rows == spec.p or plan.samples == 1
    # Balanced: with as many chunks as the plan has along an axis, no uniform size could be smaller
    # (912 + 110 becomes 511 + 511), so no chunk is below half the largest unless that is unavoidable.
    for total, size in ((spec.n, plan.samples), (spec.p, plan.rows)):
        if total:
            parts = -(-total // size)
            assert size == -(-total // parts), (total, size)
    return chunks


def _random_specs(count, seed):
    rng = numpy.random.default_rng(seed)
    specs = []
    while len(specs) < count:
        n, c = (int(v) for v in rng.integers(1, 9, size=2))
        h, w = (int(v) for v in rng.integers(1, 48, size=2))
        r, s = (int(v) for v in rng.integers(1, 6, size=2))
        stride = tuple(int(v) for v in rng.integers(1, 3, size=2))
        dilation = tuple(int(v) for v in rng.integers(1, 3, size=2))
        pad = tuple(int(v) for v in rng.integers(0, 3, size=4))
        spec = ConvSpec(n, c, h, w, 4, r, s, stride, pad, dilation)
        if spec.p >= 1 and spec.q >= 1:
            specs.append(spec)
    return specs


def test_plan_invariants_random_small_problems():
    for spec in _random_specs(200, seed=11):
        for itemsize in (2, 4, 8):
            row_bytes = _row_bytes(spec, itemsize)
            sample_bytes = row_bytes * spec.p
            limits = {row_bytes, row_bytes + 1, 2 * row_bytes - 1, 2 * row_bytes, 3 * row_bytes + 5,
                      sample_bytes - 1, sample_bytes, 2 * sample_bytes, 3 * sample_bytes + 7,
                      spec.n * sample_bytes, DEFAULT_LIMIT}
            for limit in sorted(v for v in limits if v > 0):
                if limit < row_bytes:
                    with pytest.raises(ValueError, match="workspace_limit"):
                        plan_chunks(spec, itemsize, limit)
                else:
                    check_plan(spec, itemsize, limit, plan_chunks(spec, itemsize, limit))


@pytest.mark.parametrize("limit", [DEFAULT_LIMIT, 256 << 20, 64 << 20, 24 << 20, 4 << 20],
                         ids=lambda v: f"{v >> 20}MiB")
@pytest.mark.parametrize("itemsize", [2, 4, 8])
@pytest.mark.parametrize("problem", [pytest.param(p, id=p.name) for p in PROBLEMS])
def test_plan_invariants_benchmark_problems(problem, itemsize, limit):
    spec = problem.spec()
    if _row_bytes(spec, itemsize) > limit and not spec.is_pointwise_identity:
        with pytest.raises(ValueError, match="workspace_limit"):
            plan_chunks(spec, itemsize, limit)
        return
    check_plan(spec, itemsize, limit, plan_chunks(spec, itemsize, limit))


@pytest.mark.parametrize("limit", [1, 4096, DEFAULT_LIMIT], ids=lambda v: f"limit{v}")
def test_pointwise_identity_needs_no_buffer(limit):
    spec = ConvSpec.from_args((6, 8, 7, 5), (4, 8, 1, 1))
    plan = plan_chunks(spec, 4, limit)
    assert plan == ChunkPlan(6, 7, 0)
    assert list(plan.chunks(spec)) == [(0, 6, 0, 7)]


@pytest.mark.parametrize("kwargs", [dict(stride=2), dict(padding=1), dict(padding=(0, 1))],
                         ids=["stride2", "pad1", "pad0x1"])
def test_pointwise_with_stride_or_padding_gathers(kwargs):
    spec = ConvSpec.from_args((2, 8, 7, 5), (4, 8, 1, 1), **kwargs)
    assert plan_chunks(spec, 4, DEFAULT_LIMIT).buffers == 1


@pytest.mark.parametrize("x_shape,w_shape,kwargs", [
    ((2, 3, 8, 8), (4, 3, 3, 3), {}),
    ((1, 5, 13, 7), (3, 5, 3, 3), dict(padding=1)),
    ((2, 4, 23, 37), (6, 4, 5, 9), dict(padding=(2, 4), dilation=(2, 3))),
    ((4, 16, 32, 32), (64, 16, 5, 9), {}),  # 15 MB of float64 columns
], ids=["basic", "batch1", "dilated", "square_5x9_at_64px"])
@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_small_problem_is_one_chunk(x_shape, w_shape, kwargs, itemsize):
    spec = ConvSpec.from_args(x_shape, w_shape, **kwargs)
    plan = plan_chunks(spec, itemsize, DEFAULT_LIMIT)
    assert plan == ChunkPlan(spec.n, spec.p, 1)
    assert list(plan.chunks(spec)) == [(0, spec.n, 0, spec.p)]


def test_empty_batch_plans_nothing():
    spec = ConvSpec.from_args((0, 3, 8, 8), (4, 3, 3, 3))
    plan = plan_chunks(spec, 4, 1024)
    assert plan.buffers == 1 and list(plan.chunks(spec)) == []


@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_row_larger_than_limit_raises(itemsize):
    spec = ConvSpec.from_args((1, 16, 40, 300), (8, 16, 3, 3))
    row_bytes = _row_bytes(spec, itemsize)
    check_plan(spec, itemsize, row_bytes, plan_chunks(spec, itemsize, row_bytes))
    with pytest.raises(ValueError, match=rf"workspace_limit={row_bytes - 1} bytes is too small for im2col_gemm: "
                                         rf"one output row needs {row_bytes} bytes"):
        plan_chunks(spec, itemsize, row_bytes - 1)


@pytest.mark.parametrize("itemsize", [2, 4, 8])
@pytest.mark.parametrize("name", SUITES["large"])
def test_large_problems_use_two_buffers_at_default_limit(name, itemsize):
    spec = next(p for p in PROBLEMS if p.name == name).spec()
    plan = plan_chunks(spec, itemsize, DEFAULT_LIMIT)
    chunks = check_plan(spec, itemsize, DEFAULT_LIMIT, plan)
    assert plan.buffers == 2
    assert len(chunks) >= 4


def test_rows_are_balanced():
    # P = 2044 output rows, each of two buffers holds 912: three chunks of 682, 682, 680, not 912, 912, 220.
    spec = ConvSpec(1, 1, 2044, 65, 1, 1, 2)  # 1x2 kernel: not a pointwise identity; Q = 64
    assert chunk_bytes(spec, 1, 912, 4) == 912 * chunk_bytes(spec, 1, 1, 4)  # no pitch padding here
    plan = plan_chunks(spec, 4, 2 * chunk_bytes(spec, 1, 912, 4) + 8)
    assert plan == ChunkPlan(1, 682, 2)
    assert [rows for _, _, _, rows in plan.chunks(spec)] == [682, 682, 680]


def test_whole_problem_within_limit_but_large_gets_four_chunks():
    # 32 samples of float32 columns, 231 MB in all: fits in 1 GiB, split in four for overlap.
    spec = ConvSpec.from_args((32, 64, 56, 56), (64, 64, 3, 3), padding=1)
    plan = plan_chunks(spec, 4, DEFAULT_LIMIT)
    assert plan == ChunkPlan(8, 56, 2)
    assert len(list(plan.chunks(spec))) == 4


def _problem(name):
    return next(p for p in PROBLEMS if p.name == name)


@pytest.mark.parametrize("name,samples", [("resnet_1x1_256", 32), ("resnet_3x3_64", 32), ("stem_7x7_s2", 32),
                                          ("square_5x9", 0), ("square_3x3_1024", 0)])
def test_wgrad_batches_samples_into_partial_sums_where_few_outputs(name, samples):
    """One-group wgrad keeps per-sample partial sums for whole chunks of small layers (their own GEMMs would
    leave the GPU idle); the large problems' chunks hold one sample each and take the old path."""
    from cuconv.algos.im2col_gemm import wgrad_partial_samples

    spec = _problem(name).spec()
    plan = plan_chunks(spec, 4, 1 << 30, overlap=False)
    assert wgrad_partial_samples(spec, plan, 4, chunk_bytes(spec, plan.samples, plan.rows, 4), 1 << 30) == samples


def test_wgrad_partial_sums_stay_within_their_budget_and_the_workspace_limit(monkeypatch):
    from cuconv.algos import im2col_gemm
    from cuconv.algos.im2col_gemm import wgrad_partial_samples

    one = ConvSpec.from_args((32, 64, 56, 56), (64, 64, 3, 3), padding=1)  # 64 x 576 outputs: 147 KB a sample
    per = 64 * 576 * 4
    plan = ChunkPlan(32, 56, 1)
    assert wgrad_partial_samples(one, plan, 4, 0, GiB) == 32
    monkeypatch.setattr(im2col_gemm, "_WGRAD_PARTIALS_BYTES", 5 * per + 1)
    assert wgrad_partial_samples(one, plan, 4, 0, GiB) == 5
    assert wgrad_partial_samples(one, plan, 4, 97 * per, 100 * per) == 3  # what the column buffer leaves
    assert wgrad_partial_samples(one, plan, 4, 99 * per, 100 * per) == 0  # room for one: no batching
    assert wgrad_partial_samples(one, ChunkPlan(1, 56, 1), 4, 0, GiB) == 0
    grouped = ConvSpec.from_args((32, 64, 56, 56), (64, 32, 3, 3), padding=1, groups=2)
    assert wgrad_partial_samples(grouped, plan, 4, 0, GiB) == 0
    wide = ConvSpec.from_args((8, 1024, 14, 14), (1024, 1024, 3, 3), padding=1)  # 9.4 M outputs
    assert wgrad_partial_samples(wide, ChunkPlan(8, 14, 1), 4, 0, GiB) == 0


# ----- the GEMMs of a plan, run on the CPU: cuBLAS's column-major GEMM emulated in NumPy on host memory --------
class _HostGemm:
    """``_cublas.PreparedGemm`` on host pointers: column-major ``C[i] = op(A[i]) @ op(B[i]) (+ beta·C[i])
    (+ bias, one per row)`` (the contract of ``_cublas.gemm`` and of the bias epilogue), computed in float64 and
    rounded once to C's dtype."""

    def __init__(self, dtype, precision, m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c, batch, beta=0.0, *,
                 trans_a="N", trans_b="N", c_dtype=None, align=None, device=None, bias=False):
        self.workspace = 0
        self.fuses_bias = bias
        self.args = (numpy.dtype(dtype), numpy.dtype(c_dtype or dtype), m, n, k, lda, stride_a, ldb, stride_b, ldc,
                     stride_c, batch, beta, trans_a, trans_b)

    @staticmethod
    def _matrix(ptr, rows, cols, ld, dtype, trans):
        """op(X) of the column-major (rows x cols, ld) matrix stored at ``ptr`` (its transpose stored for "T")."""
        import ctypes

        stored_cols = cols if trans == "N" else rows
        raw = numpy.frombuffer((ctypes.c_char * (ld * stored_cols * dtype.itemsize)).from_address(ptr), dtype=dtype)
        stored = raw.reshape(stored_cols, ld).T  # (ld x stored_cols), column-major
        return stored[:rows, :cols] if trans == "N" else stored[:cols, :rows].T

    def __call__(self, a, b, c, stream, workspace, bias=0):
        dtype, c_dtype, m, n, k, lda, sa, ldb, sb, ldc, sc, batch, beta, ta, tb = self.args
        rows = _host_array(bias, m, c_dtype).astype(numpy.float64)[:, None] if self.fuses_bias else 0.0
        for i in range(batch):
            am = self._matrix(a + i * sa * dtype.itemsize, m, k, lda, dtype, ta).astype(numpy.float64)
            bm = self._matrix(b + i * sb * dtype.itemsize, k, n, ldb, dtype, tb).astype(numpy.float64)
            cm = self._matrix(c + i * sc * c_dtype.itemsize, m, n, ldc, c_dtype, "N")
            cm[...] = (am @ bm + (beta * cm.astype(numpy.float64) if beta else 0.0) + rows).astype(c_dtype)


def _host_array(ptr, count, dtype):
    import ctypes

    return numpy.frombuffer((ctypes.c_char * (count * dtype.itemsize)).from_address(ptr), dtype=dtype)


def _host_swap_planes(dtype, a, b, length):
    """``elementwise.swap_planes`` on host pointers: dst (b, a, length) = src (a, b, length)."""
    dtype = numpy.dtype(dtype)

    def launch(stream, src, dst):
        view = _host_array(src, a * b * length, dtype).reshape(a, b, length)
        _host_array(dst, a * b * length, dtype)[...] = view.transpose(1, 0, 2).reshape(-1)
    return launch


def _host_bias_fill(dtype, n, k, pq, *, aligned):
    """``bias.fill_launch`` on host pointers: out (n, k, pq) = bias[k]."""
    dtype = numpy.dtype(dtype)

    def launch(stream, out, bias):
        b = _host_array(bias, k, dtype)
        _host_array(out, n * k * pq, dtype)[...] = numpy.broadcast_to(b[None, :, None], (n, k, pq)).reshape(-1)
    return launch


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32, numpy.float16], ids=lambda d: numpy.dtype(d).name)
@pytest.mark.parametrize("x_shape,k", [((3, 7, 5, 6), 4), ((2, 16, 1, 1), 9), ((1, 5, 3, 1), 12), ((2, 3, 15, 14), 5)],
                         ids=["small_planes", "one_pixel", "batch1", "planes"])
def test_pointwise_gemm_arguments_on_host_memory(x_shape, k, dtype, monkeypatch):
    """A 1x1 stride-1 layer's passes as cuBLAS GEMMs: on 1x1 planes one GEMM each (the forward's bias in its
    epilogue: one step); on small planes one GEMM over
    the batch between swaps of the first two axes (``batch_folded``; the forward with its bias); on larger
    planes the forward and dgrad one strided batch of GEMMs. Their plans, run on host memory with the GEMM, the
    swaps and the bias fill emulated, equal the CPU path bit for bit on integers (the leading dimensions,
    strides, transposes and batch of each GEMM, checked without a GPU)."""
    import cuconv
    from cuconv import _cublas, _plan
    from cuconv.blocks import elementwise
    from cuconv.algos import im2col_gemm

    monkeypatch.setattr(_cublas, "PreparedGemm", _HostGemm)
    monkeypatch.setattr(elementwise, "swap_planes", _host_swap_planes)
    monkeypatch.setattr(im2col_gemm, "bias_fill_launch", _host_bias_fill)
    env = _plan.Env(0, GiB, 227 << 10, True, 132, 228 << 10, True)
    rng = numpy.random.default_rng(4)
    spec = ConvSpec.from_args(x_shape, (k, x_shape[1], 1, 1))
    folded = im2col_gemm.batch_folded(spec, numpy.dtype(dtype).itemsize, env.workspace_limit)
    assert folded == (1 < spec.h * spec.w < 196)
    x = rng.integers(-3, 4, spec.input_shape).astype(dtype)
    w = rng.integers(-3, 4, spec.weight_shape).astype(dtype)
    bias = rng.integers(-3, 4, (k,)).astype(dtype)
    dy = rng.integers(-3, 4, spec.output_shape).astype(dtype)
    out, dx = numpy.full(spec.output_shape, numpy.nan, dtype), numpy.full(spec.input_shape, numpy.nan, dtype)
    dw = numpy.full(spec.weight_shape, numpy.nan, dtype)
    with_bias = folded or spec.h * spec.w == 1
    passes = [("fprop", (x.ctypes.data, w.ctypes.data, bias.ctypes.data if with_bias else 0, out.ctypes.data)),
              ("dgrad", (dy.ctypes.data, w.ctypes.data, dx.ctypes.data))]
    if folded or spec.h * spec.w == 1:
        passes.append(("wgrad", (x.ctypes.data, dy.ctypes.data, dw.ctypes.data)))
    for pass_, ptrs in passes:
        plan = im2col_gemm.prepare(pass_, spec, dtype, "ieee", env, **({"bias": with_bias} if pass_ == "fprop" else {}))
        gemms = [step for step in plan.steps if type(step).__name__ == "Gemm"]
        if pass_ == "fprop" and spec.h * spec.w == 1:
            assert len(plan.steps) == 1 and gemms[0].bias is not None
        assert len(gemms) == 1 if (folded or spec.h * spec.w == 1) else gemms == list(plan.steps)
        workspace = numpy.zeros(max(plan.workspace, 1), numpy.uint8)
        plan.run(ptrs, 0, workspace.ctypes.data)
    numpy.testing.assert_array_equal(out, cuconv.conv2d(x, w, bias if with_bias else None))
    numpy.testing.assert_array_equal(dx, cuconv.conv2d_input(x.shape, w, dy))
    if len(passes) == 3:
        numpy.testing.assert_array_equal(dw, cuconv.conv2d_weight(x, w.shape, dy))


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32, numpy.float16], ids=lambda d: numpy.dtype(d).name)
@pytest.mark.parametrize("x_shape,k", [((3, 7, 5, 6), 4), ((2, 16, 1, 1), 9), ((1, 5, 3, 1), 12), ((2, 3, 15, 14), 5)],
                         ids=["small_planes", "one_pixel", "batch1", "planes"])
def test_pointwise_nhwc_gemms_on_host_memory(x_shape, k, dtype, monkeypatch):
    """Channels-last 1×1 layers: each pass one GEMM over the pixels (the bias in the forward's epilogue), run
    with cuBLAS's contract emulated on host memory, equals the CPU path on the NCHW views bit for bit (integers)."""
    import cuconv
    from cuconv import _cublas, _plan
    from cuconv.algos import im2col_gemm

    monkeypatch.setattr(_cublas, "PreparedGemm", _HostGemm)
    env = _plan.Env(0, GiB, 227 << 10, True, 132, 228 << 10, True)
    rng = numpy.random.default_rng(5)
    spec = ConvSpec.from_args(x_shape, (k, x_shape[1], 1, 1))
    assert im2col_gemm.pointwise_nhwc(spec)
    n, c, h, w_ = x_shape
    x = rng.integers(-3, 4, (n, h, w_, c)).astype(dtype)             # NHWC in memory
    w = rng.integers(-3, 4, spec.weight_shape).astype(dtype)
    bias = rng.integers(-3, 4, (k,)).astype(dtype)
    dy = rng.integers(-3, 4, (n, h, w_, k)).astype(dtype)
    out, dx = numpy.full((n, h, w_, k), numpy.nan, dtype), numpy.full((n, h, w_, c), numpy.nan, dtype)
    dw = numpy.full(spec.weight_shape, numpy.nan, dtype)
    for pass_, ptrs in (("fprop", (x.ctypes.data, w.ctypes.data, bias.ctypes.data, out.ctypes.data)),
                        ("dgrad", (dy.ctypes.data, w.ctypes.data, dx.ctypes.data)),
                        ("wgrad", (x.ctypes.data, dy.ctypes.data, dw.ctypes.data))):
        plan = im2col_gemm.prepare(pass_, spec, dtype, "ieee", env, layout="nhwc",
                                   **({"bias": True} if pass_ == "fprop" else {}))
        assert [type(step).__name__ for step in plan.steps] == ["Gemm"]
        plan.run(ptrs, 0, numpy.zeros(max(plan.workspace, 1), numpy.uint8).ctypes.data)
    nchw = lambda a: a.transpose(0, 3, 1, 2)  # noqa: E731
    numpy.testing.assert_array_equal(nchw(out), cuconv.conv2d(nchw(x), w, bias))
    numpy.testing.assert_array_equal(nchw(dx), cuconv.conv2d_input(spec.input_shape, w, nchw(dy)))
    numpy.testing.assert_array_equal(dw, cuconv.conv2d_weight(nchw(x), w.shape, nchw(dy)))


def test_a_float_wgrad_whose_column_matrix_does_not_fit_takes_it_by_images():
    """Channels-last wgrads in float32/float64 whose column matrix (N·P·Q, R·S·C) exceeds the workspace gather and
    reduce as many images at a time as it holds (``square_3x3_1024`` in TF32: 9.6 GB); 16-bit ones, whose partial
    sums would be rounded, and anything where one image's does not fit, are refused."""
    from cuconv import _plan
    from cuconv.algos import im2col_gemm

    spec = ConvSpec.from_args((16, 16, 1024, 1024), (128, 16, 3, 3))
    one = im2col_gemm.column_bytes(ConvSpec.from_args((1, 16, 1024, 1024), (128, 16, 3, 3)), numpy.float32)
    for limit, images in ((GiB, 1), (3 * one, 3), (16 * one, None), (one - 1, 0)):
        limits = _plan.Limits(227 << 10, True, limit)
        reason = im2col_gemm.reason_unsupported_nhwc(spec, numpy.float32, "wgrad", limits=limits)
        assert (reason is None) == (images != 0), (limit, reason)
        if images != 0:
            assert im2col_gemm._wgrad_by_images("wgrad", spec, numpy.float32, limit) == images
    assert "workspace" in im2col_gemm.reason_unsupported_nhwc(spec, numpy.float16, "wgrad",
                                                              limits=_plan.Limits(227 << 10, True, GiB))
    assert im2col_gemm._wgrad_by_images("fprop", spec, numpy.float32, GiB) is None


def test_pointwise_nhwc_only_for_plain_1x1_layers():
    """Channels-last plans of im2col_gemm: unpadded 1x1 layers of one group, at stride 1 on the tensors as they are,
    at a larger stride through a column matrix of the pixels read; padded, grouped and k x k layers refused."""
    from cuconv import _plan
    from cuconv.algos import im2col_gemm

    env = _plan.Env(0, GiB, 227 << 10, True, 132, 228 << 10, True)
    strided = ConvSpec.from_args((2, 6, 8, 8), (4, 6, 1, 1), stride=2)
    assert im2col_gemm.strided_pointwise_nhwc(strided) and not im2col_gemm.pointwise_nhwc(strided)
    assert im2col_gemm.reason_unsupported_nhwc(strided, numpy.float32, "wgrad") is None
    assert "workspace" in im2col_gemm.reason_unsupported_nhwc(strided, numpy.float32, "wgrad",
                                                              limits=_plan.Limits(227 << 10, True, 100))
    for kwargs, w_shape in ((dict(padding=1), (4, 6, 1, 1)), (dict(groups=2), (4, 3, 1, 1)), ({}, (4, 6, 3, 3)),
                            (dict(stride=2, padding=1), (4, 6, 1, 1))):
        spec = ConvSpec.from_args((2, 6, 8, 8), w_shape, **kwargs)
        assert not im2col_gemm.pointwise_nhwc(spec) and not im2col_gemm.strided_pointwise_nhwc(spec)
        with pytest.raises(NotImplementedError, match="channels-last"):
            im2col_gemm.prepare("fprop", spec, numpy.float32, "ieee", env, layout="nhwc")


# (x shape, filters, stride, element offset of the channels-last operands from their allocation)
_STRIDED_POINTWISE = [
    pytest.param((2, 16, 9, 9), 8, 2, 0, id="s2_odd_plane"),
    pytest.param((3, 24, 8, 10), 16, (2, 3), 0, id="s2x3"),
    pytest.param((1, 3, 7, 12), 5, 2, 0, id="three_channels_n1"),
    pytest.param((2, 32, 6, 6), 8, 2, 1, id="s2_off_16_bytes"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("x_shape,k,stride,offset", _STRIDED_POINTWISE)
def test_strided_pointwise_nhwc_passes_equal_cpu_exactly_on_integers(x_shape, k, stride, offset, dtype_name):
    """Strided 1x1 layers on channels-last arrays, every pass through im2col_gemm's column matrix of the pixels
    read (the forward with a bias; dgrad spread over dx with zeros between the pixels, every element written):
    bit for bit the CPU path's on integers, into NaN-poisoned outputs; operands off a 16-byte boundary copied in
    elements."""
    import cupy

    import cuconv
    from cuconv import _dtypes, _plan
    from cuconv.algos import im2col_gemm

    dtype = _dtypes.by_name(dtype_name)
    if dtype is None:
        pytest.skip("bfloat16 needs ml_dtypes")
    rng = numpy.random.default_rng(11)
    n, c, h, w_ = x_shape
    spec = ConvSpec.from_args(x_shape, (k, c, 1, 1), stride=stride)
    assert im2col_gemm.strided_pointwise_nhwc(spec)
    x = rng.integers(-3, 4, x_shape).astype(dtype)
    w = rng.integers(-3, 4, spec.weight_shape).astype(dtype)
    b = rng.integers(-3, 4, k).astype(dtype)
    dy = rng.integers(-3, 4, spec.output_shape).astype(dtype)

    def nhwc(a, poison=False):  # a channels-last device copy of a (NCHW) starting ``offset`` elements into its buffer
        shape = (a.shape[0], a.shape[2], a.shape[3], a.shape[1])
        flat = cupy.full(int(numpy.prod(shape)) + offset, numpy.nan, dtype=dtype)
        view = flat[offset:].reshape(shape)
        if not poison:
            view[...] = cupy.asarray(numpy.ascontiguousarray(a.transpose(0, 2, 3, 1)))
        return view

    def nchw(a):
        return cupy.asnumpy(a).transpose(0, 3, 1, 2).astype(numpy.float64)

    xg, wg, bg, dyg = nhwc(x), cupy.asarray(w), cupy.asarray(b), nhwc(dy)
    out = nhwc(numpy.empty(spec.output_shape, dtype), poison=True)
    dx = nhwc(numpy.empty(x_shape, dtype), poison=True)
    dw = cupy.full(w.shape, numpy.nan, dtype=dtype)
    for pass_, arrays in (("fprop", (xg, wg, bg, out)), ("dgrad", (dyg, wg, dx)), ("wgrad", (xg, dyg, dw))):
        env = _plan.current_env(*arrays)
        assert env.aligned == (offset == 0)
        plan = im2col_gemm.prepare(pass_, spec, dtype, "ieee", env, layout="nhwc",
                                   **({"bias": True} if pass_ == "fprop" else {}))
        _plan.run_arrays(plan, *arrays)
    numpy.testing.assert_array_equal(nchw(out), cuconv.conv2d(x, w, b, stride=stride).astype(numpy.float64))
    numpy.testing.assert_array_equal(nchw(dx), cuconv.conv2d_input(x_shape, w, dy, stride=stride).astype(numpy.float64))
    numpy.testing.assert_array_equal(cupy.asnumpy(dw).astype(numpy.float64),
                                     cuconv.conv2d_weight(x, w.shape, dy, stride=stride).astype(numpy.float64))


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["kcrs", "krsc"])
@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("x_shape,w_shape,kwargs", [
    ((2, 16, 9, 7), (24, 16, 3, 3), dict(padding=1)),
    ((3, 8, 10, 11), (16, 8, 3, 3), dict(stride=2, padding=1)),
    ((2, 24, 8, 8), (8, 24, 2, 2), dict(stride=2)),
    ((1, 5, 12, 9), (6, 5, 5, 3), dict(padding=(2, 1), dilation=(1, 2))),
    ((2, 16, 6, 6), (8, 16, 1, 1), dict(padding=1)),
], ids=["3x3", "3x3_s2", "2x2_s2_patches", "5x3_dilated_c5", "1x1_padded"])
def test_columns_wgrad_nhwc_equals_cpu_exactly_on_integers(x_shape, w_shape, kwargs, dtype_name, weights):
    """The wgrad of layers of one group on channels-last x and dy as one GEMM of dy by the column matrix
    (N·P·Q, R·S·C) gathered into the workspace, dW channels-last (a row's taps in (r, s, c) order) or KCRS ((c, r,
    s) order): bit for bit the CPU path's on integers, into a NaN-poisoned dW. In float32, also with a workspace
    of one image's column matrix: a gather and a GEMM an image, summed in dW."""
    import cupy

    import cuconv
    from cuconv import _dtypes, _plan, dispatch
    from cuconv.algos import im2col_gemm

    dtype = _dtypes.by_name(dtype_name)
    if dtype is None:
        pytest.skip("bfloat16 needs ml_dtypes")
    rng = numpy.random.default_rng(13)
    spec = ConvSpec.from_args(x_shape, w_shape, **kwargs)
    assert im2col_gemm.reason_unsupported_nhwc(spec, dtype, "wgrad") is None
    assert im2col_gemm.reason_unsupported_nhwc(spec, dtype, "fprop") is not None
    x = rng.integers(-3, 4, x_shape).astype(dtype)
    dy = rng.integers(-3, 4, spec.output_shape).astype(dtype)
    xg = cupy.ascontiguousarray(cupy.asarray(x).transpose(0, 2, 3, 1))
    dyg = cupy.ascontiguousarray(cupy.asarray(dy).transpose(0, 2, 3, 1))
    krsc = weights == "krsc"
    k, c, r, s = w_shape
    dw = cupy.full((k, r, s, c) if krsc else w_shape, numpy.nan, dtype=dtype)
    env = _plan.current_env(xg, dyg, dw)
    plan = dispatch.prepare("im2col_gemm", "wgrad", spec, dtype, "tf32", env, layout="nhwc", weights=weights)
    _plan.run_arrays(plan, xg, dyg, dw)
    got = cupy.asnumpy(dw.transpose(0, 3, 1, 2) if krsc else dw).astype(numpy.float64)
    want = cuconv.conv2d_weight(x, w_shape, dy, **kwargs).astype(numpy.float64)
    numpy.testing.assert_array_equal(got, want)
    if dtype.itemsize == 4 and spec.n > 1:
        one = im2col_gemm.column_bytes(ConvSpec.from_args((1,) + x_shape[1:], w_shape, **kwargs), dtype)
        plan = im2col_gemm.prepare("wgrad", spec, dtype, "tf32", env._replace(workspace_limit=one), layout="nhwc",
                                   weights=weights)
        assert len(plan.steps) == 2 * spec.n  # (a gather and a GEMM an image)
        dw.fill(numpy.nan)
        _plan.run_arrays(plan, xg, dyg, dw)
        got = cupy.asnumpy(dw.transpose(0, 3, 1, 2) if krsc else dw).astype(numpy.float64)
        numpy.testing.assert_array_equal(got, want)
