"""GPU path of cuconv.conv2d: every case × dtype × precision × algorithm against the float64 oracle."""

from __future__ import annotations

import types

import numpy
import pytest

import cuconv
from cuconv import _dtypes
from cuconv.families.im2col_gemm import chunk_bytes, plan_chunks
from test_errors import MISUSES, _arrays, _conv
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


# ----- call plans: a signature checked once is not checked again (cuconv.conv._plans) ----------------------
# Misuses whose message does not depend on the array library (the NumPy `out=` and torch ones are replaced).
_GPU_MISUSES = [m for m in MISUSES if m.id not in ("out_wrong_shape", "out_wrong_dtype", "input_torch_tensor")] + [
    pytest.param(_conv(out=lambda a: a.xp.empty((2, 6, 6, 5))), ValueError,
                 r"expected out of size \[2, 6, 6, 6\], but got out of size \[2, 6, 6, 5\]", id="out_wrong_shape"),
    pytest.param(_conv(out=lambda a: a.xp.empty((2, 6, 6, 6), dtype=numpy.float32)), TypeError,
                 r"expected out to have dtype float64, but got float32", id="out_wrong_dtype"),
    # equal as dictionary keys to the valid calls made first, but not valid arguments
    pytest.param(_conv(stride=1.0), TypeError, r"argument 'stride' must be an int or a tuple of 2 ints, not float",
                 id="stride_float_equal_to_1"),
    pytest.param(_conv(stride=(1, True)), TypeError, r"argument 'stride' must be an int or a tuple of 2 ints",
                 id="stride_tuple_with_bool"),
    pytest.param(_conv(padding=False), TypeError, r"argument 'padding' must be", id="padding_bool"),
    pytest.param(_conv(groups=numpy.float64(1.0)), TypeError, r"argument 'groups' must be int", id="groups_numpy_float"),
]


def _gpu_arrays():
    import cupy

    a = _arrays()
    return types.SimpleNamespace(x=cupy.asarray(a.x), w=cupy.asarray(a.w), b=cupy.asarray(a.b),
                                 rng=cupy.random.default_rng(42), xp=cupy)


@pytest.mark.parametrize("misuse,exc,message", _GPU_MISUSES)
def test_misuse_raises_after_the_valid_call_was_planned(misuse, exc, message):
    """The call plan is keyed by what the checks read: a misuse after a valid call of the same arrays (whose
    plan exists) is still refused with torch's message, and the valid call still works after it."""
    import cupy

    a = _gpu_arrays()
    ref = reference(cupy.asnumpy(a.x), cupy.asnumpy(a.w), cupy.asnumpy(a.b))
    for kwargs in ({}, dict(stride=1, padding=0, dilation=1), dict(stride=(1, 1), padding=(0, 0), groups=1)):
        cuconv.conv2d(a.x, a.w, a.b, **kwargs)
    with pytest.raises(exc, match=message):
        misuse(a)
    y = cuconv.conv2d(a.x, a.w, a.b)
    assert rel_err(cupy.asnumpy(y), ref) <= tolerance(numpy.float64)


def test_planned_call_takes_new_strides_out_and_batch_axis():
    """The plan leaves strides out: a contiguous call, then the same shapes non-contiguous, into a
    non-contiguous out=, and unbatched, each give the right result."""
    import cupy

    case = CASES[0].values[0]
    x, w, b = make_inputs(case, seed=5)
    ref = reference(x, w, b, **case.kwargs)
    xg, wg, bg = cupy.asarray(x), cupy.asarray(w), cupy.asarray(b)
    for _ in range(2):
        y = cuconv.conv2d(xg, wg, bg, **case.kwargs)
        assert rel_err(cupy.asnumpy(y), ref) <= tolerance(numpy.float64)
    y = cuconv.conv2d(noncontiguous(xg, cupy), noncontiguous(wg, cupy), noncontiguous(bg, cupy), **case.kwargs)
    assert rel_err(cupy.asnumpy(y), ref) <= tolerance(numpy.float64)
    wide = cupy.full(ref.shape[:-1] + (2 * ref.shape[-1],), numpy.nan)
    for _ in range(2):
        got = cuconv.conv2d(xg, wg, bg, out=wide[..., ::2], **case.kwargs)
        assert rel_err(cupy.asnumpy(got), ref) <= tolerance(numpy.float64)
    for _ in range(2):
        y1 = cuconv.conv2d(xg[0], wg, bg, **case.kwargs)
        assert y1.shape == ref.shape[1:]
        assert rel_err(cupy.asnumpy(y1), ref[0]) <= tolerance(numpy.float64)


