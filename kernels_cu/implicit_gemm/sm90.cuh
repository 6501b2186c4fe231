// What the sm_90a engines of implicit_gemm share (wgmma.cu, wgmma_tma.cu, wgrad_tma.cu, wgmma_nchw.cu): the
// wgmma descriptors and instructions, mbarriers, TMA copies and their ring of slots, and the wgmma epilogue.
// CUCONV_IGEMM_WGMMA is defined where the target is sm_90a; elsewhere the kernels compile to a trap.
#pragma once

#include "implicit_gemm/igemm.cuh"

namespace cuconv {
namespace igemm {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CUCONV_IGEMM_WGMMA 1
#endif

// Descriptor of a K-major tile of KB-byte rows (128, 64 or 32) stored with the KB-byte swizzle at shared address
// `addr` (atoms of 8 rows, 8·KB bytes, aligned to their size): start address, leading byte offset unused (1),
// stride byte offset 8·KB (one atom), all in 16-byte units; layout type 1, 2, 3 = 128-, 64-, 32-byte swizzle.
template <int KB = 128> __device__ __forceinline__ unsigned long long wgmma_desc(unsigned addr) {
    static_assert(KB == 128 || KB == 64 || KB == 32, "a swizzle wgmma reads");
    constexpr unsigned long long kLayout = KB == 128 ? 1 : KB == 64 ? 2 : 3;
    return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) | (1ull << 16) |
           (static_cast<unsigned long long>(KB / 2) << 32) | (kLayout << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// cp.async writes through the generic proxy, wgmma reads through the async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// A tensor map (cuTensorMapEncode*, cuconv/_tma.py): 128 opaque bytes, passed as a __grid_constant__ kernel
// parameter so that the TMA reads it where the launch put it.
struct alignas(64) TensorMap {
    unsigned long long bits[16];
};

// mbarriers (shared memory, CTA scope; try_wait is sm_90): init with the arrivals a phase needs, arrive, and
// wait until the phase of the given parity has completed.
#ifdef CUCONV_IGEMM_WGMMA
__device__ __forceinline__ void mbarrier_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(unsigned bar) {
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

// A ring of STAGES slots' barriers, 8 bytes apart: slot s's full barrier completes on the producer's one arrival
// (with the slot's byte count) and its copies, its empty one on every consumer thread's arrival.
template <int STAGES> __device__ __forceinline__ void init_ring(unsigned full, unsigned empty, unsigned consumers) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
        mbarrier_init(full + 8 * s, 1);
        mbarrier_init(empty + 8 * s, consumers);
    }
}

// The tensor memory accelerator (TMA, TensorMap below): bulk copies of a tensor map's boxes into shared memory
// that complete on an mbarrier, which the issuing thread first tells how many bytes to expect.
__device__ __forceinline__ void mbarrier_expect_bytes(unsigned bar, unsigned bytes) {
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n"
                 ::"r"(bar), "r"(bytes) : "memory");
}
// A column of an NHWC tensor's im2col matrix: the box's pixels (pixelsPerColumn of the map) from window origin
// (w, h) of image n on, walking the map's bounding box of origins (W fastest, then H, then N; past the last image
// and outside the image: zeros), each pixel's channels c.. (channelsPerPixel of the map) at tap offset (ow, oh).
__device__ __forceinline__ void tma_im2col_4d(unsigned dst, const TensorMap& map, int c, int w, int h, int n,
                                              unsigned short ow, unsigned short oh, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8};\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c), "r"(w), "r"(h), "r"(n),
                   "r"(bar), "h"(ow), "h"(oh) : "memory");
}
// A box of an NHWC tensor (a 4-D tiled map: channels, W, H, N) from channel c, column w, row h of image n (outside
// the tensor: zeros).
__device__ __forceinline__ void tma_tile_4d(unsigned dst, const TensorMap& map, int c, int w, int h, int n,
                                            unsigned bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c), "r"(w), "r"(h), "r"(n), "r"(bar)
                 : "memory");
}
// A box of a 3-D tensor from (x, y, z) (outside the tensor: zeros).
__device__ __forceinline__ void tma_tile_3d(unsigned dst, const TensorMap& map, int x, int y, int z, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(x), "r"(y), "r"(z), "r"(bar)
                 : "memory");
}
// A box of a 2-D tensor from column x, row y (rows past the tensor: zeros).
__device__ __forceinline__ void tma_tile_2d(unsigned dst, const TensorMap& map, int x, int y, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(x), "r"(y), "r"(bar) : "memory");
}

