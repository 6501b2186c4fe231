"""cuBLAS GEMMs for every dtype and precision cuconv offers, callable during CUDA-graph capture.

Two entry points on CuPy's current stream: ``gemm`` (strided batches) and ``gemm_batched`` (pointer
arrays). We call the libraries through ctypes with handles of our own (per device and thread) rather than
through ``cupy.cuda.cublas``, because CuPy refuses every cuBLAS call while a stream is being captured into a
CUDA graph (``NotImplementedError: calling cuBLAS API during stream capture``) and capture is part of our
contract (``cuconv.nn`` under ``torch.cuda.graph``). Owning the handles also keeps the math mode ours: "ieee"
float32 can never be turned into TF32 by someone else's setting. The libraries are the ones CuPy loads.

``gemm`` runs ``cublasLtMatmul`` with a plan made once per problem (descriptors and the algorithm cuBLASLt's
heuristic picks for that shape, those alignments and that workspace) and kept for the process: the same
kernels as ``cublasGemmStridedBatchedEx``, which asks the heuristic again on every call. That is host time
a small layer pays before its GPU work starts (about half a 1x1 layer's call; docs/perf-notes.md). A call seen
before (same shapes, strides, pointer alignments, device, stream and thread) goes straight to
``cublasLtMatmul`` with its arguments kept from the first time, without building the plan's key again. Where
cuBLASLt offers no algorithm, the plan says so and ``gemm`` calls ``cublasGemmStridedBatchedEx``.

Workspace: cuBLAS gets a 32 MiB workspace per (device, stream), allocated with cudaMalloc the first time a
stream is used outside a capture and kept for the process (as torch does). Inside a capture on a stream
that has none, cuBLAS runs without workspace (it then picks kernels that need none).

cuBLAS is column-major: a row-major ``C = A @ B`` is the column-major ``Cᵀ = Bᵀ Aᵀ``; callers describe
their problem column-major.
"""

from __future__ import annotations

import ctypes
import functools
import threading

import numpy

from . import _backend

__all__ = ["gemm", "gemm_batched", "PreparedGemm", "alignment"]

# cublasLt attribute numbers (cublasLt.h; fixed by the ABI): matmul descriptor, matrix layout, preference.
_LT_DESC_TRANSA, _LT_DESC_TRANSB, _LT_DESC_EPILOGUE, _LT_DESC_BIAS_POINTER = 3, 4, 7, 8
_LT_EPILOGUE_BIAS = 4  # D = alpha·A·B + beta·C + bias[row], bias of D's type, added before D's one rounding
_LT_LAYOUT_BATCH_COUNT, _LT_LAYOUT_STRIDED_BATCH_OFFSET = 5, 6
_LT_PREF_MAX_WORKSPACE_BYTES = 1
_LT_PREF_MIN_ALIGNMENT = {"A": 5, "B": 6, "C": 7, "D": 8}
_LT_MAX_ALIGNMENT = 256  # the heuristic's default assumption; our pointers may be less aligned (chunk offsets)
_LT_PLANS_MAX = 4096

# cublasComputeType_t, cudaDataType_t, cublasOperation_t, cublasMath_t values (fixed by the CUDA ABI).
_CUDA_R_16F, _CUDA_R_32F, _CUDA_R_64F, _CUDA_R_16BF = 2, 0, 1, 14
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32, _COMPUTE_64F = 68, 77, 70
_GEMM_DEFAULT = -1
_OP = {"N": 0, "T": 1}
_DEFAULT_MATH = 0
_POINTER_MODE_HOST = 0
_WORKSPACE_BYTES = 32 << 20
_DATA_TYPES = {"float16": _CUDA_R_16F, "bfloat16": _CUDA_R_16BF, "float32": _CUDA_R_32F,
               "float64": _CUDA_R_64F}
_ITEMSIZE = {_CUDA_R_16F: 2, _CUDA_R_16BF: 2, _CUDA_R_32F: 4, _CUDA_R_64F: 8}

# Host-mode scalars: cuBLAS reads them before the call returns; module-level so no allocation per call.
_SCALARS = {(numpy.float32, v): numpy.full((), v, numpy.float32) for v in (0.0, 1.0)}
_SCALARS.update({(numpy.float64, v): numpy.full((), v, numpy.float64) for v in (0.0, 1.0)})
_SCALAR_PTRS = {key: value.ctypes.data for key, value in _SCALARS.items()}


