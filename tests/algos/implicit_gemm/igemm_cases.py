"""What several of implicit_gemm's GPU test files share: channels-last copies and the TMA tiles' geometries."""

from __future__ import annotations

import numpy
import pytest

import cuconv
from cuconv import _dtypes



def _nhwc(a):
    """A C-contiguous (N, C, H, W) CuPy array's values as a dense (N, H, W, C) one."""
    import cupy

    return cupy.ascontiguousarray(a.transpose(0, 2, 3, 1))


def _weight(w, dtype, weights: str):
    """The weight on the GPU in ``weights``' layout: KCRS, or channels-last ((K, R, S, C/groups) in memory)."""
    import cupy

    wg = cupy.asarray(w.astype(dtype))
    return _nhwc(wg) if weights == "krsc" else wg


# The TMA-fed tiles (implicit_gemm_wgmma_tma): geometries whose padded channels are whole k tiles of some tile
# (64, 32 or 16 channels), across partial pixel and filter tiles, padding, strides, dilation, 1x1 and patchify
# kernels, a batch of one and several channel blocks a tap.
_TMA_GEOMETRIES = [
    pytest.param((2, 64, 9, 7), (64, 64, 3, 3), dict(padding=1), id="3x3_m126"),
    pytest.param((3, 128, 12, 13), (96, 128, 3, 3), dict(stride=2, padding=1), id="3x3_s2_k96"),
    pytest.param((2, 64, 12, 13), (128, 64, 5, 9), dict(padding=(3, 2), dilation=(2, 1)), id="5x9_d2x1_p3x2"),
    pytest.param((1, 64, 20, 20), (192, 64, 1, 1), {}, id="1x1_n1_k192"),
    pytest.param((2, 192, 14, 14), (256, 192, 3, 3), dict(padding=1), id="3x3_c192"),
    pytest.param((4, 64, 16, 16), (128, 64, 2, 2), dict(stride=2), id="2x2_s2"),
    pytest.param((2, 64, 7, 30), (64, 64, 3, 5), dict(stride=(1, 2), padding=(0, 2)), id="3x5_s1x2_p0x2"),
    # narrow channels: one tap's 32 or 16 a k tile (64- and 32-byte tiles)
    pytest.param((2, 32, 13, 30), (64, 32, 5, 9), dict(padding=(2, 4), dilation=(2, 3)), id="c32_5x9_dil"),
    pytest.param((3, 16, 17, 9), (128, 16, 3, 3), {}, id="c16_3x3_k128"),
    pytest.param((2, 48, 9, 10), (32, 48, 3, 3), dict(stride=2, padding=1), id="c48_3x3_s2_k32"),
    # strided dgrads: 2 x 2 phases and 1 x 2 run in one launch (implicit_gemm_wgmma_tma_phases), 3 x 3 phases in
    # one each, 2 of 4 phases without taps (zeros, then one launch of the other two)
    pytest.param((2, 64, 13, 14), (64, 64, 3, 3), dict(stride=3, padding=1), id="3x3_s3"),
    pytest.param((2, 64, 11, 10), (64, 64, 3, 1), dict(stride=2, padding=(1, 0)), id="3x1_s2_zero_phases"),
]


def _tma_operands(x_shape, w_shape, kwargs, dtype_name, seed):
    from cuconv.algos import implicit_gemm

    if not implicit_gemm.wgmma_available():
        pytest.skip("the TMA tiles run wgmma and TMA copies, which need compute capability 9.0")
    dtype = _dtypes.by_name(dtype_name)
    rng = numpy.random.default_rng(seed)
    x = rng.integers(-3, 4, x_shape).astype(dtype)
    w = rng.integers(-3, 4, w_shape).astype(dtype)
    b = rng.integers(-3, 4, w_shape[0]).astype(dtype)
    return dtype, x, w, b, cuconv.ConvSpec.from_args(x_shape, w_shape, **kwargs)
