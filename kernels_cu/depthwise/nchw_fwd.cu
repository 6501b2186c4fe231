// depthwise: convolutions with groups == C (one input channel per group, K = m·C output channels with
// channel multiplier m), any kernel size, stride, padding and dilation. Memory-bound: every kernel here
// aims to move each input and output element through DRAM about once.
//
// This file: the forward kernels on NCHW activations (and dgrad at stride 1, multiplier 1, as the forward of dy
// reading the weight flipped). Their planning: cuconv/algos/depthwise/nchw_fwd.py.
//
// Kernels (T: storage type; sums in cuconv::Acc<T>, i.e. float for half types, rounded once). Each takes, after
// out, the residual `res` and, last, the epilogue `epi` (cuconv::EpilogueArgs, epilogue.cuh); its instances with
// the last template parameter kEpi put every sum (bias included) through them before the one rounding, the others
// (plain forwards, a dgrad as the forward of dy) leave both unread.
//   depthwise_fwd<T, KR, KS>(x, w, bias, out, ...)
//       blockIdx.x = one output plane (n, k), blockIdx.y = one 32×64 tile of it; 32×8 threads. The block
//       stages its input tile, halo and dilation included ((32-1)·sh + (R-1)·dh + 1 rows × (64-1)·sw +
//       (S-1)·dw + 1 columns, zeros where the tile hangs over the padding, only the part its outputs inside
//       the plane read at a stride or dilation above 1; 12 loads in flight per thread)
//       and the R·S weights in dynamic shared memory; each thread then keeps 4×2 outputs in registers
//       (rows ty + 8i, columns tx + 32j: conflict-free reads, coalesced stores). KR×KS = 3×3, 5×5, 7×7 are
//       compiled with unrolled tap loops (and, for stride = dilation = 1, compile-time tile offsets), 0×0
//       reads R, S at run time. Bias is added in the sum.
//   depthwise_fwd_strips<T, KR, KS, kFlat>(x, w, bias, out, ..., rows_per_strip, strips, items)
//       stride = dilation = 1 with a 3×3, 5×5 or 7×7 kernel: no shared memory at all. blockIdx.x = one output
//       plane (n, k) and thread blockIdx.y·256 + threadIdx.x of it, or with kFlat (small planes, whose few
//       strips would leave a block per plane nearly empty and the SM at its resident-block limit) thread
//       blockIdx.x·256 + threadIdx.x of the (plane, strip, column) items flat over the batch, owns output
//       column q and a strip of rows_per_strip consecutive output rows, walking down them with the KR input
//       rows it reads held in registers (KS columns each): per output row, KS loads of one new input row
//       (neighbouring lanes read neighbouring columns: coalesced, the overlap served by L1), KR·KS FMAs and one
//       coalesced store.
//   depthwise_fwd_rows<T, KR, KS, kSegmented, kBytes>(x, w, bias, out, ..., slots, strips, segs, seg_lanes,
//                                                     rows_per_strip)
//       stride = dilation = 1, KS odd with its centred padding left and right (Q == W), rows of a multiple
//       of kBytes (16, or 8 for 16-bit rows of 4 modulo 8 elements such as 28 or 20), 16-byte aligned
//       tensors: the fastest where it applies (near a same-size copy's time; docs/perf-notes.md). A thread
//       owns V = kBytes / sizeof(T) consecutive columns of a strip of output rows: per input row one kBytes
//       load (the KS - 1 halo columns come from the neighbouring lanes by shuffles), KR·KS·V FMAs and one
//       kBytes store per output row; its KR window rows stay in registers, indexed j % KR so that a step of
//       KR rows needs no register moves, the KR loads of a step in flight together, issued a step early in
//       the 16-bit types (else the next step's rows are prefetched into L2). A row's
//       W / V vectors form segments of at most 32 lanes (edge lanes of a segment that ends inside the
//       image load their halo: kSegmented); a warp serves 32 / seg_lanes slots side by side, a slot being
//       one segment of one strip of one output plane, and a persistent grid walks the slots.
//   depthwise_fwd_plane<T, KR, KS>(x, w, bias, out, ..., rows_per_strip, strips, lead, pitch, stages)
//       stride = dilation = 1 with a 3×3 (or, summing in float, 5×5) kernel, where a padded input plane fits
//       in shared memory and its rows are 16-byte aligned: a persistent grid, block b convolving input
//       planes (n, c) = b, b + gridDim.x, ... into their `mult` output planes each. Planes are staged whole
//       by 16-byte cp.async copies, `stages` buffers deep (image column 0 at shared column `lead`, a
//       multiple of 16 bytes, rows `pitch` apart; the zero halo written once), so that the loads of the
//       next planes are in flight while one is convolved: each thread walks column strips of
//       rows_per_strip output rows as depthwise_fwd_strips does, reading shared memory instead of L1.
//   depthwise_fwd_gather<T, KR, KS>(x, w, bias, out, DwGeometry)
//       3×3, 5×5, 7×7 at any stride and dilation: one thread per output, flat over the batch's planes (small
//       planes and strided layers, where a tile or a strip per plane leaves most threads idle); the window
//       comes through L1.
//   depthwise_fwd_gather2<T, KR, KS, SW>(x, w, bias, out, DwGeometry)
//       the gather at dilation 1 and column stride SW = 1 or 2: two neighbouring outputs per thread, their
//       shared window columns loaded once.
// Layouts: x (N, C, H, W), w (K, 1, R, S), out and res (N, K, P, Q), all contiguous; 64-bit plane offsets.
#include "depthwise/depthwise.cuh"
#include "epilogue.cuh"

