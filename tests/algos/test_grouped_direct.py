"""grouped_direct: which cases it serves and how it tiles them (CPU), and on the GPU its forward and its stride-1
dgrad on grouped cases of every filters-per-thread and columns-per-thread instance, bit for bit against the CPU
path on integers and against the float64 oracle on random inputs. The case table runs it with every algorithm in
test_conv_gpu.py and test_backward_gpu.py."""

import numpy
import pytest

import cuconv
from cases import EXACT_DTYPES, _p, assert_forward_equals_cpu_on_integers, case_spec, make_inputs, reference_grads, \
    rel_err, to_gpu, tolerance
from cuconv.algos import grouped_direct
from cuconv.spec import ConvSpec

# Every FK (filters a thread: 8, 4, 2, 1) and PX (columns: 4, 2, 1), channels in several shared-memory stages,
# dilation, a non-square kernel, one-sided padding, a stride, batch 1.
GROUPED_CASES = [
    _p("fk8_px2_16_filters", (2, 32, 9, 10), (32, 16, 3, 3), groups=2, padding=1),
    _p("fk8_px4_wide", (1, 12, 13, 37), (24, 4, 3, 3), groups=3, padding=1),
    _p("fk4_px1_stride2", (3, 8, 11, 9), (16, 2, 3, 3), groups=4, stride=2, padding=1, bias=False),
    _p("fk2_px2_dilated", (2, 10, 12, 11), (10, 2, 3, 5), groups=5, dilation=(2, 1), padding=(2, 2)),
    _p("fk1_px4_one_sided", (1, 6, 10, 19), (3, 2, 3, 3), groups=3, padding=(0, 2)),
    _p("chunks", (1, 128, 9, 200), (16, 64, 3, 3), groups=2, padding=1),
]


def _tiling(param, dtype=numpy.float32):
    return grouped_direct.tiling(case_spec(param.values[0]), dtype)


def test_the_cases_cover_every_instance_and_several_stages():
    tilings = [_tiling(p) for p in GROUPED_CASES]
    assert {t[0] for t in tilings} == set(grouped_direct.FILTERS_PER_THREAD)
    assert {t[1] for t in tilings} == set(grouped_direct.COLUMNS_PER_THREAD)
    fk, px, (rows, col_blocks, filter_blocks, chunk, in_rows, in_cols), threads, smem = _tiling(GROUPED_CASES[-1])
    assert chunk < 64 and smem <= grouped_direct._SMEM and threads == -(-rows * col_blocks * filter_blocks // 32) * 32
    assert threads <= 256


@pytest.mark.parametrize("xs,ws,kwargs,reason", [
    ((2, 8, 9, 9), (8, 8, 3, 3), {}, "at least two groups"),
    ((2, 8, 9, 9), (8, 1, 3, 3), dict(groups=8), "at least two groups"),
    ((2, 256, 9, 9), (256, 128, 3, 3), dict(groups=2), "GEMM-sized"),
])
def test_refuses_with_a_reason(xs, ws, kwargs, reason):
    spec = ConvSpec.from_args(xs, ws, **kwargs)
    assert reason in grouped_direct.reason_unsupported(spec, numpy.float32)
    assert "no wgrad" in grouped_direct.reason_unsupported(ConvSpec.from_args((2, 8, 9, 9), (8, 4, 3, 3), groups=2),
                                                           numpy.float32, "wgrad")
    strided = ConvSpec.from_args((2, 8, 9, 9), (8, 4, 3, 3), groups=2, stride=2)
    assert grouped_direct.reason_unsupported(strided, numpy.float32, "fprop") is None
    assert "stride 1" in grouped_direct.reason_unsupported(strided, numpy.float32, "dgrad")


def test_auto_takes_it_for_narrow_groups_at_stride_one_on_large_planes():
    narrow = ConvSpec.from_args((32, 128, 56, 56), (128, 4, 3, 3), groups=32, padding=1)
    for pass_ in ("fprop", "dgrad"):
        assert cuconv.select_algorithm(narrow, numpy.float32, "tf32", True, pass_) == "grouped_direct"
    for spec in (ConvSpec.from_args((32, 320, 14, 14), (320, 16, 3, 3), groups=20, padding=1),  # 16 a group
                 ConvSpec.from_args((32, 128, 56, 56), (128, 4, 3, 3), groups=32, stride=2, padding=1)):
        assert cuconv.select_algorithm(spec, numpy.float32, "tf32", True, "fprop") != "grouped_direct"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", EXACT_DTYPES)
@pytest.mark.parametrize("case", GROUPED_CASES)
def test_forward_equals_cpu_exactly_on_integers(case, dtype_name):
    assert_forward_equals_cpu_on_integers(case, dtype_name, 5, lambda x, w, b, spec, out: _plan_run(
        "fprop", spec, (x, w, b, out)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("case", [c for c in GROUPED_CASES
                                  if grouped_direct.reason_unsupported(case_spec(c.values[0]), numpy.float32,
                                                                       "dgrad") is None])
def test_dgrad_against_the_oracle(case, dtype_name):
    """dx of the cases it serves (stride 1, and the forward of dy has two channels or more a group: K/groups >= 2)
    into a NaN-poisoned output."""
    import cupy
    from cuconv import _dtypes

    c = case
    x, w, _ = make_inputs(c, seed=3)
    spec = case_spec(c)
    x = x.reshape(spec.input_shape)
    dy = numpy.random.default_rng(4).standard_normal(spec.output_shape)
    dtype = _dtypes.by_name(dtype_name)
    dx = cupy.full(spec.input_shape, numpy.nan, dtype=dtype)
    _plan_run("dgrad", spec, (to_gpu(dy, dtype), to_gpu(w, dtype), dx))
    got = cupy.asnumpy(dx).astype(numpy.float64)
    assert numpy.isfinite(got).all()
    rounded = lambda a: a.astype(dtype).astype(numpy.float64)  # (the inputs as stored)
    ref = reference_grads(x, rounded(w), rounded(dy), **c.kwargs)[0]
    assert rel_err(got, ref) <= tolerance(dtype)


def _plan_run(pass_, spec, arrays):
    from cuconv import _plan

    _plan.run_on_arrays(grouped_direct.prepare, pass_, spec, "ieee", *arrays)