def test_planned_call_follows_the_config(monkeypatch):
    """config.precision and config.workspace_limit take part in the choice: a call after a change runs what
    the heuristic picks under the new values, not the plan made under the old ones."""
    import cupy
    from cuconv import conv, registry
    from cuconv.spec import ConvSpec

    x = cupy.random.standard_normal((2, 32, 20, 20), dtype=numpy.float32)
    w = cupy.random.standard_normal((64, 32, 3, 3), dtype=numpy.float32)
    spec = ConvSpec.from_args(x.shape, w.shape, padding=1)
    from cuconv import _plan

    ran = []
    real_run = _plan.Plan.run
    monkeypatch.setattr(_plan.Plan, "run", lambda self, *args: (ran.append(self.algo), real_run(self, *args))[1])
    for precision in ("ieee", "tf32", "ieee"):
        with cuconv.config(precision=precision):
            cuconv.conv2d(x, w, padding=1)
            cuconv.conv2d(x, w, padding=1)
        expected = registry.select_algorithm(spec, numpy.float32, precision)
        assert ran[-2:] == [expected, expected], (precision, ran)
    assert registry.select_algorithm(spec, numpy.float32, "ieee") != registry.select_algorithm(spec, numpy.float32,
                                                                                               "tf32")
    assert len([k for k in conv._plans if k[1] == x.shape and k[3] == w.shape]) == 2


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


def test_runs_on_a_non_default_stream():
    import cupy

    case = CASES[2].values[0]
    x, w, b = make_inputs(case, seed=7)
    ref = reference(x, w, b, **case.kwargs)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        xg, wg, bg = cupy.asarray(x), cupy.asarray(w), cupy.asarray(b)
        with cuconv.config(workspace_limit=1 << 17):  # several chunks: side stream forks from `stream`
            y = cuconv.conv2d(xg, wg, bg, **case.kwargs)
        got = cupy.asnumpy(y, stream=stream)
    stream.synchronize()
    assert rel_err(got, ref) <= tolerance(numpy.float64)


def test_mixing_numpy_and_cupy_is_refused_then_valid_call_works():
    import cupy

    x = numpy.random.default_rng(0).standard_normal((1, 3, 8, 8))
    w = numpy.random.default_rng(1).standard_normal((2, 3, 3, 3))
    with pytest.raises(TypeError, match="same library"):
        cuconv.conv2d(cupy.asarray(x), w)
    with pytest.raises(TypeError, match="same library"):
        cuconv.conv2d(cupy.asarray(x), cupy.asarray(w), out=numpy.empty((1, 2, 6, 6)))
    y = cuconv.conv2d(cupy.asarray(x), cupy.asarray(w))
    assert rel_err(cupy.asnumpy(y), reference(x, w)) <= tolerance(numpy.float64)


def test_arrays_on_different_gpus_are_refused():
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs: this machine has one")
    x = cupy.random.standard_normal((1, 3, 8, 8))
    with cupy.cuda.Device(1):
        w = cupy.random.standard_normal((2, 3, 3, 3))
    with pytest.raises(ValueError, match="same device"):
        cuconv.conv2d(x, w)


def test_runs_on_the_inputs_device():
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs: this machine has one")
    x0, w0 = numpy.random.default_rng(0).standard_normal((2, 3, 8, 8)), numpy.ones((2, 3, 3, 3)) * 0.5
    with cupy.cuda.Device(1):
        x, w = cupy.asarray(x0), cupy.asarray(w0)
    y = cuconv.conv2d(x, w)  # current device is 0
    assert y.device.id == 1
    assert rel_err(cupy.asnumpy(y), reference(x0, w0)) <= tolerance(numpy.float64)


def test_launch_failure_names_the_kernel_and_leaves_cuda_usable():
    import cupy

    from cuconv import _loader
    from cuconv.families import bias

    out = cupy.zeros((1, 2, 3, 3), dtype=numpy.float32)
    launch = _loader.prepare(bias.STEM, bias.NAME_EXPRESSIONS, "bias_fill<float>", (1, 1, 1),
                             (4096, 1, 1), 2, (numpy.int64(2), numpy.int64(9)))  # > 1024 threads: invalid
    with pytest.raises(_loader.KernelLaunchError, match=r"bias_fill<float>"):
        launch(cupy.cuda.get_current_stream().ptr, out.data.ptr, cupy.zeros(2, numpy.float32).data.ptr)
    x = cupy.random.standard_normal((1, 3, 8, 8))
    w = cupy.random.standard_normal((2, 3, 3, 3))
    y = cuconv.conv2d(x, w)
    assert rel_err(cupy.asnumpy(y), reference(cupy.asnumpy(x), cupy.asnumpy(w))) <= 1e-12