// Tap i = r·S + s of filter k's R·S taps: as stored, or with `flip` (dgrad at stride 1 as the forward
// convolution of dy: the kernel flipped in both axes, w'[k][r][s] = w[k][R-1-r][S-1-s], the flattened taps
// reversed) read from the stored weight in place, no flipped copy.
__device__ __forceinline__ i64 tap_index(i64 k, int taps, int i, bool flip) {
    return k * taps + (flip ? taps - 1 - i : i);
}

// Forward tile: kRowsPerThread × 8 rows and kColsPerThread × 32 columns of one output plane; a block of
// 32 × 8 threads, each computing kRowsPerThread × kColsPerThread outputs held in registers.
constexpr int kRowsPerThread = 4;
constexpr int kColsPerThread = 2;
constexpr int kTileP = 8 * kRowsPerThread;
constexpr int kTileQ = 32 * kColsPerThread;

// KR, KS > 0: the kernel size is known at compile time (tap loops unrolled); 0: read R, S at run time.
// kUnit: stride and dilation are 1, so with KR, KS the tile's shape and every shared-memory offset are
// compile-time constants (ncu showed the general kernel issue-bound on index arithmetic, DRAM at 25%).
template <typename T, int KR, int KS, bool kUnit, bool kEpi>
__global__ void __launch_bounds__(256)
depthwise_fwd(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, T* __restrict__ out,
              const T* __restrict__ res, const cuconv::ConvGeometry geo, const DwWork work,
              const cuconv::EpilogueArgs epi) {
    const i64 C = geo.c, H = geo.h, W = geo.w, K = geo.k, R_rt = geo.r, S_rt = geo.s, P = geo.p, Q = geo.q;
    const i64 mult = work.mult, stride_h = geo.stride_h, stride_w = geo.stride_w, pad_top = geo.pad_top;
    const i64 pad_left = geo.pad_left, dil_h = geo.dil_h, dil_w = geo.dil_w, tiles_q = work.tiles_q;
    typedef typename cuconv::Acc<T>::type Acc;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int R = KR > 0 ? KR : static_cast<int>(R_rt);
    const int S = KS > 0 ? KS : static_cast<int>(S_rt);
    const int taps = R * S;
    Acc* w_s = reinterpret_cast<Acc*>(smem_raw);
    T* tile = reinterpret_cast<T*>(smem_raw + ((taps * sizeof(Acc) + 15) / 16) * 16);

    // 32-bit decode: a 64-bit division is a ~100-instruction routine that every thread would run.
    const int plane = blockIdx.x;  // n * K + k (grid.x < 2^31)
    const int k = plane % static_cast<int>(K);
    const int n = plane / static_cast<int>(K);
    const T* __restrict__ x_plane = x + (static_cast<i64>(n) * C + k / static_cast<int>(mult)) * H * W;
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 32 + tx;
    const int p0 = static_cast<int>(blockIdx.y) / static_cast<int>(tiles_q) * kTileP;
    const int q0 = static_cast<int>(blockIdx.y) % static_cast<int>(tiles_q) * kTileQ;
    const int sh = kUnit ? 1 : static_cast<int>(stride_h), sw = kUnit ? 1 : static_cast<int>(stride_w);
    const int dh = kUnit ? 1 : static_cast<int>(dil_h), dw = kUnit ? 1 : static_cast<int>(dil_w);
    const int Hi = static_cast<int>(H), Wi = static_cast<int>(W);
    const int tile_h = (kTileP - 1) * sh + (R - 1) * dh + 1;
    const int tile_w = (kTileQ - 1) * sw + (S - 1) * dw + 1;
    const int ih0 = p0 * sh - static_cast<int>(pad_top);
    const int iw0 = q0 * sw - static_cast<int>(pad_left);

    for (int i = tid; i < taps; i += 256) w_s[i] = cuconv::to_acc(w[tap_index(k, taps, i, work.flip != 0)]);
    // Stage the input the tile's outputs inside the plane read (need_h x need_w of the tile_h x tile_w
    // window, rows tile_w apart; strided tiles on small planes, e.g. 7x7 outputs at stride 2, would otherwise
    // stage a window 30x what they read): kLoads elements per thread per batch, all loads in flight before any
    // store (one batch covers the whole tile of a 3x3 stride-1 kernel). The sums of outputs past the plane
    // read unstaged shared memory and are not stored.
    const int rows_out = min(kTileP, static_cast<int>(P) - p0), cols_out = min(kTileQ, static_cast<int>(Q) - q0);
    const int need_h = kUnit ? tile_h : min(tile_h, (rows_out - 1) * sh + (R - 1) * dh + 1);
    const int need_w = kUnit ? tile_w : min(tile_w, (cols_out - 1) * sw + (S - 1) * dw + 1);
    const int need_size = need_h * need_w;
    const int step_r = 256 / need_w, step_c = 256 - step_r * need_w;  // (row, col) advance of 256 elements
    for (int base = 0; base < need_size; base += kLoads * 256) {
        T v[kLoads];
        int at[kLoads];
        int r = (base + tid) / need_w, c = (base + tid) - r * need_w;
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
            const int ih = ih0 + r, iw = iw0 + c;
            const bool inside = r < need_h && ih >= 0 && ih < Hi && iw >= 0 && iw < Wi;
            v[j] = inside ? x_plane[static_cast<i64>(ih) * W + iw] : cuconv::zero<T>();
            at[j] = r * tile_w + c;
            r += step_r;
            c += step_c;
            if (c >= need_w) { c -= need_w; ++r; }
        }
#pragma unroll
        for (int j = 0; j < kLoads; ++j)
            if (base + j * 256 + tid < need_size) tile[at[j]] = v[j];
    }
    __syncthreads();

    const Acc b = bias != nullptr ? cuconv::to_acc(bias[k]) : Acc(0);
    Acc acc[kRowsPerThread][kColsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
        for (int j = 0; j < kColsPerThread; ++j) acc[i][j] = b;
#pragma unroll
    for (int r = 0; r < (KR > 0 ? KR : 1); ++r) {
        for (int rr = (KR > 0 ? r : 0); rr < (KR > 0 ? r + 1 : R); ++rr) {
#pragma unroll
            for (int s = 0; s < (KS > 0 ? KS : 1); ++s) {
                for (int ss = (KS > 0 ? s : 0); ss < (KS > 0 ? s + 1 : S); ++ss) {
                    const Acc wv = w_s[rr * S + ss];
                    const T* __restrict__ src = tile + (ty * sh + rr * dh) * tile_w + tx * sw + ss * dw;
#pragma unroll
                    for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
                        for (int j = 0; j < kColsPerThread; ++j)
                            acc[i][j] += wv * cuconv::to_acc(src[(8 * i * sh) * tile_w + 32 * j * sw]);
                }
            }
        }
    }
    const i64 plane_off = static_cast<i64>(plane) * P * Q;
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
        const int p = p0 + ty + 8 * i;
#pragma unroll
        for (int j = 0; j < kColsPerThread; ++j) {
            const int q = q0 + tx + 32 * j;
            const i64 o = plane_off + static_cast<i64>(p) * Q + q;
            if (p < P && q < Q) out[o] = cuconv::from_acc<T>(cuconv::epilogue_if<kEpi>(acc[i][j], epi, res, o));
        }
    }
}

