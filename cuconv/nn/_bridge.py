"""The torch ↔ cuconv crossing: a ``Layer`` per call signature, holding the plans of its passes.

A CUDA call passes raw data pointers and torch's current stream to the layer's plans (``cuconv._plan``), with
its output and workspace from torch's caching allocator: no DLPack objects, no CuPy arrays or streams, no
context managers on the way. That keeps a layer called again within torch's own host time per call, and
makes every call capturable in a CUDA graph (outputs and workspaces come from the graph's pool).

CPU tensors cross as zero-copy NumPy views (bfloat16 as int16 storage reinterpreted as
``ml_dtypes.bfloat16``) and run cuconv's CPU path (``cuconv.cpu.reference``), its GEMMs through torch's
(``_torch_matmul``): on torch's threads, none of NumPy's BLAS threads spinning beside them.
"""

from __future__ import annotations

import threading

import numpy
import torch

from .. import _dtypes, _layout, _plan, algos as _algorithms, dispatch, select as _select
from .._config import Settings
from ..problem import BIAS, PASSES, PLAIN, Problem
from ..select import autotune
from ..blocks.bias import grad_launch, grad_launch_nhwc
from ..cpu import reference
from ..spec import ConvSpec

__all__ = ["Layer", "as_array", "raw_stream", "bias_grad", "backward_algo"]

try:
    _capturing = torch._C._cuda_isCurrentStreamCapturing
except AttributeError:  # pragma: no cover - a torch built without CUDA (no CUDA layers either)
    def _capturing() -> bool:
        return False

# Eager calls' workspaces kept per thread, device and stream (``Layer._workspace``): up to _KEPT_MAX bytes, each
# buffer at least _KEPT_MIN (so a model's small workspaces settle on one buffer after a few calls).
_kept = threading.local()
_KEPT_MIN, _KEPT_MAX = 1 << 20, 8 << 20
_MISALIGNED = _plan.ALIGNMENT - 1  # (pointer bits that put an operand off a 256-byte boundary)
_NUMPY_DTYPES = {torch.float16: numpy.dtype(numpy.float16), torch.float32: numpy.dtype(numpy.float32),
                 torch.float64: numpy.dtype(numpy.float64), torch.bfloat16: _dtypes.bfloat16}

try:  # an int, without a torch.cuda.Stream object per call (host time)
    _current_raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:  # pragma: no cover - older torch
    def _current_raw_stream(index: int) -> int:
        return torch.cuda.current_stream(index).cuda_stream


def raw_stream(index: int) -> int:
    """torch's current stream of CUDA device ``index``, as a raw ``cudaStream_t``."""
    return _current_raw_stream(index)


def _bf16():
    if _dtypes.bfloat16 is None:
        raise TypeError("cuconv: bfloat16 tensors on the CPU need the ml_dtypes package (pip install ml_dtypes)")
    return _dtypes.bfloat16


def as_array(t: torch.Tensor):
    """Zero-copy NumPy view of a CPU tensor (detached; made contiguous first if it is not)."""
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_bf16())
    return t.numpy()


def _torch_matmul(a: numpy.ndarray, b: numpy.ndarray) -> numpy.ndarray:
    """``numpy.matmul`` through torch's CPU GEMM, on torch's threads (the CPU path's GEMMs for torch tensors), in
    the arrays' own precision (a CPU autocast region around the call would otherwise lower it)."""
    with torch.autocast("cpu", enabled=False):
        return torch.matmul(_writable_tensor(a), _writable_tensor(b)).numpy()


