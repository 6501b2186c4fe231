"""The NumPy (CPU) path of ``cuconv.conv2d`` against the float64 torch oracle."""

import dataclasses

import numpy
import pytest
import torch

import cuconv
from cases import (CASES, PROBLEM_CASES, TORCH_ERROR_FACTOR, make_inputs, noncontiguous, reference, rel_err,
                   tolerance)
from cuconv.algos.im2col_gemm import chunk_bytes, plan_chunks
from cuconv.spec import ConvSpec

# torch notes that 'same' with an even kernel may copy the input; the oracle does not care.
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")

ALL_CASES = CASES + PROBLEM_CASES


def _cast(arrays, dtype):
    return tuple(None if a is None else a.astype(dtype) for a in arrays)


def _spec(case):
    x_shape = case.x_shape if len(case.x_shape) == 4 else (1,) + case.x_shape
    return ConvSpec.from_args(x_shape, case.w_shape, **case.kwargs)


def _result_shape(case):
    shape = _spec(case).output_shape
    return shape if len(case.x_shape) == 4 else shape[1:]


def _by_id(case_id):
    return next(p.values[0] for p in ALL_CASES if p.id == case_id)


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32], ids=lambda d: numpy.dtype(d).name)
@pytest.mark.parametrize("case", ALL_CASES)
def test_matches_oracle(case, dtype):
    x, w, b = _cast(make_inputs(case), dtype)
    y = cuconv.conv2d(x, w, b, **case.kwargs)
    assert y.dtype == dtype
    assert y.shape == _result_shape(case)
    # The oracle sees exactly the values we were given (already rounded to dtype).
    assert rel_err(y, reference(x, w, b, **case.kwargs)) <= tolerance(dtype)


@pytest.mark.parametrize("case", ALL_CASES)
def test_float16_no_worse_than_torch(case):
    # torch's CPU backend has a float16 conv2d (checked with torch 2.13), so the rule
    # "≤ 2x torch's own float16 error, both against float64" applies here too.
    x, w, b = _cast(make_inputs(case), numpy.float16)
    ref = reference(x, w, b, **case.kwargs)
    y = cuconv.conv2d(x, w, b, **case.kwargs)
    assert y.dtype == numpy.float16
    to_torch = lambda a: None if a is None else torch.from_numpy(a)
    y_torch = torch.nn.functional.conv2d(to_torch(x), to_torch(w), to_torch(b), **case.kwargs).numpy()
    err, torch_err = rel_err(y, ref), rel_err(y_torch, ref)
    assert err <= tolerance(numpy.float16)
    assert err <= TORCH_ERROR_FACTOR * torch_err


# NumPy calls every empty array contiguous, so an empty `out` has no non-contiguous variant.
OUT_LAYOUTS = [pytest.param(p.values[0], layout, id=f"{p.id}-{layout}") for p in CASES
               for layout in ("contiguous", "noncontiguous")
               if layout == "contiguous" or numpy.prod(_result_shape(p.values[0])) > 0]


@pytest.mark.parametrize("case,layout", OUT_LAYOUTS)
def test_out_nan_poisoned(case, layout):
    x, w, b = make_inputs(case)
    poisoned = numpy.full(_result_shape(case), numpy.nan)
    out = poisoned if layout == "contiguous" else noncontiguous(poisoned)
    if layout == "noncontiguous":
        gaps = out.base[..., 1::2]  # the elements between the view's, which must stay untouched
        gaps[...] = numpy.inf
    y = cuconv.conv2d(x, w, b, out=out, **case.kwargs)
    assert y is out
    assert not numpy.isnan(out).any()
    assert rel_err(out, reference(x, w, b, **case.kwargs)) <= tolerance(numpy.float64)
    if layout == "noncontiguous":
        assert numpy.isinf(gaps).all()


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32], ids=lambda d: numpy.dtype(d).name)
@pytest.mark.parametrize("case", CASES)
def test_noncontiguous_inputs(case, dtype):
    x, w, b = _cast(make_inputs(case), dtype)
    # noncontiguous() cannot make an empty array non-contiguous (NumPy calls every empty array contiguous).
    x_nc, w_nc, b_nc = (a if a is None or a.size == 0 else noncontiguous(a) for a in (x, w, b))
    y = cuconv.conv2d(x_nc, w_nc, b_nc, **case.kwargs)
    assert y.flags.c_contiguous
    numpy.testing.assert_array_equal(y, cuconv.conv2d(x, w, b, **case.kwargs))
    assert rel_err(y, reference(x, w, b, **case.kwargs)) <= tolerance(dtype)