// The column-strip kernels (strips, plane, rows) share these two steps.
// wr = the KR x KS taps of output channel k in the arithmetic type (flipped: see tap_index); returns its bias
// (0 without one).
template <typename T, typename Acc, int KR, int KS>
__device__ __forceinline__ Acc load_taps(Acc (&wr)[KR][KS], const T* __restrict__ w, const T* __restrict__ bias,
                                         i64 k, bool flip) {
#pragma unroll
    for (int r = 0; r < KR; ++r) {
#pragma unroll
        for (int s = 0; s < KS; ++s) wr[r][s] = cuconv::to_acc(w[tap_index(k, KR * KS, r * KS + s, flip)]);
    }
    return bias != nullptr ? cuconv::to_acc(bias[k]) : Acc(0);
}

// One step down a strip: win[r] = win[r + 1] (renamed away by the caller's unrolling), win[KR - 1] =
// new_row, and the output b + sum of wr * win.
template <typename Acc, int KR, int KS>
__device__ __forceinline__ Acc strip_step(Acc (&win)[KR][KS], const Acc (&new_row)[KS], const Acc (&wr)[KR][KS],
                                          Acc b) {
#pragma unroll
    for (int r = 0; r + 1 < KR; ++r) {
#pragma unroll
        for (int s = 0; s < KS; ++s) win[r][s] = win[r + 1][s];
    }
#pragma unroll
    for (int s = 0; s < KS; ++s) win[KR - 1][s] = new_row[s];
    Acc acc = b;
#pragma unroll
    for (int r = 0; r < KR; ++r) {
#pragma unroll
        for (int s = 0; s < KS; ++s) acc = fma(wr[r][s], win[r][s], acc);
    }
    return acc;
}