def test_cupy_tf32_math_mode_does_not_leak_into_ieee():
    """CuPy's cuBLAS handle left in TF32 math mode (CUPY_TF32=1 does that) must not make "ieee" TF32."""
    import cupy
    from cupy.cuda import cublas, device

    case = PROBLEM_CASES[0].values[0]
    x, w, _ = make_inputs(case, seed=8)
    ref = reference(x, w, **case.kwargs)
    handle = device.get_cublas_handle()
    saved = cublas.getMathMode(handle)
    cublas.setMathMode(handle, 3)  # CUBLAS_TF32_TENSOR_OP_MATH
    try:
        y = cuconv.conv2d(to_gpu(x, numpy.float32), to_gpu(w, numpy.float32), precision="ieee",
                          **case.kwargs)
        assert cublas.getMathMode(handle) == 3, "the caller's math mode was changed"
    finally:
        cublas.setMathMode(handle, saved)
    assert rel_err(cupy.asnumpy(y), ref) <= tolerance(numpy.float32)


class _PeakHook:
    """Peak bytes held by CuPy allocations made inside the block (a cupy.cuda.MemoryHook)."""

    def __new__(cls):
        from cupy.cuda import memory_hook

        class Hook(memory_hook.MemoryHook):
            name = "cuconv_peak"

            def __init__(self):
                self.current = self.peak = 0
                self.sizes = {}

            def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
                self.sizes[mem_ptr] = size  # bytes asked for (the pool rounds up to 512 B)
                self.current += size
                self.peak = max(self.peak, self.current)

            def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
                self.current -= self.sizes.pop(mem_ptr, 0)

        return Hook()


def test_workspace_bound_on_square_3x3_1024(record_property):
    """The 9.6 GB column matrix of square_3x3_1024 runs within the default 1 GiB workspace."""
    import cupy

    from cuconv.problems import PROBLEMS

    prob = next(p for p in PROBLEMS if p.name == "square_3x3_1024")
    rng = cupy.random.default_rng(9)
    x = rng.standard_normal(prob.input_shape, dtype=numpy.float32)
    w = rng.standard_normal(prob.weight_shape, dtype=numpy.float32) / 12
    spec = prob.spec()
    out = cupy.full(spec.output_shape, numpy.nan, dtype=numpy.float32)
    cupy.cuda.Device().synchronize()
    hook = _PeakHook()
    with hook:
        cuconv.conv2d(x, w, out=out, **prob.conv_kwargs)
        cupy.cuda.Device().synchronize()
    record_property("peak_workspace_bytes", hook.peak)
    assert 0 < hook.peak <= cuconv.config.workspace_limit
    for n in (0, spec.n - 1):
        ref = reference(cupy.asnumpy(x[n:n + 1]), cupy.asnumpy(w), **prob.conv_kwargs)
        assert rel_err(cupy.asnumpy(out[n:n + 1]), ref) <= tolerance(numpy.float32)


@pytest.mark.slow
def test_column_chunk_past_2_31_elements():
    """One column chunk of more than 2^31 elements: 64-bit offsets in the gather and cuBLAS strides."""
    import cupy
    import torch

    c, hw, k = 64, 4096, 4
    rng = cupy.random.default_rng(10)
    x = rng.standard_normal((1, c, hw, hw), dtype=numpy.float32).astype(numpy.float16)
    w = (rng.standard_normal((k, c, 3, 3), dtype=numpy.float32) / 24).astype(numpy.float16)
    limit = 10 << 30
    spec = cuconv.ConvSpec.from_args(x.shape, w.shape, padding=1)
    plan = plan_chunks(spec, 2, limit)
    assert chunk_bytes(spec, plan.samples, plan.rows, 2) // 2 > 2**31
    with cuconv.config(workspace_limit=limit):
        y = cuconv.conv2d(x, w, padding=1)
    # Oracle on the first and last 8 output rows (the last ones sit past 2^31 in the column chunk).
    xt, wt = torch.from_dlpack(x), torch.from_dlpack(w)
    for rows_out, rows_in in ((slice(0, 8), slice(0, 9)), (slice(hw - 8, hw), slice(hw - 9, hw))):
        ref = torch.nn.functional.conv2d(xt[:, :, rows_in].double(), wt.double(), padding=1)
        ref = ref[:, :, :8] if rows_out.start == 0 else ref[:, :, -8:]
        err = rel_err(cupy.asnumpy(y[:, :, rows_out]), ref.cpu().numpy())
        assert err <= tolerance(numpy.float16)


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

    from cuconv import registry

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
    served = [name for name in registry.algorithms(pass_)
              if registry.reason_unsupported(name, spec, dtype, pass_, precision) is None]
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
