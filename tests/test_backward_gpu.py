"""GPU dgrad (conv2d_input) and wgrad (conv2d_weight) on CuPy arrays against the float64 oracle."""

from __future__ import annotations

import dataclasses

import numpy
import pytest

import cuconv
from cases import (CASES, PROBLEM_CASES, TORCH_ERROR_FACTOR, algo_mode_cases, bound, exact_algo_cases, make_inputs,
                   reference_grads, rel_err, to_gpu)
from test_conv_gpu import MODES, _dtype

pytestmark = pytest.mark.gpu


def _torch_gpu_grads(x, w, dy, dtype_name, kwargs):
    import torch

    torch.backends.cudnn.allow_tf32 = False
    tdt = getattr(torch, dtype_name)
    xt = torch.from_numpy(x).cuda().to(tdt).requires_grad_()
    wt = torch.from_numpy(w).cuda().to(tdt).requires_grad_()
    torch.nn.functional.conv2d(xt, wt, **kwargs).backward(torch.from_numpy(dy).cuda().to(tdt))
    return xt.grad.double().cpu().numpy(), wt.grad.double().cpu().numpy()


def _inputs(case, seed, dtype, integer=False):
    """x, w, dy quantised to ``dtype`` (as float64), so the oracle sees what the kernels see."""
    from cases import reference

    x, w, _ = make_inputs(case, seed=seed, integer=integer)
    y_shape = reference(x, w, **case.kwargs).shape
    rng = numpy.random.default_rng(seed + 1)
    dy = rng.integers(-3, 4, size=y_shape).astype(numpy.float64) if integer else rng.standard_normal(y_shape)
    q = lambda a: a.astype(dtype).astype(numpy.float64)
    return q(x), q(w), q(dy)


# (case, algorithm, pass) for every algorithm serving each backward pass (direct_smem, implicit_gemm and winograd
# have a dgrad only) and summing integers exactly, and with the modes each serves for the oracle test
_BACKWARD_CASES = [pytest.param(*param.values, pass_, id=f"{param.id}-{pass_}")
                   for pass_ in ("dgrad", "wgrad") for param in exact_algo_cases(CASES + PROBLEM_CASES, pass_)]
_BACKWARD_MODE_CASES = [pytest.param(*param.values, pass_, id=f"{param.id}-{pass_}")
                        for pass_ in ("dgrad", "wgrad")
                        for param in algo_mode_cases(CASES + PROBLEM_CASES, MODES, pass_)]


def _grad(pass_, x, w, dy, dtype, precision, algo, kwargs):
    """One gradient on the GPU: dx (dgrad) or dw (wgrad), as a float64 NumPy array."""
    import cupy

    if pass_ == "dgrad":
        got = cuconv.conv2d_input(x.shape, to_gpu(w, dtype), to_gpu(dy, dtype), precision=precision,
                                  algo=algo, **kwargs)
    else:
        got = cuconv.conv2d_weight(to_gpu(x, dtype), w.shape, to_gpu(dy, dtype), precision=precision,
                                   algo=algo, **kwargs)
    assert got.dtype == dtype
    return cupy.asnumpy(got).astype(numpy.float64)


def test_every_backward_pass_has_algorithms():
    assert "im2col_gemm" in cuconv.select.algorithms("dgrad")
    assert "im2col_gemm" in cuconv.select.algorithms("wgrad")


@pytest.mark.parametrize("case,algo,mode,pass_", _BACKWARD_MODE_CASES)
def test_grads_match_oracle(case, algo, mode, pass_):
    dtype_name, precision = mode
    dtype = _dtype(dtype_name)
    x, w, dy = _inputs(case, 11, dtype)
    which = 0 if pass_ == "dgrad" else 1
    ref = reference_grads(x, w, dy, **case.kwargs)[which]
    got = _grad(pass_, x, w, dy, dtype, precision, algo, case.kwargs)
    err = rel_err(got, ref)
    assert err <= bound(ref, dtype, precision), f"{pass_} {err:.2e}"
    if dtype_name in ("float16", "bfloat16"):
        torch_err = rel_err(_torch_gpu_grads(x, w, dy, dtype_name, case.kwargs)[which], ref)
        assert err <= max(TORCH_ERROR_FACTOR * torch_err, 1e-7), f"{pass_} vs torch {torch_err:.2e}"


@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
@pytest.mark.parametrize("case,algo,pass_", _BACKWARD_CASES)
def test_gpu_grads_equal_cpu_exactly_on_integers(case, algo, pass_, dtype_name):
    dtype = numpy.dtype(dtype_name)
    x, w, dy = _inputs(case, 12, dtype, integer=True)
    kw = dict(case.kwargs)
    if pass_ == "dgrad":
        cpu = cuconv.conv2d_input(x.shape, w.astype(dtype), dy.astype(dtype), **kw)
    else:
        cpu = cuconv.conv2d_weight(x.astype(dtype), w.shape, dy.astype(dtype), **kw)
    numpy.testing.assert_array_equal(_grad(pass_, x, w, dy, dtype, "ieee", algo, kw), cpu)