def _load(name: str):
    """``lib<name>`` as CuPy loads it (cuda-pathfinder), else the system's."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        return ctypes.CDLL(load_nvidia_dynamic_lib(name).abs_path)
    except Exception:  # no cuda-pathfinder: the system's library
        import ctypes.util

        found = ctypes.util.find_library(name)
        if found is None:
            raise RuntimeError(f"cuconv: lib{name} not found (install CuPy's CUDA extra, e.g. cuconv[cuda13])")
        return ctypes.CDLL(found)


def _declare(lib, protos: dict):
    for name, argtypes in protos.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return lib


@functools.lru_cache(maxsize=None)
def _lib():
    """libcublas with the prototypes we call."""
    vp, i32, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_size_t
    return _declare(_load("cublas"), {
        "cublasCreate_v2": [ctypes.POINTER(vp)],
        "cublasSetStream_v2": [vp, vp],
        "cublasSetWorkspace_v2": [vp, vp, sz],
        "cublasSetMathMode": [vp, i32],
        "cublasSetPointerMode_v2": [vp, i32],
        "cublasGemmStridedBatchedEx": [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, i64, vp, i32, i32, i64,
                                       vp, vp, i32, i32, i64, i32, i32, i32],
        "cublasGemmBatchedEx": [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, vp, i32, i32, vp, vp, i32, i32,
                                i32, i32, i32],
    })


@functools.lru_cache(maxsize=None)
def _lt():
    """libcublasLt with the prototypes we call."""
    vp, i32, u64, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t
    out = ctypes.POINTER(vp)
    return _declare(_load("cublasLt"), {
        "cublasLtCreate": [out],
        "cublasLtMatmulDescCreate": [out, i32, i32],
        "cublasLtMatmulDescDestroy": [vp],
        "cublasLtMatmulDescSetAttribute": [vp, i32, vp, sz],
        "cublasLtMatrixLayoutCreate": [out, i32, u64, u64, i64],
        "cublasLtMatrixLayoutDestroy": [vp],
        "cublasLtMatrixLayoutSetAttribute": [vp, i32, vp, sz],
        "cublasLtMatmulPreferenceCreate": [out],
        "cublasLtMatmulPreferenceDestroy": [vp],
        "cublasLtMatmulPreferenceSetAttribute": [vp, i32, vp, sz],
        "cublasLtMatmulAlgoGetHeuristic": [vp, vp, vp, vp, vp, vp, vp, i32, vp, ctypes.POINTER(i32)],
        "cublasLtMatmul": [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, sz, vp],
    })


class _LtHeuristicResult(ctypes.Structure):
    """``cublasLtMatmulHeuristicResult_t``: the algorithm (64 opaque bytes) and the workspace it needs."""

    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuconv: {what} failed with cublasStatus_t {status}")


_handles = threading.local()  # {device: handle} per thread: cuBLAS handles are not thread-safe
_workspaces = {}  # (device, stream) -> device pointer, for the process
_workspace_lock = threading.Lock()


def _handle(device: int):
    table = getattr(_handles, "by_device", None)
    if table is None:
        table = _handles.by_device = {}
        _handles.bound = {}
    handle = table.get(device)
    if handle is None:
        lib = _lib()
        handle = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        _check(lib.cublasSetMathMode(handle, _DEFAULT_MATH), "cublasSetMathMode")
        _check(lib.cublasSetPointerMode_v2(handle, _POINTER_MODE_HOST), "cublasSetPointerMode")
        table[device] = handle
    return handle


def _workspace(device: int, stream: int):
    """(pointer, bytes) of this stream's workspace; (None, 0) while capturing on a stream without one."""
    key = (device, stream)
    ptr = _workspaces.get(key)
    if ptr is None:
        from cupy.cuda import runtime

        if stream and runtime.streamIsCapturing(stream) != 0:
            return None, 0
        with _workspace_lock:
            ptr = _workspaces.get(key)
            if ptr is None:
                ptr = _workspaces[key] = runtime.malloc(_WORKSPACE_BYTES)
    return ptr, _WORKSPACE_BYTES


