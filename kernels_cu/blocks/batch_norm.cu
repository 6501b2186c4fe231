// BatchNorm on a convolution's output in train mode, with the block's epilogue (cuconv/nn/fuse_train.py: a fused
// Conv -> BatchNorm2d -> [residual] -> activation -> [residual] block on CUDA tensors). y is (N, C, H, W) as M = N·HW
// rows of C channels, laid out NCHW (NHWC false) or channels-last (NHWC true); every tensor of a call in y's layout.
// Statistics and sums in fp32, in a fixed order (chunks of rows, then the chunks in turn): a call's results are the
// same run to run.
//
// Forward
//   bn_stats<T, NHWC>(y, part1, part2, M, C, HW, rows_per_chunk)
//       a chunk's Σ (y - y0) and Σ (y - y0)² per channel into part1/part2[chunk·C + c], y0 the channel's first
//       element (the shift keeps the variance's cancellation at the scale of the spread, not of the mean)
//   bn_finalize(part1, part2, y, gamma, beta, running_mean, running_var, num_batches_tracked, mean, invstd, scale,
//               shift, M, C, HW, chunks, eps, momentum)   [a template on T for y0's type, and NHWC]
//       mean, 1/sqrt(var + eps) (var biased), scale = γ·invstd, shift = β - mean·scale (γ, β: null for none);
//       running statistics updated as torch's BatchNorm updates them, where running_mean is not null: the factor
//       momentum, or 1/num_batches_tracked where momentum < 0 (torch's momentum=None), the variance unbiased
//   bn_apply<T, NHWC>(y, residual, scale, shift, out, n, C, HW, act, res, alpha)
//       out = epilogue(y·scale + shift) (cuconv::finish_value: the residual before (res 1) or after (res 2) the
//       activation act), rounded once to T
// Backward (dz the block's output gradient)
//   bn_backward_sums<T, NHWC>(dz, y, residual, scale, shift, mean, invstd, part1, part2, d_residual, M, C, HW,
//                             rows_per_chunk, act, res, alpha)
//       d = dz·act'(pre) at the recomputed pre = y·scale + shift (+ residual, res 1); a chunk's Σ d and
//       Σ d·(y - mean)·invstd per channel; d written to d_residual where it is not null (the gradient of a residual
//       added before the activation)
//   bn_backward_finalize(part1, part2, d_beta, d_gamma, coef1, coef2, M, C, chunks)
//       dβ = Σ d, dγ = Σ d·x̂, coef1 = Σ d / M, coef2 = Σ d·x̂ / M
//   bn_backward_dy<T, NHWC>(dz, y, residual, scale, shift, mean, invstd, coef1, coef2, dy, n, C, HW, act, res, alpha)
//       dy = scale·(d - coef1 - x̂·coef2), d recomputed as above, rounded once to T
// Mapping: the sums take a block per (channel tile, chunk): NHWC 32 channels × 8 rows of threads (a warp's loads a
// row's 32 consecutive channels), NCHW a channel × 256 positions (consecutive positions of a plane); the threads of a
// channel are summed through shared memory in a fixed tree. The elementwise kernels are grid-stride loops in memory
// order.
#include "epilogue.cuh"

using cuconv::i64;