// Forward, stride = dilation = 1, compile-time KR × KS: a column strip of output rows per thread (see top).
template <typename T, int KR, int KS, bool kFlat, bool kEpi>
__global__ void __launch_bounds__(256)
depthwise_fwd_strips(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                     T* __restrict__ out, const T* __restrict__ res, const cuconv::ConvGeometry geo,
                     const DwWork work, const cuconv::EpilogueArgs epi) {
    const i64 C = geo.c, H = geo.h, W = geo.w, K = geo.k, P = geo.p, Q = geo.q, mult = work.mult;
    const i64 pad_top = geo.pad_top, pad_left = geo.pad_left, rows_per_strip = work.rows, strips = work.strips;
    const i64 items = work.items;
    typedef typename cuconv::Acc<T>::type Acc;
    const int Qi = static_cast<int>(Q), Hi = static_cast<int>(H), Wi = static_cast<int>(W);
    int q, strip, plane;  // plane = n * K + k
    if (kFlat) {
        const int idx = static_cast<int>(blockIdx.x) * 256 + static_cast<int>(threadIdx.x);  // items < 2^31
        if (idx >= static_cast<int>(items)) return;
        q = idx % Qi;
        const int t = idx / Qi;
        strip = t % static_cast<int>(strips);
        plane = t / static_cast<int>(strips);
    } else {
        const int idx = static_cast<int>(blockIdx.y) * 256 + static_cast<int>(threadIdx.x);
        q = idx % Qi;
        strip = idx / Qi;
        if (strip >= static_cast<int>(strips)) return;
        plane = blockIdx.x;  // grid.x < 2^31
    }
    const int k = plane % static_cast<int>(K);
    const int n = plane / static_cast<int>(K);
    const T* __restrict__ x_plane = x + (static_cast<i64>(n) * C + k / static_cast<int>(mult)) * H * W;
    const i64 col_off = static_cast<i64>(plane) * P * Q + q;  // output (p, q) at col_off + p·Q

    Acc wr[KR][KS];
    const Acc b = load_taps(wr, w, bias, k, work.flip != 0);
    const int iw0 = q - static_cast<int>(pad_left);
    bool col_ok[KS];
#pragma unroll
    for (int s = 0; s < KS; ++s) col_ok[s] = static_cast<unsigned>(iw0 + s) < static_cast<unsigned>(Wi);

    // win[r][s] = x[ih0 + r][iw0 + s] for the current output row p (ih0 = p - pad_top); zeros outside.
    Acc win[KR][KS];
    const int p0 = strip * static_cast<int>(rows_per_strip);
    const int p1 = min(p0 + static_cast<int>(rows_per_strip), static_cast<int>(P));
    const int ih0 = p0 - static_cast<int>(pad_top);
#pragma unroll
    for (int r = 0; r + 1 < KR; ++r) strip_row<KS>(win[r + 1], x_plane, ih0 + r, Hi, W, iw0, col_ok);
#pragma unroll 8  // loads of several rows in flight; measured: 4 and 8 best, 8 by 12% on fp16
    for (int p = p0; p < p1; ++p) {
        Acc row[KS];
        strip_row<KS>(row, x_plane, p - static_cast<int>(pad_top) + KR - 1, Hi, W, iw0, col_ok);
        const i64 o = col_off + static_cast<i64>(p) * Q;
        out[o] = cuconv::from_acc<T>(cuconv::epilogue_if<kEpi>(strip_step(win, row, wr, b), epi, res, o));
    }
}

// depthwise_fwd_rows: registers allow two blocks per SM for 3×3 summing in float (~110 registers in the
// half types, whose window is converted once), else one (5×5: 150-200). A third block at 80 registers spills
// in the half types and is slower (docs/perf-notes.md).
template <typename T, int KR>
__host__ __device__ constexpr int rows_min_blocks() {
    return KR <= 3 && sizeof(typename cuconv::Acc<T>::type) == 4 ? 2 : 1;
}

// A row vector of depthwise_fwd_rows as 32-bit words: kBytes = 16 or 8.
template <int kBytes> struct RowsRaw;
template <> struct RowsRaw<16> {
    typedef uint4 type;
    static __device__ __forceinline__ uint4 zero() { return make_uint4(0u, 0u, 0u, 0u); }
};
template <> struct RowsRaw<8> {
    typedef uint2 type;
    static __device__ __forceinline__ uint2 zero() { return make_uint2(0u, 0u); }
};

// Its output vector: V elements of T stored with one kBytes store.
// One input row of a depthwise_fwd_rows window: the thread's V columns c0 .. c0 + V - 1 as stored and the
// halo in the arithmetic type, (KS - 1) / 2 columns each side.
template <typename T, int KS, int kBytes>
struct RowsWindowRow {
    typedef typename cuconv::Acc<T>::type Acc;
    typedef typename RowsRaw<kBytes>::type Raw;
    static constexpr int V = kBytes / static_cast<int>(sizeof(T)), PL = (KS - 1) / 2, PR = KS - 1 - PL;
    Raw mid;
    Acc halo[KS - 1];  // columns c0 - PL .. c0 - 1, then c0 + V .. c0 + V + PR - 1

    // Window column col (0 .. V + KS - 2), i.e. image column c0 - PL + col; col is a compile-time constant
    // once the caller's loops are unrolled.
    __device__ __forceinline__ Acc at(int col) const {
        return col < PL ? halo[col] : col < PL + V ? elem_of<T>(mid, col - PL) : halo[col - V];
    }

