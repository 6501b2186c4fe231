"""direct_smem's plan (tile, staged input window, channels per chunk, grid) and the limits it reports (CPU), and
on the GPU: ``direct`` and ``direct_smem`` bit for bit against the CPU path on integers, and the refusal of a
window beyond the device's shared memory. The case table runs every algorithm in test_conv_gpu.py.
"""

import numpy
import pytest

import cuconv
from cases import CASES, EXACT_DTYPES, PROBLEM_CASES, TILING_CASES, make_inputs, to_gpu
from cuconv import _dtypes
from cuconv.algos import direct, direct_smem
from cuconv._plan import SMEM_OPTIN_WITHOUT_DEVICE
from cuconv.algos.direct_smem import NAME_EXPRESSIONS, plan
from cuconv.problems import PROBLEMS, SUITES
from cuconv.spec import ConvSpec

SMEM_DEFAULT = 48 << 10
TWO_BLOCKS_PER_SM = 113 << 10  # 228 KB per SM on H100/H200, 1 KB reserved per block


def _spec(case):
    x_shape = case.x_shape if len(case.x_shape) == 4 else (1,) + case.x_shape
    return ConvSpec.from_args(x_shape, case.w_shape, **case.kwargs)


def _random_specs(count, seed):
    rng = numpy.random.default_rng(seed)
    specs = []
    while len(specs) < count:
        groups = int(rng.choice([1, 2, 3]))
        n, cpg, kpg = (int(v) for v in rng.integers(1, 40, size=3))
        h, w = (int(v) for v in rng.integers(1, 300, size=2))
        r, s = (int(v) for v in rng.integers(1, 12, size=2))
        stride = tuple(int(v) for v in rng.integers(1, 4, size=2))
        dilation = tuple(int(v) for v in rng.integers(1, 4, size=2))
        pad = tuple(int(v) for v in rng.integers(0, 4, size=4))
        spec = ConvSpec(n, cpg * groups, h, w, kpg * groups, r, s, stride, pad, dilation, groups)
        if spec.p >= 1 and spec.q >= 1:
            specs.append(spec)
    return specs


ALL_SPECS = ([_spec(p.values[0]) for p in CASES + PROBLEM_CASES + TILING_CASES if 0 not in p.values[0].x_shape]
             + [p.spec() for p in PROBLEMS] + _random_specs(300, seed=21))


