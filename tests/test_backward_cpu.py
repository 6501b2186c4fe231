"""The NumPy (CPU) path of ``cuconv.conv2d_input`` (dgrad) and ``cuconv.conv2d_weight`` (wgrad).

The backward oracle is torch's autograd of ``torch.nn.functional.conv2d`` in float64 on the CPU, fed the
very values we were given (already rounded to the dtype under test).
"""

import dataclasses
import types

import numpy
import pytest
import torch

import cuconv
from cases import (CASES, PROBLEM_CASES, TORCH_ERROR_FACTOR, Case, bound, make_inputs, noncontiguous,
                   reference_grads, rel_err, tolerance)
from cuconv.algos.im2col_gemm import chunk_bytes, plan_chunks
from cuconv.spec import ConvSpec

# torch notes that 'same' with an even kernel may copy the input; the oracle does not care.
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")

# dgrad must leave zeros where no output reads the input: the last row and column here (stride 2).
UNCOVERED_TAIL = pytest.param(Case((2, 3, 8, 9), (4, 3, 3, 2), dict(stride=2), False), id="stride2_uncovered_tail")
ALL_CASES = CASES + PROBLEM_CASES + [UNCOVERED_TAIL]


def _by_id(case_id):
    return next(p.values[0] for p in ALL_CASES if p.id == case_id)


def _spec(case):
    x_shape = case.x_shape if len(case.x_shape) == 4 else (1,) + case.x_shape
    return ConvSpec.from_args(x_shape, case.w_shape, **case.kwargs)


def _problem(case, dtype=numpy.float64, seed=0, integer=False):
    """(x, w, dy) of ``case`` in ``dtype``; dy has the output's shape (3-D for an unbatched case)."""
    x, w, _ = make_inputs(case, seed=seed, integer=integer)
    shape = _spec(case).output_shape
    shape = shape if len(case.x_shape) == 4 else shape[1:]
    rng = numpy.random.default_rng(seed + 1)
    dy = rng.integers(-3, 4, size=shape).astype(numpy.float64) if integer else rng.standard_normal(shape)
    return tuple(a.astype(dtype) for a in (x, w, dy))


def _ours(x, w, dy, kwargs, **options):
    return (cuconv.conv2d_input(x.shape, w, dy, **kwargs, **options),
            cuconv.conv2d_weight(x, w.shape, dy, **kwargs, **options))


def _f64(*arrays):
    return tuple(a.astype(numpy.float64) for a in arrays)


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32], ids=lambda d: numpy.dtype(d).name)
@pytest.mark.parametrize("case", ALL_CASES)
def test_matches_torch_autograd(case, dtype):
    x, w, dy = _problem(case, dtype)
    dx, dw = _ours(x, w, dy, case.kwargs)
    ref_dx, ref_dw = reference_grads(*_f64(x, w, dy), **case.kwargs)
    assert (dx.dtype, dw.dtype) == (dtype, dtype)
    assert (dx.shape, dw.shape) == (x.shape, w.shape)
    assert rel_err(dx, ref_dx) <= tolerance(dtype)
    assert rel_err(dw, ref_dw) <= tolerance(dtype)


@pytest.mark.parametrize("case", ALL_CASES)
def test_float16_no_worse_than_torch(case):
    # torch's CPU backend differentiates float16 conv2d (checked with torch 2.13), so the rule
    # "≤ 2x torch's own float16 error, both against float64" applies to dgrad and wgrad.
    x, w, dy = _problem(case, numpy.float16)
    ours = _ours(x, w, dy, case.kwargs)
    theirs = reference_grads(x, w, dy, **case.kwargs)
    refs = reference_grads(*_f64(x, w, dy), **case.kwargs)
    for name, got, torch_got, ref in zip(("dx", "dw"), ours, theirs, refs):
        assert got.dtype == numpy.float16, name
        err, torch_err = rel_err(got, ref), rel_err(torch_got, ref)
        assert err <= bound(ref, numpy.float16), name
        assert err <= TORCH_ERROR_FACTOR * torch_err, name


# Geometries with a batch of 5 (odd, so the last sample chunk is short); pointwise identities never chunk.
CHUNK_CASES = ["k5x9_d2x3_p2x4", "stride2x3_pad1x2", "stride2_dil2_pad3", "groups2", "depthwise_mult3_3x1",
               "same_even_dil3", "stem_like_c3_7x7_s2", "reduced_depthwise_3x3", "stride2_uncovered_tail"]