@pytest.mark.parametrize("rows", [1, 2], ids=["one_row_chunks", "two_row_chunks"])
@pytest.mark.parametrize("case", [c for c in CASES if c.id in ("k5x9_d2x3_p2x4", "groups2", "depthwise",
                                                               "stride2_dil2_pad3", "same_even_dil3")])
def test_chunked_grads_equal_one_chunk(case, rows):
    """Row chunks (dgrad accumulating halo rows) and sample chunks give the one-chunk gradients."""
    import cupy

    from cuconv.algos.im2col_gemm import chunk_bytes, plan_chunks

    case = dataclasses.replace(case, x_shape=(3,) + case.x_shape[1:])
    x, w, dy = _inputs(case, 13, numpy.float32, integer=True)
    xg, wg, dyg = (to_gpu(a, numpy.float32) for a in (x, w, dy))
    whole_dx = cuconv.conv2d_input(x.shape, wg, dyg, **case.kwargs)
    whole_dw = cuconv.conv2d_weight(xg, w.shape, dyg, **case.kwargs)
    spec = cuconv.ConvSpec.from_args(x.shape, w.shape, **case.kwargs)
    limit = chunk_bytes(spec, 1, rows, 4)
    assert plan_chunks(spec, 4, limit, overlap=False).rows < spec.p
    with cuconv.config(workspace_limit=limit):
        dx = cuconv.conv2d_input(x.shape, wg, dyg, **case.kwargs)
        dw = cuconv.conv2d_weight(xg, w.shape, dyg, **case.kwargs)
    numpy.testing.assert_array_equal(cupy.asnumpy(dx), cupy.asnumpy(whole_dx))
    numpy.testing.assert_array_equal(cupy.asnumpy(dw), cupy.asnumpy(whole_dw))


@pytest.mark.parametrize("dtype_name", ["float32", "float16"])
@pytest.mark.parametrize("case", [c for c in CASES if c.id in ("k5x9_d2x3_p2x4", "pointwise_1x1", "stride2_dil2_pad3")])
def test_wgrad_partial_sums_in_turns_equal_all_at_once(case, dtype_name, monkeypatch):
    """One-group wgrad sums per-sample partials; with room for only two samples' partials at a time (five
    samples: turns of 2, 2, 1) the result is the same, exactly on integers, and equals the CPU path."""
    import cupy

    from cuconv.algos import im2col_gemm

    dtype = _dtype(dtype_name)
    case = dataclasses.replace(case, x_shape=(5,) + case.x_shape[1:])
    x, w, dy = _inputs(case, 15, dtype, integer=True)
    xg, dyg = to_gpu(x, dtype), to_gpu(dy, dtype)
    whole = cupy.asnumpy(cuconv.conv2d_weight(xg, w.shape, dyg, algo="im2col_gemm", **case.kwargs))
    spec = cuconv.ConvSpec.from_args(x.shape, w.shape, **case.kwargs)
    monkeypatch.setattr(im2col_gemm, "_WGRAD_PARTIALS_BYTES", 2 * spec.k * spec.crs * 4)
    turns = cupy.asnumpy(cuconv.conv2d_weight(xg, w.shape, dyg, algo="im2col_gemm", **case.kwargs))
    numpy.testing.assert_array_equal(turns, whole)
    cpu = cuconv.conv2d_weight(x.astype(dtype), w.shape, dy.astype(dtype), **case.kwargs)
    numpy.testing.assert_array_equal(whole, cpu)


def test_grads_are_deterministic():
    """No atomics: two runs on random float32 data agree bit for bit."""
    import cupy

    case = PROBLEM_CASES[0].values[0]
    x, w, dy = _inputs(case, 14, numpy.float32)
    xg, wg, dyg = (to_gpu(a, numpy.float32) for a in (x, w, dy))
    first = [cupy.asnumpy(cuconv.conv2d_input(x.shape, wg, dyg, **case.kwargs)),
             cupy.asnumpy(cuconv.conv2d_weight(xg, w.shape, dyg, **case.kwargs))]
    second = [cupy.asnumpy(cuconv.conv2d_input(x.shape, wg, dyg, **case.kwargs)),
              cupy.asnumpy(cuconv.conv2d_weight(xg, w.shape, dyg, **case.kwargs))]
    for a, b in zip(first, second):
        numpy.testing.assert_array_equal(a, b)