def _compute_type(dtype: numpy.dtype, precision: str):
    """(cublasComputeType, NumPy type of alpha/beta) for a storage dtype and float32 precision mode."""
    if dtype == numpy.float64:
        return _COMPUTE_64F, numpy.float64
    if dtype == numpy.float32 and precision == "tf32":
        return _COMPUTE_32F_FAST_TF32, numpy.float32
    return _COMPUTE_32F, numpy.float32  # fp32 IEEE; fp16/bf16 inputs accumulate in fp32


def gemm(dtype, precision: str, m: int, n: int, k: int,
         a_ptr: int, lda: int, stride_a: int,
         b_ptr: int, ldb: int, stride_b: int,
         c_ptr: int, ldc: int, stride_c: int,
         batch: int, beta: float = 0.0, *, trans_a: str = "N", trans_b: str = "N",
         c_dtype=None, stream: int = None) -> None:
    """Column-major ``C[i] (m×n) = op(A[i]) (m×k) @ op(B[i]) (k×n) (+ beta·C[i])`` for ``i < batch``.

    ``op`` is the identity (``"N"``) or the transpose (``"T"``). Pointers are raw device addresses;
    strides are in elements of their operand and may be 0 (a shared operand). ``c_dtype`` (default
    ``dtype``) may be float32 for float16/bfloat16 inputs, so that sums over several GEMMs stay in fp32.
    With ``beta == 0`` C is never read, so a NaN-poisoned output is fully overwritten. Runs on ``stream``
    (a raw handle; default CuPy's current stream) of the current device.
    """
    device = _current_device()
    if stream is None:
        stream = _current_stream()
    # the call as it comes: what its plan depends on (pointer alignments as their low bits), and the thread,
    # whose handle it uses
    call_key = (dtype, precision, c_dtype, trans_a, trans_b, m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c,
                batch, beta, a_ptr & 255, b_ptr & 255, c_ptr & 255, device, stream, threading.get_ident())
    call = _lt_calls.get(call_key)
    if call is None:
        _check_dims(m, n, k, lda, ldb, ldc, batch)
        if min(m, n, batch) == 0:
            return
        call = _lt_call(dtype, precision, c_dtype, trans_a, trans_b, m, n, k, lda, stride_a, ldb, stride_b, ldc,
                        stride_c, batch, beta, a_ptr, b_ptr, c_ptr, device, stream)
        if call is None:  # k == 0 (C = beta·C), or no cuBLASLt algorithm: the classic entry point
            lib, handle, alpha, beta_s, data_type, c_type, compute = _prepare(dtype, precision, c_dtype, beta,
                                                                              device, stream)
            _check(lib.cublasGemmStridedBatchedEx(
                handle, _OP[trans_a], _OP[trans_b], m, n, k,
                alpha.ctypes.data, a_ptr, data_type, lda, stride_a,
                b_ptr, data_type, ldb, stride_b,
                beta_s.ctypes.data, c_ptr, c_type, ldc, stride_c,
                batch, compute, _GEMM_DEFAULT), f"cublasGemmStridedBatchedEx(m={m}, n={n}, k={k}, batch={batch})")
            return
        if (device, stream) in _workspaces:  # (a capture on a stream without a workspace plans again: it may get one)
            if len(_lt_calls) >= _LT_PLANS_MAX:
                _lt_calls.clear()
            _lt_calls[call_key] = call
    fn, handle, desc, alpha, a_desc, b_desc, beta_ptr, c_desc, algo, ws, needed, _ = call
    status = fn(handle, desc, alpha, a_ptr, a_desc, b_ptr, b_desc, beta_ptr, c_ptr, c_desc, c_ptr, c_desc, algo, ws,
                needed, stream)
    if status:  # (the message is built only on failure: formatting it costs host time)
        _check(status, f"cublasLtMatmul(m={m}, n={n}, k={k}, batch={batch})")


