// implicit_gemm: forward convolution as an implicit GEMM on tensor cores, TF32 / FP16 / BF16; the engines are
// the files of this folder: pack.cu (the packs and split-K's sum), mma_sync.cu (any sm_80+ device),
// wgmma.cu, wgmma_tma.cu, wgrad_tma.cu and wgmma_nchw.cu (warpgroup MMAs on compute capability 9.0, each
// with its own notes). This header holds what they share: the packing's TF32 rounding, the GEMM's
// geometry, the tile loader and the epilogue's stores; sm90.cuh the sm_90a helpers.
//
// GEMM view (one group): out (M = N·P·Q, K) = A (M, R·S·Cp) @ Bᵀ, A never materialised. The input is
// first packed to NHWC with the channels padded to Cp (a multiple of one 16-byte vector: 4 floats, 8
// halves) by `pack_nhwc` (`pack_nhwc_narrow` for narrow pixels), and the weight to (Kp, R·S·Cp rounded
// up to a k tile) by the same launch, both zero-filled, so that:
//   - every 16-byte vector of an A row is 8 (or 4) consecutive channels of one input pixel at one tap:
//     one cp.async with zero fill for padding, out-of-image taps, rows past M and k past R·S·Cp;
//   - the B tile needs no masks at all.
// Shared memory holds STAGES tiles of A (BM rows) and B (BN rows), each row KB bytes of k (KB = 128: 32
// floats or 64 halves; or 64) plus 16 bytes of padding: the 144- (80-) byte pitch makes ldmatrix reads
// conflict-free. Each k step takes 32 bytes of every row: for TF32 that is k = 8 (m16n8k8), for halves
// k = 16 (m16n8k16), and the ldmatrix addressing is byte-for-byte the same for both (the lane addressing in the main loop).
// The epilogue stages the accumulator tile through shared memory as [n][m] and writes NCHW rows of m
// with 128-byte coalesced stores, or, for channels-last outputs in whole 16-byte vectors of filters, as
// [m][n] and writes 16-byte vectors of a pixel's filters (store_tile_nhwc); the epilogue (bias, then a residual
// before or after an activation: Epi) applied in fp32 before the one rounding.
//
// TF32: the pack kernels round float32 to TF32 (cvt.rna) once, so the MMAs see rounded operands.

#pragma once

#include "common.cuh"
#include "epilogue.cuh"
#include "mma.cuh"

namespace cuconv {
namespace igemm {


template <typename T, bool kTf32> __device__ __forceinline__ T prepare(T v) { return v; }
template <> __device__ __forceinline__ float prepare<float, true>(float v) { return round_tf32(v); }

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

}  // namespace igemm
}  // namespace cuconv

using namespace cuconv;

// ---------------------------------------------------------------------------------------------------
// What both GEMM kernels share: the geometry and the tile loader.