namespace {

// The offset of row m (n·HW + hw), channel c.
template <bool NHWC>
__device__ __forceinline__ i64 offset_of(i64 m, int c, int C, i64 HW) {
    if constexpr (NHWC) {
        return m * C + c;
    } else {
        const i64 n = m / HW;
        return (n * C + c) * HW + (m - n * HW);
    }
}

// The channel of element i in memory order.
template <bool NHWC>
__device__ __forceinline__ int channel_of(i64 i, int C, i64 HW) {
    if constexpr (NHWC) {
        return static_cast<int>(i % C);
    } else {
        return static_cast<int>((i / HW) % C);
    }
}

// d(act)/d(pre) at v, torch's derivative of each activation (its backward formulas; at a kink the side torch takes).
__device__ __forceinline__ float activation_grad(int act, float v, float alpha) {
    switch (act) {
        case 1: return v > 0.0f ? 1.0f : 0.0f;
        case 2: return (v > 0.0f && v < 6.0f) ? 1.0f : 0.0f;
        case 3: return v > 0.0f ? 1.0f : alpha;
        case 4: {
            const float s = 1.0f / (1.0f + expf(-v));
            return s * (1.0f + v * (1.0f - s));
        }
        case 5: {
            const float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752440f));
            const float pdf = expf(-0.5f * v * v) * 0.39894228040143267794f;
            return cdf + v * pdf;
        }
        case 6: {
            const float beta = 0.79788456080286535588f, kappa = 0.044715f;
            const float t = tanhf(beta * (v + kappa * v * v * v));
            return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * beta * (1.0f + 3.0f * kappa * v * v);
        }
        case 7: return v <= -3.0f ? 0.0f : (v < 3.0f ? v / 3.0f + 0.5f : 1.0f);
        case 8: return (v > -3.0f && v < 3.0f) ? (1.0f / 6.0f) : 0.0f;
        case 9: {
            const float s = 1.0f / (1.0f + expf(-v));
            return s * (1.0f - s);
        }
        default: return 1.0f;
    }
}

// The threads' per-channel values a and b summed over the threads that share a channel, in a fixed order:
// NHWC the 8 rows of a 32-channel tile (threadIdx.y), NCHW the 256 threads of a channel. Thread 0 of each channel
// (threadIdx.y == 0, NHWC; threadIdx.x == 0, NCHW) gets the sums.
template <bool NHWC>
__device__ __forceinline__ void block_sums(float& a, float& b) {
    __shared__ float sa[256], sb[256];
    const int t = threadIdx.y * blockDim.x + threadIdx.x;
    sa[t] = a;
    sb[t] = b;
    __syncthreads();
    if constexpr (NHWC) {
        // (8 rows: a thread of row 0 sums its channel's column)
        if (threadIdx.y == 0) {
#pragma unroll
            for (int r = 1; r < 8; ++r) {
                a += sa[r * 32 + threadIdx.x];
                b += sb[r * 32 + threadIdx.x];
            }
        }
    } else {
        for (int stride = 128; stride > 0; stride >>= 1) {
            if (t < stride) {
                sa[t] += sa[t + stride];
                sb[t] += sb[t + stride];
            }
            __syncthreads();
        }
        a = sa[0];
        b = sb[0];
    }
}

// A block's share of a pass that sums channels: its channel c (NHWC: 32 channels a block, 8 rows of threads down
// the rows; NCHW: one channel a block, 256 threads down its rows) and the rows [begin, end) of chunk blockIdx.y,
// a thread taking every lanes-th from lane.
template <bool NHWC>
struct ChunkRows {
    int c, lane, lanes;
    i64 begin, end;
    __device__ ChunkRows(i64 M, i64 rows_per_chunk)
        : c(NHWC ? blockIdx.x * 32 + threadIdx.x : blockIdx.x),
          lane(NHWC ? threadIdx.y : threadIdx.x),
          lanes(NHWC ? 8 : 256),
          begin(static_cast<i64>(blockIdx.y) * rows_per_chunk),
          end(min(M, begin + rows_per_chunk)) {}
};

// The block's two sums of its chunk into part1/part2[chunk][c]; every thread of the block calls it (block_sums
// synchronizes).
template <bool NHWC>
__device__ void store_chunk_sums(float s1, float s2, const ChunkRows<NHWC>& r, int C, float* part1, float* part2) {
    block_sums<NHWC>(s1, s2);
    if (r.c < C && r.lane == 0) {
        part1[blockIdx.y * static_cast<i64>(C) + r.c] = s1;
        part2[blockIdx.y * static_cast<i64>(C) + r.c] = s2;
    }
}

}  // namespace

