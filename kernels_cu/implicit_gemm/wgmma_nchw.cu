// implicit_gemm_wgmma_nchw: the wgmma GEMM gathering the NCHW input and KCRS weight itself, no pack
// (sm_90a). Python twin: cuconv/algos/implicit_gemm/wgmma_nchw.py.
#include "implicit_gemm/sm90.cuh"

// ---------------------------------------------------------------------------------------------------
// The wgmma GEMM straight from NCHW (sm_90a): no packing launch. The block gathers both operands itself,
// through registers: the input from NCHW (a thread per pixel row: a warp's 32 lanes read 32 neighbouring
// pixels of one channel and tap, coalesced) and the weight from KCRS (16-byte vectors where the rows allow,
// else element by element), rounds float32 to TF32 on the way, and stores both in the swizzled layout of
// implicit_gemm_wgmma. What a packed input buys (one 16-byte cp.async per 4 or 8 k) costs a separate
// launch and a round trip of the input through memory. Where the GEMM does little work per input element
// that round trip costs more than this gather (1x1 layers), or as much (float32 resnet_3x3_64, one launch
// fewer); elsewhere the packed kernels win (docs/perf-notes.md, v6).
//
// k order here is the weight's own, k = (c·R + r)·S + s over C·R·S (g.w_row; g.cp is C), zero past it up
// to whole 128-byte k tiles. A table in shared memory gives each k its input offset c·H·W + r·dil_h·W +
// s·dil_w and its tap's bit 1 << (r·S + s) (0 past C·R·S); each thread holds the bits of the taps that fall
// inside the image for its pixel, so a k costs the gather one shared load (the same address for a warp),
// one AND and a predicated load (kernels of up to 31 taps, Python twin). Two slots: tile kt + 1 goes from
// registers to its slot while the wgmmas of tile kt run, and tile kt + 2 is loaded into registers then.
// Block: BF / 64 warpgroups along filters, 128 pixels (one m64n128 wgmma per k step each); epilogue as
// implicit_gemm_wgmma. Shared memory (the Python twin's NchwTile): the slots or the epilogue's staging, if
// larger, then 8 bytes of table per k.