namespace cuconv {
namespace igemm {

// Packed input (n, h, w, cp) of this chunk's samples; output channels k and size p x q; kernel r x s,
// stride, top and left padding, dilation; m = n·p·q, the GEMM's M; k_tiles = ceil(r·s·cp / tile k); w_row:
// the packed weight's row length. The output's strides in elements between images and between filters
// (NCHW: k·p·q and p·q; wgrad writes dW (K, C, R, S) from images that are its input channels: r·s and c·r·s).
// Split-K: block z reduces k tiles [z·split_tiles, (z + 1)·split_tiles) and, where split_stride is not 0,
// writes its fp32 partial sums at z·split_stride floats into the output (a workspace the caller sums in a
// fixed order: deterministic). Groups: k is a group's filters and kp its block rows (a multiple of the
// tile's); block row n0 is group grp = n0 / kp, which reads the packed input from element grp·grp_a on, the
// packed weight from row grp·w_rows on (w_rows: a group's rows there) and writes filters from grp·k, its m
// (a group's GEMM rows) its own. The forward's groups split the channels: cp is a group's (its reduction),
// pix the packed input's pixel stride (all groups' channels), grp_a = cp and w_rows = kp. wgrad's split the
// images (x's channels), each group a GEMM of m = C/groups·R·S rows over the whole reduction: pix = cp,
// grp_a a group's images, w_rows = k (dy's filters packed one after another). One group: grp is 0. The
// Python twin builds the same layout (GEOMETRY_DTYPE). Output pixel (p, q) of an image sits at
// p·out_row + q·out_col (q and 1 but where dgrad's phases write every stride-th pixel of dx). block_diag
// (implicit_gemm_wgmma_tma only; 0: none): the width of the groups of a grouped forward whose packed weight is
// block-diagonal, a block's filters n0 .. n0 + cp - 1 against the input channels from n0 on (those of their
// groups; pack_block_diagonal); pix is then the input's pixel pitch (its C channels).
struct Geometry {
    int h, w, cp, k, p, q, r, s, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, m, k_tiles;
    long long w_row, out_img, out_k, split_stride;
    int split_tiles, pix, kp, grp_a, w_rows, out_row, out_col, block_diag;
};
static_assert(sizeof(Geometry) == 128 && alignof(Geometry) == 8,  // 16 ints, 4 long longs from byte 64, 8 ints
              "GEOMETRY_DTYPE in cuconv/algos/implicit_gemm/launch.py has this layout");

// A forward's epilogue as its kernels take it, launch-wide values (EPILOGUE_DTYPE in launch.py): act the
// activation's code (epilogue.cuh; 0: none), res where the residual is added (0: none, 1: before the
// activation, 2: after it), alpha leaky_relu's slope. Runtime values, not template parameters: every
// activation and place would multiply the 116 forward instances by 30, and the branches are uniform across
// the launch, taken once per output element after the main loop.
struct Epilogue {
    int act, res;
    float alpha;
    int unused;
};
static_assert(sizeof(Epilogue) == 16, "EPILOGUE_DTYPE in cuconv/algos/implicit_gemm/launch.py has this layout");

// What the stores apply to the fp32 sums: the bias (or null), the residual r (or null: res 0), lying as the
// output does (the same element offset), and the Epilogue's codes. Backward passes and split-K's partial sums
// take none (Epi<T>{}): their stores write the bare sums.
template <typename T>
struct Epi {
    const T* bias = nullptr;
    const T* r = nullptr;
    int act = 0, res = 0;
    float alpha = 0.f;
};

template <typename T>
__device__ __forceinline__ Epi<T> epi_of(const T* bias, const T* r, const Epilogue& e) {
    Epi<T> ep;
    ep.bias = bias;
    ep.r = r;
    ep.act = e.act;
    ep.res = e.res;
    ep.alpha = e.alpha;
    return ep;
}

template <typename T>
__device__ __forceinline__ Epi<T> bias_only(const T* bias) {
    Epi<T> ep;
    ep.bias = bias;
    return ep;
}

template <typename T>
__device__ __forceinline__ float bias_at(const Epi<T>& ep, long long filter) {
    return ep.bias != nullptr ? to_acc(ep.bias[filter]) : 0.f;
}

// Whether the stores apply more than the bias. Each store loop is compiled twice, kEpi (the activation and the
// residual) and not, and the kernel takes one of them by this launch-wide test: the nine activations' code at
// every element of an unrolled store loop made the plain store's loop 14x longer in PTX (branches around code
// never run), and the large problems' channels-last forwards, issue-bound in that loop, 1.4x slower.
template <typename T>
__device__ __forceinline__ bool epi_full(const Epi<T>& ep) {
    return ep.act != 0 || ep.res != 0;
}

// v (the sum plus its bias) through the residual and the activation; off: the element's offset in the output
// (and in r). The residual is read where its value is needed (rv: a value already loaded, where the caller
// read a vector of them).
template <bool kEpi = true, typename T>
__device__ __forceinline__ float finish(float v, const Epi<T>& ep, float rv) {
    if constexpr (kEpi) v = finish_value<float>(v, ep.act, ep.res, ep.alpha, rv);
    return v;
}

template <bool kEpi = true, typename T>
__device__ __forceinline__ float finish_at(float v, const Epi<T>& ep, long long off) {
    if constexpr (kEpi) {
        return finish(v, ep, ep.res != 0 ? to_acc(ep.r[off]) : 0.f);
    } else {
        return v;
    }
}

// One thread's share of a k tile: the 16-byte vector column `vec` of ROWS_A rows of A (output pixels,
// gathered from the packed input) and ROWS_B rows of B (packed weight rows), every ROWS_PER_PASS-th row
// from `row0`. The caller gives the shared address of its first A and B row at its vector column and the
// distance between its rows, so one loader serves padded (mma.sync) and swizzled (wgmma) layouts.
//
// Per A row two registers: the element offset of the row's top-left input pixel (img, ih0, iw0) in the
// packed chunk (int: the Python twin keeps chunks below 2^31 elements) and ih0, iw0 packed as 16-bit halves
// (images below 32768 per side); ih0 = -32768 marks a row past M and fails every bounds check. The k
// position (tap r, s and channel c of the vector) starts at tile kt0 (split-K) and advances one tile at a
// time, without divisions. B vectors past the reduction (r·s·cp) are zero-filled like A's, so a packed
// weight row needs nothing written past it.
template <typename T, int ROWS_A, int ROWS_B, int ROWS_PER_PASS, int TILE_K>
struct TileLoader {
    static constexpr int A_ITERS = ROWS_A / ROWS_PER_PASS, B_ITERS = ROWS_B / ROWS_PER_PASS;
    static_assert(ROWS_A % ROWS_PER_PASS == 0 && ROWS_B % ROWS_PER_PASS == 0, "tile rows must split over threads");
    int a_off[A_ITERS], a_hw[A_ITERS];
    int kc, ks, kr;
    const T* b_ptr;

