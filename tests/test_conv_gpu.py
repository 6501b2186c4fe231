"""GPU path of cuconv.conv2d: every case × dtype × precision × algorithm against the float64 oracle; exactness on
integers, chunking, aliasing, non-finite inputs (plans, streams, devices and memory: test_conv_gpu_runtime.py)."""

from __future__ import annotations

import numpy
import pytest

import cuconv
from cuconv import _dtypes
from cuconv.algos.im2col_gemm import chunk_bytes, plan_chunks
from cases import (CASES, PROBLEM_CASES, TORCH_ERROR_FACTOR, algo_mode_cases, bound,
                   exact_algo_cases, make_inputs, noncontiguous, reference, rel_err, to_gpu, tolerance)

pytestmark = pytest.mark.gpu

# (dtype name, precision): the float32 modes are separate rows of the tolerance table.
MODES = [("float64", "ieee"), ("float32", "ieee"), ("float32", "tf32"), ("float16", "ieee")]
if _dtypes.bfloat16 is not None:
    MODES.append(("bfloat16", "ieee"))


def _dtype(name):
    return _dtypes.by_name(name)


def _torch_error(x, w, b, dtype_name, precision, kwargs, ref):
    """torch's own normwise error in this dtype/precision on the GPU (cuDNN), against the same oracle."""
    import torch

    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    try:
        tdt = getattr(torch, dtype_name)
        t = lambda a: None if a is None else torch.from_numpy(a).cuda().to(tdt)
        y = torch.nn.functional.conv2d(t(x), t(w), t(b), **kwargs)
        return rel_err(y.double().cpu().numpy(), ref)
    finally:
        torch.backends.cudnn.allow_tf32 = False


@pytest.mark.parametrize("case,algo,mode", algo_mode_cases(CASES + PROBLEM_CASES, MODES))
def test_matches_oracle(case, algo, mode):
    import cupy

    dtype_name, precision = mode
    dtype = _dtype(dtype_name)
    x, w, b = make_inputs(case, seed=hash((case.x_shape, case.w_shape)) % 2**32)
    # Quantise the inputs to the dtype first, so the oracle sees exactly what the kernel sees.
    x, w = x.astype(dtype).astype(numpy.float64), w.astype(dtype).astype(numpy.float64)
    b = None if b is None else b.astype(dtype).astype(numpy.float64)
    ref = reference(x, w, b, **case.kwargs)
    out = cupy.full(ref.shape, numpy.nan, dtype=dtype)
    got = cuconv.conv2d(to_gpu(x, dtype), to_gpu(w, dtype), to_gpu(b, dtype), algo=algo,
                        precision=precision, out=out, **case.kwargs)
    assert got is out
    y = cupy.asnumpy(out).astype(numpy.float64)
    assert not numpy.isnan(y).any(), "some outputs were never written"
    err = rel_err(y, ref)
    assert err <= bound(ref, dtype, precision), f"relative error {err:.2e}"
    if dtype_name in ("float16", "bfloat16"):  # tf32 has only its absolute bound: cuDNN may not use TF32
        torch_err = _torch_error(x, w, b, dtype_name, precision, case.kwargs, ref)
        assert err <= max(TORCH_ERROR_FACTOR * torch_err, 1e-7), f"{err:.2e} vs torch {torch_err:.2e}"


@pytest.mark.parametrize("case", CASES[:12])
def test_noncontiguous_inputs(case):
    import cupy

    x, w, b = make_inputs(case, seed=3)
    ref = reference(x, w, b, **case.kwargs)
    xg, wg = noncontiguous(cupy.asarray(x), cupy), noncontiguous(cupy.asarray(w), cupy)
    bg = None if b is None else noncontiguous(cupy.asarray(b), cupy)
    y = cuconv.conv2d(xg, wg, bg, **case.kwargs)
    assert rel_err(cupy.asnumpy(y), ref) <= tolerance(numpy.float64)


def test_noncontiguous_out_is_written_in_place():
    import cupy

    case = CASES[0].values[0]
    x, w, b = make_inputs(case, seed=4)
    ref = reference(x, w, b, **case.kwargs)
    wide = cupy.full(ref.shape[:-1] + (2 * ref.shape[-1],), numpy.nan)
    out = wide[..., ::2]
    got = cuconv.conv2d(cupy.asarray(x), cupy.asarray(w), cupy.asarray(b), out=out, **case.kwargs)
    assert got is out
    assert rel_err(cupy.asnumpy(out), ref) <= tolerance(numpy.float64)
    assert cupy.isnan(wide[..., 1::2]).all(), "wrote outside the out= view"


@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
@pytest.mark.parametrize("case,algo", exact_algo_cases(CASES + PROBLEM_CASES))
def test_gpu_equals_cpu_exactly_on_integers(case, algo, dtype_name):
    """Integer-valued inputs make every partial sum exact: each algorithm equals the CPU path bit for bit."""
    import cupy

    x, w, b = make_inputs(case, seed=5, integer=True)
    dtype = numpy.dtype(dtype_name)
    cpu = cuconv.conv2d(x.astype(dtype), w.astype(dtype), None if b is None else b.astype(dtype),
                        **case.kwargs)
    gpu = cuconv.conv2d(to_gpu(x, dtype), to_gpu(w, dtype), to_gpu(b, dtype), precision="ieee", algo=algo,
                        **case.kwargs)
    numpy.testing.assert_array_equal(cupy.asnumpy(gpu), cpu)


