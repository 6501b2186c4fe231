// flip_weight: the weight of dgrad's forward convolution (dgrad_forward.py): per group, input and output
// channels swapped and the kernel flipped in both axes.
//
// Kernel   flip_weight<T>(w, wf, FlipShape fs)
//   w   (groups·KG, CG, R, S)    the forward weight, KCRS
//   wf  (groups·CG, KG, R, S)    wf[g·CG + c, k, t] = w[g·KG + k, c, RS - 1 - t]  (t = r·S + s: reversing the
//                                flattened tap index flips both axes)
//   T   storage type.
// Mapping: block (32, 8) transposes a 32 x 32 tile of (filter k, channel c) of one group at one tap through
// shared memory; grid (c tiles · groups, k tiles, taps). Reads and writes step RS elements between
// neighbouring lanes; the blocks of the other taps read and write the rest of those sectors, from L2.
// Kernel   flip_weight_elementwise<T>(w, wf, FlipShape fs)
//   the same w', one thread per element of wf (grid-stride, coalesced writes): for groups narrower than a
//   32 x 32 tile (depthwise: one filter and one channel per group), where the tiles would be mostly empty
//   blocks (a 960-channel 5x5 depthwise weight: 24000 blocks of one element each, ~35 us).
// Offsets are 32-bit: the Python twin launches them for weights of fewer than 2^31 elements.
#include "common.cuh"

struct FlipShape {
    int groups, kg, cg, rs, c_tiles, unused;
};
static_assert(sizeof(FlipShape) == 24, "FLIP_SHAPE_DTYPE in cuconv/blocks/dgrad_forward.py has this layout");

template <typename T>
__global__ void __launch_bounds__(256) flip_weight(const T* __restrict__ w, T* __restrict__ wf, const FlipShape fs) {
    __shared__ T tile[32][33];
    const int g = blockIdx.x / fs.c_tiles;
    const int c0 = (blockIdx.x - g * fs.c_tiles) * 32, k0 = blockIdx.y * 32;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int t = blockIdx.z;
    const T* src = w + (g * fs.kg) * fs.cg * fs.rs;
    T* dst = wf + (g * fs.cg) * fs.kg * fs.rs;
#pragma unroll
    for (int i = ty; i < 32; i += 8) {  // tile[k][c] = w[k0 + i, c0 + tx, t]
        const int k = k0 + i, c = c0 + tx;
        if (k < fs.kg && c < fs.cg) tile[i][tx] = src[(k * fs.cg + c) * fs.rs + t];
    }
    __syncthreads();
#pragma unroll
    for (int i = ty; i < 32; i += 8) {  // wf[c0 + i, k0 + tx, RS - 1 - t] = tile[k][c]
        const int c = c0 + i, k = k0 + tx;
        if (k < fs.kg && c < fs.cg) dst[(c * fs.kg + k) * fs.rs + (fs.rs - 1 - t)] = tile[tx][i];
    }
}

template <typename T>
__global__ void __launch_bounds__(256)
flip_weight_elementwise(const T* __restrict__ w, T* __restrict__ wf, const FlipShape fs) {
    const int total = fs.groups * fs.cg * fs.kg * fs.rs;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        const int t = e % fs.rs;
        int rest = e / fs.rs;
        const int k = rest % fs.kg;
        rest /= fs.kg;
        const int c = rest % fs.cg, g = rest / fs.cg;  // wf[g·CG + c, k, t] = w[g·KG + k, c, RS - 1 - t]
        wf[e] = w[((g * fs.kg + k) * fs.cg + c) * fs.rs + (fs.rs - 1 - t)];
    }
}
