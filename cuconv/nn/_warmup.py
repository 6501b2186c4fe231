"""``cuconv.nn.warmup``: a model's kernels compiled and its layers planned before the first real call.

A converted model's first call on an empty kernel cache compiles every kernel it needs, one after another, as
each layer is first met (NVRTC: seconds per kernel). ``warmup`` finds the model's convolutions by running it on
meta tensors (shapes only: no memory, no kernels), then makes the layer of each call signature
(``_bridge.Layer``, with the plans of its backward passes) in a pool of threads: NVRTC releases the GIL, so the
compiles run side by side. The layers are kept as a real call would keep them, so that call finds its layer
made and its kernels loaded.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import os
from typing import Any, Optional

import torch

from .. import _layout
from .._config import config
from . import _bridge, functional

__all__ = ["warmup"]


def _to_meta(value):
    if isinstance(value, torch.Tensor):
        return torch.empty_like(value, device="meta").requires_grad_(value.requires_grad)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_to_meta(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_meta(v) for k, v in value.items()}
    return value


def _record_calls(model: torch.nn.Module, inputs: tuple, kwargs: dict) -> list:
    """Every ``cuconv.nn.functional.conv2d`` call ``model(*inputs, **kwargs)`` makes, run on meta copies of
    its parameters, buffers and inputs: ``(input, weight, bias, spec, stride, padding, dilation, groups, algo,
    precision, needs_no_dgrad)`` with meta tensors (the last: the input is one of ``inputs`` and needs no
    gradient)."""
    calls = []
    meta_inputs = _to_meta(inputs)
    top = {id(t) for t in meta_inputs if isinstance(t, torch.Tensor)}

    def record(x, w, b, spec, stride, padding, dilation, groups, algo, precision):
        calls.append((x, w, b, spec, stride, padding, dilation, groups, algo, precision,
                      id(x) in top and not x.requires_grad))

    state = {name: _to_meta(t) for name, t in (*model.named_parameters(), *model.named_buffers())}
    if functional._recorder is not None:
        raise RuntimeError("cuconv.nn.warmup: another warmup is running in this process")
    functional._recorder = record
    try:
        with torch.no_grad():
            torch.func.functional_call(model, state, tuple(meta_inputs), _to_meta(kwargs))
    except Exception as exc:
        raise RuntimeError(f"cuconv.nn.warmup: the model could not run on meta tensors, which warmup needs to find "
                           f"its convolutions' shapes: {type(exc).__name__}: {exc}") from exc
    finally:
        functional._recorder = None
    return calls


def warmup(model: torch.nn.Module, *inputs: Any, backward: Optional[bool] = None, threads: Optional[int] = None,
           **kwargs: Any) -> int:
    """Compile the kernels of ``model``'s cuconv convolutions and plan its layers, side by side in threads, for
    the call ``model(*inputs, **kwargs)``; returns how many layers were made.

    Call it where the model will run: on its device, under the same ``torch.autocast`` (its dtype is the
    layers' dtype), TF32 setting and ``cuconv.config`` as the real calls, since all of them are part of a
    layer's signature. ``inputs`` may be tensors of the real shapes (only their shapes, dtypes and devices are
    read) or meta tensors. Nothing runs on the GPU and the model's state is not touched; a layer already made
    costs a lookup. CPU models have nothing to compile: 0.

    Parameters
    ----------
    backward : bool, optional
        Also plan dgrad and wgrad (a layer's input gradient unless that input is one of ``inputs`` needing none).
        Default: whether any parameter of ``model`` requires a gradient.
    threads : int, optional
        Threads that compile at once (default: the CPUs this process may use, at most 16).

    Examples
    --------
    >>> import torch, cuconv.nn
    >>> model = cuconv.nn.convert(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 8, 1)))
    >>> cuconv.nn.warmup(model, torch.empty(4, 3, 32, 32))  # on the CPU: nothing to compile
    0

    On a GPU, under the autocast the model will train with (``torchvision`` models have 23 to 46 distinct
    convolutions; each layer's kernels compile once)::

        model = cuconv.nn.convert(torchvision.models.resnet50()).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            cuconv.nn.warmup(model, torch.empty(32, 3, 224, 224, device="cuda"))  # 23 layers
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"warmup(): argument 'model' must be a torch.nn.Module, not {type(model).__name__}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"warmup(): threads must be a positive int, got {threads!r}")
    device = next((t.device for t in (*model.parameters(), *model.buffers()) if t.device.type != "meta"), None)
    if device is None:
        device = next((t.device for t in inputs if isinstance(t, torch.Tensor) and t.device.type != "meta"), None)
    if device is None or device.type != "cuda":
        return 0
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if backward is None:
        backward = any(p.requires_grad for p in model.parameters())
    autocast = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
    workspace_limit, benchmark, benchmark_cache = config.workspace_limit, config.benchmark, config.benchmark_cache
    jobs = {}
    for x, w, b, spec, stride, padding, dilation, groups, algo, precision, no_dgrad in _record_calls(
            model, inputs, kwargs):
        dtype = x.dtype
        if autocast is not None and dtype in (torch.float16, torch.bfloat16, torch.float32):
            dtype = autocast
        if dtype not in functional._TORCH_DTYPES or (w.dtype != x.dtype and autocast is None):
            continue  # (the real call raises)
        key = functional._signature_of(x.shape, x.stride(), dtype, device.index, w.shape, w.stride(),
                                       b is not None and b.shape, stride, padding, dilation, groups, algo,
                                       workspace_limit, benchmark, benchmark_cache)
        if key is None or key in functional._layers:
            continue
        job = jobs.get(key)
        passes = (() if no_dgrad else ("dgrad",)) + ("wgrad",) if backward else ()
        jobs[key] = (spec, dtype, precision, algo, b is not None, tuple(x.shape),
                     _layout.result_channels_last(x, w, True), functional._only_channels_last(w),
                     tuple(sorted(set(passes) | set(job[-1] if job else ()))))
    if not jobs:
        return 0
    workers = threads or min(16, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                             else os.cpu_count() or 1)

    def make(key, job):
        spec, dtype, precision, algo, bias, x_shape, channels_last, w_channels_last, passes = job
        with torch.cuda.device(device.index):
            layer = _bridge.Layer(spec, dtype, device, precision, algo, bias, x_shape, benchmark, workspace_limit,
                                  channels_last, w_channels_last, benchmark_cache)
            if not benchmark:  # (config.benchmark: the backward passes are tuned at their first real call)
                layer.prepare(passes)
        return key, layer

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        # each job in a copy of this context: a ``with cuconv.config(...)`` block around the call holds there too
        made = [f.result() for f in [pool.submit(contextvars.copy_context().run, make, key, job)
                                     for key, job in jobs.items()]]
    for key, layer in made:
        functional._remember(key, layer)
    return len(made)
