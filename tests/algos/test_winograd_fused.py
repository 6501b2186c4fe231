"""Algorithm ``winograd_fused``: its plan and reasons (CPU), and on the GPU every tile against the float64 oracle
across the tile's boundaries (channel chunks with a tail, filter blocks with a tail, rows of tiles that overhang
the output, padding wider than the kernel), exactly against ``direct`` on integers, as dgrad, and with an output
whose rows are not 8-byte aligned. The case table and the reduced problems also run it (with the device's
tile), in test_conv_gpu.py and test_backward_gpu.py."""

from __future__ import annotations

import numpy
import pytest

import cuconv
from cuconv.algos import winograd_fused
from cuconv.spec import ConvSpec
from cases import Case, _p, make_inputs, noncontiguous, reference, reference_grads, rel_err, tolerance

FUSED_CASES = [
    _p("c20_k70_q_odd", (2, 20, 13, 131), (70, 20, 3, 3), padding=1),  # chunk tail, filter tail, 66 tiles a row
    _p("valid_small", (1, 3, 8, 8), (4, 3, 3, 3), bias=False),  # one chunk of 3 channels, one tile row of 3
    _p("c40_k200_pad_asym", (3, 40, 19, 33), (200, 40, 3, 3), padding=(1, 2)),  # 5 chunks, 4 filter blocks
    _p("pad_wider_than_kernel", (2, 9, 7, 10), (65, 9, 3, 3), padding=(3, 2)),  # whole zero tile rows
    _p("q_even_two_blocks", (1, 16, 10, 130), (64, 16, 3, 3)),  # Q = 128: pairs of floats, two tile blocks
    _p("same_p_odd", (2, 17, 9, 20), (64, 17, 3, 3), padding="same"),
]


def _spec(case):
    return ConvSpec.from_args(case.x_shape, case.w_shape, **case.kwargs)


# ---- CPU: plan and reasons ----------------------------------------------------------------------------

def test_every_tile_is_compiled():
    for tile in winograd_fused.TILES:
        assert tile.kernel_name in winograd_fused.NAME_EXPRESSIONS
    assert len(winograd_fused.NAME_EXPRESSIONS) == len(winograd_fused.TILES) + 1  # and the weight transform