// The ring's three steps. The producer takes slot kt % STAGES for tile kt once the consumers released tile
// kt - STAGES from it (phase kt / STAGES - 1 of its empty barrier), tells its full barrier the copies' bytes and
// returns that barrier; a consumer waits for tile kt's full barrier (phase kt / STAGES); once it has issued tile
// kt's wgmmas, it retires tile kt - 1's (one group stays in flight) and releases that tile's slot.
template <int STAGES> __device__ __forceinline__ unsigned ring_fill(unsigned full, unsigned empty, int kt,
                                                                   unsigned bytes) {
    const int s = kt % STAGES;
    if (kt >= STAGES) mbarrier_wait(empty + 8 * s, ((kt / STAGES) - 1) & 1);
    mbarrier_expect_bytes(full + 8 * s, bytes);
    return full + 8 * s;
}
template <int STAGES> __device__ __forceinline__ void ring_wait_full(unsigned full, int kt) {
    mbarrier_wait(full + 8 * (kt % STAGES), (kt / STAGES) & 1);
}
template <int STAGES> __device__ __forceinline__ void ring_release_previous(unsigned empty, int kt) {
    wgmma_wait<1>();
    if (kt > 0) mbarrier_arrive(empty + 8 * ((kt - 1) % STAGES));
}
#endif

// Pin the accumulators at this point of the program: the compiler sees only the wgmma's asm statement
// write them, not the asynchronous completion that wgmma_wait marks.
template <int N> __device__ __forceinline__ void fence_acc(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define CUCONV_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                     "+f"(d[i + 6]), "+f"(d[i + 7])
#define CUCONV_D64 CUCONV_D8(0), CUCONV_D8(8), CUCONV_D8(16), CUCONV_D8(24), CUCONV_D8(32), CUCONV_D8(40), \
                   CUCONV_D8(48), CUCONV_D8(56)
#define CUCONV_D64_LIST "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define CUCONV_WGMMA_M64N128(shape_types, tail)                                                              \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                 \
                 "wgmma.mma_async.sync.aligned.m64n128" shape_types " " CUCONV_D64_LIST ", %64, %65, p, 1, 1" \
                 tail ";\n}\n"                                                                                \
                 : CUCONV_D64                                                                                 \
                 : "l"(a), "l"(b), "r"(1))

#define CUCONV_D32 CUCONV_D8(0), CUCONV_D8(8), CUCONV_D8(16), CUCONV_D8(24)
#define CUCONV_D32_LIST "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define CUCONV_WGMMA_M64N64(shape_types, tail)                                                               \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                 \
                 "wgmma.mma_async.sync.aligned.m64n64" shape_types " " CUCONV_D32_LIST ", %32, %33, p, 1, 1"  \
                 tail ";\n}\n"                                                                                \
                 : CUCONV_D32                                                                                 \
                 : "l"(a), "l"(b), "r"(1))

// d (64 filters x 128 pixels, fp32) += A (64 x k step) · B (128 x k step)ᵀ, both from shared memory.
template <typename T> struct Wgmma;
template <> struct Wgmma<float> {
    static __device__ __forceinline__ void run(float (&d)[64], unsigned long long a, unsigned long long b) {
#ifdef CUCONV_IGEMM_WGMMA
        CUCONV_WGMMA_M64N128("k8.f32.tf32.tf32", "");
#endif
    }
};
template <> struct Wgmma<__half> {
    static __device__ __forceinline__ void run(float (&d)[64], unsigned long long a, unsigned long long b) {
#ifdef CUCONV_IGEMM_WGMMA
        CUCONV_WGMMA_M64N128("k16.f32.f16.f16", ", 0, 0");
#endif
    }
};
template <> struct Wgmma<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float (&d)[64], unsigned long long a, unsigned long long b) {
#ifdef CUCONV_IGEMM_WGMMA
        CUCONV_WGMMA_M64N128("k16.f32.bf16.bf16", ", 0, 0");
#endif
    }
};

