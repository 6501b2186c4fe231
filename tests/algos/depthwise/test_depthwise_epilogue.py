"""depthwise's fused epilogue (bias, a residual before or after an activation, applied in fp32 where each forward
kernel stores, its kEpi instances): every forward kernel the algorithm offers on NCHW and on channels-last
activations, against the float64 convolution of the same rounded inputs with the epilogue applied
(``blocks.epilogue.apply_numpy``, itself checked against torch's ops on the CPU); float64 through its plain kernels
and the pass after."""

from __future__ import annotations

import numpy
import pytest

from cuconv import _dtypes, _plan, dispatch
from cuconv.algos import depthwise
from cuconv.problem import Epilogue, Problem
from cuconv.spec import ConvSpec

from cases import TOLERANCE, epilogue_case, rel_err

_EPILOGUES = [
    pytest.param(Epilogue(bias=True, activation="relu6"), id="relu6"),
    pytest.param(Epilogue(bias=True, activation="hardswish", residual="after"), id="hardswish_after"),
    pytest.param(Epilogue(bias=True, activation="leaky_relu", alpha=0.2, residual="before"), id="leaky_before"),
    pytest.param(Epilogue(bias=False, activation="silu"), id="silu_nobias"),
    pytest.param(Epilogue(bias=True, activation="gelu_tanh", residual="before"), id="gelu_tanh_before"),
]
# (input, weight, arguments): a 3x3 stride-1 plane for rows, plane and strips; 5x5 at stride 2 (the gathers, the
# tiles); 7x7 on a small plane (flat strips); an odd batch and sizes.
_SHAPES = [
    pytest.param((2, 32, 16, 24), (32, 1, 3, 3), dict(padding=1, groups=32), id="3x3"),
    pytest.param((3, 24, 13, 11), (24, 1, 5, 5), dict(stride=2, padding=2, groups=24), id="5x5_s2"),
    pytest.param((1, 16, 7, 7), (16, 1, 7, 7), dict(padding=3, groups=16), id="7x7_n1"),
]
_DTYPES = ["float16", "bfloat16", "float32", "float64"]


def _kernels(problem, env) -> list:
    return [k.get("kernel") for k in depthwise.ALGORITHM.knobs(problem, env)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", _DTYPES)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("x_shape,w_shape,kwargs", _SHAPES)
@pytest.mark.parametrize("epilogue", _EPILOGUES)
def test_fused_epilogue_matches_the_oracle_on_every_kernel(epilogue, x_shape, w_shape, kwargs, layout, dtype_name):
    import cupy

    dtype = _dtypes.by_name(dtype_name)
    spec = ConvSpec.from_args(x_shape, w_shape, **kwargs)
    problem = Problem.of(spec, dtype, "ieee", "fprop", layout, epilogue=epilogue)
    env = _plan.current_env()
    if depthwise.ALGORITHM.can_implement(problem, env) is not None:
        pytest.skip(f"depthwise does not run this case: {depthwise.ALGORITHM.can_implement(problem, env)}")
    gx, gw, gb, gr, want, out_shape, to_nchw = epilogue_case(x_shape, w_shape, kwargs, epilogue, dtype, layout,
                                                             seed=7)
    fused = dtype_name != "float64"
    assert depthwise.ALGORITHM.fuses(problem) == fused
    for kernel in _kernels(problem, env):
        knobs = (("kernel", kernel),) if kernel else ()
        plan = dispatch.prepare("depthwise", "fprop", spec, dtype, "ieee", env, layout=layout, knobs=knobs,
                                epilogue=epilogue)
        out = cupy.full(out_shape, numpy.nan, dtype=dtype)
        _plan.run_arrays(plan, gx, gw, gb, out, residual=gr)
        got = to_nchw(cupy.asnumpy(out).astype(numpy.float64))
        assert rel_err(got, want) <= TOLERANCE[dtype_name], (kernel, rel_err(got, want))
        last = plan.steps[-1]
        if fused:  # (the forward, last, is a kEpi instance; no pass after it)
            assert not any(isinstance(step, _plan.Nested) for step in plan.steps), kernel
            assert last.kernel.name.endswith(",true>"), (kernel, last.kernel.name)
        else:  # (float64: the plain kernels, then the pass)
            assert isinstance(plan.steps[0], _plan.Nested) and last.kernel.name.startswith("epilogue<"), kernel
