// winograd: the transforms of a Winograd (Toom-Cook) convolution; its GEMMs are cuBLAS's.
//
// Stride 1, dilation 1, one group. Per axis a kernel of R taps produces output tiles of M positions from
// input tiles of A = M + R - 1 positions (M = 1 leaves the axis untransformed, with A = R = 1), through
// the 1-D minimal filtering algorithm F(M, R):  y = AT · ((G · w) ⊙ (BT · d)),  built from the A - 1
// interpolation points 0, 1, -1, 2, -2, 1/2, -1/2 (the first A - 1 of them) and infinity. In 2-D, with
// tiles MH x MW over the output and AH x AW over the input:
//   U[a, b, k, c] = (G_h · w[k, c] · G_wᵀ)[a, b]                           winograd_weight
//   V[a, b, c, t] = (BT_h · d_t[c] · BT_wᵀ)[a, b]    d_t: the input tile t   winograd_input
//   M[a, b, k, t] = Σ_c U[a, b, k, c] · V[a, b, c, t]   (AH·AW GEMMs, cuBLAS, strided-batched)
//   y_t[k]        = AT_h · M[:, :, k, t] · AT_wᵀ  (+ bias[k])                 winograd_output
// The matrices are computed at compile time from (M, R) (struct Axis in winograd.cuh), so zeros cost nothing
// and ones cost no multiply; the 2-D transforms stay in registers.
//
// Kernels (T: float or double; the transforms compute in T, the GEMMs in cuBLAS at T's full precision):
//   winograd_weight<T, MH, RH, MW, RW>(w, u, K, C)         one thread per (k, c); w is (K, C, RH, RW)
//   winograd_input<T, MH, RH, MW, RW>(x, v, ConvGeometry, WinoChunk)           one thread per (tile, c): blockIdx.y = c
//   winograd_output<T, MH, RH, MW, RW>(m, bias, y, x, w, ConvGeometry, WinoChunk)  one thread per (tile, k):
//                                                                                 blockIdx.y = k
// Non-finite values: see wino::direct_output (winograd.cuh); winograd_output applies it to its outputs.
// Tiles: output tile (th, tw) of sample n covers rows th·MH.. and columns tw·MW..; tiles are numbered
// t = (n·tiles_h + th)·tiles_w + tw, and a launch covers the tiles of the tile rows n·tiles_h + th in
// [row0, row0 + tiles / tiles_w) (a chunk of whole tile rows, so that the GEMM operands of one chunk fit
// the workspace). V and M hold a chunk as (AH·AW, C or K, ld) with tile t at column t - row0·tiles_w
// (ld ≥ tiles, padded for the GEMM's alignment).
// Consecutive threads take consecutive tiles: V and M are read and written coalesced; x and y are read
// and written element by element, a warp's 32 accesses MW elements apart.
#include "common.cuh"
#include "winograd.cuh"

using cuconv::i64;

// A launch's chunk of tiles (see "Tiles" above; WINO_CHUNK_DTYPE in cuconv/algos/winograd.py has this layout):
// the tile rows and columns of a sample, the chunk's first tile row, its tiles, and V's and M's row length.
struct WinoChunk {
    long long tiles_h, tiles_w, row0, tiles, ld;
};
static_assert(sizeof(WinoChunk) == 40, "WINO_CHUNK_DTYPE in cuconv/algos/winograd.py has this layout");

namespace wino {

// Sample and tile coordinates of tile t of a launch that starts at tile row row0 (= n·tiles_h + th).
struct TileOrigin {
    i64 n, th;
    int tw;
};
__device__ __forceinline__ TileOrigin tile_origin(int t, i64 row0, int tiles_w, i64 tiles_h) {
    const i64 row = row0 + t / tiles_w;
    const i64 n = row / tiles_h;
    return {n, row - n * tiles_h, t % tiles_w};
}

}  // namespace wino

template <typename T, int MH, int RH, int MW, int RW>
__global__ void __launch_bounds__(256)
winograd_weight(const T* __restrict__ w, T* __restrict__ u, i64 K, i64 C) {
    constexpr const wino::Axis<MH, RH>& ah = wino::Table<MH, RH>::value;
    constexpr const wino::Axis<MW, RW>& aw = wino::Table<MW, RW>::value;
    constexpr int AH = ah.A, AW = aw.A;
    const i64 total = K * C;
    for (i64 idx = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
         idx += static_cast<i64>(gridDim.x) * blockDim.x) {
        const T* __restrict__ src = w + idx * (RH * RW);  // idx = k·C + c
        T taps[RH][RW];
#pragma unroll
        for (int i = 0; i < RH; ++i)
#pragma unroll
            for (int j = 0; j < RW; ++j) taps[i][j] = src[i * RW + j];
        T out[AH][AW];
        wino::transform(ah.g, taps, aw.g, out);
#pragma unroll
        for (int a = 0; a < AH; ++a)
#pragma unroll
            for (int b = 0; b < AW; ++b) u[(a * AW + b) * total + idx] = out[a][b];
    }
}

