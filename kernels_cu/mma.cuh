// Tensor-core helpers shared by the mma.sync kernels (implicit_gemm, grouped_mma; depthwise takes its words):
// TF32 rounding, 32-bit words of two 16-bit elements, and one m16n8 MMA step per storage type with fp32 accumulation.
#pragma once

#include "common.cuh"

namespace cuconv {

__device__ __forceinline__ float round_tf32(float v) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return __uint_as_float(r);
}

// Element `i` of the 32-bit word `w` (a float, or one of two 16-bit halves, low first) set to `v`.
__device__ __forceinline__ void put_bits(unsigned& w, int, float v) { w = __float_as_uint(v); }
__device__ __forceinline__ void put_bits(unsigned& w, int i, __half v) {
    const unsigned b = __half_as_ushort(v);
    w = i == 0 ? b : (w | (b << 16));
}
__device__ __forceinline__ void put_bits(unsigned& w, int i, __nv_bfloat16 v) {
    const unsigned b = __bfloat16_as_ushort(v);
    w = i == 0 ? b : (w | (b << 16));
}

// Element `i` (0: the low half) of a word of two 16-bit T, in fp32: the inverse of pair_word.
template <typename T> __device__ __forceinline__ float word_half(unsigned w, int i);
template <> __device__ __forceinline__ float word_half<__half>(unsigned w, int i) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(i == 0 ? w & 0xffffu : w >> 16)));
}
template <> __device__ __forceinline__ float word_half<__nv_bfloat16>(unsigned w, int i) {
    return __uint_as_float(i == 0 ? w << 16 : w & 0xffff0000u);
}

// Two fp32 sums rounded once each to the 16-bit T, as one word (the first in the low half): a store of two
// adjacent channels or filters.
template <typename T> __device__ __forceinline__ unsigned pair_word(float a, float b) {
    unsigned w = 0;
    put_bits(w, 0, from_acc<T>(a));
    put_bits(w, 1, from_acc<T>(b));
    return w;
}

// D += A·B for one m16n8 tile and one 32-byte k step. Fragments: a 4 registers, b 2, c 4 floats.
template <typename T> struct Mma;
template <> struct Mma<float> {  // TF32 m16n8k8
    static __device__ __forceinline__ void run(float (&c)[4], const unsigned (&a)[4], const unsigned* b) {
        asm volatile(
            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
template <> struct Mma<__half> {  // FP16 m16n8k16, fp32 accumulation
    static __device__ __forceinline__ void run(float (&c)[4], const unsigned (&a)[4], const unsigned* b) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
template <> struct Mma<__nv_bfloat16> {  // BF16 m16n8k16, fp32 accumulation
    static __device__ __forceinline__ void run(float (&c)[4], const unsigned (&a)[4], const unsigned* b) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

}  // namespace cuconv