_CHUNK_MODES = {
    # name: (workspace limit from the case's spec, expected buffers, expect sample chunks)
    "rows_two_buffers": (lambda spec: 2 * chunk_bytes(spec, 1, 2, 4), 2, False),
    "rows_one_buffer": (lambda spec: chunk_bytes(spec, 1, 1, 4) * 3 // 2, 1, False),
    "samples_two_buffers": (lambda spec: 2 * chunk_bytes(spec, 1, spec.p, 4), 2, True),
}


@pytest.mark.parametrize("mode", sorted(_CHUNK_MODES))
@pytest.mark.parametrize("case", [c for c in CASES if c.id in ("k5x9_d2x3_p2x4", "groups2", "depthwise",
                                                               "stride2_dil2_pad3", "batch1_odd")])
def test_chunked_and_overlapped_equals_one_chunk(case, mode):
    """Row chunks, sample chunks and the two-buffer side-stream overlap give the one-chunk result."""
    import dataclasses

    import cupy

    case = dataclasses.replace(case, x_shape=(5,) + case.x_shape[1:])  # room for several sample chunks
    x, w, b = make_inputs(case, seed=6, integer=True)
    xg, wg, bg = (to_gpu(a, numpy.float32) for a in (x, w, b))
    whole = cuconv.conv2d(xg, wg, bg, **case.kwargs)
    spec = cuconv.ConvSpec.from_args(xg.shape, wg.shape, **case.kwargs)
    limit_of, buffers, by_samples = _CHUNK_MODES[mode]
    limit = limit_of(spec)
    plan = plan_chunks(spec, 4, limit)
    assert (plan.buffers, plan.rows < spec.p, len(list(plan.chunks(spec))) > 1) == (buffers, not by_samples, True)
    with cuconv.config(workspace_limit=limit):
        chunked = cuconv.conv2d(xg, wg, bg, **case.kwargs)
    numpy.testing.assert_array_equal(cupy.asnumpy(chunked), cupy.asnumpy(whole))


@pytest.mark.parametrize("precision", ["ieee", "tf32"])
@pytest.mark.parametrize("alias", ["x", "w"])
def test_out_aliasing_an_input_gives_the_right_result_on_gpu(alias, precision):
    """Every GPU algorithm reads its operands while it writes: an aliased out= is computed apart and copied."""
    import cupy

    rng = numpy.random.default_rng(45)
    x_shape, w_shape, kwargs = ((1, 64, 45, 45), (64, 64, 3, 3), dict(padding=1)) if alias == "x" else \
        ((3, 3, 5, 5), (3, 3, 3, 3), {})
    x, w = rng.standard_normal(x_shape).astype(numpy.float32), rng.standard_normal(w_shape).astype(numpy.float32)
    expected = reference(x, w, None, **kwargs)
    xg, wg = cupy.asarray(x), cupy.asarray(w)
    out = xg if alias == "x" else wg
    y = cuconv.conv2d(xg, wg, out=out, precision=precision, **kwargs)
    assert y is out
    assert rel_err(cupy.asnumpy(y), expected) <= tolerance(numpy.float32, precision)


@pytest.mark.parametrize("pass_", ["fprop", "dgrad"])
@pytest.mark.parametrize("dtype_name, precision", [("float32", "ieee"), ("float64", "ieee"), ("float32", "tf32"),
                                                   ("float16", "ieee")], ids=["f32", "f64", "tf32", "f16"])
@pytest.mark.parametrize("w_shape, padding", [((24, 16, 3, 3), (1, 1)), ((24, 16, 3, 3), (2, 0))],
                         ids=["pad1", "pad2x0"])  # (3x3: the kernels other tests compile; winograd_fused serves it)
def test_nonfinite_inputs_spoil_the_outputs_torch_spoils(pass_, dtype_name, precision, w_shape, padding):
    """A NaN and an Inf in the input (grad_output for dgrad) make non-finite exactly the outputs that torch's
    float64 convolution makes non-finite, with every algorithm that serves the case: Winograd's transforms mix a
    whole tile, so its outputs that come out non-finite are computed again from their own windows."""
    import cupy
    import torch

    from cuconv import select

    dtype = numpy.dtype(dtype_name)
    rng = numpy.random.default_rng(23)
    x_shape = (2, 16, 19, 23)
    spec = cuconv.ConvSpec.from_args(x_shape, w_shape, padding=padding)
    w = rng.standard_normal(w_shape)
    first = rng.standard_normal(x_shape if pass_ == "fprop" else spec.output_shape)
    first[0, 3, 5, 7] = numpy.nan
    first[1, 10, 12, 2] = numpy.inf
    if pass_ == "fprop":
        ref = torch.nn.functional.conv2d(torch.from_numpy(first), torch.from_numpy(w), padding=padding)
    else:
        ref = torch.nn.grad.conv2d_input(x_shape, torch.from_numpy(w), torch.from_numpy(first), padding=padding)
    expected = ~numpy.isfinite(ref.numpy())
    assert 0 < expected.sum() < expected.size / 4
    served = [name for name in select.algorithms(pass_)
              if select.reason_unsupported(name, spec, dtype, pass_, precision) is None]
    assert len(served) >= 2 and ("winograd" in served or precision == "tf32" or dtype_name == "float16")
    for name in served:
        a, b = cupy.asarray(first.astype(dtype)), cupy.asarray(w.astype(dtype))
        with cuconv.config(precision=precision):
            if pass_ == "fprop":
                got = cuconv.conv2d(a, b, padding=padding, algo=name)
            else:
                got = cuconv.conv2d_input(x_shape, b, a, padding=padding, algo=name)
        mask = ~numpy.isfinite(cupy.asnumpy(got))
        assert (mask == expected).all(), f"{name}: {int((mask & ~expected).sum())} outputs spoiled that torch " \
                                         f"keeps finite, {int((expected & ~mask).sum())} finite that torch spoils"
