"""grouped_mma: which cases it serves and how it tiles them (CPU), and on the GPU its forward and its stride-1
dgrad (the weight read transposed and flipped) in float16, bfloat16 and TF32, bit for bit against the CPU path
on integers and against the float64 oracle on random inputs, into NaN-poisoned outputs. The case table runs it
with every algorithm in test_conv_gpu.py and test_backward_gpu.py."""

import numpy
import pytest

import cuconv
from cases import select_nhwc_auto
from cases import (_p, assert_forward_equals_cpu_on_integers, case_spec, make_inputs, reference, reference_grads, rel_err, to_gpu,
                   tolerance)
from cuconv import _dtypes, _plan
from cuconv.algos import grouped_mma
from cuconv.spec import ConvSpec

# One and several bands of rows, a last block of fewer than four groups, a stride
# (columns split by phase), dilation, one-sided padding, a non-square kernel, 1x1, batch 1, rows that leave a
# pixel tile part empty.
MMA_CASES = [
    _p("g4_one_band", (2, 64, 7, 7), (64, 16, 3, 3), groups=4, padding=1),
    _p("g5_bands_last_block_one_group", (1, 80, 19, 17), (80, 16, 3, 3), groups=5, padding=1, bias=False),
    _p("g2_stride2", (3, 32, 15, 13), (32, 16, 3, 3), groups=2, stride=2, padding=1),
    _p("g3_dilated_one_sided", (2, 48, 12, 11), (48, 16, 3, 3), groups=3, dilation=(2, 1), padding=(2, 0)),
    _p("g2_3x1_1warp", (2, 32, 5, 3), (32, 16, 3, 1), groups=2, padding=(1, 0)),
    _p("g6_1x1", (2, 96, 6, 9), (96, 16, 1, 1), groups=6),
    _p("g4_stride2x1_wide", (1, 64, 9, 70), (64, 16, 3, 3), groups=4, stride=(2, 1), padding=1),
    _p("g2_stride1x2_dil1x2", (2, 32, 23, 19), (32, 16, 3, 3), groups=2, stride=(1, 2), dilation=(1, 2),
       padding=(1, 2)),
    _p("g3_bands_stride2x1", (2, 48, 40, 12), (48, 16, 3, 3), groups=3, stride=(2, 1), padding=1),
    _p("g3_same_2x4_one_sided", (2, 48, 11, 12), (48, 16, 2, 4), groups=3, padding="same"),
    _p("g2_dil2x2_same", (1, 32, 30, 31), (32, 16, 3, 3), groups=2, dilation=2, padding="same"),
]
MODES = [("float16", "ieee"), ("bfloat16", "ieee"), ("float32", "tf32")]
# (float16 stands in where ml_dtypes is absent)
_BF16 = numpy.dtype(_dtypes.bfloat16) if _dtypes.bfloat16 is not None else numpy.dtype(numpy.float16)


def _tiling(param, dtype=numpy.float16):
    return grouped_mma.tiling(case_spec(param.values[0]), dtype, _plan.SMEM_OPTIN_WITHOUT_DEVICE)


