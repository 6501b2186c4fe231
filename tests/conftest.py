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


# Tests that each cost many times an average one, as multiples of it, by (file, function): test_kernel_compiles
# waits on NVRTC compiling every kernel source for two architectures on the CPU. Dealt by count alone, its part of
# seven on a fresh H200 took 462 s, the other six 96-206 s (~0.1 s a test): ~300 s of compiles.
_COST = {("test_kernels_compile.py", "test_kernel_compiles"): 40}


def _cost(item) -> int:
    return _COST.get((os.path.basename(str(item.path)), getattr(item, "originalname", None) or item.name), 1)


def _keep_shard(config, items):
    """CUCONV_SHARD=i/n keeps the i-th of n parts of the suite, dealt in units largest first to the lightest part:
    whole test files (a file's tests share kernels, so splitting one would compile them in several processes),
    but a file of more than its fair share (the suite over n) by its test functions, whose kernels differ (a
    forward's, a dgrad's, a wgrad's: test_implicit_gemm.py's 4,605 tests in one process outlasted the others by
    minutes). A test counts once, or ``_COST`` times where listed there. .ci/gpu runs the parts as
    processes side by side: on a GPU machine with an empty kernel cache the suite is bound by NVRTC's compiles, one
    core per process."""
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
    cost = {path: sum(map(_cost, file_items)) for path, file_items in by_file.items()}
    fair = -(-sum(cost.values()) // count)
    units = {}
    for path, file_items in by_file.items():
        for item in file_items:
            function = getattr(item, "originalname", None) or item.name if cost[path] > fair else ""
            units.setdefault((path, function), []).append(item)
    loads = [0] * count
    keep = set()
    for unit, unit_items in sorted(units.items(), key=lambda kv: (-sum(map(_cost, kv[1])), kv[0])):
        part = loads.index(min(loads))
        loads[part] += sum(map(_cost, unit_items))
        if part == index:
            keep.update(id(item) for item in unit_items)
    deselected = [item for item in items if id(item) not in keep]
    items[:] = [item for item in items if id(item) in keep]
    config.hook.pytest_deselected(items=deselected)


@pytest.hookimpl(trylast=True)  # (after pytest's own --deselect and -k: the parts are dealt from what is left)
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