    __device__ __forceinline__ TileLoader(const Geometry& g, const T* wp, int m0, int n0, int row0, int vec,
                                          int kt0) {
        const int pq = g.p * g.q;
        const int grp = n0 / g.kp;
#pragma unroll
        for (int i = 0; i < A_ITERS; ++i) {
            const int m = m0 + row0 + i * ROWS_PER_PASS;
            if (m < g.m) {
                const int img = m / pq;
                const int rem = m - img * pq;
                const int op = rem / g.q;
                const int oq = rem - op * g.q;
                const int ih = op * g.stride_h - g.pad_h, iw = oq * g.stride_w - g.pad_w;
                a_off[i] = ((img * g.h + ih) * g.w + iw) * g.pix + grp * g.grp_a;
                a_hw[i] = (ih << 16) | (iw & 0xffff);
            } else {
                a_off[i] = 0;
                a_hw[i] = static_cast<int>(0x80000000u);
            }
        }
        const int k0 = kt0 * TILE_K + vec * (16 / static_cast<int>(sizeof(T)));
        const int tap = k0 / g.cp;
        kc = k0 - tap * g.cp;
        kr = tap / g.s;
        ks = tap - kr * g.s;
        b_ptr = wp + (static_cast<long long>(grp) * g.w_rows + (n0 - grp * g.kp) + row0) * g.w_row + k0;
    }

