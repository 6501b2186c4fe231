// Device helpers shared by every kernel family in kernels_cu/.
//
// Conversions between storage types (__half, __nv_bfloat16, float, double) and the float/double
// arithmetic type, and a 16-byte vector of any storage type for coalesced wide stores.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace cuconv {

typedef long long i64;

// A convolution's geometry as ConvSpec holds it, the one struct argument of the kernels that take no more
// (CONV_GEOMETRY_DTYPE in cuconv/_loader.py has this layout): x (n, c, h, w), w (k, c / groups, r, s), out
// (n, k, p, q); the top and left padding (the bottom and right follow from p, q).
struct ConvGeometry {
    long long n, c, h, w, k, p, q, r, s, groups, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w;
};
static_assert(sizeof(ConvGeometry) == 128, "CONV_GEOMETRY_DTYPE in cuconv/_loader.py has this layout");

// Arithmetic type for a storage type: half precisions compute in float.
template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };

template <typename T> __device__ __forceinline__ typename Acc<T>::type to_acc(T v) {
    return static_cast<typename Acc<T>::type>(v);
}
template <> __device__ __forceinline__ float to_acc<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_acc<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}

template <typename T> __device__ __forceinline__ T from_acc(typename Acc<T>::type v) {
    return static_cast<T>(v);
}
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

// Zero of any storage type without relying on converting constructors.
template <typename T> __device__ __forceinline__ T zero() { return from_acc<T>(0); }

// VecWidth<T>::value elements of T make 16 bytes.
template <typename T> struct VecWidth { static const int value = 16 / sizeof(T); };

template <typename T> struct __align__(16) Vec16 {
    T v[VecWidth<T>::value];
};

// ---- cp.async (sm_80+): global -> shared copies that bypass registers, in commit groups ----------------

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Bytes = 4, 8 or 16, through L1. valid == false reads nothing (src-size 0) and zero-fills the destination:
// the padding of a convolution costs no branch.
template <int Bytes>
__device__ __forceinline__ void cp_async_ca(unsigned dst, const void* src, bool valid) {
    static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async.ca copies 4, 8 or 16 bytes");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(Bytes),
                 "r"(valid ? Bytes : 0));
}

// 16 bytes bypassing L1 (operands read once per block).
__device__ __forceinline__ void cp_async_cg16(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Wait until at most N of this thread's most recent commit groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace cuconv