def _lt_call(dtype, precision, c_dtype, trans_a, trans_b, m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c, batch,
             beta, a_ptr, b_ptr, c_ptr, device, stream):
    """cublasLtMatmul and its arguments but the three pointers and the stream, from the plan of this GEMM
    (made if new); None where cuBLASLt cannot run it (k == 0, or no algorithm)."""
    if k == 0:
        return None
    types = _types(dtype, precision, c_dtype)
    ws_ptr, ws_bytes = _workspace(device, stream)
    item, c_item = _ITEMSIZE[types[1]], _ITEMSIZE[types[2]]
    if batch == 1:
        stride_a = stride_b = stride_c = 0  # unused: not part of the plan's key
    key = (device, types, trans_a, trans_b, m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c, batch,
           _alignment(a_ptr, stride_a * item), _alignment(b_ptr, stride_b * item),
           _alignment(c_ptr, stride_c * c_item), ws_bytes, False)
    plan = _lt_plans.get(key)
    if plan is None and key not in _lt_plans:
        plan = _lt_plan(key)
    if plan is None:
        return None
    desc, a_desc, b_desc, c_desc, algo, needed, _ = plan
    scalar_type = types[0]
    # (the plan rides along: holding it keeps its descriptors alive, _LtPlanOwner)
    return (_lt().cublasLtMatmul, _lt_handle(device), desc, _SCALAR_PTRS[(scalar_type, 1.0)], a_desc, b_desc,
            _SCALAR_PTRS[(scalar_type, float(beta))], c_desc, algo, ws_ptr if needed else None, needed, plan)


def _current_device() -> int:
    return _backend.cupy_or_none().cuda.runtime.getDevice()


def _current_stream() -> int:
    return _backend.cupy_or_none().cuda.get_current_stream().ptr


def _alignment(ptr: int, stride_bytes: int) -> int:
    """Bytes every matrix of a batch is aligned to (the lowest set bit of its address and stride), ≤ 256."""
    bits = ptr | stride_bytes | _LT_MAX_ALIGNMENT
    return bits & -bits


_lt_plans = {}  # key -> (desc, A, B, C layouts, algo pointer, workspace bytes, owner) or None (no algorithm)
# gemm's calls as they come (see gemm's call_key) -> cublasLtMatmul and every argument but the three pointers and
# the stream: a GEMM made before skips building and hashing the plan's key. Holds its plan, so its descriptors
# live as long.
_lt_calls = {}
_lt_lock = threading.Lock()


class _LtPlanOwner:
    """The ctypes objects behind a plan's pointers; destroys its descriptors when the last reference goes.
    A plan dropped from the table while another thread is calling with it lives until that call returns."""

    __slots__ = ("made", "result")

    def __init__(self, made, result):
        self.made, self.result = made, result

    def __del__(self):
        for destroy, obj in self.made:
            try:
                destroy(obj)
            except Exception:  # interpreter shutdown: the library may be gone first
                pass


def _lt_handle(device: int):
    table = getattr(_handles, "lt_by_device", None)
    if table is None:
        table = _handles.lt_by_device = {}
    handle = table.get(device)
    if handle is None:
        handle = ctypes.c_void_p()
        _check(_lt().cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
        table[device] = handle = handle.value
    return handle


def _set_matmul_attrs(lt, desc, trans_a: str, trans_b: str, bias: bool) -> None:
    """A matmul descriptor's transposes and, with ``bias``, the bias epilogue (its pointer is set per call)."""
    attrs = [(_LT_DESC_TRANSA, ctypes.c_int32(_OP[trans_a])), (_LT_DESC_TRANSB, ctypes.c_int32(_OP[trans_b]))]
    if bias:
        attrs.append((_LT_DESC_EPILOGUE, ctypes.c_uint32(_LT_EPILOGUE_BIAS)))
    for attr, value in attrs:
        _check(lt.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(value), ctypes.sizeof(value)),
               "cublasLtMatmulDescSetAttribute")


class _BiasDesc:
    """A PreparedGemm's own matmul descriptor with the bias epilogue: the bias pointer is an attribute of the
    descriptor, so each call sets it where it changed (under the lock: a plan, and its GEMMs, serve every layer of
    its shape, from any thread) just before ``cublasLtMatmul`` reads it."""

    __slots__ = ("desc", "lock", "_pointer", "_set", "_owner")

    def __init__(self, types, trans_a: str, trans_b: str):
        scalar_type, _, _, compute = types
        lt = _lt()
        desc = ctypes.c_void_p()
        _check(lt.cublasLtMatmulDescCreate(ctypes.byref(desc), compute,
                                           _CUDA_R_64F if scalar_type is numpy.float64 else _CUDA_R_32F),
               "cublasLtMatmulDescCreate")
        self._owner = _LtPlanOwner([(lt.cublasLtMatmulDescDestroy, desc)], None)
        _set_matmul_attrs(lt, desc, trans_a, trans_b, True)
        self.desc, self.lock = desc.value, threading.Lock()
        self._pointer = ctypes.c_uint64(0)
        self._set = lt.cublasLtMatmulDescSetAttribute

    def point(self, bias: int) -> None:
        if self._pointer.value == bias:  # (inference: the same folded bias every call, no driver-side call)
            return
        self._pointer.value = bias
        status = self._set(self.desc, _LT_DESC_BIAS_POINTER, ctypes.byref(self._pointer), 8)
        if status:
            self._pointer.value = 0  # (not set: the next call tries again)
            _check(status, "cublasLtMatmulDescSetAttribute(BIAS_POINTER)")