def test_unbatched_returns_kpq():
    case = _by_id("k5x9_d2x3_p2x4")
    x, w, b = make_inputs(case)
    y = cuconv.conv2d(x[1], w, b, **case.kwargs)
    assert y.shape == _spec(case).output_shape[1:]
    numpy.testing.assert_array_equal(y, cuconv.conv2d(x[1:2], w, b, **case.kwargs)[0])


@pytest.mark.parametrize("with_out", [False, True], ids=["fresh", "out"])
def test_empty_batch(with_out):
    rng = numpy.random.default_rng(3)
    x, w, b = rng.standard_normal((0, 3, 9, 8)), rng.standard_normal((5, 3, 2, 3)), rng.standard_normal(5)
    out = numpy.empty((0, 5, 4, 4)) if with_out else None
    y = cuconv.conv2d(x, w, b, stride=2, padding=(0, 1), out=out)
    assert y.shape == (0, 5, 4, 4)
    assert out is None or y is out
    assert y.dtype == numpy.float64


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_zero_input_channels_gives_bias(bias):
    rng = numpy.random.default_rng(4)
    x, w = rng.standard_normal((2, 0, 7, 6)), rng.standard_normal((4, 0, 3, 2))
    b = rng.standard_normal(4) if bias else None
    y = cuconv.conv2d(x, w, b, padding=1)
    expected = numpy.broadcast_to((b if bias else numpy.zeros(4))[:, None, None], (2, 4, 7, 7))
    numpy.testing.assert_array_equal(y, expected)


# Geometries of CASES with a batch of 5 (odd, so the last sample chunk is short).
CHUNK_CASES = ["k5x9_d2x3_p2x4", "stride2x3_pad1x2", "stride2_dil2_pad3", "groups2", "depthwise_mult3_3x1",
               "same_even_dil3", "stem_like_c3_7x7_s2", "reduced_depthwise_3x3"]


def _chunk_limit(spec, itemsize, split):
    """A workspace_limit that makes im2col_gemm split over samples or over output rows."""
    if split == "samples":
        return 2 * chunk_bytes(spec, 2, spec.p, itemsize)  # two buffers of two samples each
    return 2 * chunk_bytes(spec, 1, 2, itemsize)  # two buffers of (about) two output rows each


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32], ids=lambda d: numpy.dtype(d).name)
@pytest.mark.parametrize("split", ["samples", "rows"])
@pytest.mark.parametrize("case_id", CHUNK_CASES)
def test_chunked_equals_unchunked(case_id, split, dtype):
    case = dataclasses.replace(_by_id(case_id), x_shape=(5,) + _by_id(case_id).x_shape[1:])
    x, w, b = _cast(make_inputs(case, integer=True), dtype)
    spec = _spec(case)
    limit = _chunk_limit(spec, numpy.dtype(dtype).itemsize, split)
    plan = plan_chunks(spec, numpy.dtype(dtype).itemsize, limit)
    chunks = list(plan.chunks(spec))
    if split == "samples":
        assert plan.rows == spec.p and len({n0 for n0, _, _, _ in chunks}) > 1
    else:
        assert plan.samples == 1 and len({p0 for _, _, p0, _ in chunks}) > 1
    whole = cuconv.conv2d(x, w, b, **case.kwargs)
    assert len(list(plan_chunks(spec, numpy.dtype(dtype).itemsize, cuconv.config.workspace_limit)
                    .chunks(spec))) == 1
    # Into a NaN-poisoned `out`: a fresh array may reuse freed memory that already holds the answer.
    chunked = numpy.full(whole.shape, numpy.nan, dtype=dtype)
    with cuconv.config(workspace_limit=limit):
        cuconv.conv2d(x, w, b, out=chunked, **case.kwargs)
    # Small integers: every partial sum is exact, so any order of summation gives the same bits.
    numpy.testing.assert_array_equal(chunked, whole)
    numpy.testing.assert_array_equal(chunked, reference(x, w, b, **case.kwargs))