def _chunk_limit(spec, itemsize, split):
    """A workspace_limit that splits over samples (≤ 2 a chunk) or over output rows (≤ 2 a chunk) with
    either plan: the forward's two overlapping buffers or the backward's one buffer (``overlap=False``)."""
    if split == "samples":
        return chunk_bytes(spec, 2, spec.p, itemsize)
    return chunk_bytes(spec, 1, 2, itemsize)


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32], ids=lambda d: numpy.dtype(d).name)
@pytest.mark.parametrize("split", ["samples", "rows"])
@pytest.mark.parametrize("case_id", CHUNK_CASES)
def test_chunked_equals_unchunked(case_id, split, dtype):
    case = dataclasses.replace(_by_id(case_id), x_shape=(5,) + _by_id(case_id).x_shape[1:])
    x, w, dy = _problem(case, dtype, integer=True)
    spec = _spec(case)
    itemsize = numpy.dtype(dtype).itemsize  # float32 and float64 compute in themselves on the CPU
    limit = _chunk_limit(spec, itemsize, split)
    for overlap in (True, False):
        plan = plan_chunks(spec, itemsize, limit, overlap=overlap)
        chunks = list(plan.chunks(spec))
        if split == "samples":
            assert plan.rows == spec.p and len({n0 for n0, _, _, _ in chunks}) > 1, overlap
        else:
            assert plan.samples == 1 and len({p0 for _, _, p0, _ in chunks}) > 1, overlap
        assert len(list(plan_chunks(spec, itemsize, cuconv.config.workspace_limit, overlap=overlap)
                        .chunks(spec))) == 1
    whole = _ours(x, w, dy, case.kwargs)
    with cuconv.config(workspace_limit=limit):
        chunked = _ours(x, w, dy, case.kwargs)
    # Small integers: every partial sum is exact, so any order of summation gives the same bits.
    refs = reference_grads(*_f64(x, w, dy), **case.kwargs)
    for name, got, expected, ref in zip(("dx", "dw"), chunked, whole, refs):
        numpy.testing.assert_array_equal(got, expected, err_msg=name)
        numpy.testing.assert_array_equal(got, ref, err_msg=name)


@pytest.mark.parametrize("case_id", ["k5x9_d2x3_p2x4", "stride2x3_pad1x2", "groups2", "same_even_4x2",
                                     "pointwise_1x1", "stride2_uncovered_tail"])
def test_unbatched_forms(case_id):
    case = _by_id(case_id)
    x, w, dy = _problem(case)
    dx = cuconv.conv2d_input(x.shape[1:], w, dy[1], **case.kwargs)
    dw = cuconv.conv2d_weight(x[1], w.shape, dy[1], **case.kwargs)
    assert dx.shape == x.shape[1:]
    assert dw.shape == w.shape
    numpy.testing.assert_array_equal(dx, cuconv.conv2d_input((1,) + x.shape[1:], w, dy[1:2], **case.kwargs)[0])
    numpy.testing.assert_array_equal(dw, cuconv.conv2d_weight(x[1:2], w.shape, dy[1:2], **case.kwargs))
    ref_dx, ref_dw = reference_grads(x[1], w, dy[1], **case.kwargs)
    assert rel_err(dx, ref_dx) <= tolerance(numpy.float64)
    assert rel_err(dw, ref_dw) <= tolerance(numpy.float64)


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32, numpy.float16], ids=lambda d: numpy.dtype(d).name)
@pytest.mark.parametrize("x_shape,w_shape,kwargs", [
    pytest.param((0, 3, 9, 8), (5, 3, 2, 3), dict(stride=2, padding=(0, 1)), id="no_samples"),
    pytest.param((0, 4, 6, 7), (6, 2, 3, 3), dict(groups=2, padding="same"), id="no_samples_groups2"),
])
def test_degenerate_gives_zeros(x_shape, w_shape, kwargs, dtype):
    # Nothing is multiplied: both gradients are zeros of the right shape and dtype, never uninitialised.
    spec = ConvSpec.from_args(x_shape, w_shape, **kwargs)
    rng = numpy.random.default_rng(5)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    dy = numpy.ones(spec.output_shape, dtype=dtype)
    for got, shape in ((cuconv.conv2d_input(x_shape, w, dy, **kwargs), x_shape),
                       (cuconv.conv2d_weight(x, w_shape, dy, **kwargs), w_shape)):
        assert got.shape == shape
        assert got.dtype == dtype
        numpy.testing.assert_array_equal(got, numpy.zeros(shape, dtype=dtype))


