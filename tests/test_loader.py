"""The kernel loader on the GPU: what happens when CuPy's kernel cache cannot be written."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_unwritable_kernel_cache_falls_back_to_a_private_one():
    """A CUPY_CACHE_DIR that cannot be written (here /proc/self: a directory no one, root included, can create
    files in) costs a warning, not the first call: kernels compile into a private cache and the result is right."""
    import os
    import pathlib
    import subprocess
    import sys

    script = (
        "import warnings, numpy, cupy, cuconv\n"
        "x = numpy.random.default_rng(0).standard_normal((2, 3, 9, 9))\n"
        "w = numpy.random.default_rng(1).standard_normal((4, 3, 3, 3))\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    y = cupy.asnumpy(cuconv.conv2d(cupy.asarray(x), cupy.asarray(w), padding=1, algo='direct'))\n"
        "assert any('cannot be written' in str(m.message) for m in seen), [str(m.message) for m in seen]\n"
        "ref = cuconv.conv2d(x, w, padding=1)\n"
        "assert numpy.abs(y - ref).max() <= 1e-12 * numpy.abs(ref).max(), 'wrong result'\n"
        "print('ok')\n")
    env = dict(os.environ, CUPY_CACHE_DIR="/proc/self")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          cwd=pathlib.Path(__file__).resolve().parents[1])
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]



def test_a_launch_from_a_thread_without_a_current_context():
    """A fresh thread has no current CUDA context until some runtime call makes one current (torch's device guard
    skips cudaSetDevice for the device number that is already current): a prepared launch that is the thread's
    first CUDA call binds the device's primary context and runs, instead of failing with
    CUDA_ERROR_INVALID_CONTEXT."""
    import threading

    import cupy
    import numpy

    from cuconv.blocks import elementwise

    a = cupy.full(1000, 7.0, dtype=cupy.float32)
    launch = elementwise.fill(numpy.float32, 1000, 2.5)
    errors = []

    def work():
        try:
            launch(0, a.data.ptr)  # (the legacy default stream: the thread has no other)
        except Exception as exc:  # (reported below, on the test's thread)
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not errors, errors
    cupy.cuda.runtime.deviceSynchronize()
    assert bool((a == 2.5).all())


def test_converted_layers_in_fresh_threads_and_on_a_fresh_autograd_thread():
    """In a new process: a depthwise layer (its passes are launches alone, no cuBLAS) runs its forward in a fresh
    Python thread, and its backward on autograd's device thread where the layer's dgrad is that thread's first
    CUDA call (the caching allocator serves dx from a block freed before, so no cudaMalloc binds a context)."""
    import pathlib
    import subprocess
    import sys

    script = (
        "import threading, torch, cuconv.nn.functional as F\n"
        "x = torch.randn(2, 8, 9, 9, device='cuda', dtype=torch.float64)\n"
        "w = torch.randn(8, 1, 3, 3, device='cuda', dtype=torch.float64)\n"
        "ref = torch.nn.functional.conv2d(x, w, padding=1, groups=8)\n"
        "out = []\n"
        "t = threading.Thread(target=lambda: out.append(F.conv2d(x, w, padding=1, groups=8)))\n"
        "t.start(); t.join()\n"
        "assert out and torch.allclose(out[0], ref, rtol=1e-12, atol=1e-12), 'forward in a fresh thread'\n"
        "xg = x.clone().requires_grad_()\n"
        "y = F.conv2d(xg, w, padding=1, groups=8)\n"
        "dy = torch.randn_like(y)\n"
        "del out; spare = torch.empty_like(x); del spare\n"
        "torch.cuda.synchronize()\n"
        "(dx,) = torch.autograd.grad(y, xg, dy)\n"
        "xr = x.clone().requires_grad_()\n"
        "(dx_ref,) = torch.autograd.grad(torch.nn.functional.conv2d(xr, w, padding=1, groups=8), xr, dy)\n"
        "assert torch.allclose(dx, dx_ref, rtol=1e-12, atol=1e-12), 'backward on a fresh autograd thread'\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=pathlib.Path(__file__).resolve().parents[1])
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