    // Issue this thread's cp.asyncs of the next k tile; a_dst/b_dst: shared address of its first row.
    __device__ __forceinline__ void load(const Geometry& g, const T* __restrict__ x, unsigned a_dst,
                                         unsigned b_dst, int row_bytes) {
        const bool k_valid = kr < g.r;
        const int dr = kr * g.dil_h, ds = ks * g.dil_w;
        const int offset = (dr * g.w + ds) * g.pix + kc;
#pragma unroll
        for (int i = 0; i < A_ITERS; ++i) {
            const int ih = (a_hw[i] >> 16) + dr, iw = ((a_hw[i] << 16) >> 16) + ds;
            const bool ok = k_valid && static_cast<unsigned>(ih) < static_cast<unsigned>(g.h) &&
                            static_cast<unsigned>(iw) < static_cast<unsigned>(g.w);
            cp_async_ca<16>(a_dst + i * ROWS_PER_PASS * row_bytes, x + (ok ? a_off[i] + offset : 0), ok);
        }
#pragma unroll
        for (int i = 0; i < B_ITERS; ++i)
            cp_async_cg16(b_dst + i * ROWS_PER_PASS * row_bytes,
                          k_valid ? b_ptr + static_cast<long long>(i) * ROWS_PER_PASS * g.w_row : b_ptr, k_valid);
        b_ptr += TILE_K;
        kc += TILE_K;
        while (kc >= g.cp) { kc -= g.cp; if (++ks == g.s) { ks = 0; ++kr; } }
    }
};

// Four consecutive elements at p (4-element aligned) in one vector load, as fp32.
template <typename T>
__device__ __forceinline__ void load4_acc(const T* p, float (&out)[4]) {
    if constexpr (sizeof(T) == 4) {
        const float4 f = *reinterpret_cast<const float4*>(p);
        out[0] = f.x, out[1] = f.y, out[2] = f.z, out[3] = f.w;
    } else {
        const uint2 u = *reinterpret_cast<const uint2*>(p);
        const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
        for (int i = 0; i < 4; ++i) out[i] = to_acc(e[i]);
    }
}

// The epilogue's second half, shared by all GEMM kernels: the block's fp32 tile, staged in shared memory as
// c_smem[filter][pixel] (pitch BM + 4), goes to NCHW rows (or, where filters are adjacent, out_k == 1, to
// channels-last pixels, lanes along the filters) with bias added before the one rounding. A warp
// writes one filter's BM pixels at a time. Where the tile's pixels are one run of a single image, stored
// densely, and the runs are aligned (the run's start and P·Q multiples of 4, the output 4-element aligned; a
// row-band tile's run starts where its output row does) a lane writes 4 consecutive pixels per store, 128
// pixels of a filter row per warp store; elsewhere 32 pixels per store
// (whole 128-byte runs in fp32 where dense), each pixel's image and place found on its own.
template <typename T, int BM, int BN, int WARPS, bool kEpi = true>
__device__ __forceinline__ void store_tile_nchw(const float* c_smem, const Geometry& g, const Epi<T>& ep,
                                                T* __restrict__ y, int m0, int n0, int warp, int lane) {
    constexpr int kCPitch = BM + 4;
    constexpr int kCols = BM / 32;  // output pixels per lane per channel
    const int pq = g.p * g.q;
    const int grp = n0 / g.kp;  // the group's filters, from filter grp·k of the output
    const long long filter0 = static_cast<long long>(grp) * g.k;
    n0 -= grp * g.kp;
    if constexpr (BM % 128 == 0) {
        const int img = m0 / pq, rem = m0 - img * pq;
        if (rem + BM <= pq && m0 + BM <= g.m && rem % 4 == 0 && pq % 4 == 0 && g.out_img % 4 == 0 && g.out_k % 4 == 0 &&
            g.out_col == 1 && g.out_row == g.q &&
            reinterpret_cast<unsigned long long>(y) % (4 * sizeof(T)) == 0 &&
            (!kEpi || ep.res == 0 || reinterpret_cast<unsigned long long>(ep.r) % (4 * sizeof(T)) == 0)) {
            const long long base = img * g.out_img + rem + 4 * lane;
            T* yl = y + base;
            constexpr int kJ = BM / 128;
            // A warp's filter rows kAhead at a time, their residual (where there is one) loaded before any of their
            // stores: the stores are asm volatile with a memory clobber, which keeps a load between them from
            // moving ahead (measured: 0.83-1.05x the time of the load beside each row, the most on 56x56 planes).
            constexpr int kAhead = 4;
            for (int nl0 = warp; nl0 < BN; nl0 += WARPS * kAhead) {
                float rv[kAhead][kJ][4] = {};
                if constexpr (kEpi) {
                    if (ep.res != 0) {
#pragma unroll
                        for (int u = 0; u < kAhead; ++u) {
                            const int nl = nl0 + u * WARPS, n = n0 + nl;
                            if (nl < BN && n < g.k) {
#pragma unroll
                                for (int j = 0; j < kJ; ++j)
                                    load4_acc(ep.r + base + (filter0 + n) * g.out_k + 128 * j, rv[u][j]);
                            }
                        }
                    }
                }
#pragma unroll
                for (int u = 0; u < kAhead; ++u) {
                    const int nl = nl0 + u * WARPS, n = n0 + nl;
                    if (nl >= BN || n >= g.k) break;
                    const float b = bias_at(ep, filter0 + n);
                    T* dst = yl + (filter0 + n) * g.out_k;
#pragma unroll
                    for (int j = 0; j < kJ; ++j) {
                        float4 v = *reinterpret_cast<const float4*>(&c_smem[nl * kCPitch + 128 * j + 4 * lane]);
                        v.x = finish<kEpi>(v.x + b, ep, rv[u][j][0]);
                        v.y = finish<kEpi>(v.y + b, ep, rv[u][j][1]);
                        v.z = finish<kEpi>(v.z + b, ep, rv[u][j][2]);
                        v.w = finish<kEpi>(v.w + b, ep, rv[u][j][3]);
                        // (in PTX: the C++ float4 store came out of NVRTC as four 4-byte stores)
                        if constexpr (sizeof(T) == 4) {
                            asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst + 128 * j),
                                         "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
                        } else {
                            unsigned lo, hi;
                            put_bits(lo, 0, from_acc<T>(v.x));
                            put_bits(lo, 1, from_acc<T>(v.y));
                            put_bits(hi, 0, from_acc<T>(v.z));
                            put_bits(hi, 1, from_acc<T>(v.w));
                            asm volatile("st.global.v2.b32 [%0], {%1, %2};\n" ::"l"(dst + 128 * j), "r"(lo), "r"(hi)
                                         : "memory");
                        }
                    }
                }
            }
            return;
        }
    }
    if (g.out_k == 1) {  // filters adjacent (channels-last, or one output pixel a plane)
        // lanes along filters, a warp storing one pixel's run of filters at a time (reads of c_smem BM + 4
        // words apart: 4-way banked; whole 16-byte vectors of filters take store_tile_nhwc instead)
        for (int ml = warp; ml < BM; ml += WARPS) {
            const int m = m0 + ml;
            if (m >= g.m) break;
            const int img = m / pq, rem = m - img * pq, op = rem / g.q;
            const long long off = img * g.out_img + op * g.out_row + (rem - op * g.q) * g.out_col + filter0;
            for (int nl = lane; nl < BN; nl += 32) {
                const int n = n0 + nl;
                if (n >= g.k) break;
                const float v = c_smem[nl * kCPitch + ml] + bias_at(ep, filter0 + n);
                y[off + n] = from_acc<T>(finish_at<kEpi>(v, ep, off + n));
            }
        }
        return;
    }
    long long out_off[kCols];
    bool m_ok[kCols];
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
        const int m = m0 + lane + 32 * j;
        m_ok[j] = m < g.m;
        const int img = m_ok[j] ? m / pq : 0, rem = m - img * pq, op = rem / g.q;
        out_off[j] = img * g.out_img + op * g.out_row + (rem - op * g.q) * g.out_col;
    }
    for (int nl = warp; nl < BN; nl += WARPS) {
        const int n = n0 + nl;
        if (n >= g.k) break;
        const float b = bias_at(ep, filter0 + n);
        const long long fo = (filter0 + n) * g.out_k;
#pragma unroll
        for (int j = 0; j < kCols; ++j)
            if (m_ok[j])
                y[fo + out_off[j]] = from_acc<T>(finish_at<kEpi>(c_smem[nl * kCPitch + lane + 32 * j] + b, ep,
                                                           fo + out_off[j]));
    }
}