def test_no_filters_is_refused_as_torch():
    # A weight of no filters (K = 0): torch.nn.grad refuses it, in the words of its forward; so do both passes.
    x = numpy.random.default_rng(6).standard_normal((2, 3, 6, 7))
    w, dy = numpy.ones((0, 3, 3, 3)), numpy.ones((2, 0, 6, 7))
    message = (r"Given groups=1, expected weight to be at least 1 at dimension 0, but got weight of size "
               r"\[0, 3, 3, 3\] instead")
    with pytest.raises(RuntimeError, match=message):
        torch.nn.grad.conv2d_input(x.shape, torch.from_numpy(w), torch.from_numpy(dy), padding=1)
    with pytest.raises(ValueError, match=message):
        cuconv.conv2d_input(x.shape, w, dy, padding=1)
    with pytest.raises(ValueError, match=message):
        cuconv.conv2d_weight(x, w.shape, dy, padding=1)


@pytest.mark.parametrize("dtype", [numpy.float64, numpy.float32], ids=lambda d: numpy.dtype(d).name)
@pytest.mark.parametrize("case", [p for p in CASES + [UNCOVERED_TAIL] if p.id != "empty_batch"])
def test_noncontiguous_inputs(case, dtype):
    x, w, dy = _problem(case, dtype)
    dx, dw = _ours(x, w, dy, case.kwargs)
    x_nc, w_nc, dy_nc = (noncontiguous(a) for a in (x, w, dy))
    dx_nc = cuconv.conv2d_input(x.shape, w_nc, dy_nc, **case.kwargs)
    dw_nc = cuconv.conv2d_weight(x_nc, w.shape, dy_nc, **case.kwargs)
    assert dx_nc.flags.c_contiguous and dw_nc.flags.c_contiguous
    numpy.testing.assert_array_equal(dx_nc, dx)
    numpy.testing.assert_array_equal(dw_nc, dw)


@pytest.mark.parametrize("case", CASES)
def test_forced_algo_and_tf32_equal_auto(case):
    """The CPU path computes float32 in IEEE arithmetic whatever is asked; a forced algorithm gives auto's bits
    where the GPU could run it for the pass, and is refused as the GPU refuses it elsewhere."""
    from cuconv import _plan, select
    from cuconv.problem import Problem

    x, w, dy = _problem(case, numpy.float32)
    auto = _ours(x, w, dy, case.kwargs)
    x4 = x if x.ndim == 4 else x[None]
    spec = ConvSpec.from_args(x4.shape, w.shape, **case.kwargs)
    limits = _plan.current_limits()
    passes = (("dgrad", lambda **o: cuconv.conv2d_input(x.shape, w, dy, **case.kwargs, **o)),
              ("wgrad", lambda **o: cuconv.conv2d_weight(x, w.shape, dy, **case.kwargs, **o)))
    for (pass_, call), expected in zip(passes, auto):
        for options in [dict(algo=name) for name in cuconv.algorithms(pass_)] + [dict(precision="tf32")]:
            name = options.get("algo")
            if name and select.can_implement(name, Problem.of(spec, x.dtype, "ieee", pass_), limits) is not None:
                with pytest.raises(NotImplementedError, match=f"cuconv: algo '{name}' cannot run this {pass_}: "):
                    call(**options)
                continue
            numpy.testing.assert_array_equal(call(**options), expected, err_msg=f"{pass_} {options}")


# ----- misuse ---------------------------------------------------------------------------------------------
def _arrays():
    rng = numpy.random.default_rng(42)
    return types.SimpleNamespace(
        x=rng.standard_normal((2, 4, 8, 8)),  # (N, C, H, W)
        w=rng.standard_normal((6, 4, 3, 3)),  # (K, C, R, S)
        dy=rng.standard_normal((2, 6, 6, 6)),  # (N, K, P, Q)
    )


def _resolve(a, kwargs):
    return {k: (v(a) if callable(v) else v) for k, v in kwargs.items()}


def _dgrad(**kwargs):
    """A call of conv2d_input on the valid arrays above with some arguments replaced."""
    def call(a):
        args = dict(input_size=a.x.shape, weight=a.w, grad_output=a.dy)
        args.update(_resolve(a, kwargs))
        return cuconv.conv2d_input(args.pop("input_size"), args.pop("weight"), args.pop("grad_output"), **args)
    return call


