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


def _keep_shard(config, items):
    """CUCONV_SHARD=i/n keeps the i-th of n parts of the suite, whole test files each (a file's tests share
    kernels, so splitting one would compile them in several processes); files are dealt largest first to
    the lightest part. .ci/gpu runs the parts as processes side by side: on a GPU machine with an empty
    kernel cache the suite is bound by NVRTC's compiles, one core per process."""
    shard = os.environ.get("CUCONV_SHARD")
    if not shard:
        return
    try:
        index, count = (int(x) for x in shard.split("/"))
        if not 0 <= index < count:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(f"CUCONV_SHARD must read i/n with 0 <= i < n, not {shard!r}") from None
    by_file = {}
    for item in items:
        by_file.setdefault(str(item.path), []).append(item)
    loads = [0] * count
    keep = set()
    for path, file_items in sorted(by_file.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        part = loads.index(min(loads))
        loads[part] += len(file_items)
        if part == index:
            keep.add(path)
    deselected = [item for item in items if str(item.path) not in keep]
    items[:] = [item for item in items if str(item.path) in keep]
    config.hook.pytest_deselected(items=deselected)


def pytest_collection_modifyitems(config, items):
    _keep_shard(config, items)
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
