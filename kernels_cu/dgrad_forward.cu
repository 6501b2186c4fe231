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
// Offsets are 32-bit: the Python twin launches it for weights of fewer than 2^31 elements.
#include "common.cuh"

struct FlipShape {
    int groups, kg, cg, rs, c_tiles, unused;
};
static_assert(sizeof(FlipShape) == 24, "FLIP_SHAPE_DTYPE in cuconv/families/dgrad_forward.py has this layout");

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
