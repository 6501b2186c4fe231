// grouped_mma: the forward of grouped convolutions with 16 channels and 16 filters a group (RegNet's group width)
// on tensor cores (mma.sync), NCHW in and NCHW out, or channels-last in and out, in one launch: no packing, no
// workspace. Such a group reduces
// over 16·R·S products per output, too few to fill a GEMM tile: what costs is moving the input and the output,
// which here each cross DRAM once, and waiting for the staging's loads (hence four blocks an SM).
//
// Kernel   grouped_mma<T, kDgrad, kNhwc, kKrsc>(x, w, bias, out, ConvGeometry, GroupedMmaTiling)
//   T       storage type: __half and __nv_bfloat16 (m16n8k16), float computed as TF32 (m16n8k8, operands
//           rounded with cvt.rna as they are staged); fp32 accumulation, bias added in fp32, one rounding.
//   kDgrad  the geometry is the forward convolution of dy whose output is dx (stride 1: dgrad_forward.py) and
//           w is the layer's own weight (K, C/groups, R, S), read transposed per group and flipped: no
//           launch writes the flipped weight.
//   kNhwc   x (N, H, W, C) and out (N, P, Q, K), dense, on 16-byte boundaries: a staged position's four groups'
//           channels are 128 (float: 256) contiguous bytes, read as 16-byte vectors of four words, and a lane
//           stores its two adjacent filters of a pixel as one word (float: 8 bytes).
//   kKrsc   (with kNhwc) w channels-last, (K, R, S, C/groups) in memory, as a channels_last model's weight is.
//
// Layouts: x (N, C, H, W), w (K, C/groups, R, S), out (N, K, P, Q), bias (K,) or a null pointer; contiguous.
//
// Mapping: block (row band, four groups, sample), one warp a group: 128 threads of at most 128 registers, four
// blocks an SM with their staging's loads in flight together. The block stages the band's input rows of its 64
// channels in shared memory as 32-bit words (two channels of a 16-bit type, or one float), one word plane per
// channel pair: word (hr, hc) of a plane sits at hr·row_stride +
// (hc % stride_w)·phase_cols + hc / stride_w, the columns split by their phase of the stride, so that
// neighbouring output columns read neighbouring words at any stride. Planes are `plane` words apart, 8 modulo
// 32: an A fragment's eight pixels × four words then fall into 32 different banks. A warp holds its group's
// weight as B fragments in registers (9 taps × 2 filter halves), walks its 16-pixel tiles (the band's rows·Q
// outputs, flattened) and per tap loads its A fragment word by word (pixel tiles may cross output rows).
// Pixels past the band repeat its last pixel and are not stored.
#include "common.cuh"
#include "mma.cuh"

using cuconv::i64;

// The launch's tiling (GROUPED_MMA_TILING_DTYPE in cuconv/algos/grouped_mma.py has this layout).
struct GroupedMmaTiling {
    int rows;             // output rows per block
    int halo_rows;        // input rows a block stages: (rows - 1)·stride_h + (R - 1)·dil_h + 1
    int halo_cols;        // input columns it stages: (Q - 1)·stride_w + (S - 1)·dil_w + 1
    int phase_cols;       // words of one phase of the stride in a staged row: ceil(halo_cols / stride_w)
    int plane;            // words between two channel-pair planes (>= halo_rows·stride_w·phase_cols, 8 mod 32)
    int m_tiles;          // 16-pixel tiles of the rows·Q outputs
};
static_assert(sizeof(GroupedMmaTiling) == 24, "GROUPED_MMA_TILING_DTYPE in cuconv/algos/grouped_mma.py");