def test_every_kernel_instance_serves_a_dtype():
    """One tile per accumulation type: each name expression is the kernel of one storage type."""
    names = {plan(ConvSpec(1, 1, 8, 8, 1, 3, 3), dtype, SMEM_OPTIN_WITHOUT_DEVICE).tile.kernel_name(ctype)
             for dtype, ctype in _dtypes.CTYPES.items()}
    tiles = {n for n in NAME_EXPRESSIONS if n.startswith("direct_smem<")}
    assert names <= tiles
    if _dtypes.bfloat16 is not None:
        assert names == tiles
    # and the weight transpose each plan runs first, per storage type
    assert set(NAME_EXPRESSIONS) - tiles == {f"transpose_weight<{t}>" for t in _dtypes.ALL_CTYPE_NAMES}


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
def test_plan_invariants(dtype):
    for spec in ALL_SPECS:
        pl = plan(spec, dtype, SMEM_OPTIN_WITHOUT_DEVICE)
        t = pl.tile
        acc = numpy.dtype(dtype).itemsize
        (sh, sw), (dh, dw) = spec.stride, spec.dilation
        # Every input position a tile's outputs read lies in the staged window (relative to (ih0, iw0)).
        assert (t.tp - 1) * sh + (spec.r - 1) * dh < pl.x_rows
        assert (t.tq - 1) * sw + (spec.s - 1) * dw < pl.x_cols
        assert pl.x_phase_cols == -(-pl.x_cols // sw) and pl.x_pitch == sw * pl.x_phase_cols >= pl.x_cols
        assert pl.channel_bytes == (spec.r * spec.s * t.tk + pl.x_rows * pl.x_pitch) * acc
        # Chunks of input channels: at least one, one to three buffers of them within two blocks per SM
        # unless one channel needs more (then one buffer of one channel), balanced (no chunk much smaller
        # than the others), and more chunks than buffers where there are enough channels.
        cpg = spec.c_per_group
        assert 1 <= pl.ct <= cpg and 1 <= pl.stages <= 3
        assert pl.smem_bytes <= TWO_BLOCKS_PER_SM or (pl.ct == 1 and pl.stages == 1)
        assert pl.smem_bytes >= pl.stages * pl.ct * pl.channel_bytes
        chunks = -(-cpg // pl.ct)
        assert pl.ct == -(-cpg // chunks)
        assert pl.ct <= -(-cpg // (2 * pl.stages))
        # Every buffer's ws, and xs after it, start 16-byte aligned (the kernel reads ws as 16-byte vectors).
        assert (pl.ct * spec.r * spec.s * t.tk * acc) % 16 == 0 and (t.kt * acc) % 16 == 0
        assert (pl.stage_elems * acc) % 16 == 0
        # The grid covers every output exactly: tiles of TP rows, TQ columns, TK channels of a group.
        assert (pl.tiles_p - 1) * t.tp < spec.p <= pl.tiles_p * t.tp
        assert (pl.tiles_q - 1) * t.tq < spec.q <= pl.tiles_q * t.tq
        assert (pl.tiles_k - 1) * t.tk < spec.k_per_group <= pl.tiles_k * t.tk
        assert pl.grid == (spec.n * pl.tiles_p * pl.tiles_q, spec.groups * pl.tiles_k, 1)


def test_large_problems_pipeline_three_buffers_of_several_channels():
    for name in SUITES["large"]:
        spec = next(p for p in PROBLEMS if p.name == name).spec()
        for dtype in (numpy.float16, numpy.float32, numpy.float64):
            pl = plan(spec, dtype, SMEM_OPTIN_WITHOUT_DEVICE)
            assert pl.stages == 3 and pl.ct >= 2 and pl.smem_bytes <= TWO_BLOCKS_PER_SM, (name, dtype, pl)
            assert -(-spec.c_per_group // pl.ct) >= 2 * pl.stages
            assert direct_smem.reason_unsupported(spec, dtype) is None


def test_tiling_cases_cross_the_boundaries_they_name():
    plans = {p.id: (_spec(p.values[0]), plan(_spec(p.values[0]), numpy.float32, SMEM_OPTIN_WITHOUT_DEVICE))
             for p in TILING_CASES}
    spec, pl = plans["q_tiles_tail"]
    assert pl.tiles_q > 2 and spec.q % pl.tile.tq and spec.p % pl.tile.tp
    spec, pl = plans["chunks_groups_k_tail"]
    assert spec.c_per_group > 2 * pl.ct and spec.c_per_group % pl.ct and pl.tiles_k > 1 and pl.stages == 3
    assert spec.k_per_group % pl.tile.tk and spec.groups > 1
    spec, pl = plans["k15_two_buffers"]
    assert pl.stages == 2 and spec.c_per_group > pl.stages * pl.ct
    spec, pl = plans["big_kernel_smem_optin"]
    assert pl.ct == 1 and pl.stages == 1 and pl.smem_bytes > SMEM_DEFAULT and spec.c_per_group > 1
    assert plan(spec, numpy.float64, SMEM_OPTIN_WITHOUT_DEVICE).smem_bytes > SMEM_DEFAULT
    spec, pl = plans["batch1_q256_no_bias"]
    assert spec.n == 1 and spec.q == 2 * pl.tile.tq


@pytest.mark.parametrize("dtype", [numpy.float16, numpy.float32, numpy.float64])
def test_reasons(dtype):
    for spec in ALL_SPECS:
        assert direct_smem.reason_unsupported(spec, dtype) is None, spec
        assert direct.reason_unsupported(spec, dtype) is None, spec
    spec = ALL_SPECS[0]
    for pass_ in ("dgrad", "wgrad"):
        assert direct.reason_unsupported(spec, dtype, pass_) == f"it implements no {pass_}"
    assert direct_smem.reason_unsupported(spec, dtype, "wgrad") == "it implements no wgrad"
    # dgrad is the forward of grad_output: stride 1 and padding inside the dilated kernel only
    assert direct_smem.reason_unsupported(ConvSpec.from_args((1, 2, 9, 9), (3, 2, 3, 3), padding=1), dtype,
                                          "dgrad") is None
    for kwargs in (dict(stride=2), dict(padding=3)):
        reason = direct_smem.reason_unsupported(ConvSpec.from_args((1, 2, 9, 9), (3, 2, 3, 3), **kwargs), dtype,
                                                "dgrad")
        assert "needs stride 1 and padding no wider than the dilated kernel" in reason
    # A 3x3 kernel dilated (200, 1000): one channel's input window alone is 400+ rows of 2000+ columns.
    huge = ConvSpec.from_args((1, 1, 401, 2001), (2, 1, 3, 3), dilation=(200, 1000))
    reason = direct_smem.reason_unsupported(huge, dtype)
    assert reason is not None and "bytes of shared memory" in reason and "the device allows" in reason
    assert direct.reason_unsupported(huge, dtype) is None
    # 70000 groups of one channel: more k tiles than gridDim.y allows.
    many = ConvSpec.from_args((1, 70000, 3, 3), (70000, 1, 3, 3), groups=70000)
    assert "exceeds the CUDA limits" in direct_smem.reason_unsupported(many, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ["direct", "direct_smem"])
@pytest.mark.parametrize("dtype_name", EXACT_DTYPES)
@pytest.mark.parametrize("case", TILING_CASES)
def test_direct_tiles_equal_cpu_exactly_on_integers(case, dtype_name, algo):
    """Across direct_smem's tile, chunk and shared-memory boundaries (TILING_CASES), on integer inputs: every
    sum is exact in the float32/float64 accumulator, so each dtype equals the CPU path bit for bit (the half
    types round the same exact sum once, on both sides)."""
    import cupy

    x, w, b = make_inputs(case, seed=12, integer=True)
    dtype = _dtypes.by_name(dtype_name)
    cpu = cuconv.conv2d(x.astype(dtype), w.astype(dtype), None if b is None else b.astype(dtype), **case.kwargs)
    out = cupy.full(cpu.shape, numpy.nan, dtype=dtype)
    cuconv.conv2d(to_gpu(x, dtype), to_gpu(w, dtype), to_gpu(b, dtype), algo=algo, out=out, **case.kwargs)
    numpy.testing.assert_array_equal(cupy.asnumpy(out).astype(numpy.float64), cpu.astype(numpy.float64))



@pytest.mark.gpu
def test_direct_smem_refuses_a_window_beyond_the_device_shared_memory():
    import cupy

    x = cupy.zeros((1, 1, 401, 2001), dtype=numpy.float32)
    w = cupy.zeros((2, 1, 3, 3), dtype=numpy.float32)
    with pytest.raises(NotImplementedError, match=r"algo 'direct_smem' cannot run this fprop: .* bytes of shared "
                                                  r"memory .* the device allows"):
        cuconv.conv2d(x, w, dilation=(200, 1000), algo="direct_smem")
    assert cuconv.conv2d(x, w, dilation=(200, 1000), algo="direct").shape == (1, 2, 1, 1)

