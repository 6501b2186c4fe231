"""``python -m cuconv info``: what cuconv runs on here."""

from __future__ import annotations

import os
import platform
import sys

import numpy


def lines():
    import cuconv

    from .. import _backend, _loader

    yield f"cuconv        {cuconv.__version__} ({os.path.dirname(cuconv.__file__)})"
    yield f"python        {platform.python_version()} ({sys.executable})"
    yield f"numpy         {numpy.__version__}"
    yield f"kernels       {_loader.KERNEL_DIR}"
    cupy = _backend.cupy_or_none()
    if cupy is None:
        yield "cupy          not available: CuPy arrays cannot be used; NumPy arrays run on the CPU path"
    else:
        yield f"cupy          {cupy.__version__}"
        from cupy.cuda import compiler

        cache = os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache")
        yield f"kernel cache  {cache} (CuPy's on-disk cache, CUPY_CACHE_DIR)"
        del compiler
        if _backend.gpu_available():
            rt = cupy.cuda.runtime
            yield f"CUDA runtime  {rt.runtimeGetVersion()}, driver {rt.driverGetVersion()}"
            for dev in range(rt.getDeviceCount()):
                p = rt.getDeviceProperties(dev)
                name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
                yield (f"device {dev}      {name}, compute capability {p['major']}.{p['minor']}, "
                       f"{p['multiProcessorCount']} SMs, {p['totalGlobalMem'] / 2**30:.0f} GiB")
        else:
            yield "device        none visible"
    try:
        import torch

        yield f"torch         {torch.__version__}"
    except ImportError:
        yield "torch         not installed (only needed for cuconv.nn, tests and the benchmark)"
    from .._config import config

    yield f"config        precision={config.precision}, workspace_limit={config.workspace_limit}"


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m cuconv info",
                                     description="Print cuconv's version, Python, NumPy, CuPy, the kernel cache, "
                                                 "the CUDA runtime and devices, torch and the configuration.")
    parser.parse_args(argv)  # (no options: an unknown one is an error, not ignored)
    for line in lines():
        print(line)
    return 0
