"""A recording stand-in for the device, so that plans can be built and checked on a machine without a GPU.

``fake_device(monkeypatch)`` replaces what planning asks of CUDA: CuPy (the current device, the driver a
``PreparedLaunch`` holds), the loader's kernel lookup (each name checked against its source's instances and the
``.cu`` file's presence), cuBLASLt's prepared GEMMs and the TMA map encoders. Nothing is compiled or launched; every
launch and GEMM a plan prepares is recorded in the returned ``Recorder``. ``ENVS`` are environments of an H200
(wgmma, 132 SMs) and of an A100-like device.
"""

from __future__ import annotations

import functools
import sys
import types

from cuconv import _backend, _cublas, _loader, _plan, _tma

__all__ = ["Recorder", "fake_device", "ENVS"]

ENVS = {
    "sm90": _plan.Env(device=0, workspace_limit=1 << 30, smem_limit=227 << 10, wgmma=True, sm_count=132,
                      smem_per_sm=228 << 10),
    "sm80": _plan.Env(device=0, workspace_limit=1 << 30, smem_limit=163 << 10, wgmma=False, sm_count=108,
                      smem_per_sm=164 << 10),
}


class Recorder:
    """What a fake device was asked for: ``launches`` (stem, kernel, grid, block, shared memory) and ``gemms``
    (the prepared GEMMs' arguments)."""

    def __init__(self):
        self.launches, self.gemms = [], []


class _Function:
    def __init__(self, stem, name):
        self.stem, self.name = stem, name
        self.kernel = types.SimpleNamespace(ptr=0)
        self.max_dynamic_shared_size_bytes = _loader.SMEM_DEFAULT
        self.num_regs = 64


def _isolate_memos(monkeypatch) -> None:
    """Every memoized function of cuconv's modules gets a fresh cache until the test ends: nothing planned or asked
    of the fake device (plans, device properties, choices) outlives it, and nothing memoized before is reused."""
    for name, module in list(sys.modules.items()):
        if name == "cuconv" or name.startswith("cuconv."):
            for attr, value in list(vars(module).items()):
                if hasattr(value, "cache_clear") and hasattr(value, "__wrapped__"):
                    monkeypatch.setattr(module, attr, functools.lru_cache(maxsize=None)(value.__wrapped__))


def fake_device(monkeypatch) -> Recorder:
    _isolate_memos(monkeypatch)
    recorder = Recorder()
    env = ENVS["sm90"]
    runtime = types.SimpleNamespace(
        getDevice=lambda: 0, setDevice=lambda device: None, cudaDevAttrMaxSharedMemoryPerBlockOptin=97,
        deviceGetAttribute=lambda attribute, device: env.smem_limit,
        getDeviceProperties=lambda device: {"multiProcessorCount": env.sm_count,
                                            "sharedMemPerMultiprocessor": env.smem_per_sm})
    driver = types.SimpleNamespace(launchKernel=lambda *args: None)
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime, driver=driver),
                                 ndarray=type("ndarray", (), {}))
    monkeypatch.setattr(_backend, "cupy_or_none", lambda: cupy)
    monkeypatch.setitem(sys.modules, "cupy", cupy)  # (modules that ask the device with ``import cupy``)

    def get_function(stem, name_expressions, name):
        assert name in name_expressions, f"{name} is not an instance of kernels_cu/{stem}.cu"
        assert (_loader.KERNEL_DIR / f"{stem}.cu").is_file(), f"kernels_cu/{stem}.cu does not exist"
        return _Function(stem, name)

    monkeypatch.setattr(_loader, "get_function", get_function)
    real_init = _loader.PreparedLaunch.__init__

    def init(self, fn, name, grid, block, n_pointers, scalars=(), smem=0):
        real_init(self, fn, name, grid, block, n_pointers, scalars, smem)
        assert smem <= ENVS["sm90"].smem_limit, f"{name} asks for {smem} bytes of shared memory"
        recorder.launches.append((fn.stem, name, tuple(grid), tuple(block), smem))

    monkeypatch.setattr(_loader.PreparedLaunch, "__init__", init)
    monkeypatch.setattr(_tma, "_driver", lambda: (lambda *args: 0, lambda *args: 0))

    class PreparedGemm:
        def __init__(self, *args, bias=False, **kwargs):
            recorder.gemms.append((args, tuple(sorted(kwargs.items())), bias))
            self.workspace, self.fuses_bias = 0, bias

        def __call__(self, *pointers):
            pass

    monkeypatch.setattr(_cublas, "PreparedGemm", PreparedGemm)
    return recorder
