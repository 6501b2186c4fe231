"""GPU path of cuconv.conv2d beyond values: call plans that refuse misuse, streams and devices, launch
failures, CuPy's own state, and memory bounds."""

from __future__ import annotations

import types

import numpy
import pytest

import cuconv
from cuconv.algos.im2col_gemm import chunk_bytes, plan_chunks
from test_errors import MISUSES, _arrays, _conv
from cases import CASES, PROBLEM_CASES, make_inputs, noncontiguous, reference, rel_err, to_gpu, tolerance

pytestmark = pytest.mark.gpu


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
    pytest.param(_conv(groups=numpy.float64(1.0)), TypeError, r"argument 'groups' must be int",
                 id="groups_numpy_float"),
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
    from cuconv import conv, select
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
        expected = select.select_algorithm(spec, numpy.float32, precision)
        assert ran[-2:] == [expected, expected], (precision, ran)
    assert select.select_algorithm(spec, numpy.float32, "ieee") != select.select_algorithm(spec, numpy.float32,
                                                                                               "tf32")
    assert len([k for k in conv._plans if k[1] == x.shape and k[4] == w.shape]) == 2


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
    from cuconv.blocks import bias

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

