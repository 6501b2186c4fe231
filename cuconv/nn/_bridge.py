"""The torch ↔ array crossing: the only place tensors become CuPy/NumPy arrays and back.

- ``as_array(t)``: a zero-copy CuPy (CUDA tensor) or NumPy (CPU tensor) view of a detached tensor; a
  non-contiguous tensor is made contiguous once, here. bfloat16 crosses as int16 storage reinterpreted as
  ``ml_dtypes.bfloat16``, which needs no DLPack bf16 support on either side.
- ``on_torch_stream(device)``: a context in which CuPy works on torch's current stream of ``device`` and
  allocates from torch's caching allocator, so there is one memory pool and no cross-stream hazard.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from .. import _dtypes

__all__ = ["as_array", "on_torch_stream"]


def _bf16():
    if _dtypes.bfloat16 is None:
        raise TypeError("cuconv: bfloat16 tensors need the ml_dtypes package (pip install ml_dtypes)")
    return _dtypes.bfloat16


def as_array(t: torch.Tensor):
    """Zero-copy CuPy/NumPy view of ``t`` (detached; made contiguous first if it is not)."""
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    bf16 = t.dtype == torch.bfloat16
    if bf16:
        t = t.view(torch.int16)
    if t.is_cuda:
        import cupy

        a = cupy.from_dlpack(t)
    else:
        a = t.numpy()
    return a.view(_bf16()) if bf16 else a


def _torch_malloc(size: int, device_id: int) -> int:
    return torch.cuda.caching_allocator_alloc(size, device_id, torch.cuda.current_stream(device_id))


def _torch_free(ptr: int, device_id: int) -> None:
    torch.cuda.caching_allocator_delete(ptr)


@functools.lru_cache(maxsize=None)
def _allocator():
    import cupy

    return cupy.cuda.memory.PythonFunctionAllocator(_torch_malloc, _torch_free)


_streams = {}


def _cupy_stream(stream: torch.cuda.Stream, device_id: int):
    """CuPy's view of a torch stream, cached by handle (creating one per call costs host time)."""
    import cupy

    key = (stream.cuda_stream, device_id)
    wrapped = _streams.get(key)
    if wrapped is None:
        wrapped = _streams[key] = cupy.cuda.ExternalStream(stream.cuda_stream, device_id)
    return wrapped


@contextlib.contextmanager
def on_torch_stream(device: torch.device):
    """CuPy on torch's current stream and allocator for ``device`` (no-op for CPU tensors)."""
    if device.type != "cuda":
        yield
        return
    import cupy

    index = device.index if device.index is not None else torch.cuda.current_device()
    with torch.cuda.device(index), cupy.cuda.Device(index):
        with _cupy_stream(torch.cuda.current_stream(index), index), \
                cupy.cuda.using_allocator(_allocator().malloc):
            yield