def test_the_cases_cover_several_bands_and_a_last_block_of_fewer_groups():
    tilings = [_tiling(p) for p in MMA_CASES]
    specs = [case_spec(p.values[0]) for p in MMA_CASES]
    assert any(values[0] < spec.p for (values, _, _), spec in zip(tilings, specs))
    assert any(spec.groups % grouped_mma.GROUPS_PER_BLOCK for spec in specs)
    for (values, threads, smem), spec in zip(tilings, specs):
        rows, halo_rows, halo_cols, phase_cols, plane, m_tiles = values
        assert plane % 32 == 8 and plane >= halo_rows * spec.stride[1] * phase_cols
        assert smem == 4 * 32 * plane
        assert threads == 128 and m_tiles == -(-rows * spec.q // 16)


def test_wide_rows_take_narrower_bands_and_float_twice_the_planes():
    """Where the target band's staging passes the shared-memory target the bands narrow (down to one row); float
    stages 64 word planes where the 16-bit types stage 32."""
    limit = _plan.SMEM_OPTIN_WITHOUT_DEVICE
    wide = ConvSpec.from_args((2, 64, 120, 200), (64, 16, 3, 3), groups=4, padding=1)
    (rows, *_, plane, _), _, smem16 = grouped_mma.tiling(wide, numpy.float16, limit)
    assert rows == 1 and smem16 == 4 * 32 * plane > grouped_mma._SMEM_TARGET
    (rows32, *_), _, smem32 = grouped_mma.tiling(wide, numpy.float32, limit)
    assert rows32 == 1 and smem32 == 2 * smem16
    strided = ConvSpec.from_args((2, 64, 120, 84), (64, 16, 3, 3), groups=4, stride=2, padding=1)
    assert grouped_mma._target_rows(strided) == 3  # (128 // 42 output columns)
    (rows, *_), _, smem = grouped_mma.tiling(strided, numpy.float16, limit)
    assert rows == 1 and smem <= grouped_mma._SMEM_TARGET  # (3 rows staged 7 input rows: 79 KB)


def test_an_empty_batch_or_image_is_served_without_a_launch():
    for xs in ((0, 32, 0, 0), (0, 32, 9, 9)):
        spec = ConvSpec.from_args(xs, (32, 16, 3, 3), groups=2, padding=2)
        for pass_ in ("fprop", "dgrad"):
            assert grouped_mma.reason_unsupported(spec, numpy.float16, pass_) is None
            assert grouped_mma.blocks(spec, pass_) == 0
            cuconv.select_algorithm(spec, numpy.float16, "ieee", True, pass_)


def test_a_row_too_wide_for_shared_memory_is_refused():
    spec = ConvSpec.from_args((1, 64, 3, 9000), (64, 16, 3, 3), groups=4, padding=1)
    assert "shared memory" in grouped_mma.reason_unsupported(spec, numpy.float16)


@pytest.mark.parametrize("xs,ws,kwargs,dtype,precision,pass_,reason", [
    ((2, 32, 9, 9), (32, 16, 3, 3), dict(groups=2), numpy.float32, "ieee", "fprop", "tensor cores"),
    ((2, 32, 9, 9), (32, 16, 3, 3), dict(groups=2), numpy.float64, "ieee", "fprop", "tensor cores"),
    ((2, 16, 9, 9), (16, 16, 3, 3), {}, numpy.float16, "ieee", "fprop", "several groups"),
    ((2, 64, 9, 9), (64, 32, 3, 3), dict(groups=2), numpy.float16, "ieee", "fprop", "16 channels"),
    ((2, 32, 9, 9), (64, 16, 3, 3), dict(groups=2), numpy.float16, "ieee", "fprop", "16 filters"),
    ((2, 32, 9, 9), (32, 16, 5, 5), dict(groups=2), numpy.float16, "ieee", "fprop", "taps"),
    ((2, 32, 9, 9), (32, 16, 3, 3), dict(groups=2, stride=2), numpy.float16, "ieee", "dgrad", "stride 1"),
    ((2, 32, 9, 9), (32, 16, 3, 3), dict(groups=2), numpy.float16, "ieee", "wgrad", "no wgrad"),
])
def test_refuses_with_a_reason(xs, ws, kwargs, dtype, precision, pass_, reason):
    spec = ConvSpec.from_args(xs, ws, **kwargs)
    assert reason in grouped_mma.reason_unsupported(spec, dtype, pass_, precision)


def test_serves_both_passes_at_stride_one():
    spec = ConvSpec.from_args((2, 32, 9, 9), (32, 16, 3, 3), groups=2, padding=1)
    for dtype, precision in ((numpy.float16, "ieee"), (numpy.float32, "tf32")):
        for pass_ in ("fprop", "dgrad"):
            assert grouped_mma.reason_unsupported(spec, dtype, pass_, precision) is None


def _plan_run(pass_, spec, precision, arrays, **options):
    _plan.run_on_arrays(grouped_mma.prepare, pass_, spec, precision, *arrays, **options)


def test_channels_last_auto_takes_it_where_it_takes_it_on_nchw():
    """On channels-last activations ``auto`` runs it in place wherever it would on NCHW ones (RegNet's 16-channel
    groups in the half types: the forward and the stride-1 dgrad; the strided dgrad stays implicit_gemm's), but for
    the forwards that a wgmma device runs through implicit_gemm's block-diagonal weight (no GPU needed)."""
    from cuconv import config, select

    spec = ConvSpec.from_args((32, 320, 14, 14), (320, 16, 3, 3), groups=20, padding=1)
    strided = ConvSpec.from_args((32, 64, 112, 112), (64, 16, 3, 3), groups=4, stride=2, padding=1)
    for dtype in (numpy.dtype(numpy.float16), numpy.dtype(_BF16)):
        for wgmma in (False, True):
            def nhwc(s, pass_, wgmma=wgmma):
                return select_nhwc_auto("auto", s, dtype, "ieee", pass_, 227 << 10, wgmma,
                                             config.workspace_limit)
            for s, pass_ in ((spec, "fprop"), (spec, "dgrad"), (strided, "fprop")):
                assert select.select_algorithm(s, dtype, "ieee", True, pass_) == "grouped_mma"
                want = "implicit_gemm" if wgmma and pass_ == "fprop" else "grouped_mma"
                assert nhwc(s, pass_) == want
            assert nhwc(strided, "dgrad") == "implicit_gemm"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name,precision", MODES)
@pytest.mark.parametrize("case", MMA_CASES)
def test_forward_equals_cpu_exactly_on_integers(case, dtype_name, precision):
    assert_forward_equals_cpu_on_integers(case, dtype_name, 5, lambda x, w, b, spec, out: _plan_run(
        "fprop", spec, precision, (x, w, b, out)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name,precision", MODES)
@pytest.mark.parametrize("case", MMA_CASES)
def test_forward_and_dgrad_against_the_oracle(case, dtype_name, precision):
    """y of every case, dx of those it serves (stride 1), each into a NaN-poisoned output."""
    import cupy
    from cuconv import _dtypes

    c = case
    x, w, b = make_inputs(c, seed=3)
    spec = case_spec(c)
    x = x.reshape(spec.input_shape)
    dtype = _dtypes.by_name(dtype_name)
    rounded = lambda a: a.astype(dtype).astype(numpy.float64)  # (the inputs as stored)
    tol = tolerance(dtype, precision)
    y = cupy.full(spec.output_shape, numpy.nan, dtype=dtype)
    _plan_run("fprop", spec, precision, (to_gpu(x, dtype), to_gpu(w, dtype), to_gpu(b, dtype), y))
    ref = reference(rounded(x), rounded(w), None if b is None else rounded(b), **c.kwargs)
    got = cupy.asnumpy(y).astype(numpy.float64)
    assert numpy.isfinite(got).all() and rel_err(got, ref) <= tol
    if grouped_mma.reason_unsupported(spec, dtype, "dgrad", precision) is not None:
        return
    dy = numpy.random.default_rng(4).standard_normal(spec.output_shape)
    dx = cupy.full(spec.input_shape, numpy.nan, dtype=dtype)
    _plan_run("dgrad", spec, precision, (to_gpu(dy, dtype), to_gpu(w, dtype), dx))
    got = cupy.asnumpy(dx).astype(numpy.float64)
    ref = reference_grads(rounded(x), rounded(w), rounded(dy), **c.kwargs)[0]
    assert numpy.isfinite(got).all() and rel_err(got, ref) <= tol


@pytest.mark.gpu
def test_dgrad_equals_cpu_exactly_on_integers():
    """The transposed, flipped weight read in place gives the CPU path's dx bit for bit."""
    import cupy

    c = MMA_CASES[3].values[0]  # dilated, one-sided padding: the flip and the transposition both show
    x, w, _ = make_inputs(c, seed=6, integer=True)
    spec = case_spec(c)
    dy = numpy.random.default_rng(7).integers(-3, 4, size=spec.output_shape).astype(numpy.float64)
    want = cuconv.conv2d_input(spec.input_shape, w.astype(numpy.float16), dy.astype(numpy.float16), **c.kwargs)
    dx = cupy.full(spec.input_shape, numpy.nan, dtype=numpy.float16)
    _plan_run("dgrad", spec, "ieee", (to_gpu(dy, numpy.float16), to_gpu(w, numpy.float16), dx))
    numpy.testing.assert_array_equal(cupy.asnumpy(dx).astype(numpy.float64), want.astype(numpy.float64))


def _nhwc(a):
    """A C-contiguous (N, C, H, W) CuPy array's values as a dense (N, H, W, C) one."""
    import cupy

    return cupy.ascontiguousarray(a.transpose(0, 2, 3, 1))


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["kcrs", "krsc"])
@pytest.mark.parametrize("dtype_name,precision", MODES)
@pytest.mark.parametrize("case", MMA_CASES)
def test_channels_last_equals_cpu_exactly_on_integers(case, dtype_name, precision, weights):
    """``layout="nhwc"`` (x and out, dy and dx channels-last in memory; the weight KCRS or channels-last too): the
    forward and, where it serves it (stride 1), the dgrad bit for bit the CPU path on integers, into NaN-poisoned
    outputs."""
    import cupy

    def weight(w):
        return _nhwc(w) if weights == "krsc" else w

    def forward(x, w, b, spec, out):
        y = cupy.full((spec.n, spec.p, spec.q, spec.k), numpy.nan, dtype=out.dtype)
        _plan_run("fprop", spec, precision, (_nhwc(x), weight(w), b, y), layout="nhwc", weights=weights)
        out[...] = y.transpose(0, 3, 1, 2)

    assert_forward_equals_cpu_on_integers(case, dtype_name, 8, forward)
    spec = case_spec(case)
    dtype = _dtypes.by_name(dtype_name)
    if grouped_mma.reason_unsupported(spec, dtype, "dgrad", precision) is not None:
        return
    _, w, _ = make_inputs(case, seed=9, integer=True)
    dy = numpy.random.default_rng(10).integers(-3, 4, size=spec.output_shape).astype(numpy.float64)
    want = cuconv.conv2d_input(spec.input_shape, w.astype(dtype), dy.astype(dtype), **case.kwargs)
    dx = cupy.full((spec.n, spec.h, spec.w, spec.c), numpy.nan, dtype=dtype)
    _plan_run("dgrad", spec, precision, (_nhwc(to_gpu(dy, dtype)), weight(to_gpu(w, dtype)), dx), layout="nhwc",
              weights=weights)
    numpy.testing.assert_array_equal(cupy.asnumpy(dx.transpose(0, 3, 1, 2)).astype(numpy.float64),
                                     want.astype(numpy.float64))
