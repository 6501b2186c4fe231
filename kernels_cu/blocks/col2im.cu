// col2im: the adjoint of im2col, written as a gather: each input pixel sums its own contributions.
//
// Kernel   col2im<Tcol, T, kUnitStride, Index>(col, dx, ConvGeometry, Col2imChunk)
//   Tcol   type of the column matrix (float for half-precision T, so the GEMM's fp32 result is summed
//          before the single rounding to T; otherwise T itself).
//   T      type of dx.
//   kUnitStride  stride (1, 1): every tap lands on an output position, no division or modulo needed.
//   Index  int when the launch covers < 2^31 elements, else long long: the per-element decode divides,
//          and a 64-bit division is a software routine several times the cost of a 32-bit one.
//
// Layouts: col is (nb, C*R*S, ld) for output rows [p0, p0 + rows) of nb samples, columns p*Q + q
// (p local to the chunk), row pitch ld; dx is (nb, C, H, W) contiguous.
//   dx[n, c, h, w] (+)= sum over (r, s) of col[n, (c, r, s), (p - p0)*Q + q]
//   where h = p*stride_h - pad_top + r*dil_h and w = q*stride_w - pad_left + s*dil_w,
// over the (p, q) of the chunk: p = (h + pad_top - r*dil_h) / stride_h when that divides exactly.
// accumulate = 0 writes dx (the chunk holds every output row); 1 adds to it (row chunks, in order).
//
// Mapping: one thread per dx element of the rows [h0, h0 + h_rows) the chunk can touch, x fastest, so
// reads of col are coalesced along q when stride_w == 1. No atomics: every dx element is written by
// exactly one thread with a fixed summation order (r, then s), so results are deterministic.
//
// Kernel   col2im_pixels_nhwc<Unit, Index>(col, dx, ConvGeometry, units_per_pixel, total)
//   the adjoint of im2col_nhwc for an unpadded 1x1 layer at a stride (channels-last): dx (N, H, W, C)
//   pixel (n, h, w) = col row (n, h / stride_h, w / stride_w) where both divide exactly and land inside P x Q,
//   zeros elsewhere, so that one pass writes every dx element. A thread a Unit of dx (see im2col.cu), flat.
#include "common.cuh"

using cuconv::i64;

// The launch's chunk, passed by value beside the ConvGeometry (COL2IM_CHUNK_DTYPE in cuconv/blocks/col2im.py
// has this layout): the dx elements the launch covers, the chunk's output rows and column pitch, the input rows
// it can touch.
struct Col2imChunk {
    long long total, p0, rows, ld, h0, h_rows;
    int accumulate, unused;
};
static_assert(sizeof(Col2imChunk) == 56, "COL2IM_CHUNK_DTYPE in cuconv/blocks/col2im.py has this layout");

template <typename Tcol, typename T, bool kUnitStride, typename Index>
__global__ void __launch_bounds__(256)
col2im(const Tcol* __restrict__ col, T* __restrict__ dx, const cuconv::ConvGeometry g, const Col2imChunk ch) {
    typedef typename cuconv::Acc<T>::type Acc;
    const i64 total = ch.total, H = g.h, W = g.w, R = g.r, S = g.s, Q = g.q, ld = ch.ld;
    const i64 C = g.c, p0 = ch.p0, rows = ch.rows, h0 = ch.h0, h_rows = ch.h_rows;
    const i64 stride_h = g.stride_h, stride_w = g.stride_w, pad_top = g.pad_top, pad_left = g.pad_left;
    const i64 dil_h = g.dil_h, dil_w = g.dil_w;
    // the geometry in Index: with int (the Python twin's choice where every value and the element count are
    // below 2^30) the per-tap divisions are 32-bit; in i64 each is a software routine
    const Index Wx = static_cast<Index>(W), rows_x = static_cast<Index>(h_rows), Cx = static_cast<Index>(C);
    const Index Rx = static_cast<Index>(R), Sx = static_cast<Index>(S), Qx = static_cast<Index>(Q);
    const Index sh = static_cast<Index>(stride_h), sw = static_cast<Index>(stride_w);
    const Index pt = static_cast<Index>(pad_top), pl = static_cast<Index>(pad_left);
    const Index dh = static_cast<Index>(dil_h), dw = static_cast<Index>(dil_w);
    const Index p0x = static_cast<Index>(p0), rows_c = static_cast<Index>(rows), h0x = static_cast<Index>(h0);
    for (Index idx = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; idx < static_cast<Index>(total);
         idx += static_cast<Index>(gridDim.x) * blockDim.x) {
        const Index w = idx % Wx;
        const Index h = h0x + (idx / Wx) % rows_x;
        const i64 nc = idx / (Wx * rows_x);  // n * C + c
        const Tcol* __restrict__ col_c = col + nc * R * S * ld;
        Acc sum = 0;
        for (Index r = 0; r < Rx; ++r) {
            const Index hp = h + pt - r * dh;  // = p * stride_h
            if (hp < 0 || (!kUnitStride && hp % sh != 0)) continue;
            const Index p = (kUnitStride ? hp : hp / sh) - p0x;
            if (p < 0 || p >= rows_c) continue;
            for (Index s = 0; s < Sx; ++s) {
                const Index wq = w + pl - s * dw;  // = q * stride_w
                if (wq < 0 || (!kUnitStride && wq % sw != 0)) continue;
                const Index q = kUnitStride ? wq : wq / sw;
                if (q >= Qx) continue;
                sum += static_cast<Acc>(cuconv::to_acc(col_c[(static_cast<i64>(r) * S + s) * ld +
                                                             static_cast<i64>(p) * Q + q]));
            }
        }
        T* __restrict__ dst = dx + (nc * H + h) * W + w;
        if (ch.accumulate) sum += cuconv::to_acc(*dst);
        *dst = cuconv::from_acc<T>(sum);
    }
}

template <typename Unit, typename Index>
__global__ void __launch_bounds__(256)
col2im_pixels_nhwc(const Unit* __restrict__ col, Unit* __restrict__ dx, const cuconv::ConvGeometry g,
                   long long units_per_pixel, long long total) {
    const Index per = static_cast<Index>(units_per_pixel), q_count = static_cast<Index>(g.q);
    const Index p_count = static_cast<Index>(g.p), h_count = static_cast<Index>(g.h), w_count = static_cast<Index>(g.w);
    const Index sh = static_cast<Index>(g.stride_h), sw = static_cast<Index>(g.stride_w);
    for (Index i = static_cast<Index>(blockIdx.x) * 256 + static_cast<Index>(threadIdx.x);
         i < static_cast<Index>(total); i += static_cast<Index>(gridDim.x) * 256) {
        const Index u = i % per, pix = i / per;
        const Index iw = pix % w_count, t = pix / w_count, ih = t % h_count, n = t / h_count;
        const Index p = ih / sh, q = iw / sw;
        Unit v{};  // (zero-initialised: the pixels no output reads)
        if (p * sh == ih && q * sw == iw && p < p_count && q < q_count)
            v = col[((n * p_count + p) * q_count + q) * per + u];
        dx[i] = v;
    }
}
