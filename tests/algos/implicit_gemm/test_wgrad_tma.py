"""The TMA wgrad (kernels_cu/implicit_gemm/wgrad_tma.cu) on the GPU: every tile bit for bit against the CPU path on
integers."""

from __future__ import annotations

import numpy
import pytest

import cuconv
from igemm_cases import _TMA_GEOMETRIES, _nhwc, _tma_operands

pytestmark = pytest.mark.gpu


def _wgrad_tma_cases():
    """Every TMA wgrad tile on every TMA geometry it serves, and on one of many pixels (long splits)."""
    from cuconv.algos import implicit_gemm

    geometries = _TMA_GEOMETRIES + [
        pytest.param((5, 96, 21, 19), (72, 96, 3, 3), dict(padding=1), id="3x3_c96_k72_m1995"),
        # groups of 16, 32 and 64 channels (RegNet's 16: four groups a 64 x 64 block, partial blocks, a stride)
        pytest.param((2, 64, 17, 15), (64, 16, 3, 3), dict(padding=1, stride=2, groups=4), id="g4x16_s2"),
        pytest.param((3, 144, 9, 10), (144, 16, 3, 3), dict(padding=1, groups=9), id="g9x16_partial_block"),
        pytest.param((2, 96, 8, 11), (96, 32, 3, 3), dict(padding=(1, 2), groups=3), id="g3x32"),
        pytest.param((2, 128, 7, 9), (128, 64, 5, 3), dict(padding=(2, 1), groups=2), id="g2x64_5x3")]
    out = []
    for g in geometries:
        spec = cuconv.ConvSpec.from_args(g.values[0], g.values[1], **g.values[2])
        out += [pytest.param(*g.values, name, id=f"{g.id}-{name}") for name, t in implicit_gemm.WGRAD_TMA_TILES.items()
                if implicit_gemm.wgrad_tma_reason(spec, numpy.float16, t) is None]
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("x_shape,w_shape,kwargs,tile", _wgrad_tma_cases())
def test_wgrad_tma_tiles_equal_cpu_exactly_on_integers(x_shape, w_shape, kwargs, dtype_name, tile):
    """Every TMA wgrad tile on channels-last x and dy, whole, split as auto splits it and over 3 pixel ranges,
    into dW KCRS and channels-last: on integers, bit for bit the CPU path, into NaN-poisoned outputs (a second run
    keeps the maps the first encoded)."""
    import cupy

    from cuconv import _plan
    from cuconv.algos import implicit_gemm

    dtype, x, w, _, spec = _tma_operands(x_shape, w_shape, kwargs, dtype_name, 56)
    dy = numpy.random.default_rng(57).integers(-3, 4, spec.output_shape).astype(dtype)
    want = cuconv.conv2d_weight(x, w.shape, dy, **kwargs).astype(numpy.float64)
    xg, dyg = _nhwc(cupy.asarray(x)), _nhwc(cupy.asarray(dy))
    t = implicit_gemm.WGRAD_TMA_TILES[tile]
    for weights in ("kcrs", "krsc"):
        krsc = weights == "krsc"
        dw = cupy.full((w.shape[0],) + w.shape[2:] + (w.shape[1],) if krsc else w.shape, numpy.nan, dtype=dtype)
        for splits in (1, None, 3):
            plan = implicit_gemm.prepare("wgrad", spec, dtype, "ieee", _plan.current_env(xg, dyg, dw), tile=t,
                                         splits=splits, layout="nhwc", weights=weights)
            assert any(isinstance(getattr(s, "kernel", None), implicit_gemm._tma.TmaLaunch) for s in plan.steps)
            for _ in range(2):
                _plan.run_arrays(plan, xg, dyg, dw)
                got = cupy.asnumpy(dw.transpose(0, 3, 1, 2) if krsc else dw).astype(numpy.float64)
                numpy.testing.assert_array_equal(got, want, err_msg=f"{weights}, splits {splits}")
                dw.fill(numpy.nan)
