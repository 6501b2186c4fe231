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