// wgrad's products, both operands MN-major (imm-trans-a = imm-trans-b = 1, the 16-bit types only): d (64 filters
// x N channels, fp32, N / 2 a thread) += A (64 filters x 16 pixels, filters contiguous) · B (16 pixels x N
// channels, channels contiguous).
template <typename T> constexpr bool kHalfStorage = false;
template <> constexpr bool kHalfStorage<__half> = true;
template <typename T, int N> struct WgmmaMn {
    static_assert(N == 64 || N == 128, "m64n64 or m64n128");
    static __device__ __forceinline__ void run(float (&d)[N / 2], unsigned long long a, unsigned long long b) {
#ifdef CUCONV_IGEMM_WGMMA
        if constexpr (N == 64 && kHalfStorage<T>)
            CUCONV_WGMMA_M64N64("k16.f32.f16.f16", ", 1, 1");
        else if constexpr (N == 64)
            CUCONV_WGMMA_M64N64("k16.f32.bf16.bf16", ", 1, 1");
        else if constexpr (kHalfStorage<T>)
            CUCONV_WGMMA_M64N128("k16.f32.f16.f16", ", 1, 1");
        else
            CUCONV_WGMMA_M64N128("k16.f32.bf16.bf16", ", 1, 1");
#endif
    }
};

// Descriptor of an MN-major operand at shared address `addr` as wgrad's TMA copies store it: boxes of 64 k rows
// (pixels) × 64 MN elements (128 bytes, the 128-byte swizzle: atoms of 8 rows, 1024 bytes), one box after the
// other along MN. Leading byte offset: the next 64 MN elements (the next box, 8192 bytes on); stride byte offset:
// the next 8 k rows (1024 bytes); 16-byte units; layout type 1 (128-byte swizzle).
constexpr unsigned kMnBoxBytes = 64 * 128;
__device__ __forceinline__ unsigned long long wgmma_desc_mn(unsigned addr) {
    constexpr unsigned long long kLeading = kMnBoxBytes >> 4, kStride = 1024 >> 4;
    return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) | (kLeading << 16) | (kStride << 32) | (1ull << 62);
}

// Descriptor of a K-major operand without swizzle whose rows are 16 bytes apart (8-row core matrices one after
// the other: stride byte offset 128) and whose 16-byte k chunks are `chunk_bytes` apart (leading byte offset):
// implicit_gemm_wgmma_tma_rows's band of input pixels, read from any pixel on (a start 16 bytes further is the
// operand one pixel further: no swizzle atom to stay aligned to). 16-byte units; layout type 0.
__device__ __forceinline__ unsigned long long wgmma_desc_rows(unsigned addr, unsigned chunk_bytes) {
    return static_cast<unsigned long long>((addr & 0x3FFFF) >> 4) |
           (static_cast<unsigned long long>(chunk_bytes >> 4) << 16) | (static_cast<unsigned long long>(128 >> 4) << 32);
}

// Bytes of the epilogue's fp32 staging of a BF x BP tile: [BF][BP + 4], or [BP][BF + 4] for channels-last vectors
// (nhwc_vectors), whichever is larger (the Python twin's _staging_bytes).
template <int BF, int BP> __host__ __device__ constexpr int staging_bytes() {
    return 4 * (BF * (BP + 4) > BP * (BF + 4) ? BF * (BP + 4) : BP * (BF + 4));
}