    // mid = raw (already zero outside the image); the halo from the neighbouring lanes' vectors by shuffles,
    // except at the edges of a segment: there from `row` (the image row at column c0) where the segment
    // ends inside the image (edge_load_*: ok and the row is an image row), zero in the padding. Every
    // lane of the warp must call this: the shuffles are warp-wide.
    __device__ __forceinline__ void fill(const Raw& raw, const T* __restrict__ row, bool left_edge,
                                         bool right_edge, bool edge_load_left, bool edge_load_right) {
        mid = raw;
#pragma unroll
        for (int j = 0; j < PL; ++j) {  // column c0 - PL + j: the left lane's (c0 - V) + V - PL + j
            const Acc v = __shfl_up_sync(0xffffffffu, elem_of<T>(mid, V - PL + j), 1);
            Acc e = Acc(0);
            if (edge_load_left) e = cuconv::to_acc(row[j - PL]);
            halo[j] = left_edge ? e : v;
        }
#pragma unroll
        for (int j = 0; j < PR; ++j) {  // column c0 + V + j: the right lane's (c0 + V) + j
            const Acc v = __shfl_down_sync(0xffffffffu, elem_of<T>(mid, j), 1);
            Acc e = Acc(0);
            if (edge_load_right) e = cuconv::to_acc(row[V + j]);
            halo[PL + j] = right_edge ? e : v;
        }
    }
};

// Forward, stride = dilation = 1, KR × KS with KS odd and its centred padding left and right (so Q == W),
// rows of a multiple of kBytes: kBytes vectors per thread (see top). kSegmented: rows of more than 32
// vectors, cut into segments whose edge lanes read their halo from memory (the instance without it has
// no such loads: fewer instructions per row).
template <typename T, int KR, int KS, bool kSegmented, int kBytes, bool kEpi>
__global__ void __launch_bounds__(256, rows_min_blocks<T, KR>())
depthwise_fwd_rows(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                   T* __restrict__ out, const T* __restrict__ res, const cuconv::ConvGeometry geo,
                   const DwWork work, const cuconv::EpilogueArgs epi) {
    const i64 C = geo.c, H = geo.h, W = geo.w, K = geo.k, P = geo.p, mult = work.mult, pad_top = geo.pad_top;
    const i64 slots = work.slots, strips = work.strips, segs = work.segs, seg_lanes = work.seg_lanes;
    const i64 rows_per_strip = work.rows;
    typedef typename cuconv::Acc<T>::type Acc;
    typedef typename RowsRaw<kBytes>::type Raw;
    typedef RowsOut<T, kBytes> Vec;
    constexpr int V = kBytes / static_cast<int>(sizeof(T));
    static_assert(KS % 2 == 1 && (KS - 1) / 2 <= V, "the halo must come from one neighbouring vector");

    const int lane = threadIdx.x & 31;
    const int Ls = static_cast<int>(seg_lanes), per_warp = 32 / Ls;
    const int sub = lane / Ls, li = lane - sub * Ls;
    const int G = static_cast<int>(W) / V, Hi = static_cast<int>(H), Pi = static_cast<int>(P);
    const int Ki = static_cast<int>(K), m = static_cast<int>(mult), pt = static_cast<int>(pad_top);
    const int rps = static_cast<int>(rows_per_strip), n_strips = static_cast<int>(strips);
    const int n_segs = static_cast<int>(segs), n_slots = static_cast<int>(slots);  // < 2^31: the launcher's check
    const int warps = gridDim.x * (256 / 32);

    // A persistent grid: warp i serves the slot groups i, i + warps, ... (a warp-uniform loop: the shuffles
    // need every lane).
    for (int base = (blockIdx.x * 256 + static_cast<int>(threadIdx.x)) / 32 * per_warp; base < n_slots;
         base += warps * per_warp) {
        const int slot = base + sub;
        const bool live = sub < per_warp && slot < n_slots;
        int rest = live ? slot : 0;
        const int seg = rest % n_segs;
        rest /= n_segs;
        const int strip = rest % n_strips;
        const int plane = rest / n_strips;  // n * K + k
        const int g = seg * Ls + li, c0 = g * V;
        const int k = plane % Ki, n = plane / Ki;
        Acc wr[KR][KS];
        const Acc b = load_taps(wr, w, bias, static_cast<i64>(k), work.flip != 0);

        // Output rows p0 .. p1 - 1; input row j of the window (image row p0 - pt + j) is read iff
        // j_lo <= j < j_hi (inside the image, and needed by a row of this strip; none for an idle lane).
        const int p0 = strip * rps, p1 = min(p0 + rps, Pi);
        const int j_lo = max(0, pt - p0);
        const int j_hi = live && g < G ? max(j_lo, min(p1 - p0 + KR - 1, Hi + pt - p0)) : j_lo;
        auto in_rows = [&](int j) { return static_cast<unsigned>(j - j_lo) < static_cast<unsigned>(j_hi - j_lo); };
        const bool left_edge = li == 0, right_edge = li == Ls - 1 || g >= G - 1;
        const bool load_left = kSegmented && left_edge && g > 0;  // a segment's end inside the image
        const bool load_right = kSegmented && right_edge && g < G - 1;
        // Row j of the window at src + j * W (an address outside the plane is never dereferenced); pointers
        // advance row by row (a 64-bit multiply per row was a third of the loop's instructions).
        const T* __restrict__ src = x + (static_cast<i64>(n) * C + k / m) * H * W + static_cast<i64>(p0 - pt) * W + c0;
        T* __restrict__ dst = out + static_cast<i64>(plane) * P * W + static_cast<i64>(p0) * W + c0;
        const int n_store = live && g < G ? p1 - p0 : 0;  // output rows this lane writes
        auto load_row = [&](const T* row, bool ok, Raw& raw) {  // a predicated load over zeros
            raw = RowsRaw<kBytes>::zero();
            if (ok) raw = *reinterpret_cast<const Raw*>(row);
        };

        // The window row j lives in win[j % KR]: stepping KR output rows at a time, every index below is a
        // compile-time constant (no register moves down the window), and the KR loads of a step are in
        // flight together, the next step's rows prefetched into L2 behind them.
        RowsWindowRow<T, KS, kBytes> win[KR];
#pragma unroll
        for (int j = 0; j + 1 < KR; ++j, src += W) {
            Raw raw;
            const bool ok = in_rows(j);
            load_row(src, ok, raw);
            win[j].fill(raw, src, left_edge, right_edge, ok && load_left, ok && load_right);
        }
        // Output rows i .. i + KR - 1 per step (rps is a multiple of KR); src at window row i + KR - 1.
        // When a step's KR rows are loaded: 16-bit types (unsegmented rows) load the next step's rows while
        // this one is convolved (registers double-buffered); the others load a step's rows as it starts and
        // prefetch the next step's into L2. Loading early pays in the 16-bit types; in float the extra
        // registers halve its resident blocks, whose loads were in flight side by side already, and segmented
        // 16-bit rows lose too (measurements: docs/perf-notes.md).
        constexpr bool kEarly = sizeof(T) == 2 && !kSegmented;
        Raw next[KR];
        bool next_ok[KR];
        auto load_step = [&](const T* row, int i0) {  // window rows i0 + KR - 1 .. i0 + 2 KR - 2 from `row`
#pragma unroll
            for (int u = 0; u < KR; ++u, row += W) {
                next_ok[u] = in_rows(i0 + u + KR - 1);
                load_row(row, next_ok[u], next[u]);
            }
        };
        if (kEarly) load_step(src, 0);
        for (int i = 0; i < rps; i += KR) {
            if (!kEarly) load_step(src, i);
            Raw raw[KR];
            bool ok[KR];
#pragma unroll
            for (int u = 0; u < KR; ++u) raw[u] = next[u], ok[u] = next_ok[u];
            if (kEarly) {
                load_step(src + KR * W, i + KR);
            } else {
                const T* __restrict__ row = src + KR * W;
#pragma unroll
                for (int u = 0; u < KR; ++u, row += W) {  // predicated, not branched around
                    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %1, 0;\n @p prefetch.global.L2 [%0];\n}\n"
                                 ::"l"(row), "r"(static_cast<int>(in_rows(i + KR + u + KR - 1))));
                }
            }
#pragma unroll
            for (int u = 0; u < KR; ++u, src += W, dst += W) {
                win[(u + KR - 1) % KR].fill(raw[u], src, left_edge, right_edge, ok[u] && load_left,
                                            ok[u] && load_right);
                Vec o;
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    Acc acc = b;
#pragma unroll
                    for (int r = 0; r < KR; ++r) {
#pragma unroll
                        for (int s = 0; s < KS; ++s) acc = fma(wr[r][s], win[(u + r) % KR].at(e + s), acc);
                    }
                    if constexpr (kEpi) {  // (rows and lanes not stored read no residual: it may end there)
                        if (i + u < n_store) acc = cuconv::epilogue(acc, epi, res, (dst - out) + e);
                    }
                    o.v[e] = cuconv::from_acc<T>(acc);
                }
                if (i + u < n_store) *reinterpret_cast<Vec*>(dst) = o;
            }
        }
    }
}