def test_plan_pads_channels_to_the_tile_and_counts_blocks():
    spec = ConvSpec.from_args((3, 40, 19, 33), (200, 40, 3, 3), padding=(1, 2))
    tile = winograd_fused.TILES[0]
    pl = winograd_fused.plan(spec, tile)
    assert (pl.c_pad, pl.k_pad) == (40, 256)
    assert (pl.tiles_h, pl.k_blocks) == (-(-spec.p // 2), 4)
    assert pl.col_blocks == -(-(-(-spec.q // 2)) // tile.bt)
    assert pl.items == spec.n * pl.tiles_h * pl.col_blocks * pl.k_blocks
    assert pl.u_bytes == 4 * 16 * 40 * 256


def test_plan_takes_the_first_tile_the_shared_memory_allows():
    spec = ConvSpec.from_args((1, 16, 20, 20), (64, 16, 3, 3))
    overlap, wide, narrow = winograd_fused.TILES
    assert overlap.overlap and not wide.overlap and not narrow.overlap
    assert (overlap.smem_bytes, wide.smem_bytes, narrow.smem_bytes) == (192 << 10, 120 << 10, 96 << 10)
    assert winograd_fused.plan(spec, smem_limit=227 << 10).tile == overlap  # sm_90
    assert winograd_fused.plan(spec, smem_limit=163 << 10).tile == wide  # sm_80
    assert winograd_fused.plan(spec, smem_limit=99 << 10).tile == narrow  # sm_86/sm_89


@pytest.mark.parametrize("x_shape,w_shape,kwargs,dtype,pass_,match", [
    ((1, 8, 9, 9), (64, 8, 3, 3), {}, numpy.float64, "fprop", "float32 only"),
    ((1, 8, 9, 9), (64, 8, 3, 3), {}, numpy.float16, "fprop", "float32 only"),
    ((1, 8, 9, 9), (64, 8, 5, 5), {}, numpy.float32, "fprop", "3x3 kernel"),
    ((1, 8, 9, 9), (64, 8, 3, 3), dict(stride=2), numpy.float32, "fprop", "stride 1"),
    ((1, 8, 9, 9), (64, 8, 3, 3), dict(dilation=2), numpy.float32, "fprop", "dilation 1"),
    ((1, 8, 9, 9), (64, 4, 3, 3), dict(groups=2), numpy.float32, "fprop", "groups=1"),
    ((1, 8, 9, 9), (64, 8, 3, 3), dict(stride=2), numpy.float32, "dgrad", "stride 1"),
    ((1, 8, 9, 9), (64, 8, 3, 3), {}, numpy.float32, "wgrad", "no wgrad"),
], ids=["float64", "float16", "5x5", "stride", "dilation", "groups", "strided_dgrad", "wgrad"])
def test_reasons(x_shape, w_shape, kwargs, dtype, pass_, match):
    spec = ConvSpec.from_args(x_shape, w_shape, **kwargs)
    assert match in winograd_fused.reason_unsupported(spec, dtype, pass_)


def test_serves_float32_at_both_precisions_and_its_dgrad():
    spec = ConvSpec.from_args((2, 16, 12, 12), (64, 16, 3, 3), padding=1)
    for precision in ("ieee", "tf32"):
        for pass_ in ("fprop", "dgrad"):
            assert winograd_fused.reason_unsupported(spec, numpy.float32, pass_, precision) is None


def test_transformed_weights_must_fit_the_workspace():
    spec = ConvSpec.from_args((1, 512, 8, 8), (512, 512, 3, 3))
    need = winograd_fused.plan(spec, smem_limit=227 << 10).u_bytes
    with cuconv.config(workspace_limit=need):
        assert winograd_fused.reason_unsupported(spec, numpy.float32) is None
    with cuconv.config(workspace_limit=need - 1):
        assert "workspace_limit" in cuconv.select.reason_unsupported("winograd_fused", spec, numpy.float32)


# ---- GPU --------------------------------------------------------------------------------------------

def _gpu(a):
    import cupy

    return None if a is None else cupy.asarray(a.astype(numpy.float32))


def _require_shared_memory(tile):
    if tile.smem_bytes > cuconv._loader.smem_limit():
        pytest.skip(f"this device gives a block less than the tile's {tile.smem_bytes} bytes of shared memory")


def _forward(case, x, w, b, tile, out, grid=None):
    """The algorithm's entry point with ``tile`` (and an ``overlap`` tile's ``grid``) forced (``conv2d`` runs the
    device's tile on a block per SM)."""
    winograd_fused.forward_gpu(x, w, b, _spec(case), out, "ieee", tile, grid)


def _tile_id(t):
    return f"bt{t.bt}_w{t.warps}" + ("_overlap" if t.overlap else "")


@pytest.mark.gpu
@pytest.mark.parametrize("tile", winograd_fused.TILES, ids=_tile_id)
@pytest.mark.parametrize("case", FUSED_CASES)
def test_forward_matches_oracle_every_tile(case, tile):
    import cupy

    _require_shared_memory(tile)
    x, w, b = (None if a is None else a.astype(numpy.float32).astype(numpy.float64)
               for a in make_inputs(case, seed=31))
    ref = reference(x, w, b, **case.kwargs)
    out = cupy.full(ref.shape, numpy.nan, dtype=numpy.float32)
    _forward(case, _gpu(x), _gpu(w), _gpu(b), tile, out)
    err = rel_err(cupy.asnumpy(out), ref)
    assert err <= tolerance(numpy.float32), f"{err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("tile", winograd_fused.TILES, ids=_tile_id)
@pytest.mark.parametrize("case", FUSED_CASES)
def test_integer_inputs_equal_direct_exactly(case, tile):
    """Transforms of 0, ±1 and ±1/2: integer inputs give exact multiples of 1/4 all the way."""
    import cupy

    _require_shared_memory(tile)
    x, w, b = (_gpu(a) for a in make_inputs(case, seed=32, integer=True))
    expected = cuconv.conv2d(x, w, b, algo="direct", precision="ieee", **case.kwargs)
    out = cupy.full(expected.shape, numpy.nan, dtype=numpy.float32)
    _forward(case, x, w, b, tile, out)
    assert bool((out == expected).all())


# Blocks that take several items in turn (a block per SM on a large layer): items of other samples, tile rows,
# column blocks and filter blocks after each other, the next one's first chunk staged under the last one's
# epilogue; grids that do and do not divide the items.
@pytest.mark.gpu
@pytest.mark.parametrize("grid", [1, 3, 7])
@pytest.mark.parametrize("case", FUSED_CASES)
def test_overlap_blocks_take_items_in_turn(case, grid):
    import cupy

    tile = winograd_fused.TILES[0]
    _require_shared_memory(tile)
    x, w, b = (None if a is None else a.astype(numpy.float32).astype(numpy.float64)
               for a in make_inputs(case, seed=37))
    ref = reference(x, w, b, **case.kwargs)
    out = cupy.full(ref.shape, numpy.nan, dtype=numpy.float32)
    _forward(case, _gpu(x), _gpu(w), _gpu(b), tile, out, grid)
    err = rel_err(cupy.asnumpy(out), ref)
    assert err <= tolerance(numpy.float32), f"{err:.2e}"
    xi, wi, bi = (_gpu(a) for a in make_inputs(case, seed=38, integer=True))
    expected = cuconv.conv2d(xi, wi, bi, algo="direct", precision="ieee", **case.kwargs)
    out = cupy.full(expected.shape, numpy.nan, dtype=numpy.float32)
    _forward(case, xi, wi, bi, tile, out, grid)
    assert bool((out == expected).all())


@pytest.mark.gpu
def test_output_rows_not_8_byte_aligned():
    """Q even but the output 4 bytes off an 8-byte boundary: single-float stores, same values (the input a
    non-contiguous view)."""
    import cupy

    case = FUSED_CASES[4].values[0]
    x, w, b = (None if a is None else a.astype(numpy.float32).astype(numpy.float64)
               for a in make_inputs(case, seed=33))
    ref = reference(x, w, b, **case.kwargs)
    flat = cupy.full(ref.size + 1, numpy.nan, dtype=numpy.float32)
    out = flat[1:].reshape(ref.shape)
    assert out.data.ptr % 8 == 4 and out.flags.c_contiguous
    got = cuconv.conv2d(noncontiguous(_gpu(x), cupy), _gpu(w), _gpu(b), algo="winograd_fused", out=out,
                        **case.kwargs)
    assert got is out
    err = rel_err(cupy.asnumpy(out), ref)
    assert err <= tolerance(numpy.float32), f"{err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", [FUSED_CASES[0], FUSED_CASES[2], FUSED_CASES[4]])
def test_dgrad_matches_oracle(case):
    import cupy
    x, w, _ = make_inputs(case, seed=34)
    spec = _spec(case)
    assert winograd_fused.reason_unsupported(spec, numpy.float32, "dgrad") is None
    dy = numpy.random.default_rng(35).standard_normal(spec.output_shape)
    w, dy = (a.astype(numpy.float32).astype(numpy.float64) for a in (w, dy))
    ref = reference_grads(x, w, dy, **case.kwargs)[0]
    got = cuconv.conv2d_input(x.shape, _gpu(w), _gpu(dy), algo="winograd_fused", **case.kwargs)
    err = rel_err(cupy.asnumpy(got), ref)
    assert err <= tolerance(numpy.float32), f"{err:.2e}"


@pytest.mark.gpu
def test_float32_error_with_many_channels():
    """1024 input channels (winograd's F(4x4, 3x3) stops at 512 in float32): the error stays a direct sum's."""
    import cupy

    case = Case((2, 1024, 10, 12), (64, 1024, 3, 3), dict(padding=1), True)
    x, w, b = (a.astype(numpy.float32).astype(numpy.float64) for a in make_inputs(case, seed=36))
    ref = reference(x, w, b, **case.kwargs)
    got = cupy.asnumpy(cuconv.conv2d(_gpu(x), _gpu(w), _gpu(b), algo="winograd_fused", **case.kwargs))
    direct = cupy.asnumpy(cuconv.conv2d(_gpu(x), _gpu(w), _gpu(b), algo="direct", precision="ieee", **case.kwargs))
    err, err_direct = rel_err(got, ref), rel_err(direct, ref)
    assert err <= min(tolerance(numpy.float32), 4 * err_direct), f"{err:.2e} (direct {err_direct:.2e})"