def _wgrad(**kwargs):
    """A call of conv2d_weight on the valid arrays above with some arguments replaced."""
    def call(a):
        args = dict(x=a.x, weight_size=a.w.shape, grad_output=a.dy)
        args.update(_resolve(a, kwargs))
        return cuconv.conv2d_weight(args.pop("x"), args.pop("weight_size"), args.pop("grad_output"), **args)
    return call


MISUSES = [
    # ----- grad_output that does not fit the convolution ----------------------------------------------
    pytest.param(_dgrad(grad_output=lambda a: a.dy[:, :, :5]), ValueError,
                 r"Expected grad_output of size \[2, 6, 6, 6\] for this convolution, but got grad_output of "
                 r"size \[2, 6, 5, 6\]", id="dgrad_grad_output_spatial"),
    pytest.param(_dgrad(input_size=(3, 4, 8, 8)), ValueError,
                 r"Expected grad_output of size \[3, 6, 6, 6\] for this convolution, but got grad_output of "
                 r"size \[2, 6, 6, 6\]", id="dgrad_grad_output_batch"),
    # (torch.nn.grad's words for a rank that is not the input's)
    pytest.param(_dgrad(grad_output=lambda a: a.dy[None]), ValueError,
                 r"Expected input and grad_output to have the same number of dimensions, but got: 4 and 5",
                 id="dgrad_grad_output_5d"),
    pytest.param(_dgrad(grad_output=lambda a: a.dy[0, 0]), ValueError,
                 r"Expected input and grad_output to have the same number of dimensions, but got: 4 and 2",
                 id="dgrad_grad_output_2d"),
    pytest.param(_wgrad(grad_output=lambda a: a.dy[0]), ValueError,
                 r"Expected input and grad_output to have the same number of dimensions, but got: 4 and 3",
                 id="wgrad_grad_output_3d"),
    pytest.param(_dgrad(input_size=(4, 8, 8)), ValueError,
                 r"Expected grad_output of size \[1, 6, 6, 6\] .* but got grad_output of size \[2, 6, 6, 6\]",
                 id="dgrad_unbatched_size_batched_grad_output"),
    pytest.param(_wgrad(grad_output=lambda a: a.dy[:1]), ValueError,
                 r"Expected grad_output of size \[2, 6, 6, 6\] for this convolution, but got grad_output of "
                 r"size \[1, 6, 6, 6\]", id="wgrad_grad_output_batch"),
    pytest.param(_wgrad(grad_output=lambda a: a.dy[:, :5]), ValueError,
                 r"Expected grad_output of size \[2, 6, 6, 6\] .* but got grad_output of size \[2, 5, 6, 6\]",
                 id="wgrad_grad_output_channels"),
    pytest.param(_wgrad(x=lambda a: a.x[0]), ValueError,
                 r"Expected grad_output of size \[1, 6, 6, 6\] .* but got grad_output of size \[2, 6, 6, 6\]",
                 id="wgrad_unbatched_input_batched_grad_output"),
    # ----- input_size and weight_size -------------------------------------------------------------------
    pytest.param(_dgrad(input_size=(8, 8)), ValueError, r"input_size must have 3 or 4 entries, got \[8, 8\]",
                 id="input_size_len2"),
    pytest.param(_dgrad(input_size=(1, 2, 4, 8, 8)), ValueError,
                 r"input_size must have 3 or 4 entries, got \[1, 2, 4, 8, 8\]", id="input_size_len5"),
    pytest.param(_dgrad(input_size=(2, -4, 8, 8)), ValueError,
                 r"input_size must be a tuple of non-negative ints, got \(2, -4, 8, 8\)", id="input_size_negative"),
    pytest.param(_dgrad(input_size=(2, 4, 8.0, 8)), TypeError,
                 r"input_size must be a tuple of non-negative ints, got \(2, 4, 8\.0, 8\)", id="input_size_float"),
    pytest.param(_dgrad(input_size=(2, 4, True, 8)), TypeError,
                 r"input_size must be a tuple of non-negative ints, got \(2, 4, True, 8\)", id="input_size_bool"),
    pytest.param(_dgrad(input_size=8), TypeError, r"input_size must be a tuple of non-negative ints, got 8$",
                 id="input_size_scalar"),
    pytest.param(_dgrad(input_size=None), TypeError, r"input_size must be a tuple of non-negative ints, got None",
                 id="input_size_none"),
    pytest.param(_dgrad(input_size=(2, 5, 8, 8)), ValueError,
                 r"Given groups=1, weight of size \[6, 4, 3, 3\], expected input\[2, 5, 8, 8\] to have 4 "
                 r"channels, but got 5 channels instead", id="input_size_channels"),
    pytest.param(_wgrad(weight_size=(6, 4, 3)), ValueError, r"weight_size must have 4 entries, got \[6, 4, 3\]",
                 id="weight_size_len3"),
    pytest.param(_wgrad(weight_size=(6, 4, 3, 3, 1)), ValueError,
                 r"weight_size must have 4 entries, got \[6, 4, 3, 3, 1\]", id="weight_size_len5"),
    pytest.param(_wgrad(weight_size=(6, 4, -3, 3)), ValueError,
                 r"weight_size must be a tuple of non-negative ints, got \(6, 4, -3, 3\)", id="weight_size_negative"),
    pytest.param(_wgrad(weight_size="6433"), TypeError,
                 r"weight_size must be a tuple of non-negative ints, got '6433'", id="weight_size_str"),
    pytest.param(_wgrad(weight_size=(6, 5, 3, 3)), ValueError,
                 r"Given groups=1, weight of size \[6, 5, 3, 3\], expected input\[2, 4, 8, 8\] to have 5 "
                 r"channels, but got 4 channels instead", id="weight_size_channels"),
    # ----- ranks ----------------------------------------------------------------------------------------
    pytest.param(_dgrad(weight=lambda a: a.w[0]), ValueError,
                 r"Expected 4D weight \(out_channels, in_channels/groups, kH, kW\), but got weight of size: "
                 r"\[4, 3, 3\]", id="dgrad_weight_3d"),
    pytest.param(_wgrad(x=lambda a: a.x[0, 0]), ValueError,
                 r"Expected 3D \(unbatched\) or 4D \(batched\) input to conv2d, but got input of size: \[8, 8\]",
                 id="wgrad_input_2d"),
    pytest.param(_wgrad(x=lambda a: a.x[None]), ValueError,
                 r"Expected 3D \(unbatched\) or 4D \(batched\) input to conv2d, but got input of size: "
                 r"\[1, 2, 4, 8, 8\]", id="wgrad_input_5d"),
    # ----- dtypes -------------------------------------------------------------------------------------
    pytest.param(_dgrad(weight=lambda a: a.w.astype(numpy.float32)), TypeError,
                 r"(?i)grad_output type \(float64\) and weight type \(float32\) should be the same",
                 id="dgrad_dtype_mismatch"),
    pytest.param(_wgrad(x=lambda a: a.x.astype(numpy.float32)), TypeError,
                 r"Input type \(float32\) and grad_output type \(float64\) should be the same",
                 id="wgrad_dtype_mismatch"),
    pytest.param(_dgrad(weight=lambda a: a.w.astype(numpy.int64), grad_output=lambda a: a.dy.astype(numpy.int64)),
                 TypeError, r"cuconv: grad_output dtype int64 is not supported; expected one of .*float16.*float32",
                 id="dgrad_dtype_integer"),
    pytest.param(_wgrad(x=lambda a: a.x.astype(numpy.int64), grad_output=lambda a: a.dy.astype(numpy.int64)),
                 TypeError, r"cuconv: input dtype int64 is not supported; expected one of .*float16.*float32",
                 id="wgrad_dtype_integer"),
    # ----- non-arrays, and NumPy mixed with something else ----------------------------------------------
    pytest.param(_dgrad(grad_output=lambda a: a.dy.tolist()), TypeError,
                 r"conv2d\(\): argument 'grad_output' must be a NumPy or CuPy array, not list$",
                 id="dgrad_grad_output_list"),
    pytest.param(_dgrad(weight=lambda a: a.w.tolist()), TypeError,
                 r"conv2d\(\): argument 'weight' must be a NumPy or CuPy array, not list$", id="dgrad_weight_list"),
    pytest.param(_wgrad(x=lambda a: a.x.tolist()), TypeError,
                 r"conv2d\(\): argument 'input' must be a NumPy or CuPy array, not list$", id="wgrad_input_list"),
    pytest.param(_wgrad(grad_output=lambda a: a.dy.tolist()), TypeError,
                 r"conv2d\(\): argument 'grad_output' must be a NumPy or CuPy array, not list$",
                 id="wgrad_grad_output_list"),
    pytest.param(_wgrad(x=lambda a: torch.from_numpy(a.x)), TypeError,
                 r"argument 'input' must be a NumPy or CuPy array, not Tensor; for torch tensors use "
                 r"cuconv\.nn\.functional\.conv2d", id="wgrad_input_torch_tensor"),
    # ----- geometry (checked by ConvSpec, as for the forward) ---------------------------------------------
    pytest.param(_dgrad(groups=4), ValueError,
                 r"Given groups=4, expected weight to be divisible by 4 at dimension 0, but got weight of size "
                 r"\[\[6, 4, 3, 3\]\] instead", id="dgrad_groups_not_dividing_K"),  # (torch's two brackets)
    pytest.param(_wgrad(stride=0), ValueError, r"non-positive stride is not supported", id="wgrad_stride_0"),
    pytest.param(_dgrad(stride=2, padding="same"), ValueError,
                 r"padding='same' is not supported for strided convolutions", id="dgrad_same_strided"),
    pytest.param(_wgrad(weight_size=(6, 4, 9, 3)), ValueError,
                 r"Calculated padded input size per channel: \(8 x 8\)\. Kernel size: \(9 x 3\)\.",
                 id="wgrad_kernel_larger_than_input"),
    # ----- algo and precision -----------------------------------------------------------------------------
    pytest.param(_dgrad(algo="fft"), ValueError,
                 r"cuconv: unknown algo 'fft'; expected 'auto' or one of \('im2col_gemm',",
                 id="dgrad_algo_unknown"),
    pytest.param(_wgrad(algo="fft"), ValueError, r"cuconv: unknown algo 'fft'", id="wgrad_algo_unknown"),
    pytest.param(_dgrad(algo=None), TypeError, r"conv2d\(\): argument 'algo' must be str, not NoneType",
                 id="dgrad_algo_not_str"),
    pytest.param(_wgrad(precision="fp8"), ValueError,
                 r"cuconv: precision must be None or one of \('ieee', 'tf32'\), got 'fp8'",
                 id="wgrad_precision_unknown"),
]