// Blocks per SM its registers must allow: 4 for 3×3 kernels summing in float (54 registers), else 2
// (5×5 in float: 96; 3×3 in double: 72).
template <typename T, int KR>
__host__ __device__ constexpr int plane_min_blocks() {
    return KR <= 3 && sizeof(typename cuconv::Acc<T>::type) == 4 ? 4 : 2;
}

// Forward, stride = dilation = 1, compile-time KR × KS, whole input planes in shared memory (see top).
template <typename T, int KR, int KS, bool kEpi>
__global__ void __launch_bounds__(256, plane_min_blocks<T, KR>())
depthwise_fwd_plane(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                    T* __restrict__ out, const T* __restrict__ res, const cuconv::ConvGeometry geo,
                    const DwWork work, const cuconv::EpilogueArgs epi) {
    const i64 N = geo.n, C = geo.c, H = geo.h, W = geo.w, K = geo.k, P = geo.p, Q = geo.q, mult = work.mult;
    const i64 pad_top = geo.pad_top, pad_left = geo.pad_left, rows_per_strip = work.rows, strips = work.strips;
    const i64 lead = work.lead, pitch = work.pitch, stages = work.stages;
    typedef typename cuconv::Acc<T>::type Acc;
    constexpr int V = cuconv::VecWidth<T>::value;  // elements of a 16-byte copy
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* __restrict__ bufs = reinterpret_cast<T*>(smem_raw);  // `stages` buffers of rows * pitch elements

    const int Hi = static_cast<int>(H), Wi = static_cast<int>(W), Pi = static_cast<int>(P), Qi = static_cast<int>(Q);
    const int pt = static_cast<int>(pad_top), pl = static_cast<int>(pad_left);
    const int ld = static_cast<int>(lead), pch = static_cast<int>(pitch);
    const int rows = Pi + KR - 1;  // window rows: image rows -pt .. P + KR - 2 - pt
    const int buf_elems = rows * pch, n_stages = static_cast<int>(stages);
    const int tid = threadIdx.x;
    const i64 planes = N * C, grid = gridDim.x;

    // The halo (rows above and below the image, columns left and right of it) is the same in every buffer
    // and no copy ever writes it: zero it once.
    for (int b = 0; b < n_stages; ++b) {
        T* win = bufs + b * buf_elems;
        for (int i = tid; i < pt * pch; i += 256) win[i] = cuconv::zero<T>();
        for (int i = (pt + Hi) * pch + tid; i < buf_elems; i += 256) win[i] = cuconv::zero<T>();
        const int side = pch - Wi;  // per image row: columns [0, lead) and [lead + W, pitch)
        for (int i = tid; i < Hi * side; i += 256) {
            const int r = i / side, col = i - r * side;
            win[(r + pt) * pch + (col < ld ? col : col + Wi)] = cuconv::zero<T>();
        }
    }
    // Requests input plane `plane` (if it exists) into buffer b, in 16-byte copies (the launcher's
    // condition: 16-byte aligned rows; elsewhere the strips kernel, as fast without them, runs instead).
    auto stage = [&](i64 plane, int b) {
        if (plane >= planes) return;
        T* win = bufs + b * buf_elems + pt * pch + ld;  // image (0, 0)
        const T* __restrict__ x_plane = x + plane * H * W;
        const int per_row = Wi / V;
        for (int i = tid; i < Hi * per_row; i += 256) {
            const int r = i / per_row, v = i - r * per_row;
            cuconv::cp_async_cg16(cuconv::smem_addr(win + r * pch + v * V), x_plane + r * Wi + v * V, true);
        }
    };

    // Pipeline over this block's planes blockIdx.x, + gridDim.x, ...: plane it + stages - 1 is requested
    // while plane it is convolved (one commit group per plane, empty past the last).
    for (int b = 0; b + 1 < n_stages; ++b) {
        stage(blockIdx.x + b * grid, b);
        cuconv::cp_async_commit();
    }
    const int m = static_cast<int>(mult);
    const int rps = static_cast<int>(rows_per_strip), n_strips = static_cast<int>(strips);
    // (n, c) of a plane: in 32 bits where the planes allow (a 64-bit division is a ~100-instruction routine)
    const bool narrow = planes <= 0x7fffffff;
    int it = 0;
    for (i64 plane = blockIdx.x; plane < planes; plane += grid, ++it) {
        stage(plane + (n_stages - 1) * grid, (it + n_stages - 1) % n_stages);  // the buffer of plane it - 1
        cuconv::cp_async_commit();
        if (n_stages >= 4)
            cuconv::cp_async_wait<3>();
        else if (n_stages == 3)
            cuconv::cp_async_wait<2>();
        else
            cuconv::cp_async_wait<1>();
        __syncthreads();  // plane it has landed for every thread (and the halo is zero)

        // Each thread slot owns output column q and a strip of rows_per_strip rows, walking down it with
        // the KR window rows it reads in registers (KS columns each): per output row, KS conflict-free
        // shared-memory loads (neighbouring lanes, neighbouring columns), KR·KS FMAs, one coalesced store.
        const T* __restrict__ win = bufs + (it % n_stages) * buf_elems + ld - pl;  // window (0, 0)
        const int c = narrow ? static_cast<int>(static_cast<unsigned>(plane) % static_cast<unsigned>(C))
                             : static_cast<int>(plane % C);
        const i64 n = narrow ? static_cast<i64>(static_cast<unsigned>(plane) / static_cast<unsigned>(C)) : plane / C;

        for (int j = 0; j < m; ++j) {
            const int k = c * m + j;
            Acc wr[KR][KS];
            const Acc b = load_taps(wr, w, bias, static_cast<i64>(k), work.flip != 0);
            const i64 plane_off = (n * K + k) * P * Q;
            for (int idx = tid; idx < n_strips * Qi; idx += 256) {
                const int strip = idx / Qi, q = idx - strip * Qi;
                const int p0 = strip * rps, p1 = min(p0 + rps, Pi);
                const T* __restrict__ src = win + p0 * pch + q;
                Acc xw[KR][KS];
#pragma unroll
                for (int r = 0; r + 1 < KR; ++r) {
#pragma unroll
                    for (int s = 0; s < KS; ++s) xw[r + 1][s] = cuconv::to_acc(src[r * pch + s]);
                }
                src += (KR - 1) * pch;
#pragma unroll 4
                for (int p = p0; p < p1; ++p, src += pch) {
                    Acc row[KS];
#pragma unroll
                    for (int s = 0; s < KS; ++s) row[s] = cuconv::to_acc(src[s]);
                    const i64 o = plane_off + static_cast<i64>(p) * Q + q;
                    out[o] = cuconv::from_acc<T>(cuconv::epilogue_if<kEpi>(strip_step(xw, row, wr, b), epi, res, o));
                }
            }
        }
        __syncthreads();  // every thread is done with this buffer before it is staged into again
    }
    cuconv::cp_async_wait<0>();  // only empty groups remain; nothing in flight at exit
}