// Channels-last outputs in whole 16-byte vectors of filters (filters adjacent, out_k == 1; K, the pixels'
// strides and y vector-aligned; not split over k): the epilogue stages the tile as c_smem[pixel][filter]
// (pitch BN + 4, store_tile_nhwc) instead, so that a thread reads a vector's filters of one pixel together (and
// of the residual, where there is one, a vector at the same place).
template <typename T>
__device__ __forceinline__ bool nhwc_vectors(const Geometry& g, const T* y, const Epi<T>& ep) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(T));
    return g.split_stride == 0 && g.out_k == 1 && g.k % kVec == 0 && g.out_img % kVec == 0 &&
           g.out_row % kVec == 0 && g.out_col % kVec == 0 && reinterpret_cast<unsigned long long>(y) % 16 == 0 &&
           (ep.res == 0 || reinterpret_cast<unsigned long long>(ep.r) % 16 == 0);
}

// The tile from c_smem[pixel][filter] (pitch BN + 4) to channels-last pixels, bias added before the one
// rounding: a thread per (pixel, 16-byte vector of filters), 8 consecutive threads 8 pixels of one vector
// (their 16-byte reads 4 banks apart: no conflicts), so a warp stores 4 vectors, 64 bytes, of each of 8 pixels.
template <typename T, int BM, int BN, int WARPS, bool kEpi = true>
__device__ __forceinline__ void store_tile_nhwc(const float* c_smem, const Geometry& g, const Epi<T>& ep,
                                                T* __restrict__ y, int m0, int n0, int tid) {
    constexpr int kVec = 16 / static_cast<int>(sizeof(T)), kPitch = BN + 4, kVectors = BN / kVec;
    constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
    static_assert(BM % 8 == 0 && BN % kVec == 0, "whole groups of 8 pixels and vectors of filters");
    const int pq = g.p * g.q;
    const int grp = n0 / g.kp;  // the group's filters, from filter grp·k of the output
    const long long filter0 = static_cast<long long>(grp) * g.k;
    n0 -= grp * g.kp;
    for (int idx = tid; idx < BM * kVectors; idx += 32 * WARPS) {
        const int ml = idx % 8 + idx / (8 * kVectors) * 8, nl = idx / 8 % kVectors * kVec;
        const int m = m0 + ml, n = n0 + nl;
        if (m >= g.m || n >= g.k) continue;
        const int img = m / pq, rem = m - img * pq, op = rem / g.q;
        const long long off = img * g.out_img + op * g.out_row + (rem - op * g.q) * g.out_col + filter0 + n;
        T* yp = y + off;
        uint4 rw = make_uint4(0, 0, 0, 0);  // the residual's vector (it lies as y: 16-byte aligned with it)
        if (kEpi && ep.res != 0) rw = *reinterpret_cast<const uint4*>(ep.r + off);
        const T* re = reinterpret_cast<const T*>(&rw);
        unsigned word[4];
#pragma unroll
        for (int v = 0; v < kVec / 4; ++v) {
            const float4 f = *reinterpret_cast<const float4*>(&c_smem[ml * kPitch + nl + 4 * v]);
            const float e[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int el = 4 * v + i;
                const float acc = e[i] + bias_at(ep, filter0 + n + el);
                put_bits(word[el / kPerWord], el % kPerWord, from_acc<T>(finish<kEpi>(acc, ep, to_acc(re[el]))));
            }
        }
        *reinterpret_cast<uint4*>(yp) = make_uint4(word[0], word[1], word[2], word[3]);
    }
}

