"""The plan/run interface of every algorithm family.

A family's ``prepare(pass_, spec, dtype, precision, env)`` returns a :class:`Plan`, made once per signature:
the workspace one call needs and its steps, kernel launches and cuBLAS GEMMs with every argument but the
pointers built. ``Plan.run(ptrs, stream, workspace)`` only launches, on ``stream`` (a raw ``cudaStream_t``),
so the CuPy entry points and the torch bridge share the same plans and spend no host time deciding again.

The operands of a pass are raw device pointers to C-contiguous arrays, in this order (``OPERANDS``)::

    fprop  (x, w, bias or 0, out)       NCHW, KCRS, (K,), NKPQ
    dgrad  (dy, w, dx)
    wgrad  (x, dy, dw)

and the workspace (``Plan.workspace`` bytes, 256-byte aligned, uninitialised) follows them, then a forward's
residual (its epilogue's, of the output's shape and layout; 0: none): a step refers to an operand as ``(index,
byte offset)``, the workspace's index being ``len(OPERANDS[pass_])``, the residual's the next; ``NULL`` is a null
pointer.

``Env`` is the environment a plan depends on besides the problem: the device and its limits, the workspace
limit, and whether every operand starts on a 256-byte boundary (plans for aligned operands use 16-byte
vectors and cuBLASLt's kernels for aligned matrices; the others assume element alignment only).
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy

from . import _backend, _cublas

__all__ = ["OPERANDS", "NULL", "Env", "Limits", "env", "current_env", "current_limits", "device_limits", "is_aligned",
           "Plan", "Launch", "Gemm", "Nested", "Layout", "Builder", "run_arrays", "run_on_arrays", "ALIGNMENT"]

OPERANDS = {"fprop": ("x", "w", "bias", "out"), "dgrad": ("dy", "w", "dx"), "wgrad": ("x", "dy", "dw")}
NULL = (-1, 0)  # a reference to the null pointer that ends every run's operands
ALIGNMENT = 256  # bytes: what CuPy's and torch's allocators give, and cuBLASLt's largest alignment class


class Env(NamedTuple):
    """What a plan depends on besides the problem (see the module's docstring)."""

    device: int
    workspace_limit: int
    smem_limit: int       # dynamic shared memory a block may opt into
    wgmma: bool           # compute capability 9.0: the sm_90a kernels run
    sm_count: int
    smem_per_sm: int
    aligned: bool = True  # every operand pointer is a multiple of ALIGNMENT


class Limits(NamedTuple):
    """What whether a family can serve a problem depends on besides the problem (its ``reason_unsupported``):
    the shared memory a block may opt into, whether the sm_90a (wgmma) kernels run, the workspace limit. An
    ``Env`` has the same three fields and serves as one."""

    smem_limit: int
    wgmma: bool
    workspace_limit: int


_traits = {}  # device -> (smem_limit, wgmma, sm_count, smem_per_sm): the one cache of what devices can do
SMEM_OPTIN_WITHOUT_DEVICE = 227 << 10  # H100/H200: what planning assumes where no device can be asked
_envs = {}    # (device, workspace_limit, aligned) -> Env
_lock = threading.Lock()


def _device_traits(device: int) -> tuple:
    traits = _traits.get(device)
    if traits is None:
        cuda = _backend.cupy_or_none().cuda
        props = cuda.runtime.getDeviceProperties(device)
        traits = (cuda.runtime.deviceGetAttribute(cuda.runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                  cuda.Device(device).compute_capability == "90", props["multiProcessorCount"],
                  props["sharedMemPerMultiprocessor"])
        with _lock:
            _traits[device] = traits
    return traits


def env(device: int, workspace_limit: int, aligned: bool = True) -> Env:
    """The environment of a call on ``device`` (memoized: a call costs one lookup)."""
    key = (device, workspace_limit, aligned)
    e = _envs.get(key)
    if e is None:
        e = Env(device, workspace_limit, *_device_traits(device), aligned)
        with _lock:
            if len(_envs) > 1024:
                _envs.clear()
            _envs[key] = e
    return e


def device_limits() -> tuple:
    """(the shared memory a block may opt into, whether the sm_90a wgmma kernels run) on the current device;
    without a GPU, (``SMEM_OPTIN_WITHOUT_DEVICE``, False)."""
    if not _backend.gpu_available():
        return SMEM_OPTIN_WITHOUT_DEVICE, False
    smem, wgmma, _, _ = _device_traits(_backend.cupy_or_none().cuda.runtime.getDevice())
    return smem, wgmma


def current_limits(workspace_limit: int = None) -> Limits:
    """The ``Limits`` of the current device (``device_limits``) and ``workspace_limit`` (default
    ``cuconv.config.workspace_limit``)."""
    from ._config import config

    return Limits(*device_limits(), config.workspace_limit if workspace_limit is None else workspace_limit)


def is_aligned(*ptrs: int) -> bool:
    """Whether every pointer is a multiple of ``ALIGNMENT`` (0, an absent operand, is)."""
    bits = 0
    for p in ptrs:
        bits |= p
    return not bits & (ALIGNMENT - 1)


class Layout:
    """Hands out byte offsets of a workspace, each aligned to ``ALIGNMENT``; ``size`` is the total."""

    __slots__ = ("size",)

    def __init__(self):
        self.size = 0

    def take(self, nbytes: int) -> int:
        offset = -(-self.size // ALIGNMENT) * ALIGNMENT
        self.size = offset + nbytes
        return offset


class Launch:
    """A step: a prepared kernel launch (``_loader.PreparedLaunch``, or any callable ``kernel(stream, *pointers)``)
    whose pointer arguments are operands plus byte offsets, ``(index, offset)`` each."""

    __slots__ = ("kernel", "refs", "_launch")

    def __init__(self, kernel, *refs):
        self.kernel, self.refs = kernel, tuple(refs)
        # (a PreparedLaunch takes its pointers as one list: no argument packing per call)
        self._launch = getattr(kernel, "launch", None) or (lambda stream, pointers: kernel(stream, *pointers))

    def __call__(self, bases, stream: int) -> None:
        self._launch(stream, [bases[i] + offset for i, offset in self.refs])


class Gemm:
    """A step: a prepared cuBLAS GEMM (``_cublas.PreparedGemm``) on operands ``a``, ``b``, ``c`` and its
    own part of the workspace ``ws``, each ``(index, offset)``, and the ``bias`` its epilogue adds (None:
    none)."""

    __slots__ = ("gemm", "a", "b", "c", "ws", "bias")

    def __init__(self, gemm, a, b, c, ws, bias=None):
        self.gemm, self.a, self.b, self.c, self.ws, self.bias = gemm, a, b, c, ws, bias

    def __call__(self, bases, stream: int) -> None:
        (ai, ao), (bi, bo), (ci, co), (wi, wo) = self.a, self.b, self.c, self.ws
        if self.bias is None:
            self.gemm(bases[ai] + ao, bases[bi] + bo, bases[ci] + co, stream, bases[wi] + wo)
        else:
            self.gemm(bases[ai] + ao, bases[bi] + bo, bases[ci] + co, stream, bases[wi] + wo,
                      bases[self.bias[0]] + self.bias[1])


class Nested:
    """A step: another plan of the same pass run on the same operands, its workspace a region of this one's."""

    __slots__ = ("plan", "offset", "count")

    def __init__(self, plan: "Plan", offset: int):
        self.plan, self.offset, self.count = plan, offset, len(OPERANDS[plan.pass_])

    def __call__(self, bases, stream: int) -> None:
        n = self.count
        self.plan.run(bases[:n], stream, bases[n] + self.offset if self.plan.workspace else 0, bases[n + 1])


class Plan:
    """One pass of one convolution, prepared: ``run`` enqueues ``steps`` in order on a stream."""

    __slots__ = ("algo", "pass_", "workspace", "steps")

    def __init__(self, algo: str, pass_: str, workspace: int, steps):
        self.algo, self.pass_, self.workspace, self.steps = algo, pass_, workspace, tuple(steps)

    def run(self, ptrs: tuple, stream: int, workspace: int = 0, residual: int = 0) -> None:
        """Launch the steps on ``stream``: ``ptrs`` are the pass's operands (``OPERANDS``), ``workspace`` a
        device buffer of at least ``self.workspace`` bytes (0 where none is needed), ``residual`` a forward's
        residual tensor where its epilogue adds one."""
        bases = (*ptrs, workspace, residual, 0)
        for step in self.steps:
            step(bases, stream)

    def __repr__(self) -> str:
        return f"Plan({self.algo!r}, {self.pass_!r}, workspace={self.workspace}, steps={len(self.steps)})"


class Builder:
    """Builds a family's plan: operand references by name, workspace regions, steps in order. Every GEMM
    step shares one region of the workspace, as large as the largest GEMM needs (they run one after another
    on one stream), assigned when ``plan`` is called."""

    def __init__(self, pass_: str, env: Env):
        self.pass_, self.env = pass_, env
        self.index = {name: i for i, name in enumerate(OPERANDS[pass_])}
        self.workspace_index = len(OPERANDS[pass_])
        self.index["residual"] = self.workspace_index + 1  # (after the workspace: see the module's docstring)
        self.layout = Layout()
        self.steps = []
        self._gemms = []

    def ref(self, name: str, offset: int = 0) -> tuple:
        """An operand of the pass (``OPERANDS``) plus a byte offset."""
        return (self.index[name], offset)

    def take(self, nbytes: int) -> tuple:
        """A new region of ``nbytes`` of the workspace."""
        return (self.workspace_index, self.layout.take(nbytes))

    def base_aligned(self, ref: tuple) -> bool:
        """Whether ``ref``'s base pointer is 256-byte aligned: the workspace always is, operands where the
        environment says so."""
        return ref[0] == self.workspace_index or self.env.aligned

    def launch(self, kernel, *refs, append: bool = True):
        """A launch step (None, and nothing appended, where ``kernel`` is None: nothing to do)."""
        if kernel is None:
            return None
        expected = getattr(kernel, "n_pointers", None)
        if expected is not None and len(refs) != expected:  # (a pointer not passed keeps the last call's)
            raise ValueError(f"cuconv: {getattr(kernel, 'name', kernel)} takes {expected} pointers, the plan gives "
                             f"{len(refs)}")
        step = Launch(kernel, *refs)
        if append:
            self.steps.append(step)
        return step

    def gemm(self, dtype, precision: str, m: int, n: int, k: int, a: tuple, lda: int, stride_a: int, b: tuple,
             ldb: int, stride_b: int, c: tuple, ldc: int, stride_c: int, batch: int, beta: float = 0.0, *,
             trans_a: str = "N", trans_b: str = "N", c_dtype=None, append: bool = True, bias: tuple = None):
        """A GEMM step (``_cublas.gemm``'s arguments, strides in elements) on operand references ``a``, ``b``,
        ``c``: prepared for the alignments the references and the environment give. With a ``bias`` reference
        (m elements of C's type, added to every column in cuBLASLt's epilogue): None, and nothing added to the
        plan, where that cannot be done (no algorithm for it, or a bias pointer not known to be 256-byte
        aligned: the heuristic assumes the pointer's alignment)."""
        if bias is not None and not self.base_aligned(bias):
            return None
        item = numpy.dtype(dtype).itemsize
        c_item = item if c_dtype is None else numpy.dtype(c_dtype).itemsize
        align = tuple(_cublas.alignment(ref[1], stride * size, self.base_aligned(ref), size)
                      for ref, stride, size in ((a, stride_a, item), (b, stride_b, item), (c, stride_c, c_item)))
        prepared = _cublas.PreparedGemm(dtype, precision, m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c, batch,
                                        beta, trans_a=trans_a, trans_b=trans_b, c_dtype=c_dtype, align=align,
                                        device=self.env.device, bias=bias is not None)
        if bias is not None and not prepared.fuses_bias:
            return None
        step = Gemm(prepared, a, b, c, None, bias)
        self._gemms.append(step)
        if append:
            self.steps.append(step)
        return step

    def plan(self, algo: str) -> "Plan":
        need = max((g.gemm.workspace for g in self._gemms), default=0)
        ws = self.take(need) if need else (self.workspace_index, 0)
        for g in self._gemms:
            g.ws = ws
        return Plan(algo, self.pass_, self.layout.size, self.steps)


def run_arrays(plan: Plan, *arrays, residual=None) -> None:
    """Run ``plan`` on C-contiguous CuPy arrays (None for an absent bias) on CuPy's current stream and
    device, with a workspace from CuPy's memory pool; ``residual``: a forward's epilogue's residual array."""
    cupy = _backend.cupy_or_none()
    ws = cupy.empty(plan.workspace, dtype=numpy.uint8) if plan.workspace else None
    plan.run(tuple(0 if a is None else a.data.ptr for a in arrays), cupy.cuda.get_current_stream().ptr,
             0 if ws is None else ws.data.ptr, 0 if residual is None else residual.data.ptr)


def run_on_arrays(prepare, pass_: str, spec, precision: str, *arrays, **options) -> None:
    """A family's pass on C-contiguous CuPy arrays (the pass's operands in order, None for an absent bias): its
    ``prepare`` for the current device and the arrays' alignment, then ``run_arrays``. Plans are made anew on
    every call: the entry points keep theirs (``dispatch.plan``)."""
    if pass_ == "fprop":
        options["bias"] = arrays[2] is not None
    plan = prepare(pass_, spec, arrays[0].dtype, precision, current_env(*arrays), **options)
    run_arrays(plan, *arrays)


def current_env(*arrays, workspace_limit: int = None) -> Env:
    """The environment of a call on CuPy ``arrays`` (None entries ignored) on the current device."""
    from ._config import config

    device = _backend.cupy_or_none().cuda.runtime.getDevice()
    aligned = is_aligned(*(a.data.ptr for a in arrays if a is not None))
    return env(device, config.workspace_limit if workspace_limit is None else workspace_limit, aligned)