// One thread per output (n, k, p, q), flat over the batch's planes, so that small planes (7x7, 14x14) and
// strided layers keep every thread busy; the KR x KS window comes through L1, where the neighbouring outputs'
// windows overlap it.
template <typename T, int KR, int KS, bool kEpi>
__global__ void __launch_bounds__(256)
depthwise_fwd_gather(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                     T* __restrict__ out, const T* __restrict__ res, DwGeometry g, const cuconv::EpilogueArgs epi) {
    typedef typename cuconv::Acc<T>::type Acc;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < g.total; idx += gridDim.x * blockDim.x) {
        const int q = idx % g.q;
        const int t = idx / g.q;
        const int p = t % g.p;
        const int plane = t / g.p;  // n * K + k
        const int k = plane % g.k, n = plane / g.k;
        const T* __restrict__ x_plane = x + (static_cast<i64>(n) * g.c + k / g.mult) * g.h * g.w;
        const T* __restrict__ w_k = w + static_cast<i64>(k) * (KR * KS);
        const int ih0 = p * g.stride_h - g.pad_top, iw0 = q * g.stride_w - g.pad_left;
        Acc acc = bias != nullptr ? cuconv::to_acc(bias[k]) : Acc(0);
#pragma unroll
        for (int r = 0; r < KR; ++r) {
            const int ih = ih0 + r * g.dil_h;
            if (static_cast<unsigned>(ih) >= static_cast<unsigned>(g.h)) continue;
#pragma unroll
            for (int s = 0; s < KS; ++s) {
                const int iw = iw0 + s * g.dil_w;
                if (static_cast<unsigned>(iw) < static_cast<unsigned>(g.w))
                    acc = fma(cuconv::to_acc(w_k[g.flip ? KR * KS - 1 - (r * KS + s) : r * KS + s]),
                              cuconv::to_acc(x_plane[ih * g.w + iw]), acc);
            }
        }
        out[idx] = cuconv::from_acc<T>(cuconv::epilogue_if<kEpi>(acc, epi, res, idx));
    }
}

