"""Shared fixtures: the GPU marker turns into a skip *with a reason* where no GPU is usable."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/cases.py

from cuconv import _backend  # noqa: E402

try:  # the oracle runs on CI's 2 cores next to pytest: one torch thread keeps timings steady
    import torch

    torch.set_num_threads(1)
except ImportError:  # torch is a test dependency; test modules that need it say so when imported
    pass


def _gpu_skip_reason():
    if _backend.cupy_or_none() is None:
        return "GPU test: CuPy is not importable here (install cuconv[cuda13] on a machine with a GPU)"
    if not _backend.gpu_available():
        return "GPU test: CuPy is installed but no CUDA device is visible"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_skip_reason()
    if reason is None:
        return
    if os.environ.get("CUCONV_REQUIRE_GPU"):
        # .ci/gpu sets this: on the GPU machine a skipped GPU test is a failure, not a pass.
        raise pytest.UsageError(f"CUCONV_REQUIRE_GPU is set but {reason}")
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