template <typename T, int MH, int RH, int MW, int RW>
__global__ void __launch_bounds__(256)
winograd_input(const T* __restrict__ x, T* __restrict__ v, const cuconv::ConvGeometry geo, const WinoChunk chunk) {
    const i64 C = geo.c, H = geo.h, W = geo.w, pad_top = geo.pad_top, pad_left = geo.pad_left;
    const i64 tiles_h = chunk.tiles_h, row0 = chunk.row0, ld = chunk.ld;
    const int tiles_w = static_cast<int>(chunk.tiles_w), tiles = static_cast<int>(chunk.tiles);
    constexpr const wino::Axis<MH, RH>& ah = wino::Table<MH, RH>::value;
    constexpr const wino::Axis<MW, RW>& aw = wino::Table<MW, RW>::value;
    constexpr int AH = ah.A, AW = aw.A;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tiles) return;
    const int c = blockIdx.y;
    const wino::TileOrigin o = wino::tile_origin(t, row0, tiles_w, tiles_h);
    const T* __restrict__ plane = x + (o.n * C + c) * H * W;
    const i64 h0 = o.th * MH - pad_top, w0 = static_cast<i64>(o.tw) * MW - pad_left;
    T d[AH][AW];
#pragma unroll
    for (int i = 0; i < AH; ++i) {
        const i64 h = h0 + i;
        const bool row_in = h >= 0 && h < H;
#pragma unroll
        for (int j = 0; j < AW; ++j) {
            const i64 wc = w0 + j;
            d[i][j] = (row_in && wc >= 0 && wc < W) ? plane[h * W + wc] : T(0);
        }
    }
    T out[AH][AW];
    wino::transform(ah.bt, d, aw.bt, out);
    T* __restrict__ dst = v + c * ld + t;
    const i64 point_stride = C * ld;
#pragma unroll
    for (int a = 0; a < AH; ++a)
#pragma unroll
        for (int b = 0; b < AW; ++b) dst[(a * AW + b) * point_stride] = out[a][b];
}

template <typename T, int MH, int RH, int MW, int RW>
__global__ void __launch_bounds__(256)
winograd_output(const T* __restrict__ m, const T* __restrict__ bias, T* __restrict__ y, const T* __restrict__ x,
                const T* __restrict__ w, const cuconv::ConvGeometry geo, const WinoChunk chunk) {
    const i64 K = geo.k, P = geo.p, Q = geo.q, C = geo.c, H = geo.h, W = geo.w, pad_top = geo.pad_top;
    const i64 pad_left = geo.pad_left, tiles_h = chunk.tiles_h, row0 = chunk.row0, ld = chunk.ld;
    const int tiles_w = static_cast<int>(chunk.tiles_w), tiles = static_cast<int>(chunk.tiles);
    constexpr const wino::Axis<MH, RH>& ah = wino::Table<MH, RH>::value;
    constexpr const wino::Axis<MW, RW>& aw = wino::Table<MW, RW>::value;
    constexpr int AH = ah.A, AW = aw.A;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tiles) return;
    const int k = blockIdx.y;
    const T* __restrict__ src = m + k * ld + t;
    const i64 point_stride = K * ld;
    T e[AH][AW];
#pragma unroll
    for (int a = 0; a < AH; ++a)
#pragma unroll
        for (int b = 0; b < AW; ++b) e[a][b] = src[(a * AW + b) * point_stride];
    T out[MH][MW];
    wino::transform(ah.at, e, aw.at, out);
    const T add = bias != nullptr ? bias[k] : T(0);
    const wino::TileOrigin o = wino::tile_origin(t, row0, tiles_w, tiles_h);
    T* __restrict__ plane = y + (o.n * K + k) * P * Q;
    const i64 p0 = o.th * MH, q0 = static_cast<i64>(o.tw) * MW;
#pragma unroll
    for (int i = 0; i < MH; ++i)
#pragma unroll
        for (int j = 0; j < MW; ++j)
            if (p0 + i < P && q0 + j < Q) {
                T v = out[i][j];
                if (!isfinite(v))  // (a NaN or Inf among the tile's inputs: see wino::direct_output)
                    v = wino::direct_output(x, w, o.n, k, p0 + i, q0 + j, C, H, W, RH, RW, pad_top, pad_left);
                plane[(p0 + i) * Q + q0 + j] = v + add;
            }
}