namespace {

constexpr int kWidth = 16;          // channels and filters a group
constexpr int kGroupsPerBlock = 4;  // a warp each
constexpr int kMinBlocks = 4;       // resident blocks an SM: at most 128 registers a thread
constexpr int kMaxTaps = 9;         // R·S: the B fragments live in registers
constexpr int kStageLoads = 8;      // staged words a thread has in flight

// Per storage type: channels per staged 32-bit word and MMA k steps per tap (16 channels).
template <typename T> struct Words { static constexpr int per = 2, steps = 1; };
template <> struct Words<float> { static constexpr int per = 1, steps = 2; };

template <typename T> __device__ __forceinline__ T staged(T v) { return v; }
template <> __device__ __forceinline__ float staged<float>(float v) { return cuconv::round_tf32(v); }
// A 32-bit word of a channels-last vector as staged: two 16-bit channels as they are, a float rounded to TF32.
template <typename T> __device__ __forceinline__ unsigned staged_word(unsigned w) {
    return sizeof(T) == 2 ? w : __float_as_uint(cuconv::round_tf32(__uint_as_float(w)));
}

// Two adjacent filters of one output pixel (channels-last), rounded once: one 4-byte store (float: 8 bytes).
template <typename T> __device__ __forceinline__ void store_pair(T* __restrict__ o, float a, float b) {
    if constexpr (sizeof(T) == 2) {
        *reinterpret_cast<unsigned*>(o) = cuconv::pair_word<T>(a, b);
    } else {
        *reinterpret_cast<float2*>(o) = make_float2(a, b);
    }
}

// The 32-bit word of channels c and c + 1 (16-bit types; float: channel c) of weight tap `tap` for filter f of
// group g, as the MMA's B operand takes it: B[k = channel][n = filter]. From global memory, where every block of
// the group finds it in L2: in shared memory it would take the space of the bands' rows.
// kKrsc: the weight channels-last, (K, R, S, C/groups) in memory.
template <typename T, bool kDgrad, bool kKrsc>
__device__ __forceinline__ unsigned weight_word(const T* __restrict__ w, int g, int f, int c, int tap, int taps) {
    unsigned word = 0;
#pragma unroll
    for (int e = 0; e < Words<T>::per; ++e) {
        // forward: w[g·16 + f][c][tap]; dgrad: the forward of dy's filter f is the layer's channel f, its channel
        // c the layer's filter g·16 + c, and its tap the flipped one
        const int k = kDgrad ? g * kWidth + c + e : g * kWidth + f, ch = kDgrad ? f : c + e;
        const int t = kDgrad ? taps - 1 - tap : tap;
        const i64 i = kKrsc ? (static_cast<i64>(k) * taps + t) * kWidth + ch
                            : (static_cast<i64>(k) * kWidth + ch) * taps + t;
        cuconv::put_bits(word, e, staged<T>(w[i]));
    }
    return word;
}

}  // namespace

