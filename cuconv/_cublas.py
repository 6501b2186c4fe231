"""cuBLAS GEMMs for every dtype and precision cuconv offers, callable during CUDA-graph capture.

One entry point, ``gemm``: ``cublasGemmStridedBatchedEx`` on CuPy's current stream. We call libcublas
through ctypes with a handle of our own (per device and thread) rather than through ``cupy.cuda.cublas``,
because CuPy refuses every cuBLAS call while a stream is being captured into a CUDA graph
(``NotImplementedError: calling cuBLAS API during stream capture``) and capture is part of our contract
(``cuconv.nn`` under ``torch.cuda.graph``). Owning the handle also keeps its math mode ours: "ieee"
float32 can never be turned into TF32 by someone else's setting. The library itself is the one CuPy loads.

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

__all__ = ["gemm", "gemm_batched"]

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

# Host-mode scalars: cuBLAS reads them before the call returns; module-level so no allocation per call.
_SCALARS = {(numpy.float32, v): numpy.full((), v, numpy.float32) for v in (0.0, 1.0)}
_SCALARS.update({(numpy.float64, v): numpy.full((), v, numpy.float64) for v in (0.0, 1.0)})


@functools.lru_cache(maxsize=None)
def _lib():
    """libcublas as CuPy loads it (cuda-pathfinder), with the prototypes we call."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        lib = ctypes.CDLL(load_nvidia_dynamic_lib("cublas").abs_path)
    except Exception:  # no cuda-pathfinder: the system's library
        import ctypes.util

        name = ctypes.util.find_library("cublas")
        if name is None:
            raise RuntimeError("cuconv: libcublas not found (install CuPy's CUDA extra, e.g. cuconv[cuda13])")
        lib = ctypes.CDLL(name)
    vp, i32, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_size_t
    protos = {
        "cublasCreate_v2": [ctypes.POINTER(vp)],
        "cublasSetStream_v2": [vp, vp],
        "cublasSetWorkspace_v2": [vp, vp, sz],
        "cublasSetMathMode": [vp, i32],
        "cublasSetPointerMode_v2": [vp, i32],
        "cublasGemmStridedBatchedEx": [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, i64, vp, i32, i32, i64,
                                       vp, vp, i32, i32, i64, i32, i32, i32],
        "cublasGemmBatchedEx": [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, vp, i32, i32, vp, vp, i32, i32,
                                i32, i32, i32],
    }
    for name, argtypes in protos.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return lib


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
    from cupy.cuda import runtime

    key = (device, stream)
    ptr = _workspaces.get(key)
    if ptr is None:
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
         c_dtype=None) -> None:
    """Column-major ``C[i] (m×n) = op(A[i]) (m×k) @ op(B[i]) (k×n) (+ beta·C[i])`` for ``i < batch``.

    ``op`` is the identity (``"N"``) or the transpose (``"T"``). Pointers are raw device addresses;
    strides are in elements of their operand and may be 0 (a shared operand). ``c_dtype`` (default
    ``dtype``) may be float32 for float16/bfloat16 inputs, so that sums over several GEMMs stay in fp32.
    With ``beta == 0`` C is never read, so a NaN-poisoned output is fully overwritten. Runs on CuPy's
    current stream of the current device.
    """
    lib, handle, alpha, beta_s, data_type, c_type, compute = _prepare(
        dtype, precision, c_dtype, beta, (m, n, k, lda, ldb, ldc, batch))
    if min(m, n, batch) == 0:
        return
    _check(lib.cublasGemmStridedBatchedEx(
        handle, _OP[trans_a], _OP[trans_b], m, n, k,
        alpha.ctypes.data, a_ptr, data_type, lda, stride_a,
        b_ptr, data_type, ldb, stride_b,
        beta_s.ctypes.data, c_ptr, c_type, ldc, stride_c,
        batch, compute, _GEMM_DEFAULT), f"cublasGemmStridedBatchedEx(m={m}, n={n}, k={k}, batch={batch})")


def gemm_batched(dtype, precision: str, m: int, n: int, k: int, a_ptrs: int, lda: int, b_ptrs: int, ldb: int,
                 c_ptrs: int, ldc: int, batch: int, beta: float = 0.0, *, trans_a: str = "N", trans_b: str = "N",
                 c_dtype=None) -> None:
    """As :func:`gemm`, with operands given by device arrays of ``batch`` pointers (``cublasGemmBatchedEx``):
    for batches that no single stride describes, such as (sample, group) pairs."""
    lib, handle, alpha, beta_s, data_type, c_type, compute = _prepare(
        dtype, precision, c_dtype, beta, (m, n, k, lda, ldb, ldc, batch))
    if min(m, n, batch) == 0:
        return
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


def _prepare(dtype, precision, c_dtype, beta, dims):
    """Checks and per-call state shared by both GEMM entry points: the handle on the current stream with
    this stream's workspace, host scalars, data and compute types."""
    import cupy

    if max(dims) >= 2**31:
        m, n, k, lda, ldb, ldc, batch = dims
        raise NotImplementedError(f"cuconv: GEMM dimension exceeds cuBLAS's 32-bit limit "
                                  f"(m={m}, n={n}, k={k}, lda={lda}, ldb={ldb}, ldc={ldc}, batch={batch})")
    scalar_type, data_type, c_type, compute = _types(dtype, precision, c_dtype)
    lib = _lib()
    device = cupy.cuda.runtime.getDevice()
    stream = cupy.cuda.get_current_stream().ptr
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
