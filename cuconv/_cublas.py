"""cuBLAS GEMMs through CuPy's low-level bindings, for every dtype and precision cuconv offers.

All calls are ``cublasGemmStridedBatchedEx`` on CuPy's current stream (the binding sets the stream on the
per-thread, per-device handle before each call). cuBLAS is column-major: a row-major ``C = A @ B`` is the
column-major ``Cᵀ = Bᵀ Aᵀ``; callers describe their problem column-major (see ``gemm``).
"""

from __future__ import annotations

import numpy

__all__ = ["gemm"]

# cublasComputeType_t and cudaDataType_t values (cublas_api.h, library_types.h); the names are what
# CuPy exposes, the values are fixed by the CUDA ABI.
_CUDA_R_16F, _CUDA_R_32F, _CUDA_R_64F, _CUDA_R_16BF = 2, 0, 1, 14
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32, _COMPUTE_64F = 68, 77, 70
_GEMM_DEFAULT = -1
_OP = {"N": 0, "T": 1}
_DEFAULT_MATH, _TF32_TENSOR_OP_MATH, _MATH_MODE_MASK = 0, 3, 0xF
_POINTER_MODE_HOST = 0

# Host scalars must outlive the (asynchronous) call: cuBLAS reads host-mode scalars before returning,
# but keeping them module-level avoids any doubt and any allocation per call.
_SCALARS = {
    (numpy.float32, 0.0): numpy.zeros((), numpy.float32), (numpy.float32, 1.0): numpy.ones((), numpy.float32),
    (numpy.float64, 0.0): numpy.zeros((), numpy.float64), (numpy.float64, 1.0): numpy.ones((), numpy.float64),
}

_DATA_TYPES = {"float16": _CUDA_R_16F, "bfloat16": _CUDA_R_16BF, "float32": _CUDA_R_32F,
               "float64": _CUDA_R_64F}


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
    With ``beta == 0`` C is never read, so a NaN-poisoned output is fully overwritten.
    """
    from cupy.cuda import cublas, device

    dtype = numpy.dtype(dtype)
    c_dtype = dtype if c_dtype is None else numpy.dtype(c_dtype)
    if max(m, n, k, lda, ldb, ldc, batch) >= 2**31:
        raise NotImplementedError(f"cuconv: GEMM dimension exceeds cuBLAS's 32-bit limit "
                                  f"(m={m}, n={n}, k={k}, lda={lda}, ldb={ldb}, ldc={ldc}, batch={batch})")
    data_type = _DATA_TYPES[dtype.name]
    compute, scalar_type = _compute_type(dtype, precision)
    alpha = _SCALARS[(scalar_type, 1.0)]
    beta_s = _SCALARS[(scalar_type, float(beta))]
    handle = device.get_cublas_handle()
    cublas.setPointerMode(handle, _POINTER_MODE_HOST)
    # fp32 "ieee" must not silently become TF32 if someone (CUPY_TF32=1) set TF32 math on the handle.
    saved_mode = None
    if compute == _COMPUTE_32F and dtype == numpy.float32:
        mode = cublas.getMathMode(handle)
        if mode & _MATH_MODE_MASK == _TF32_TENSOR_OP_MATH:
            saved_mode = mode
            cublas.setMathMode(handle, (mode & ~_MATH_MODE_MASK) | _DEFAULT_MATH)
    try:
        cublas.gemmStridedBatchedEx(
            handle, _OP[trans_a], _OP[trans_b], m, n, k,
            alpha.ctypes.data,
            a_ptr, data_type, lda, stride_a,
            b_ptr, data_type, ldb, stride_b,
            beta_s.ctypes.data,
            c_ptr, _DATA_TYPES[c_dtype.name], ldc, stride_c,
            batch, compute, _GEMM_DEFAULT)
    finally:
        if saved_mode is not None:
            cublas.setMathMode(handle, saved_mode)