def _lt_plan(key):
    """Descriptors and cuBLASLt's best algorithm for one GEMM (see ``gemm`` for the key), kept for the
    process; None where cuBLASLt has no algorithm for it."""
    (device, (scalar_type, data_type, c_type, compute), trans_a, trans_b, m, n, k, lda, stride_a, ldb, stride_b,
     ldc, stride_c, batch, align_a, align_b, align_c, ws_bytes, bias) = key
    lt = _lt()
    made = []  # (destroy function, descriptor) of what this plan created
    owner = _LtPlanOwner(made, None)  # destroys them unless the plan is kept (also if a call below raises)

    def create(fn_name, destroy_name, *args):
        handle = ctypes.c_void_p()
        _check(getattr(lt, fn_name)(ctypes.byref(handle), *args), fn_name)
        made.append((getattr(lt, destroy_name), handle))
        return handle

    def set_attr(fn, obj, attr, value):
        _check(fn(obj, attr, ctypes.byref(value), ctypes.sizeof(value)), fn.__name__)

    def layout(type_, rows, cols, ld, stride):
        desc = create("cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy", type_, rows, cols, ld)
        if batch > 1:
            set_attr(lt.cublasLtMatrixLayoutSetAttribute, desc, _LT_LAYOUT_BATCH_COUNT, ctypes.c_int32(batch))
            set_attr(lt.cublasLtMatrixLayoutSetAttribute, desc, _LT_LAYOUT_STRIDED_BATCH_OFFSET,
                     ctypes.c_int64(stride))
        return desc

    scale_type = _CUDA_R_64F if scalar_type is numpy.float64 else _CUDA_R_32F
    with _lt_lock:
        if key in _lt_plans:
            return _lt_plans[key]
        if len(_lt_plans) >= _LT_PLANS_MAX:
            _lt_plans.clear()  # (each plan's owner destroys its descriptors once no call holds it)
        desc = create("cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy", compute, scale_type)
        _set_matmul_attrs(lt, desc, trans_a, trans_b, bias)
        a_desc = layout(data_type, *((m, k) if trans_a == "N" else (k, m)), lda, stride_a)
        b_desc = layout(data_type, *((k, n) if trans_b == "N" else (n, k)), ldb, stride_b)
        c_desc = layout(c_type, m, n, ldc, stride_c)
        pref = ctypes.c_void_p()
        _check(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        try:
            set_attr(lt.cublasLtMatmulPreferenceSetAttribute, pref, _LT_PREF_MAX_WORKSPACE_BYTES,
                     ctypes.c_uint64(ws_bytes))
            for operand, align in (("A", align_a), ("B", align_b), ("C", align_c), ("D", align_c)):
                set_attr(lt.cublasLtMatmulPreferenceSetAttribute, pref, _LT_PREF_MIN_ALIGNMENT[operand],
                         ctypes.c_uint32(align))
            result, count = _LtHeuristicResult(), ctypes.c_int(0)
            status = lt.cublasLtMatmulAlgoGetHeuristic(_lt_handle(device), desc, a_desc, b_desc, c_desc, c_desc,
                                                       pref, 1, ctypes.byref(result), ctypes.byref(count))
        finally:
            lt.cublasLtMatmulPreferenceDestroy(pref)
        if status != 0 or count.value < 1 or result.state != 0 or result.workspace_size > ws_bytes:
            _lt_plans[key] = None
            return None
        owner.result = result
        plan = _lt_plans[key] = (desc.value, a_desc.value, b_desc.value, c_desc.value,
                                 ctypes.addressof(result.algo), result.workspace_size, owner)
        return plan


def gemm_batched(dtype, precision: str, m: int, n: int, k: int, a_ptrs: int, lda: int, b_ptrs: int, ldb: int,
                 c_ptrs: int, ldc: int, batch: int, beta: float = 0.0, *, trans_a: str = "N", trans_b: str = "N",
                 c_dtype=None, stream: int = None) -> None:
    """As :func:`gemm`, with operands given by device arrays of ``batch`` pointers (``cublasGemmBatchedEx``):
    for batches that no single stride describes, such as (sample, group) pairs."""
    _check_dims(m, n, k, lda, ldb, ldc, batch)
    if min(m, n, batch) == 0:
        return
    device = _current_device()
    lib, handle, alpha, beta_s, data_type, c_type, compute = _prepare(
        dtype, precision, c_dtype, beta, device, _current_stream() if stream is None else stream)
    _check(lib.cublasGemmBatchedEx(
        handle, _OP[trans_a], _OP[trans_b], m, n, k,
        alpha.ctypes.data, a_ptrs, data_type, lda, b_ptrs, data_type, ldb,
        beta_s.ctypes.data, c_ptrs, c_type, ldc,
        batch, compute, _GEMM_DEFAULT), f"cublasGemmBatchedEx(m={m}, n={n}, k={k}, batch={batch})")


@functools.lru_cache(maxsize=None)
def _types(dtype, precision: str, c_dtype):
    """(alpha scalar type, A/B data type, C data type, compute type) of a GEMM (memoized: ``dtype.name``
    alone costs a microsecond)."""
    dtype = numpy.dtype(dtype)
    c_dtype = dtype if c_dtype is None else numpy.dtype(c_dtype)
    compute, scalar_type = _compute_type(dtype, precision)
    return scalar_type, _DATA_TYPES[dtype.name], _DATA_TYPES[c_dtype.name], compute


def _check_dims(m, n, k, lda, ldb, ldc, batch) -> None:
    if max(m, n, k, lda, ldb, ldc, batch) >= 2**31:
        raise NotImplementedError(f"cuconv: GEMM dimension exceeds cuBLAS's 32-bit limit "
                                  f"(m={m}, n={n}, k={k}, lda={lda}, ldb={ldb}, ldc={ldc}, batch={batch})")


def _prepare(dtype, precision, c_dtype, beta, device: int, stream: int):
    """Per-call state of the classic entry points: the handle bound to ``stream`` with this stream's
    workspace, host scalars, data and compute types."""
    scalar_type, data_type, c_type, compute = _types(dtype, precision, c_dtype)
    lib = _lib()
    handle = _handle(device)
    bound = _handles.bound  # per thread, as the handles: the stream and workspace each handle was given last
    if bound.get(device) != stream:
        _check(lib.cublasSetStream_v2(handle, stream), "cublasSetStream")
        ws_ptr, ws_bytes = _workspace(device, stream)
        _check(lib.cublasSetWorkspace_v2(handle, ws_ptr, ws_bytes), "cublasSetWorkspace")
        # a stream being captured without a workspace of its own is bound again next time (it may get one)
        bound[device] = stream if ws_ptr is not None else None
    return (lib, handle, _SCALARS[(scalar_type, 1.0)], _SCALARS[(scalar_type, float(beta))], data_type, c_type,
            compute)


def alignment(offset: int, stride_bytes: int, base_aligned: bool, itemsize: int) -> int:
    """The alignment class (bytes, at most 256) of a batch of matrices ``offset`` bytes and multiples of
    ``stride_bytes`` past a base pointer that is 256-byte aligned (``base_aligned``) or only element-aligned."""
    return _alignment(offset | (0 if base_aligned else itemsize), stride_bytes)


class PreparedGemm:
    """One GEMM (``gemm``'s arguments but the pointers) of fixed shapes, strides, pointer alignments (bytes,
    see ``alignment``) and device, made on that device: a call ``(a, b, c, stream, workspace)`` is one
    ``cublasLtMatmul`` with its plan's descriptors and algorithm. ``workspace`` is the bytes of device memory
    the algorithm needs at the call's ``workspace`` pointer (the caller's: a plan's workspace, so that CUDA
    graphs capture it with the rest). Where cuBLASLt has no algorithm the call goes through the classic
    ``cublasGemmStridedBatchedEx`` (and its own per-stream workspace). With ``bias`` the call takes a sixth
    pointer, a vector of m elements of C's type added to every column in the epilogue (before C's one rounding)
    where cuBLASLt has an algorithm for it: ``fuses_bias`` says whether it does (else the bias is ignored and the
    caller adds it itself)."""

    __slots__ = ("workspace", "fuses_bias", "_args", "_classic", "_device", "_bias")

    def __init__(self, dtype, precision: str, m: int, n: int, k: int, lda: int, stride_a: int, ldb: int,
                 stride_b: int, ldc: int, stride_c: int, batch: int, beta: float = 0.0, *, trans_a: str = "N",
                 trans_b: str = "N", c_dtype=None, align=(_LT_MAX_ALIGNMENT,) * 3, device: int = None,
                 bias: bool = False):
        _check_dims(m, n, k, lda, ldb, ldc, batch)
        self._device = _current_device() if device is None else device
        self.workspace = 0
        self.fuses_bias = False
        self._args = self._classic = self._bias = None
        if min(m, n, batch) == 0:
            return  # nothing to compute: a call does nothing
        types = _types(dtype, precision, c_dtype)
        plan = None
        if k > 0:
            strides = (stride_a, stride_b, stride_c) if batch > 1 else (0, 0, 0)
            key = (self._device, types, trans_a, trans_b, m, n, k, lda, strides[0], ldb, strides[1], ldc, strides[2],
                   batch, *align, _WORKSPACE_BYTES, bias)
            plan = _lt_plans.get(key)
            if plan is None and key not in _lt_plans:
                plan = _lt_plan(key)
        if plan is None:  # k == 0 (C = beta·C), or no cuBLASLt algorithm
            self._classic = (dtype, precision, c_dtype, beta, _OP[trans_a], _OP[trans_b], m, n, k, lda, stride_a, ldb,
                             stride_b, ldc, stride_c, batch)
            return
        desc, a_desc, b_desc, c_desc, algo, needed, _ = plan
        if bias:
            self._bias = _BiasDesc(types, trans_a, trans_b)
            desc, self.fuses_bias = self._bias.desc, True
        scalar_type = types[0]
        self.workspace = needed
        # (the plan rides along: holding it keeps its descriptors alive, _LtPlanOwner)
        self._args = (_lt().cublasLtMatmul, desc, _SCALAR_PTRS[(scalar_type, 1.0)], a_desc, b_desc,
                      _SCALAR_PTRS[(scalar_type, float(beta))], c_desc, algo, needed, plan, m, n, k, batch)

    def __call__(self, a: int, b: int, c: int, stream: int, workspace: int, bias: int = 0) -> None:
        args = self._args
        if args is not None:
            fn, desc, alpha, a_desc, b_desc, beta, c_desc, algo, needed, _, m, n, k, batch = args
            if self._bias is None:
                status = fn(_lt_handle(self._device), desc, alpha, a, a_desc, b, b_desc, beta, c, c_desc, c, c_desc,
                            algo, workspace if needed else None, needed, stream)
            else:
                with self._bias.lock:
                    self._bias.point(bias)
                    status = fn(_lt_handle(self._device), desc, alpha, a, a_desc, b, b_desc, beta, c, c_desc, c,
                                c_desc, algo, workspace if needed else None, needed, stream)
            if status:  # (the message is built only on failure: formatting it costs host time)
                _check(status, f"cublasLtMatmul(m={m}, n={n}, k={k}, batch={batch})")
            return
        if self._classic is None:
            return
        (dtype, precision, c_dtype, beta, op_a, op_b, m, n, k, lda, stride_a, ldb, stride_b, ldc, stride_c,
         batch) = self._classic
        lib, handle, alpha, beta_s, data_type, c_type, compute = _prepare(dtype, precision, c_dtype, beta,
                                                                          self._device, stream)
        _check(lib.cublasGemmStridedBatchedEx(
            handle, op_a, op_b, m, n, k, alpha.ctypes.data, a, data_type, lda, stride_a, b, data_type, ldb, stride_b,
            beta_s.ctypes.data, c, c_type, ldc, stride_c, batch, compute, _GEMM_DEFAULT),
            f"cublasGemmStridedBatchedEx(m={m}, n={n}, k={k}, batch={batch})")