def _gpu_refuses(name, x, w, case, pass_="fprop", precision="ieee") -> bool:
    """Whether algorithm ``name`` could not run this problem on the GPU (the current device's limits, or planning's
    own without one)."""
    from cuconv import _plan, select
    from cuconv.problem import Problem

    x4 = x if x.ndim == 4 else x[None]
    spec = ConvSpec.from_args(x4.shape, w.shape, **case.kwargs)
    return select.can_implement(name, Problem.of(spec, x.dtype, precision, pass_), _plan.current_limits()) is not None


@pytest.mark.parametrize("case", CASES)
def test_forced_algo_equals_auto_or_is_refused_as_on_the_gpu(case):
    """The CPU path runs every problem one way: a forced algorithm that can serve the problem gives auto's bits, one
    the GPU would refuse is refused, in the GPU's words (a call runs or fails alike on both)."""
    x, w, b = _cast(make_inputs(case), numpy.float32)
    auto = cuconv.conv2d(x, w, b, algo="auto", **case.kwargs)
    served = []
    for name in cuconv.algorithms():
        if _gpu_refuses(name, x, w, case):
            with pytest.raises(NotImplementedError, match=f"cuconv: algo '{name}' cannot run this fprop: "):
                cuconv.conv2d(x, w, b, algo=name, **case.kwargs)
            continue
        numpy.testing.assert_array_equal(cuconv.conv2d(x, w, b, algo=name, **case.kwargs), auto)
        served.append(name)
    assert "im2col_gemm" in served  # (it serves every geometry)


@pytest.mark.parametrize("case_id", ["k5x9_d2x3_p2x4", "groups2", "pointwise_1x1", "reduced_square_5x9"])
def test_tf32_is_ieee_on_cpu(case_id):
    # Documented: the CPU path computes float32 in IEEE arithmetic whatever the precision asked for.
    case = _by_id(case_id)
    x, w, b = _cast(make_inputs(case), numpy.float32)
    ieee = cuconv.conv2d(x, w, b, precision="ieee", **case.kwargs)
    numpy.testing.assert_array_equal(cuconv.conv2d(x, w, b, precision="tf32", **case.kwargs), ieee)
    with cuconv.config(precision="tf32"):
        numpy.testing.assert_array_equal(cuconv.conv2d(x, w, b, **case.kwargs), ieee)
    assert rel_err(ieee, reference(x, w, b, **case.kwargs)) <= tolerance(numpy.float32, "ieee")


ALIASED_OUT = [
    pytest.param((1, 8, 37, 33), (8, 8, 3, 3), dict(padding=1), "x", id="out_is_x"),
    pytest.param((2, 6, 21, 19), (6, 3, 3, 3), dict(padding=1, groups=2), "x", id="out_is_x_groups2"),
    pytest.param((3, 3, 5, 5), (3, 3, 3, 3), {}, "w", id="out_is_w"),
    pytest.param((1, 4, 12, 12), (4, 4, 1, 1), {}, "x_view", id="out_overlaps_x"),
]


@pytest.mark.parametrize("limit", [1 << 30, 32 << 10], ids=["whole", "chunked"])
@pytest.mark.parametrize("x_shape,w_shape,kwargs,alias", ALIASED_OUT)
def test_out_aliasing_an_input_gives_the_right_result(x_shape, w_shape, kwargs, alias, limit):
    """out= that is (or overlaps) an input: computed as if out were a separate array, as NumPy's ufuncs do
    (chunks read input rows that earlier chunks would have overwritten)."""
    rng = numpy.random.default_rng(44)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    expected = reference(x, w, None, **kwargs)
    if alias == "x_view":
        storage = numpy.concatenate([x.ravel(), numpy.zeros(8)])
        x = storage[:x.size].reshape(x_shape)
        out = storage[8:8 + expected.size].reshape(expected.shape)  # starts 8 elements into x
    else:
        out = x if alias == "x" else w
    with cuconv.config(workspace_limit=limit):
        y = cuconv.conv2d(x, w, out=out, **kwargs)
    assert y is out
    assert rel_err(y, expected) <= tolerance(numpy.float64)