// The same at dilation 1 and a column stride SW of 1 or 2, two neighbouring outputs (p, 2j) and (p, 2j + 1) per
// thread: their windows share KS - SW columns, so a window row is KS + SW loads for two outputs, not 2·KS.
template <typename T, int KR, int KS, int SW, bool kEpi>
__global__ void __launch_bounds__(256)
depthwise_fwd_gather2(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                      T* __restrict__ out, const T* __restrict__ res, DwGeometry g, const cuconv::EpilogueArgs epi) {
    typedef typename cuconv::Acc<T>::type Acc;
    constexpr int kCols = KS + SW;  // window columns iw0 .. iw0 + SW + KS - 1
    const int pairs = (g.q + 1) / 2;
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < g.total; idx += gridDim.x * blockDim.x) {
        const int j = idx % pairs;
        const int t = idx / pairs;
        const int p = t % g.p;
        const int plane = t / g.p;  // n * K + k
        const int k = plane % g.k, n = plane / g.k;
        const T* __restrict__ x_plane = x + (static_cast<i64>(n) * g.c + k / g.mult) * g.h * g.w;
        const T* __restrict__ w_k = w + static_cast<i64>(k) * (KR * KS);
        const int q = 2 * j;
        const int ih0 = p * g.stride_h - g.pad_top, iw0 = q * SW - g.pad_left;
        bool col_ok[kCols];
#pragma unroll
        for (int c = 0; c < kCols; ++c) col_ok[c] = static_cast<unsigned>(iw0 + c) < static_cast<unsigned>(g.w);
        const Acc b = bias != nullptr ? cuconv::to_acc(bias[k]) : Acc(0);
        Acc acc0 = b, acc1 = b;
#pragma unroll
        for (int r = 0; r < KR; ++r) {
            const int ih = ih0 + r;
            if (static_cast<unsigned>(ih) >= static_cast<unsigned>(g.h)) continue;
            const T* __restrict__ row = x_plane + ih * g.w + iw0;
            Acc v[kCols];
#pragma unroll
            for (int c = 0; c < kCols; ++c) v[c] = col_ok[c] ? cuconv::to_acc(row[c]) : Acc(0);
#pragma unroll
            for (int s = 0; s < KS; ++s) {
                const Acc wv = cuconv::to_acc(w_k[g.flip ? KR * KS - 1 - (r * KS + s) : r * KS + s]);
                acc0 = fma(wv, v[s], acc0);
                acc1 = fma(wv, v[s + SW], acc1);
            }
        }
        const i64 o = static_cast<i64>(plane) * g.p * g.q + p * g.q + q;
        out[o] = cuconv::from_acc<T>(cuconv::epilogue_if<kEpi>(acc0, epi, res, o));
        if (q + 1 < g.q) out[o + 1] = cuconv::from_acc<T>(cuconv::epilogue_if<kEpi>(acc1, epi, res, o + 1));
    }
}
