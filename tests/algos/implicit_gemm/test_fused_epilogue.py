"""implicit_gemm's fused epilogue (bias, a residual before or after an activation, applied in fp32 where the GEMM
or the sum of its splits stores): every tile the algorithm offers (its knobs) and the mma.sync tiles, NCHW and
channels-last, split over k, against the float64 convolution of the same rounded inputs with the epilogue applied
(``blocks.epilogue.apply_numpy``, itself checked against torch's ops on the CPU)."""

from __future__ import annotations

import numpy
import pytest

from cuconv import _dtypes, _plan, dispatch, select
from cuconv.algos import implicit_gemm
from cuconv.problem import Epilogue, Problem
from cuconv.spec import ConvSpec

from cases import TOLERANCE, epilogue_case, rel_err

_EPILOGUES = [
    pytest.param(Epilogue(bias=True, activation="relu"), id="relu"),
    pytest.param(Epilogue(bias=True, activation="silu", residual="after"), id="silu_after"),
    pytest.param(Epilogue(bias=True, activation="leaky_relu", alpha=0.2, residual="before"), id="leaky_before"),
    pytest.param(Epilogue(bias=False, activation="gelu", residual="before"), id="gelu_nobias_before"),
    pytest.param(Epilogue(bias=True, activation="hardswish"), id="hardswish"),
]
_SHAPES = [
    pytest.param((2, 64, 9, 7), (64, 64, 3, 3), dict(padding=1), id="3x3_64"),
    pytest.param((1, 32, 14, 14), (96, 32, 1, 1), {}, id="1x1_n1"),
    pytest.param((3, 16, 11, 12), (40, 16, 3, 3), dict(stride=2, padding=1), id="3x3_s2_k40"),
]
_DTYPES = [("float16", "ieee"), ("bfloat16", "ieee"), ("float32", "tf32")]
_MMA_SYNC = ("128x128", "128x64")


def _tiles(problem, env):
    knobs = [k["tile"] for k in implicit_gemm.ALGORITHM.knobs(problem, env)]
    return list(dict.fromkeys(knobs + [implicit_gemm.TILES[n] for n in _MMA_SYNC]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name,precision", _DTYPES)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("x_shape,w_shape,kwargs", _SHAPES)
@pytest.mark.parametrize("epilogue", _EPILOGUES)
def test_fused_epilogue_matches_the_oracle_on_every_tile(epilogue, x_shape, w_shape, kwargs, layout, dtype_name,
                                                         precision):
    import cupy

    dtype = _dtypes.by_name(dtype_name)
    spec = ConvSpec.from_args(x_shape, w_shape, **kwargs)
    problem = Problem.of(spec, dtype, precision, "fprop", layout, epilogue=epilogue)
    env = _plan.current_env()
    assert select.can_implement("implicit_gemm", problem, env) is None
    gx, gw, gb, gr, want, out_shape, to_nchw = epilogue_case(x_shape, w_shape, kwargs, epilogue, dtype, layout,
                                                             seed=3)
    for tile in _tiles(problem, env):
        for splits in (None, 3):
            if layout == "nhwc" and splits is not None and implicit_gemm.nhwc_in_place(spec, dtype):
                continue  # (the in-place channels-last GEMM is not split)
            knobs = (("tile", tile),) + ((("splits", splits),) if splits else ())
            try:
                plan = dispatch.prepare("implicit_gemm", "fprop", spec, dtype, precision, env, layout=layout,
                                        knobs=knobs, epilogue=epilogue)
            except (ValueError, NotImplementedError):  # (a tile that cannot take this geometry)
                continue
            out = cupy.full(out_shape, numpy.nan, dtype=dtype)
            _plan.run_arrays(plan, gx, gw, gb, out, residual=gr)
            got = to_nchw(cupy.asnumpy(out).astype(numpy.float64))
            tol = TOLERANCE["tf32" if precision == "tf32" else dtype_name]
            assert rel_err(got, want) <= tol, (implicit_gemm.tile_name(tile), splits, rel_err(got, want))
            assert plan.steps[-1].kernel.name.split("<")[0] != "epilogue"  # (fused: no pass after)