template <typename T, bool NHWC>
__global__ void __launch_bounds__(256) bn_stats(const T* __restrict__ y, float* __restrict__ part1,
                                                float* __restrict__ part2, i64 M, int C, i64 HW,
                                                i64 rows_per_chunk) {
    const ChunkRows<NHWC> r(M, rows_per_chunk);
    const int c = r.c;
    float s1 = 0.0f, s2 = 0.0f;
    if (c < C) {
        const float y0 = cuconv::to_acc(y[offset_of<NHWC>(0, c, C, HW)]);
        for (i64 m = r.begin + r.lane; m < r.end; m += r.lanes) {
            const float d = cuconv::to_acc(y[offset_of<NHWC>(m, c, C, HW)]) - y0;
            s1 += d;
            s2 += d * d;
        }
    }
    store_chunk_sums<NHWC>(s1, s2, r, C, part1, part2);
}

template <typename T, bool NHWC>
__global__ void __launch_bounds__(256) bn_finalize(const float* __restrict__ part1, const float* __restrict__ part2,
                                                   const T* __restrict__ y, const float* __restrict__ gamma,
                                                   const float* __restrict__ beta, float* __restrict__ running_mean,
                                                   float* __restrict__ running_var,
                                                   const long long* __restrict__ num_batches_tracked,
                                                   float* __restrict__ mean_out, float* __restrict__ invstd_out,
                                                   float* __restrict__ scale_out, float* __restrict__ shift_out, i64 M,
                                                   int C, i64 HW, int chunks, float eps, float momentum) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    // (the chunks in turn, in double: a fixed order, and no rounding of the sum of many chunks to fp32 on the way)
    double s1 = 0.0, s2 = 0.0;
    for (int k = 0; k < chunks; ++k) {
        s1 += part1[static_cast<i64>(k) * C + c];
        s2 += part2[static_cast<i64>(k) * C + c];
    }
    const double y0 = cuconv::to_acc(y[offset_of<NHWC>(0, c, C, HW)]);
    const double shifted = s1 / static_cast<double>(M);
    double var = s2 / static_cast<double>(M) - shifted * shifted;
    var = var < 0.0 ? 0.0 : var;
    const double mean = y0 + shifted;
    const float invstd = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
    const float scale = gamma != nullptr ? gamma[c] * invstd : invstd;
    mean_out[c] = static_cast<float>(mean);
    invstd_out[c] = invstd;
    scale_out[c] = scale;
    shift_out[c] = (beta != nullptr ? beta[c] : 0.0f) - static_cast<float>(mean) * scale;
    if (running_mean != nullptr) {
        const float f = momentum >= 0.0f ? momentum : 1.0f / static_cast<float>(num_batches_tracked[0]);
        const double unbiased = M > 1 ? var * static_cast<double>(M) / static_cast<double>(M - 1) : var;
        running_mean[c] = (1.0f - f) * running_mean[c] + f * static_cast<float>(mean);
        running_var[c] = (1.0f - f) * running_var[c] + f * static_cast<float>(unbiased);
    }
}

template <typename T, bool NHWC>
__global__ void __launch_bounds__(256) bn_apply(const T* __restrict__ y, const T* __restrict__ residual,
                                                const float* __restrict__ scale, const float* __restrict__ shift,
                                                T* __restrict__ out, i64 n, int C, i64 HW, int act, int res,
                                                float alpha) {
    for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<i64>(gridDim.x) * blockDim.x) {
        const int c = channel_of<NHWC>(i, C, HW);
        const float v = cuconv::to_acc(y[i]) * scale[c] + shift[c];
        const float rv = res != 0 ? cuconv::to_acc(residual[i]) : 0.0f;
        out[i] = cuconv::from_acc<T>(cuconv::finish_value<float>(v, act, res, alpha, rv));
    }
}

