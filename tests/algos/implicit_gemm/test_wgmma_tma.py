"""The TMA-fed forward tiles (kernels_cu/implicit_gemm/wgmma_tma.cu) on the GPU: every tile bit for bit against the
CPU path on integers, the row-band and persistent tiles, the block-diagonal grouped forward, and a plan run on a
thread without a context."""

from __future__ import annotations

import numpy
import pytest

import cuconv
from igemm_cases import _TMA_GEOMETRIES, _nhwc, _tma_operands, _weight

pytestmark = pytest.mark.gpu


def _tma_cases():
    """Every TMA tile on every geometry whose channels are whole k tiles of it."""
    from cuconv.algos import implicit_gemm

    return [pytest.param(*g.values, name, id=f"{g.id}-{name}") for g in _TMA_GEOMETRIES
            for name, t in implicit_gemm.TMA_TILES.items() if g.values[0][1] % (t.kbytes // 2) == 0]


# The row-band tiles (implicit_gemm_wgmma_tma_rows): stride 1, a tap's channels exactly a tile's 16, 32 or 64;
# rows of several segments and of less than one, padding, dilation, partial filter tiles, a batch of one.
_ROWS_GEOMETRIES = [
    pytest.param((2, 32, 9, 300), (64, 32, 5, 9), {}, id="5x9_q292"),
    pytest.param((2, 32, 10, 150), (64, 32, 5, 9), dict(padding=(2, 4), dilation=(2, 3)), id="5x9_dil_q138"),
    pytest.param((2, 16, 7, 140), (128, 16, 3, 3), dict(padding=1), id="c16_3x3_q140"),
    pytest.param((1, 64, 6, 200), (96, 64, 5, 7), dict(padding=(2, 3)), id="c64_5x7_k96_n1"),
    pytest.param((3, 64, 5, 40), (64, 64, 3, 3), dict(padding=1), id="c64_q40_short_row"),
    pytest.param((2, 16, 11, 270), (16, 16, 1, 1), {}, id="c16_1x1_k16"),
]


def _rows_cases():
    """Every row-band tile on every geometry whose channels are its tap's."""
    from cuconv.algos import implicit_gemm

    return [pytest.param(*g.values, name, id=f"{g.id}-{name}") for g in _ROWS_GEOMETRIES
            for name, t in implicit_gemm.TMA_ROWS_TILES.items() if g.values[0][1] == t.cp]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("x_shape,w_shape,kwargs,tile", _tma_cases() + _rows_cases())
def test_tma_tiles_equal_cpu_exactly_on_integers(x_shape, w_shape, kwargs, dtype_name, tile):
    """Every TMA tile, forward: from NCHW arrays through the pack (whole and, but for the row-band tiles, which
    reduce every tap in their block, split over 3 k ranges), and from channels-last ones read in place with a
    channels-last weight read in place, the output stored through the TMA (the row-band tiles' stopping where
    their output rows do); then the
    dgrad on channels-last tensors where dy's channels are whole k tiles (at stride 1 the forward of dy by the
    flipped weight's pack, at a stride one GEMM per phase): on integers, bit for bit the CPU path, into
    NaN-poisoned outputs."""
    import cupy

    from cuconv import _plan
    from cuconv.algos import implicit_gemm

    dtype, x, w, b, spec = _tma_operands(x_shape, w_shape, kwargs, dtype_name, 53)
    t = {**implicit_gemm.TMA_TILES, **implicit_gemm.TMA_ROWS_TILES}[tile]
    rows = getattr(t, "rows", False)
    want = cuconv.conv2d(x, w, b, **kwargs).astype(numpy.float64)
    for splits in (None,) if rows else (None, 3):
        out = cupy.full(spec.output_shape, numpy.nan, dtype=dtype)
        implicit_gemm.forward_gpu(cupy.asarray(x), cupy.asarray(w), cupy.asarray(b), spec, out, "ieee", tile=t,
                                  splits=splits)
        numpy.testing.assert_array_equal(cupy.asnumpy(out).astype(numpy.float64), want)
    xg, wg, bg = _nhwc(cupy.asarray(x)), _nhwc(cupy.asarray(w)), cupy.asarray(b)
    out = cupy.full((spec.n, spec.p, spec.q, spec.k), numpy.nan, dtype=dtype)
    plan = implicit_gemm.prepare("fprop", spec, dtype, "ieee", _plan.current_env(xg, wg, bg, out), True,
                                 tile=t, layout="nhwc", weights="krsc")
    stored_by_tma = any(k in getattr(getattr(s, "kernel", None), "name", "") for s in plan.steps
                        for k in ("_st<", "_pst<"))
    assert stored_by_tma == (spec.k % 8 == 0)  # (implicit_gemm_wgmma_tma(_rows)_st: a dense NHWC output)
    for _ in range(2):  # (the second launch keeps the maps the first encoded)
        _plan.run_arrays(plan, xg, wg, bg, out)
        numpy.testing.assert_array_equal(cupy.asnumpy(out.transpose(0, 3, 1, 2)).astype(numpy.float64), want)
        out.fill(numpy.nan)
    if (spec.k == t.cp) if rows else spec.k % (t.kbytes // 2) == 0:
        dy = numpy.random.default_rng(54).integers(-3, 4, spec.output_shape).astype(dtype)
        want_dx = cuconv.conv2d_input(x.shape, w, dy, **kwargs).astype(numpy.float64)
        dyg = _nhwc(cupy.asarray(dy))
        dx = cupy.full((spec.n, spec.h, spec.w, spec.c), numpy.nan, dtype=dtype)
        plan = implicit_gemm.prepare("dgrad", spec, dtype, "ieee", _plan.current_env(dyg, wg, dx), tile=t,
                                     layout="nhwc", weights="krsc")
        _plan.run_arrays(plan, dyg, wg, dx)
        numpy.testing.assert_array_equal(cupy.asnumpy(dx.transpose(0, 3, 1, 2)).astype(numpy.float64), want_dx)


def _tma_tiles():
    from cuconv.algos import implicit_gemm

    return implicit_gemm.TMA_TILES


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("sms", [1, 3, None])
@pytest.mark.parametrize("tile", [n for n, t in _tma_tiles().items() if t.persistent])
def test_persistent_tma_tiles_take_many_tiles_a_block(tile, sms, dtype_name):
    """A persistent TMA tile (implicit_gemm_wgmma_tma_pst) on a device of ``sms`` SMs (None: this one's): each
    block keeps its block of filters' weight (two blocks, the second partial, with a box wholly past K) and takes
    pixel block after pixel block, its ring's phases running on across them and its staging reused while the
    previous tile's stores drain; forward with bias and stride-1 dgrad, bit for bit the CPU path on integers, into
    NaN-poisoned outputs, twice."""
    import cupy

    from cuconv import _plan
    from cuconv.algos import implicit_gemm

    t = implicit_gemm.TMA_TILES[tile]
    c = t.kbytes // 2
    dtype, x, w, b, spec = _tma_operands((3, c, 20, 23), (t.bn + 64, c, 3, 3), dict(padding=1), dtype_name, 58)
    want = cuconv.conv2d(x, w, b, padding=1).astype(numpy.float64)
    xg, wg, bg = _nhwc(cupy.asarray(x)), _nhwc(cupy.asarray(w)), cupy.asarray(b)
    out = cupy.full((spec.n, spec.p, spec.q, spec.k), numpy.nan, dtype=dtype)
    env = _plan.current_env(xg, wg, bg, out)
    env = env if sms is None else env._replace(sm_count=sms)
    plan = implicit_gemm.prepare("fprop", spec, dtype, "ieee", env, True, tile=t, layout="nhwc", weights="krsc")
    (launch,) = [s.kernel for s in plan.steps if "_pst<" in getattr(getattr(s, "kernel", None), "name", "")]
    assert launch.grid[0] % 2 == 0 and launch.grid[0] <= max(2, env.sm_count * t.min_blocks)
    assert sms != 1 or launch.grid[0] == 2  # (one block of each filter block: every pixel block in turn)
    for _ in range(2):
        _plan.run_arrays(plan, xg, wg, bg, out)
        numpy.testing.assert_array_equal(cupy.asnumpy(out.transpose(0, 3, 1, 2)).astype(numpy.float64), want)
        out.fill(numpy.nan)
    wd = numpy.random.default_rng(59).integers(-3, 4, (c, t.bn + 64, 3, 3)).astype(dtype)  # dgrad: K = c filters
    dy = numpy.random.default_rng(60).integers(-3, 4, (3, c, 20, 23)).astype(dtype)
    want_dx = cuconv.conv2d_input((3, t.bn + 64, 20, 23), wd, dy, padding=1).astype(numpy.float64)
    dspec = cuconv.ConvSpec.from_args((3, t.bn + 64, 20, 23), wd.shape, padding=1)
    dyg, wdg = _nhwc(cupy.asarray(dy)), _nhwc(cupy.asarray(wd))
    dx = cupy.full((3, 20, 23, t.bn + 64), numpy.nan, dtype=dtype)
    plan = implicit_gemm.prepare("dgrad", dspec, dtype, "ieee", env, tile=t, layout="nhwc", weights="krsc")
    assert any("_pst<" in getattr(getattr(s, "kernel", None), "name", "") for s in plan.steps)
    _plan.run_arrays(plan, dyg, wdg, dx)
    numpy.testing.assert_array_equal(cupy.asnumpy(dx.transpose(0, 3, 1, 2)).astype(numpy.float64), want_dx)


# Grouped forwards through a block-diagonal weight: groups of 16 (four a block, a partial block, a stride, a batch
# of one), 32 and 64 channels.
_BLOCK_DIAGONAL_CASES = [
    pytest.param((2, 64, 17, 15), (64, 16, 3, 3), dict(padding=1, stride=2, groups=4), id="g4x16_s2"),
    pytest.param((3, 144, 9, 10), (144, 16, 3, 3), dict(padding=1, groups=9), id="g9x16_partial_block"),
    pytest.param((1, 320, 6, 7), (320, 16, 3, 3), dict(padding=1, groups=20), id="g20x16_n1"),
    pytest.param((2, 96, 8, 11), (96, 32, 3, 3), dict(padding=(1, 2), groups=3), id="g3x32"),
    pytest.param((2, 128, 7, 9), (128, 64, 5, 3), dict(padding=(2, 1), groups=2), id="g2x64_5x3"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["kcrs", "krsc"])
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("x_shape,w_shape,kwargs", _BLOCK_DIAGONAL_CASES)
def test_block_diagonal_grouped_forward_equals_cpu_exactly_on_integers(x_shape, w_shape, kwargs, dtype_name,
                                                                        weights):
    """Channels-last grouped forwards through the block-diagonal weight (``pack_block_diagonal``, then the TMA GEMM
    with ``Geometry.block_diag``; a channels-last weight of 64-wide groups read where it is, no pack), with a bias,
    the weight KCRS or channels-last: on integers, bit for bit the CPU path, into a NaN-poisoned output (a second
    run keeps the maps the first encoded)."""
    import cupy

    from cuconv import _plan
    from cuconv.algos import implicit_gemm

    dtype, x, w, b, spec = _tma_operands(x_shape, w_shape, kwargs, dtype_name, 58)
    tile = implicit_gemm.block_diagonal_tile(spec, dtype)
    assert tile is not None
    want = cuconv.conv2d(x, w, b, **kwargs).astype(numpy.float64)
    xg, wg, bg = _nhwc(cupy.asarray(x)), _weight(w, dtype, weights), cupy.asarray(b)
    out = cupy.full((spec.n, spec.p, spec.q, spec.k), numpy.nan, dtype=dtype)
    plan = implicit_gemm.prepare("fprop", spec, dtype, "ieee", _plan.current_env(xg, wg, bg, out), True, tile=tile,
                                 layout="nhwc", weights=weights)
    packs = [s for s in plan.steps if "pack_block_diagonal" in getattr(getattr(s, "kernel", None), "name", "")]
    own_pack = weights == "krsc" and spec.c_per_group == 64 and spec.k % 64 == 0  # (a 64-wide block is a group)
    assert (len(plan.steps), plan.workspace == 0) == (1, True) if own_pack else len(packs) == 1
    for _ in range(2):
        _plan.run_arrays(plan, xg, wg, bg, out)
        numpy.testing.assert_array_equal(cupy.asnumpy(out.transpose(0, 3, 1, 2)).astype(numpy.float64), want)
        out.fill(numpy.nan)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_block_diagonal_forward_keeps_other_groups_finite(dtype_name):
    """An Inf in one group's channel and a NaN in another's spoil only their own groups' outputs, as in the CPU
    path's grouped convolution: the block-diagonal tile's zero products with them (NaN) are summed again over the
    output's own group (``block_diag_fixup``); on integers, bit for bit the CPU path, NaN where it has NaN."""
    import cupy

    from cuconv import _plan
    from cuconv.algos import implicit_gemm

    kwargs = dict(padding=1, groups=8)
    dtype, x, w, b, spec = _tma_operands((2, 128, 9, 10), (128, 16, 3, 3), kwargs, dtype_name, 59)
    x[0, 3, 4, 5] = numpy.inf     # group 0 (channels 0-15)
    x[1, 37, 0, 0] = numpy.nan    # group 2, at a corner
    want = cuconv.conv2d(x, w, b, **kwargs).astype(numpy.float64)
    assert numpy.isfinite(want[:, 16:32]).all() and not numpy.isfinite(want[:, :16]).all()
    xg, wg, bg = _nhwc(cupy.asarray(x)), _weight(w, dtype, "krsc"), cupy.asarray(b)
    out = cupy.full((spec.n, spec.p, spec.q, spec.k), numpy.nan, dtype=dtype)
    plan = implicit_gemm.prepare("fprop", spec, dtype, "ieee", _plan.current_env(xg, wg, bg, out), True,
                                 tile=implicit_gemm.block_diagonal_tile(spec, dtype), layout="nhwc", weights="krsc")
    _plan.run_arrays(plan, xg, wg, bg, out)
    numpy.testing.assert_array_equal(cupy.asnumpy(out.transpose(0, 3, 1, 2)).astype(numpy.float64), want)


@pytest.mark.gpu
def test_tma_plan_prepared_and_run_on_a_thread_without_a_context():
    """A thread that has made no CUDA call has no current context, in which the driver encodes no tensor map
    (``cuconv.nn.warmup`` prepares plans on such threads): a TMA plan prepared and run there makes the device's
    primary context current and computes what the CPU path does."""
    import threading

    import cupy

    from cuconv import _plan
    from cuconv.algos import implicit_gemm

    # (a geometry of its own: a prepared launch is memoized per problem, and this one must be made in the thread)
    dtype, x, w, b, spec = _tma_operands((3, 64, 11, 7), (64, 64, 3, 3), dict(padding=1), "bfloat16", 55)
    want = cuconv.conv2d(x, w, b, padding=1).astype(numpy.float64)
    xg, wg, bg = _nhwc(cupy.asarray(x)), _nhwc(cupy.asarray(w)), cupy.asarray(b)
    out = cupy.full((spec.n, spec.p, spec.q, spec.k), numpy.nan, dtype=dtype)
    env = _plan.current_env(xg, wg, bg, out)
    cupy.cuda.Device().synchronize()
    failures = []

    def run():
        try:
            plan = implicit_gemm.prepare("fprop", spec, dtype, "ieee", env, True, layout="nhwc", weights="krsc")
            assert any(isinstance(getattr(s, "kernel", None), implicit_gemm._tma.TmaLaunch) for s in plan.steps)
            _plan.run_arrays(plan, xg, wg, bg, out)
            cupy.cuda.Device().synchronize()
        except Exception as exc:  # (re-raised in the test's thread)
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert not failures, failures
    numpy.testing.assert_array_equal(cupy.asnumpy(out.transpose(0, 3, 1, 2)).astype(numpy.float64), want)


@pytest.mark.gpu
def test_a_tma_plan_run_on_more_buffers_than_it_keeps_maps_for_computes_each():
    """A TMA launch keeps the tensor maps of its last ``MAP_SETS`` pointer sets (``_tma.TmaLaunch``): the plan run
    on more input and output buffers than that, in turn and repeated, computes each call's own result (bit for bit
    the CPU path on integers, into NaN-poisoned outputs), whether its maps were copied back or encoded anew."""
    import cupy

    from cuconv import _plan, _tma
    from cuconv.algos import implicit_gemm

    dtype, x, w, b, spec = _tma_operands((2, 64, 9, 7), (64, 64, 3, 3), dict(padding=1), "bfloat16", 57)
    wg, bg = _nhwc(cupy.asarray(w)), cupy.asarray(b)
    inputs = [_nhwc(cupy.asarray((x * (1 + (i % 3))).astype(dtype))) for i in range(_tma.MAP_SETS + 3)]
    wants = [cuconv.conv2d((x * (1 + (i % 3))).astype(dtype), w, b, padding=1).astype(numpy.float64)
             for i in range(len(inputs))]
    outs = [cupy.empty((spec.n, spec.p, spec.q, spec.k), dtype=dtype) for _ in inputs]
    plan = implicit_gemm.prepare("fprop", spec, dtype, "ieee", _plan.current_env(inputs[0], wg, bg, outs[0]), True,
                                 layout="nhwc", weights="krsc")
    assert any(isinstance(getattr(s, "kernel", None), _tma.TmaLaunch) for s in plan.steps)
    for i in [0, 1, 2, 0, 1, *range(len(inputs)), 2, 0, *reversed(range(len(inputs)))]:
        outs[i].fill(numpy.nan)
        _plan.run_arrays(plan, inputs[i], wg, bg, outs[i])
        numpy.testing.assert_array_equal(cupy.asnumpy(outs[i].transpose(0, 3, 1, 2)).astype(numpy.float64), wants[i])