template <typename T, bool kDgrad, bool kNhwc, bool kKrsc>
__global__ void __launch_bounds__(kGroupsPerBlock * 32, kMinBlocks)
grouped_mma(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ out,
            const cuconv::ConvGeometry geo, const GroupedMmaTiling t) {
    constexpr int kPer = Words<T>::per, kSteps = Words<T>::steps;
    constexpr int kPlanes = kWidth / kPer;  // word planes a group
    extern __shared__ unsigned s_x[];        // [kGroupsPerBlock · kPlanes][plane]
    const int C = static_cast<int>(geo.c), H = static_cast<int>(geo.h), W = static_cast<int>(geo.w);
    const int K = static_cast<int>(geo.k), P = static_cast<int>(geo.p), Q = static_cast<int>(geo.q);
    const int S = static_cast<int>(geo.s), taps = static_cast<int>(geo.r * geo.s);
    const int groups = static_cast<int>(geo.groups);
    const int sh = static_cast<int>(geo.stride_h), sw = static_cast<int>(geo.stride_w);
    const int dh = static_cast<int>(geo.dil_h), dw = static_cast<int>(geo.dil_w);
    const int n = blockIdx.z, g0 = blockIdx.y * kGroupsPerBlock, p0 = blockIdx.x * t.rows;
    const int groups_here = min(kGroupsPerBlock, groups - g0);
    const int rows_here = min(t.rows, P - p0);
    const int ih0 = p0 * sh - static_cast<int>(geo.pad_top), iw0 = -static_cast<int>(geo.pad_left);
    const int row_stride = sw * t.phase_cols;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    // The group's weight as B fragments, loaded first: their latency overlaps the staging's.
    const int gl = warp;  // the warp's group in the block
    const bool active = gl < groups_here;
    const int gq = lane >> 2, tq = lane & 3;  // the fragments' row (pixel / filter) and column pair
    unsigned b[kMaxTaps][kSteps][2][2];      // [tap][k step][filter half][register]
    int tap_offset[kMaxTaps];
    if (active) {
#pragma unroll
        for (int tap = 0; tap < kMaxTaps; ++tap) {
            if (tap < taps) {
                const int r = tap / S, sx = (tap - r * S) * dw;
                tap_offset[tap] = r * dh * row_stride + (sx % sw) * t.phase_cols + sx / sw;
#pragma unroll
                for (int j = 0; j < kSteps; ++j)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        // (16-bit: channels 2tq, 2tq + 1 and 2tq + 8, 2tq + 9; TF32 step j: 8j + tq and 8j + tq + 4)
                        const int c = kPer == 2 ? 2 * tq : 8 * j + tq;
                        b[tap][j][h][0] = weight_word<T, kDgrad, kKrsc>(w, g0 + gl, 8 * h + gq, c, tap, taps);
                        b[tap][j][h][1] = weight_word<T, kDgrad, kKrsc>(w, g0 + gl, 8 * h + gq,
                                                                        c + (kPer == 2 ? 8 : 4), tap, taps);
                    }
            }
        }
    }

    // Stage the band. A thread takes a word position (row, column) of the band and fills it in every word plane:
    // its indices and bounds are worked out once for all 32 (64) planes, and kStageLoads planes' loads are in
    // flight before any is stored. Channels-last, a position's planes are consecutive words of the pixel: 16-byte
    // vectors of four planes.
    static_assert(kPlanes % kStageLoads == 0 && kStageLoads % 4 == 0, "a block's word planes come in whole batches");
    const T* __restrict__ x_n = kNhwc ? x + static_cast<i64>(n) * H * W * C + static_cast<i64>(g0) * kWidth
                                      : x + (static_cast<i64>(n) * C + static_cast<i64>(g0) * kWidth) * H * W;
    const i64 channel_src = static_cast<i64>(H) * W;  // (NCHW) source elements between two channels
    const i64 plane_src = kPer * channel_src;            // and between two word planes
    const int n_planes = groups_here * kPlanes, plane_words = t.halo_rows * t.halo_cols;
    for (int rc = threadIdx.x; rc < plane_words; rc += blockDim.x) {
        const int hr = rc / t.halo_cols, hc = rc - hr * t.halo_cols;
        const int ih = ih0 + hr, iw = iw0 + hc;
        const bool ok = ih >= 0 && ih < H && iw >= 0 && iw < W;
        const int phase = hc % sw;
        unsigned* dst = s_x + hr * row_stride + phase * t.phase_cols + (hc - phase) / sw;
        if constexpr (kNhwc) {
            const uint4* __restrict__ src =
                reinterpret_cast<const uint4*>(x_n + (ok ? (static_cast<i64>(ih) * W + iw) * C : 0));
            for (int wp0 = 0; wp0 < n_planes; wp0 += kStageLoads) {
                uint4 v[kStageLoads / 4];
#pragma unroll
                for (int j = 0; j < kStageLoads / 4; ++j) v[j] = ok ? __ldg(src + wp0 / 4 + j) : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int j = 0; j < kStageLoads / 4; ++j) {
                    unsigned* d = dst + (wp0 + 4 * j) * t.plane;
                    d[0] = staged_word<T>(v[j].x);
                    d[t.plane] = staged_word<T>(v[j].y);
                    d[2 * t.plane] = staged_word<T>(v[j].z);
                    d[3 * t.plane] = staged_word<T>(v[j].w);
                }
            }
        } else {
            const T* __restrict__ src = x_n + (ok ? static_cast<i64>(ih) * W + iw : 0);
            for (int wp0 = 0; wp0 < n_planes; wp0 += kStageLoads) {
                unsigned word[kStageLoads];
#pragma unroll
                for (int u = 0; u < kStageLoads; ++u) {
                    word[u] = 0;
#pragma unroll
                    for (int e = 0; e < kPer; ++e)
                        cuconv::put_bits(word[u], e, ok ? staged<T>(src[(wp0 + u) * plane_src + e * channel_src])
                                                    : cuconv::zero<T>());
                }
#pragma unroll
                for (int u = 0; u < kStageLoads; ++u) dst[(wp0 + u) * t.plane] = word[u];
            }
        }
    }
    __syncthreads();
    if (!active) return;

    // The words this lane reads of its group's planes, per k step: (16-bit) pairs tq and tq + 4; (TF32, step j)
    // channels 8j + tq and 8j + tq + 4.
    const unsigned* planes = s_x + (gl * kPlanes + tq) * t.plane;
    constexpr int kStepPlanes = kPer == 2 ? 0 : 8;  // planes between two k steps
    const int last = rows_here * Q - 1;
    const int k0 = (g0 + gl) * kWidth;
    float bias_v[2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e)
            bias_v[h][e] = bias != nullptr ? cuconv::to_acc(bias[k0 + 8 * h + 2 * tq + e]) : 0.f;
    T* __restrict__ out_n = out + static_cast<i64>(n) * K * P * Q;
    for (int mt = 0; mt < t.m_tiles; ++mt) {
        const int m_lo = mt * 16 + gq, m_hi = m_lo + 8;
        int base[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int m = min(i == 0 ? m_lo : m_hi, last);
            const int pl = m / Q, q = m - pl * Q;
            base[i] = pl * sh * row_stride + q;
        }
        float acc[2][4] = {};
#pragma unroll
        for (int tap = 0; tap < kMaxTaps; ++tap) {
            if (tap < taps) {
#pragma unroll
                for (int j = 0; j < kSteps; ++j) {
                    const unsigned* pj = planes + j * kStepPlanes * t.plane + tap_offset[tap];
                    const unsigned a[4] = {pj[base[0]], pj[base[1]], pj[4 * t.plane + base[0]],
                                           pj[4 * t.plane + base[1]]};
                    cuconv::Mma<T>::run(acc[0], a, b[tap][j][0]);
                    cuconv::Mma<T>::run(acc[1], a, b[tap][j][1]);
                }
            }
        }
        if constexpr (kNhwc) {  // (accumulators 0, 1: pixel m_lo, filters 2tq and 2tq + 1; 2, 3: m_hi)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int m = i == 0 ? m_lo : m_hi;
                if (m > last) continue;
                const int pl = m / Q, q = m - pl * Q;
                T* __restrict__ o = out_n + (static_cast<i64>(p0 + pl) * Q + q) * K + k0 + 2 * tq;
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    store_pair<T>(o + 8 * h, acc[h][2 * i] + bias_v[h][0], acc[h][2 * i + 1] + bias_v[h][1]);
            }
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int m = e < 2 ? m_lo : m_hi;
                if (m > last) continue;
                const int pl = m / Q, q = m - pl * Q;
                T* __restrict__ o = out_n + (static_cast<i64>(k0 + 2 * tq + (e & 1)) * P + p0 + pl) * Q + q;
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    o[static_cast<i64>(8 * h) * P * Q] = cuconv::from_acc<T>(acc[h][e] + bias_v[h][e & 1]);
            }
        }
    }
}