// The block's tile to the output in T (its store loop with the epilogue or without: epi_full), or, split over k
// (split_stride), to its fp32 partial sums.
template <typename T, int BM, int BN, int WARPS>
__device__ __forceinline__ void store_tile(const float* c_smem, const Geometry& g, const Epi<T>& ep,
                                           T* __restrict__ y, int m0, int n0, int warp, int lane) {
    if (g.split_stride != 0)
        store_tile_nchw<float, BM, BN, WARPS, false>(c_smem, g, Epi<float>{}, reinterpret_cast<float*>(y) +
                                                     blockIdx.z * g.split_stride, m0, n0, warp, lane);
    else if (epi_full(ep))
        store_tile_nchw<T, BM, BN, WARPS, true>(c_smem, g, ep, y, m0, n0, warp, lane);
    else
        store_tile_nchw<T, BM, BN, WARPS, false>(c_smem, g, ep, y, m0, n0, warp, lane);
}

// store_tile_nhwc with the epilogue or without (epi_full).
template <typename T, int BM, int BN, int WARPS>
__device__ __forceinline__ void store_tile_nhwc_any(const float* c_smem, const Geometry& g, const Epi<T>& ep,
                                                    T* __restrict__ y, int m0, int n0, int tid) {
    if (epi_full(ep))
        store_tile_nhwc<T, BM, BN, WARPS, true>(c_smem, g, ep, y, m0, n0, tid);
    else
        store_tile_nhwc<T, BM, BN, WARPS, false>(c_smem, g, ep, y, m0, n0, tid);
}

}  // namespace igemm
}  // namespace cuconv

// The GEMM kernels take the packed operands, the bias (or null), the output chunk, the residual (or null), the
// geometry as one struct and the epilogue's codes as another: a launch's host time grows with its argument
// count.
#define CUCONV_IGEMM_PARAMS                                                                          \
    const T *__restrict__ x, const T *__restrict__ wp, const T *__restrict__ bias, T *__restrict__ y, \
        const T *__restrict__ res, const igemm::Geometry g, const igemm::Epilogue e


// A strided dgrad's phases (implicit_gemm/dgrad_phases.py: phase_specs) in one launch: grid z the phase, each its own
// geometry, packed weight (w_offset elements on) and first pixel of dx (y_offset); grid x the most pixel blocks
// of any phase (a phase's blocks past its pixels return at once). Separate launches left the SMs idle: a phase
// of ResNet-50's 512@14² stride-2 dgrad is 104 blocks.
struct PhaseGemms {
    igemm::Geometry g[4];
    long long y_offset[4], w_offset[4];
};
static_assert(sizeof(PhaseGemms) == 4 * 128 + 64, "PHASE_GEMMS_DTYPE in cuconv/algos/implicit_gemm/mma_sync.py");