template <typename T, int BF, int BP, int MINB>
__global__ void __launch_bounds__(BF / 64 * 128, MINB)
implicit_gemm_wgmma_nchw(CUCONV_IGEMM_PARAMS) {
#ifdef CUCONV_IGEMM_WGMMA
    using namespace igemm;
    constexpr int kThreads = BF / 64 * 128;
    constexpr int kRowBytes = 128;
    constexpr int V = 16 / sizeof(T);          // elements per 16-byte vector
    constexpr int TK = kRowBytes / sizeof(T);  // k per tile
    constexpr int TPR = kThreads / BP;         // threads per pixel row
    constexpr int EPT = TK / TPR;              // k of a row per thread and tile
    constexpr int VPT = EPT / V;               // its 16-byte vectors
    constexpr int BPT = BF * 8 / kThreads;     // weight vectors per thread and tile
    constexpr int kSlotBytes = (BF + BP) * kRowBytes;
    constexpr int kStagingBytes = staging_bytes<BF, BP>();
    constexpr int kTableOffset = 2 * kSlotBytes > kStagingBytes ? 2 * kSlotBytes : kStagingBytes;
    static_assert(BP == 128 && kThreads % BP == 0 && VPT >= 1 && BPT >= 1 && (BF * 8) % kThreads == 0,
                  "tile shape");

    extern __shared__ __align__(1024) unsigned char smem[];
    const unsigned base = (smem_addr(smem) + 1023u) & ~1023u;  // the swizzle needs 1024-byte alignment
    unsigned char* const stage = smem + (base - smem_addr(smem));
    int2* const table = reinterpret_cast<int2*>(stage + kTableOffset);

    const int tid = threadIdx.x;
    const int m0 = blockIdx.x * BP, n0 = blockIdx.y * BF;
    const int crs = static_cast<int>(g.w_row);
    const int hw = g.h * g.w;
    {
        const int rs = g.r * g.s;
        for (int k = tid; k < g.k_tiles * TK; k += kThreads) {
            int2 e = make_int2(0, 0);  // past C·R·S: no tap
            if (k < crs) {
                const int c = k / rs, tap = k - c * rs, r = tap / g.s, s = tap - r * g.s;
                e = make_int2(c * hw + r * g.dil_h * g.w + s * g.dil_w, 1 << tap);
            }
            table[k] = e;
        }
    }

    // This thread's pixel row: a pointer to its window's top-left input element in channel 0 (outside the
    // image where padded: only taps inside it are read) and the bits of those taps (none past M); and its
    // EPT k of each tile.
    const int row = tid % BP, kseg = tid / BP;
    const T* xr = x;
    unsigned taps = 0;
    if (m0 + row < g.m) {
        const int pq = g.p * g.q;
        const int img = (m0 + row) / pq, rem = m0 + row - img * pq;
        const int op = rem / g.q, oq = rem - op * g.q;
        const int ih0 = op * g.stride_h - g.pad_h, iw0 = oq * g.stride_w - g.pad_w;
        xr = x + (static_cast<long long>(img) * g.cp * hw + ih0 * g.w + iw0);
        for (int r = 0; r < g.r; ++r)
            for (int s = 0; s < g.s; ++s)
                if (static_cast<unsigned>(ih0 + r * g.dil_h) < static_cast<unsigned>(g.h) &&
                    static_cast<unsigned>(iw0 + s * g.dil_w) < static_cast<unsigned>(g.w))
                    taps |= 1u << (r * g.s + s);
    }
    // Weight vector i of a tile: filter row i·(kThreads / 8) + tid / 8 of the block, 16-byte column tid % 8.
    const bool b_vectors = crs % V == 0 && (reinterpret_cast<unsigned long long>(wp) & 15) == 0;
    const int b_col = tid % 8;

    // The staged tiles as 32-bit words (16-bit elements in pairs, low half first): arrays of halves assigned
    // element by element went to the stack. Nothing here consumes a loaded value: float32 is rounded to TF32
    // when stored (store_regs), a tile later, and halves are paired after all of a tile's loads are issued.
    // (Rounding right after each load made every load wait for the one before: 4x slower.)
    constexpr int kPerWord = 4 / sizeof(T);
    unsigned a_reg[VPT][4], b_reg[BPT][4];
    auto load_regs = [&](int kt) {
        const int2* t = table + kt * TK + kseg * EPT;
        if constexpr (sizeof(T) == 4) {
#pragma unroll
            for (int e = 0; e < EPT; ++e) {
                const int2 d = t[e];
                T v = zero<T>();
                if (taps & d.y) v = xr[d.x];
                put_bits(a_reg[e / V][e % V], 0, v);
            }
        } else {
            unsigned short raw[EPT];
#pragma unroll
            for (int e = 0; e < EPT; ++e) {
                const int2 d = t[e];
                raw[e] = 0;
                if (taps & d.y) raw[e] = reinterpret_cast<const unsigned short*>(xr)[d.x];
            }
#pragma unroll
            for (int e = 0; e < EPT; e += 2)
                a_reg[e / V][(e % V) / 2] = raw[e] | (static_cast<unsigned>(raw[e + 1]) << 16);
        }
        const int k = kt * TK + b_col * V;
#pragma unroll
        for (int i = 0; i < BPT; ++i) {
            const int f = n0 + i * (kThreads / 8) + tid / 8;
            const T* src = wp + static_cast<long long>(f) * crs + k;
            if (f < g.k && b_vectors && k < crs) {
                const uint4 q = *reinterpret_cast<const uint4*>(src);
                b_reg[i][0] = q.x; b_reg[i][1] = q.y; b_reg[i][2] = q.z; b_reg[i][3] = q.w;
            } else {
#pragma unroll
                for (int e = 0; e < V; ++e)
                    put_bits(b_reg[i][e / kPerWord], e % kPerWord, f < g.k && k + e < crs ? src[e] : zero<T>());
            }
        }
    };
    auto store_regs = [&](int slot) {
        unsigned char* s = stage + slot * kSlotBytes;
        // TF32, rounded once as the pack kernels do: more accurate than the MMA's truncation, for a few percent
        // of the time
        if constexpr (sizeof(T) == 4) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
#pragma unroll
                for (int v = 0; v < VPT; ++v) a_reg[v][j] = __float_as_uint(round_tf32(__uint_as_float(a_reg[v][j])));
#pragma unroll
                for (int i = 0; i < BPT; ++i) b_reg[i][j] = __float_as_uint(round_tf32(__uint_as_float(b_reg[i][j])));
            }
        }
#pragma unroll
        for (int j = 0; j < VPT; ++j) {
            const int r = BF + row, chunk = kseg * VPT + j;
            *reinterpret_cast<uint4*>(s + r * kRowBytes + ((chunk ^ (r & 7)) << 4)) =
                make_uint4(a_reg[j][0], a_reg[j][1], a_reg[j][2], a_reg[j][3]);
        }
#pragma unroll
        for (int i = 0; i < BPT; ++i) {
            const int r = i * (kThreads / 8) + tid / 8;
            *reinterpret_cast<uint4*>(s + r * kRowBytes + ((b_col ^ (r & 7)) << 4)) =
                make_uint4(b_reg[i][0], b_reg[i][1], b_reg[i][2], b_reg[i][3]);
        }
    };

    const int wg = tid / 128;
    const unsigned a_off = wg * 64 * kRowBytes;  // this warpgroup's filters
    const unsigned b_off = BF * kRowBytes;       // the block's pixels

    float acc[1][64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[0][i] = 0.f;

    __syncthreads();  // the table is written
    load_regs(0);
    store_regs(0);
    if (g.k_tiles > 1) load_regs(1);
    for (int kt = 0; kt < g.k_tiles; ++kt) {
        fence_proxy_async();  // the generic-proxy stores of tile kt, before the wgmmas (async proxy) read them
        __syncthreads();      // tile kt is in its slot; every warpgroup retired tile kt - 1, whose slot is next
        const unsigned slot = base + (kt & 1) * kSlotBytes;
        wgmma_k_tile<T>(acc, slot + a_off, slot + b_off);
        if (kt + 1 < g.k_tiles) {
            store_regs((kt + 1) & 1);
            if (kt + 2 < g.k_tiles) load_regs(kt + 2);
        }
        wgmma_wait<0>();
    }
    fence_acc(acc[0]);
    wgmma_epilogue<T, BF, BP, 1>(acc, stage, g, epi_of(bias, res, e), y, m0, n0);
#else
    __trap();  // an sm_90a kernel compiled for another target: the Python twin never launches it
#endif
}