def _writable_tensor(a: numpy.ndarray) -> torch.Tensor:
    # (torch.from_numpy shares memory and warns on read-only arrays, such as broadcast or strided views)
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def _as_tensor(a: numpy.ndarray, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.view(numpy.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def backward_algo(algo: str, pass_: str) -> str:
    """The algorithm a backward pass runs for a forward forced to ``algo``: the same, where it has that pass,
    else ``auto``."""
    return algo if algo == "auto" or algo in _algorithms.names(pass_) else "auto"


_bias_launches = {}  # (N, K, P·Q, dtype, device index) -> the prepared bias_grad launch


def _nhwc_operand(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a dense channels-last tensor on a ``_layout.VECTOR_ALIGNMENT`` boundary, as the in-place
    channels-last passes read it: itself where it lies so, else a copy."""
    if t.is_contiguous(memory_format=torch.channels_last) and not t.data_ptr() % _layout.VECTOR_ALIGNMENT:
        return t
    return t.clone(memory_format=torch.channels_last)


def _channels_last_result(t: torch.Tensor, strides: tuple) -> torch.Tensor:
    """``t`` (a result computed NCHW) with the dense channels-last ``strides`` the layer promises (its fake
    implementation under ``torch.compile`` too): a view where ``t`` already lies so (strides of extent-1
    dimensions aside), else a copy."""
    if t.stride() == strides:
        return t
    if t.is_contiguous(memory_format=torch.channels_last):
        return t.as_strided(t.shape, strides)
    out = t.new_empty_strided(t.shape, strides)
    out.copy_(t)
    return out


def _nhwc_bias_grad(launch, dy: torch.Tensor, k: int, stream: int, workspace) -> torch.Tensor:
    """db of a dense channels-last dy through ``launch`` (a ``bias.NhwcGrad``, or None where dy has no pixel: zeros),
    its partial sums in ``workspace(nbytes)``, on ``stream``."""
    if launch is None:
        return dy.new_zeros((k,))
    db = dy.new_empty((k,))
    launch(stream, dy.data_ptr(), db.data_ptr(), workspace(launch.partial_bytes).data_ptr())
    return db


def bias_grad(dy: torch.Tensor) -> torch.Tensor:
    """Σ of grad_output ``(N, K, P, Q)`` (or ``(K, P, Q)``) over all but K: ``bias.cu``'s ``bias_grad`` on CUDA
    tensors (fp32 sums for the half types, a fixed order), read in place where dy is contiguous or dense
    channels-last (``bias.NhwcGrad``), else from a contiguous copy; NumPy on the CPU."""
    n, k, p, q = (1,) + tuple(dy.shape) if dy.dim() == 3 else tuple(dy.shape)
    if dy.is_cuda and dy.dim() == 4 and not dy.is_contiguous() and dy.is_contiguous(memory_format=torch.channels_last):
        index = dy.get_device()
        key = ("nhwc", n, k, p * q, dy.dtype, index)
        launch = _bias_launches.get(key)
        if launch is None:
            with torch.cuda.device(index):
                launch = _bias_launches[key] = grad_launch_nhwc(ConvSpec(n, 0, p, q, k, 1, 1), _NUMPY_DTYPES[dy.dtype])
        return _nhwc_bias_grad(launch, dy, k, raw_stream(index),
                               lambda nbytes: torch.empty((nbytes,), dtype=torch.uint8, device=dy.device))
    if not dy.is_contiguous():
        dy = dy.contiguous()
    if not dy.is_cuda:
        a = as_array(dy).reshape(n, k, p, q)
        acc = numpy.float32 if a.dtype.itemsize == 2 else a.dtype
        return _as_tensor(numpy.ascontiguousarray(a.sum(axis=(0, 2, 3), dtype=acc).astype(a.dtype)), dy.dtype)
    index = dy.get_device()
    key = (n, k, p * q, dy.dtype, index)
    launch = _bias_launches.get(key)
    if launch is None and k:
        with torch.cuda.device(index):
            launch = _bias_launches[key] = grad_launch(ConvSpec(n, 0, p, q, k, 1, 1), _NUMPY_DTYPES[dy.dtype])
    db = torch.empty((k,), dtype=dy.dtype, device=dy.device)
    if launch is not None:
        launch(raw_stream(index), dy.data_ptr(), db.data_ptr())
    return db


class Layer:
    """One call signature of ``cuconv.nn.functional.conv2d``: the validated geometry, the dtype and device, and
    (CUDA) the plans of its passes, made as each pass is first run and kept, one for operands on 256-byte
    boundaries and one for any others. ``x_shape`` and ``out_shape`` are the shapes as the caller sees them
    (3-D for unbatched input: the data are the same).

    ``channels_last``: the call's input or weight is channels-last (torch's rule), so are its results (output,
    input gradient). A CUDA pass that an algorithm serves on channels-last activations (``select.select_nhwc``,
    ``nhwc[pass_]``) reads and writes them in place; the others run on NCHW copies, their results copied back to
    channels-last."""

    __slots__ = ("spec", "dtype", "np_dtype", "device", "index", "precision", "algo", "bias", "x_shape", "w_shape",
                 "out_shape", "benchmark", "benchmark_cache", "workspace_limit", "epilogue", "_aligned", "_unaligned",
                 "_bias_grad", "_lock", "fprop", "_bytes", "channels_last", "nhwc", "x_format", "_out_strides",
                 "_dx_strides", "_bias_grad_nhwc",
                 "krsc", "w_format", "_dw_strides")

    def __init__(self, spec: ConvSpec, dtype: torch.dtype, device: torch.device, precision: str, algo: str,
                 bias: bool, x_shape: tuple, benchmark: bool, workspace_limit: int, channels_last: bool = False,
                 w_channels_last: bool = False, benchmark_cache: str = None, epilogue=None):
        self.spec, self.dtype, self.device, self.precision, self.algo, self.bias = (spec, dtype, device, precision,
                                                                                    algo, bias)
        self.np_dtype = _NUMPY_DTYPES[dtype]
        self.index = device.index if device.type == "cuda" else -1
        self.x_shape, self.w_shape = tuple(x_shape), spec.weight_shape
        self.out_shape = spec.output_shape[1:] if len(x_shape) == 3 else spec.output_shape
        # config.benchmark and benchmark_cache of the call that made the layer (its backward passes are tuned at
        # their first call, which autograd may run in another thread, outside a ``with cuconv.config`` block)
        self.benchmark, self.benchmark_cache = benchmark, benchmark_cache
        # the forward's activation and residual (a ``cuconv.problem.Epilogue``, its bias flag the layer's; None:
        # none): planned into its forward (``forward(..., residual=)``), inference only (no backward through it)
        self.epilogue = epilogue
        # the workspace limit of the call that made the layer (part of its signature): its backward passes, which
        # autograd may run in another thread (outside a ``with cuconv.config`` block), choose and plan with it
        self.workspace_limit = workspace_limit
        # pass -> plan, for operands all on 256-byte boundaries / for any others
        self._aligned, self._unaligned = {}, {}
        self._bias_grad = self._bias_grad_nhwc = None
        self._lock = threading.Lock()
        self._bytes = None  # (CUDA) an empty uint8 tensor on the device, whose ``new_empty`` makes workspaces
        self.fprop = None
        # channels-last results (4-D calls only: torch treats an unbatched input as NCHW); pass -> the algorithm
        # running it on channels-last activations in place, or None (NCHW copies)
        self.channels_last = channels_last and len(x_shape) == 4
        self.nhwc = dict.fromkeys(PASSES)
        if self.channels_last and self.index >= 0:
            for pass_ in PASSES:
                self.nhwc[pass_] = _select.select_nhwc(algo if pass_ == "fprop" else backward_algo(algo, pass_),
                                                         spec, self.np_dtype, precision, pass_, self.workspace_limit,
                                                         epilogue if pass_ == "fprop" else None)
        # the memory format the forward takes x in (None: contiguous, the path without keyword arguments)
        self.x_format = torch.channels_last if self.nhwc["fprop"] else None
        # a channels-last weight (not also contiguous: 1x1 and depthwise ones are) read where it is by the passes
        # whose channels-last plans take it (``algos.takes_krsc``), wgrad's dW written so, as torch's: where
        # the forward and the dgrad both do, the layer takes w channels-last (``w_format``), else contiguous
        self.krsc = {pass_: bool(self.channels_last and w_channels_last and self.nhwc[pass_]
                                 and _algorithms.takes_krsc(self.nhwc[pass_])) for pass_ in PASSES}
        if not (self.krsc["fprop"] and self.krsc["dgrad"]):
            self.krsc["fprop"] = self.krsc["dgrad"] = False
        self.w_format = torch.channels_last if self.krsc["fprop"] else None
        self._dw_strides = _layout.nhwc_strides(spec.weight_shape)
        self._out_strides = _layout.nhwc_strides(spec.output_shape)
        self._dx_strides = _layout.nhwc_strides(spec.input_shape)
        if self.index >= 0:  # the forward's algorithm is resolved now: a forced one that cannot serve raises here
            self._bytes = torch.empty(0, dtype=torch.uint8, device=device)
            name = self.nhwc["fprop"] or _select.resolve(algo, spec, self.np_dtype, precision, True, "fprop",
                                                           self.workspace_limit, epilogue)
            self.fprop = self._prepare("fprop", name, True)
            if not benchmark or self.nhwc["fprop"]:  # (benchmark: the first aligned call times the candidates)
                self._aligned["fprop"] = self.fprop
        else:  # (the CPU path runs every problem one way: a forced algorithm the GPU would refuse is refused)
            _select.resolve(algo, spec, self.np_dtype, precision, False, "fprop", self.workspace_limit, epilogue)

    # ---- CUDA ------------------------------------------------------------------------------------------------
    def _prepare(self, pass_: str, name: str, aligned: bool, knobs: tuple = None) -> "_plan.Plan":
        env = _plan.env(self.index, self.workspace_limit, aligned)
        return dispatch.prepare(name, pass_, self.spec, self.np_dtype, self.precision, env,
                                 self.bias and pass_ == "fprop", "nhwc" if self.nhwc[pass_] else "nchw",
                                 "krsc" if self.krsc[pass_] else "kcrs", knobs,
                                 self.epilogue if pass_ == "fprop" else None)

    def plan(self, pass_: str, ptrs: tuple) -> "_plan.Plan":
        """The plan of ``pass_`` for these operand pointers (aligned or not), made the first time."""
        return self._plan_for(pass_, _plan.is_aligned(*ptrs), ptrs)

    def _plan_for(self, pass_: str, aligned: bool, ptrs: tuple) -> "_plan.Plan":
        plan = (self._aligned if aligned else self._unaligned).get(pass_)
        if plan is None:
            with self._lock:
                plans = self._aligned if aligned else self._unaligned
                plan = plans.get(pass_)
                if plan is None:
                    algo = self.algo if pass_ == "fprop" else backward_algo(self.algo, pass_)
                    name = self.nhwc[pass_] or _select.resolve(algo, self.spec, self.np_dtype, self.precision,
                                                                 True, pass_, self.workspace_limit,
                                                                 self.epilogue if pass_ == "fprop" else None)
                    knobs = None
                    # (a layer with an epilogue is not timed: its candidates would need its residual)
                    if algo == "auto" and self.benchmark and not self.nhwc[pass_] and self.epilogue is None:
                        name, knobs = self._tuned(pass_, name, ptrs, aligned)
                    plan = plans[pass_] = self._prepare(pass_, name, aligned, knobs)
        return plan

    def prepare(self, passes) -> None:
        """Plan ``passes`` (backward ones; the bias gradient's launch too where the layer has a bias) for operands
        on 256-byte boundaries, ahead of their first call (``cuconv.nn.warmup``)."""
        for pass_ in passes:
            self.plan(pass_, (0, 0, 0))
        if self.bias and passes and self._bias_grad is None:
            self._bias_grad = grad_launch(self.spec, self.np_dtype)
        if self.bias and passes and self.channels_last and self._bias_grad_nhwc is None:
            self._bias_grad_nhwc = grad_launch_nhwc(self.spec, self.np_dtype)  # (dy read in place, where it is)

    def _tuned(self, pass_: str, heuristic: str, ptrs: tuple, aligned: bool) -> "_select.Choice":
        """``cuconv.config.benchmark``: the autotuner's pick (an algorithm and its knobs), timing the candidates on
        these operands on torch's stream (a signature timed before, or a capture, costs no timing)."""
        import cupy

        env = _plan.env(self.index, self.workspace_limit, aligned)
        problem = Problem.of(self.spec, self.np_dtype, self.precision, pass_,
                             epilogue=BIAS if self.bias and pass_ == "fprop" else PLAIN)

        def run(choice):
            plan = self._prepare(pass_, choice.name, aligned, choice.knobs)
            stream = _current_raw_stream(self.index)
            workspace = self._workspace(plan.workspace, stream, False) if plan.workspace else None
            plan.run(ptrs, stream, 0 if workspace is None else workspace.data_ptr())

        settings = Settings(self.precision, self.workspace_limit, True, self.benchmark_cache)  # (the layer's)
        with cupy.cuda.ExternalStream(raw_stream(self.index), self.index):
            return autotune.pick("auto", heuristic, problem, env, settings, run)

    def _workspace(self, nbytes: int, stream: int, eager: bool) -> torch.Tensor:
        """A workspace of ``nbytes`` (> 0) for launches on ``stream``, from torch's caching allocator; the caller
        holds it until its launches are enqueued.

        Eager calls (``eager``: the autograd function's passes and inference, never the custom ops that
        ``torch.compile`` and cudagraph trees run) outside a CUDA-graph capture reuse one buffer per thread,
        device and stream, as torch keeps its cuBLAS workspaces: work on one stream runs in the order it was
        enqueued, so a pass's launches are done with the buffer before the next pass's launches write it, and a
        thread of its own means no other thread's launches fall between them. That saves an allocation a pass
        (the ~10 µs of host time it costs inside autograd's backward). Up to ``_KEPT_MAX`` bytes; larger
        workspaces, and every workspace in a capture (or in a pool cudagraph trees route allocations to, which
        only the custom ops run in), are allocated per call and are the graph's memory. Made from an empty uint8
        tensor: ``new_empty`` without keywords is torch's cheapest allocation from Python."""
        if eager and nbytes <= _KEPT_MAX and not _capturing():
            kept = getattr(_kept, "buffers", None)
            if kept is None:
                kept = _kept.buffers = {}
            key = (self.index, stream)
            buffer = kept.get(key)
            if buffer is None or buffer.numel() < nbytes:
                buffer = kept[key] = self._bytes.new_empty((max(nbytes, _KEPT_MIN),))
            return buffer
        return self._bytes.new_empty((nbytes,))

    # ---- the passes (tensors of the layer's dtype and device: contiguous, or x in ``x_format``) ---------------
    def forward(self, x: torch.Tensor, w: torch.Tensor, b, eager: bool = False, residual=None) -> torch.Tensor:
        if self.epilogue is not None:
            return self._forward_epilogue(x, w, b, eager, residual)
        if self.channels_last:
            return self._forward_channels_last(x, w, b, eager)
        out = x.new_empty(self.out_shape)  # (x is of the layer's dtype and device; no keywords to parse)
        if self.index < 0:
            return self._forward_cpu(x, w, b, out)
        # (``_run_forward``'s body, inline: the NCHW forward is the hot path, and a Python call is host time)
        x_ptr, w_ptr, out_ptr = x.data_ptr(), w.data_ptr(), out.data_ptr()
        b_ptr = 0 if b is None else b.data_ptr()
        ptrs = (x_ptr, w_ptr, b_ptr, out_ptr)
        aligned = not (x_ptr | w_ptr | b_ptr | out_ptr) & _MISALIGNED
        plan = (self._aligned if aligned else self._unaligned).get("fprop") or self._plan_for("fprop", aligned, ptrs)
        stream = _current_raw_stream(self.index)
        if plan.workspace:
            workspace = self._workspace(plan.workspace, stream, eager)
            plan.run(ptrs, stream, workspace.data_ptr())
        else:
            plan.run(ptrs, stream, 0)
        return out

    def _forward_epilogue(self, x, w, b, eager: bool, residual) -> torch.Tensor:
        """A CUDA forward with its epilogue in its plan: the residual (where the epilogue adds one) read as the
        output lies (a copy where it lies otherwise)."""
        ep = self.epilogue
        nhwc = self.channels_last and self.nhwc["fprop"]
        if nhwc:
            x = _nhwc_operand(x)
            out = x.new_empty_strided(self.out_shape, self._out_strides)
        else:
            x = x.contiguous()
            out = x.new_empty(self.out_shape)
        r = 0
        if ep.residual is not None:
            if residual.stride() != out.stride():
                residual = residual.contiguous(memory_format=torch.channels_last) if nhwc else residual.contiguous()
            r = residual.data_ptr()
        x_ptr, w_ptr, out_ptr = x.data_ptr(), w.data_ptr(), out.data_ptr()
        b_ptr = 0 if b is None else b.data_ptr()
        ptrs = (x_ptr, w_ptr, b_ptr, out_ptr)
        aligned = not (x_ptr | w_ptr | b_ptr | out_ptr | r) & _MISALIGNED  # (the residual too: kernels may vector it)
        plan = (self._aligned if aligned else self._unaligned).get("fprop") or self._plan_for("fprop", aligned, ptrs)
        stream = _current_raw_stream(self.index)
        plan.run(ptrs, stream, self._workspace(plan.workspace, stream, eager).data_ptr() if plan.workspace else 0, r)
        return _channels_last_result(out, self._out_strides) if self.channels_last and not nhwc else out

    def _forward_channels_last(self, x, w, b, eager: bool) -> torch.Tensor:
        """The forward of a channels-last result: in place where ``nhwc["fprop"]`` (x dense channels-last, the
        output allocated so), else on contiguous copies, the output copied to channels-last."""
        if not self.nhwc["fprop"]:
            x = x.contiguous()
            out = x.new_empty(self.out_shape)
            if self.index < 0:
                self._forward_cpu(x, w, b, out)
            else:
                self._run_forward(x, w, b, out, eager)
            return _channels_last_result(out, self._out_strides)
        x = _nhwc_operand(x)
        out = x.new_empty_strided(self.out_shape, self._out_strides)
        self._run_forward(x, w, b, out, eager)
        return out

    def _run_forward(self, x, w, b, out, eager: bool) -> None:
        x_ptr, w_ptr, out_ptr = x.data_ptr(), w.data_ptr(), out.data_ptr()
        b_ptr = 0 if b is None else b.data_ptr()
        ptrs = (x_ptr, w_ptr, b_ptr, out_ptr)
        aligned = not (x_ptr | w_ptr | b_ptr | out_ptr) & _MISALIGNED
        plan = (self._aligned if aligned else self._unaligned).get("fprop") or self._plan_for("fprop", aligned, ptrs)
        stream = _current_raw_stream(self.index)
        plan.run(ptrs, stream, self._workspace(plan.workspace, stream, eager).data_ptr() if plan.workspace else 0)

    def backward(self, dy: torch.Tensor, x, w, need_x: bool, need_w: bool, need_b: bool,
                 eager: bool = False) -> tuple:
        """(dx, dw, db), each None where not needed: dgrad and wgrad share one workspace (they run one after the
        other on the stream), and the stream is asked once. ``eager``: see ``_workspace``. dy (and x) in any
        memory format: each pass takes them as its plan reads them."""
        if self.channels_last:
            return self._backward_channels_last(dy, x, w, need_x, need_w, need_b, eager)
        if not dy.is_contiguous():
            dy = dy.contiguous()
        if x is not None and not x.is_contiguous():
            x = x.contiguous()
        return self._backward_nchw(dy, x, w, need_x, need_w, need_b, eager)

    def _backward_nchw(self, dy, x, w, need_x: bool, need_w: bool, need_b: bool, eager: bool) -> tuple:
        """``backward`` on contiguous dy, x and w, with the passes' NCHW plans."""
        if self.index < 0:
            return (self._backward_cpu("dgrad", dy, w) if need_x else None,
                    self._backward_cpu("wgrad", x, dy) if need_w else None,
                    self.bias_grad(dy) if need_b else None)
        dx = dw = dgrad = wgrad = None
        dy_ptr = dy.data_ptr()
        nbytes = 0
        if need_x:
            dx = dy.new_empty(self.x_shape)
            w_ptr, dx_ptr = w.data_ptr(), dx.data_ptr()
            dgrad_ptrs = (dy_ptr, w_ptr, dx_ptr)
            aligned = not (dy_ptr | w_ptr | dx_ptr) & _MISALIGNED
            dgrad = ((self._aligned if aligned else self._unaligned).get("dgrad")
                     or self._plan_for("dgrad", aligned, dgrad_ptrs))
            nbytes = dgrad.workspace
        if need_w:
            dw = dy.new_empty(self.w_shape)
            x_ptr, dw_ptr = x.data_ptr(), dw.data_ptr()
            wgrad_ptrs = (x_ptr, dy_ptr, dw_ptr)
            aligned = not (x_ptr | dy_ptr | dw_ptr) & _MISALIGNED
            wgrad = ((self._aligned if aligned else self._unaligned).get("wgrad")
                     or self._plan_for("wgrad", aligned, wgrad_ptrs))
            if wgrad.workspace > nbytes:
                nbytes = wgrad.workspace
        stream = _current_raw_stream(self.index)
        workspace = self._workspace(nbytes, stream, eager) if nbytes else None
        ws_ptr = 0 if workspace is None else workspace.data_ptr()
        if dgrad is not None:
            dgrad.run(dgrad_ptrs, stream, ws_ptr)
        if wgrad is not None:
            wgrad.run(wgrad_ptrs, stream, ws_ptr)
        return dx, dw, self.bias_grad(dy) if need_b else None

    def _backward_channels_last(self, dy, x, w, need_x: bool, need_w: bool, need_b: bool, eager: bool) -> tuple:
        """``backward`` of a channels-last layer: each pass in place on channels-last dy and x where an algorithm
        serves it (``nhwc``), else on contiguous copies; dx channels-last either way, dw channels-last where the
        wgrad plan writes it so (``krsc``), else KCRS; db from dy's NCHW copy where a pass made one, else summed over
        channels-last pixels."""
        dy_nchw = None
        dx = dw = db = None
        if self.index < 0:
            dy_nchw = dy.contiguous()
            dx, dw, db = self._backward_nchw(dy_nchw, x, w, need_x, need_w, need_b, eager)
            return (None if dx is None else _channels_last_result(dx, self._dx_strides)), dw, db
        dy_nhwc = None
        if need_x:
            if self.nhwc["dgrad"]:
                dy_nhwc = _nhwc_operand(dy)
                dx = dy.new_empty_strided(self.x_shape, self._dx_strides)
                self._run_pass("dgrad", (dy_nhwc.data_ptr(), w.data_ptr(), dx.data_ptr()), eager)
            else:
                dy_nchw = dy.contiguous()
                dx = self._backward_nchw(dy_nchw, None, w, True, False, False, eager)[0]
                dx = _channels_last_result(dx, self._dx_strides)
        if need_w:
            if self.nhwc["wgrad"]:
                if dy_nhwc is None:
                    dy_nhwc = _nhwc_operand(dy)
                x = _nhwc_operand(x)
                dw = dy.new_empty_strided(self.w_shape, self._dw_strides) if self.krsc["wgrad"] else \
                    dy.new_empty(self.w_shape)
                self._run_pass("wgrad", (x.data_ptr(), dy_nhwc.data_ptr(), dw.data_ptr()), eager)
            else:
                if dy_nchw is None:
                    dy_nchw = dy.contiguous()
                dw = self._backward_nchw(dy_nchw, x.contiguous(), None, False, True, False, eager)[1]
        if need_b:
            if dy_nchw is not None:
                db = self.bias_grad(dy_nchw)
            else:
                db = self._bias_grad_channels_last(dy_nhwc if dy_nhwc is not None else dy, eager)
        return dx, dw, db

    def _bias_grad_channels_last(self, dy, eager: bool) -> torch.Tensor:
        """Σ of a channels-last grad_output over (N, P, Q), read in place where it is dense (``bias.NhwcGrad``:
        slices of pixels into fp32 partial sums in a workspace, then their sum in order), else from an NCHW copy."""
        if not dy.is_contiguous(memory_format=torch.channels_last):
            return self.bias_grad(dy.contiguous())
        launch = self._bias_grad_nhwc
        if launch is None:
            launch = self._bias_grad_nhwc = grad_launch_nhwc(self.spec, self.np_dtype)
        stream = _current_raw_stream(self.index)
        return _nhwc_bias_grad(launch, dy, self.spec.k, stream, lambda nbytes: self._workspace(nbytes, stream, eager))

    def _run_pass(self, pass_: str, ptrs: tuple, eager: bool) -> None:
        aligned = _plan.is_aligned(*ptrs)
        plan = (self._aligned if aligned else self._unaligned).get(pass_) or self._plan_for(pass_, aligned, ptrs)
        stream = _current_raw_stream(self.index)
        plan.run(ptrs, stream, self._workspace(plan.workspace, stream, eager).data_ptr() if plan.workspace else 0)

    def dgrad(self, dy: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.backward(dy, None, w, True, False, False)[0]

    def wgrad(self, x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
        return self.backward(dy, x, None, False, True, False)[1]

    def bias_grad(self, dy: torch.Tensor) -> torch.Tensor:
        """Σ of grad_output over (N, P, Q) (``bias_grad``), with the launch kept by the layer."""
        if self.index < 0:
            return bias_grad(dy)
        launch = self._bias_grad
        if launch is None:
            launch = self._bias_grad = grad_launch(self.spec, self.np_dtype)
        db = dy.new_empty((self.spec.k,))  # (dy is of the layer's dtype and device)
        if launch is not None:
            launch(_current_raw_stream(self.index), dy.data_ptr(), db.data_ptr())
        return db

    # ---- CPU -----------------------------------------------------------------------------------------------
    def _forward_cpu(self, x, w, b, out):
        spec = self.spec
        reference.forward(as_array(x).reshape(spec.input_shape), as_array(w), None if b is None else as_array(b),
                          spec, as_array(out).reshape(spec.output_shape), _torch_matmul, self.workspace_limit)
        return out

    def _backward_cpu(self, pass_: str, first, second):
        """One backward pass on the CPU path; operands as ``_plan.OPERANDS`` (dgrad: dy, w; wgrad: x, dy)."""
        spec = self.spec
        if pass_ == "dgrad":
            result = numpy.empty(spec.input_shape, dtype=self.np_dtype)
            reference.dgrad(as_array(first).reshape(spec.output_shape), as_array(second), spec, result, _torch_matmul,
                            self.workspace_limit)
            result = result.reshape(self.x_shape)
        else:
            result = numpy.empty(spec.weight_shape, dtype=self.np_dtype)
            reference.wgrad(as_array(first).reshape(spec.input_shape), as_array(second).reshape(spec.output_shape),
                            spec, result, _torch_matmul, self.workspace_limit)
        return _as_tensor(result, self.dtype)