@pytest.mark.parametrize("misuse,exc,message", MISUSES)
def test_misuse_raises(misuse, exc, message):
    with pytest.raises(exc, match=message):
        misuse(_arrays())


@pytest.mark.parametrize("case", [c for c in ALL_CASES if c.values[0].kwargs.get("groups", 1) == 1
                                  and 0 not in c.values[0].x_shape])  # (empty problems never reach a family)
def test_wgrad_is_the_forward_convolution_of_the_transposed_spec(case):
    """implicit_gemm's wgrad: dW (K, C, R, S) is the forward convolution of x with samples and channels swapped
    by dy likewise (``transposed_spec``), its output images being dW's (c, r, s) columns, in float64 against
    torch's conv2d_weight. Negative padding (input rows no output reads) is a crop."""
    from cuconv.algos.implicit_gemm import transposed_spec

    x, w, _ = make_inputs(case, seed=5)
    x4 = x if x.ndim == 4 else x[None]
    spec = ConvSpec.from_args(x4.shape, w.shape, **case.kwargs)
    dy = numpy.random.default_rng(6).standard_normal(spec.output_shape)
    t = transposed_spec(spec)
    assert (t.n, t.c, t.k, t.r, t.s, t.p, t.q) == (spec.c, spec.n, spec.k, spec.p, spec.q, spec.r, spec.s)
    xt = torch.from_numpy(x4).transpose(0, 1)
    pt, pb, pl, pr = t.pad
    xt = torch.nn.functional.pad(xt, (max(pl, 0), max(pr, 0), max(pt, 0), max(pb, 0)))
    xt = xt[:, :, -min(pt, 0):xt.shape[2] + min(pb, 0), -min(pl, 0):xt.shape[3] + min(pr, 0)]
    out = torch.nn.functional.conv2d(xt, torch.from_numpy(dy).transpose(0, 1), stride=t.stride, dilation=t.dilation)
    ref = _wgrad_oracle(x4, w.shape, dy, spec)
    numpy.testing.assert_allclose(out.transpose(0, 1).numpy(), ref, rtol=1e-12, atol=1e-12)


def _wgrad_oracle(x, w_shape, dy, spec):
    """conv2d_weight in float64 by autograd with the spec's four-sided padding applied to x first."""
    pt, pb, pl, pr = spec.pad
    xt = torch.nn.functional.pad(torch.from_numpy(x), (pl, pr, pt, pb))
    w = torch.zeros(w_shape, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.conv2d(xt, w, stride=spec.stride, dilation=spec.dilation)
    y.backward(torch.from_numpy(dy))
    return w.grad.numpy()