// One KB-byte k tile of a warpgroup's wgmmas (KB / 32 k steps), committed as one group: its 64 filter rows from
// shared address `a`, its NW × 128 pixel rows from `b` (both KB-byte rows in swizzled atoms of 8); the caller
// waits for the group.
template <typename T, int NW, int KB = 128>
__device__ __forceinline__ void wgmma_k_tile(float (&acc)[NW][64], unsigned a, unsigned b) {
    const unsigned long long da = wgmma_desc<KB>(a);
    const unsigned long long db = wgmma_desc<KB>(b);
    wgmma_fence();
#pragma unroll
    for (int step = 0; step < KB / 32; ++step)
#pragma unroll
        for (int n = 0; n < NW; ++n)  // +2 per 32-byte k step, in 16-byte units; 128 rows of KB bytes per wgmma
            Wgmma<T>::run(acc[n], da + 2 * step, db + 2 * step + n * 128 * (KB / 16));
    wgmma_commit();
}

}  // namespace igemm
}  // namespace cuconv

namespace cuconv {
namespace igemm {

// The epilogue of both wgmma kernels, once every wgmma is retired: accumulators -> shared memory [filter]
// [pixel] at `stage` (the pipeline's slots, free by now) -> NCHW rows, or [pixel][filter] -> channels-last
// vectors (nhwc_vectors). Accumulator i of a thread: filter row
// (lane / 4) + 8·((i / 2) % 2) of its warp's 16, pixel column 2·(lane % 4) + (i % 2) + 8·(i / 4) of the
// wgmma's 128; pairs of columns go as one 8-byte store.
// NAMED: the block has threads besides these (implicit_gemm_wgmma_tma's producer warp, the last one), so they
// meet at named barrier 1 of their own count instead of __syncthreads.
template <int kThreads, bool NAMED> __device__ __forceinline__ void epilogue_sync() {
    if constexpr (NAMED)
        asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
    else
        __syncthreads();
}

template <typename T, int BF, int BP, int WG_P, int NW, bool NAMED = false>
__device__ __forceinline__ void wgmma_epilogue(float (&acc)[NW][64], unsigned char* stage, const Geometry& g,
                                               const Epi<T>& ep, T* __restrict__ y, int m0, int n0) {
    constexpr int kThreads = BF / 64 * WG_P * 128;
    constexpr int kWgPixels = BP / WG_P;
    cp_async_wait<0>();
    epilogue_sync<kThreads, NAMED>();
    float* c_smem = reinterpret_cast<float*>(stage);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid / 32, wg = tid / 128;
    const int wg_f = wg % (BF / 64), wg_p = wg / (BF / 64);
    const int row = wg_f * 64 + (warp % 4) * 16 + lane / 4;
    if (nhwc_vectors(g, y, ep)) {  // [pixel][filter], pitch BF + 4: a warp's 8 columns x 8 rows hit 32 banks
        constexpr int kFPitch = BF + 4;
#pragma unroll
        for (int n = 0; n < NW; ++n)
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                const int col = wg_p * kWgPixels + n * 128 + 8 * j + 2 * (lane % 4);
                c_smem[col * kFPitch + row] = acc[n][4 * j];
                c_smem[(col + 1) * kFPitch + row] = acc[n][4 * j + 1];
                c_smem[col * kFPitch + row + 8] = acc[n][4 * j + 2];
                c_smem[(col + 1) * kFPitch + row + 8] = acc[n][4 * j + 3];
            }
        epilogue_sync<kThreads, NAMED>();
        store_tile_nhwc_any<T, BP, BF, kThreads / 32>(c_smem, g, ep, y, m0, n0, tid);
        return;
    }
    constexpr int kCPitch = BP + 4;  // rows 4 banks apart: a warp's 8 rows x 8 columns hit 32 banks
#pragma unroll
    for (int n = 0; n < NW; ++n)
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int col = wg_p * kWgPixels + n * 128 + 8 * j + 2 * (lane % 4);
            *reinterpret_cast<float2*>(&c_smem[row * kCPitch + col]) = make_float2(acc[n][4 * j], acc[n][4 * j + 1]);
            *reinterpret_cast<float2*>(&c_smem[(row + 8) * kCPitch + col]) =
                make_float2(acc[n][4 * j + 2], acc[n][4 * j + 3]);
        }
    epilogue_sync<kThreads, NAMED>();
    store_tile<T, BP, BF, kThreads / 32>(c_smem, g, ep, y, m0, n0, warp, lane);
}

}  // namespace igemm
}  // namespace cuconv