// d = dz·act'(pre) at element i (pre recomputed: y·scale + shift, plus the residual added before the activation).
template <typename T>
__device__ __forceinline__ float pre_activation_grad(const T* __restrict__ dz, const T* __restrict__ y,
                                                     const T* __restrict__ residual, float scale, float shift, i64 i,
                                                     int act, int res, float alpha) {
    const float g = cuconv::to_acc(dz[i]);
    if (act == 0) return g;
    float pre = cuconv::to_acc(y[i]) * scale + shift;
    if (res == 1) pre += cuconv::to_acc(residual[i]);  // (bn_apply's value: fp32 throughout, no rounding between)
    return g * activation_grad(act, pre, alpha);
}

template <typename T, bool NHWC>
__global__ void __launch_bounds__(256) bn_backward_sums(const T* __restrict__ dz, const T* __restrict__ y,
                                                        const T* __restrict__ residual,
                                                        const float* __restrict__ scale,
                                                        const float* __restrict__ shift,
                                                        const float* __restrict__ mean,
                                                        const float* __restrict__ invstd, float* __restrict__ part1,
                                                        float* __restrict__ part2, T* __restrict__ d_residual, i64 M,
                                                        int C, i64 HW, i64 rows_per_chunk, int act, int res,
                                                        float alpha) {
    const ChunkRows<NHWC> r(M, rows_per_chunk);
    const int c = r.c;
    float s1 = 0.0f, s2 = 0.0f;
    if (c < C) {
        const float sc = scale[c], sh = shift[c], mu = mean[c], is = invstd[c];
        for (i64 m = r.begin + r.lane; m < r.end; m += r.lanes) {
            const i64 i = offset_of<NHWC>(m, c, C, HW);
            const float d = pre_activation_grad(dz, y, residual, sc, sh, i, act, res, alpha);
            s1 += d;
            s2 += d * ((cuconv::to_acc(y[i]) - mu) * is);
            if (d_residual != nullptr) d_residual[i] = cuconv::from_acc<T>(d);
        }
    }
    store_chunk_sums<NHWC>(s1, s2, r, C, part1, part2);
}

__global__ void __launch_bounds__(256) bn_backward_finalize(const float* __restrict__ part1,
                                                            const float* __restrict__ part2,
                                                            float* __restrict__ d_beta, float* __restrict__ d_gamma,
                                                            float* __restrict__ coef1, float* __restrict__ coef2,
                                                            i64 M, int C, int chunks) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double s1 = 0.0, s2 = 0.0;
    for (int k = 0; k < chunks; ++k) {
        s1 += part1[static_cast<i64>(k) * C + c];
        s2 += part2[static_cast<i64>(k) * C + c];
    }
    d_beta[c] = static_cast<float>(s1);
    d_gamma[c] = static_cast<float>(s2);
    coef1[c] = static_cast<float>(s1 / static_cast<double>(M));
    coef2[c] = static_cast<float>(s2 / static_cast<double>(M));
}

template <typename T, bool NHWC>
__global__ void __launch_bounds__(256) bn_backward_dy(const T* __restrict__ dz, const T* __restrict__ y,
                                                      const T* __restrict__ residual, const float* __restrict__ scale,
                                                      const float* __restrict__ shift, const float* __restrict__ mean,
                                                      const float* __restrict__ invstd,
                                                      const float* __restrict__ coef1,
                                                      const float* __restrict__ coef2, T* __restrict__ dy, i64 n,
                                                      int C, i64 HW, int act, int res, float alpha) {
    for (i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<i64>(gridDim.x) * blockDim.x) {
        const int c = channel_of<NHWC>(i, C, HW);
        const float sc = scale[c];
        const float d = pre_activation_grad(dz, y, residual, sc, shift[c], i, act, res, alpha);
        const float xhat = (cuconv::to_acc(y[i]) - mean[c]) * invstd[c];
        dy[i] = cuconv::from_acc<T>(sc * (d - coef1[c] - xhat * coef2[c]));
    }
}
