"""Algorithm ``winograd``: its plan and reasons (CPU), and on the GPU every axis transform F(m, r) it has,
through chunks of tile rows, against the float64 oracle (forward and dgrad). The case table and the reduced
problems also run it, in test_conv_gpu.py and test_backward_gpu.py; it is left out of the integer-exact
comparisons there (its transforms hold fractions)."""

from __future__ import annotations

import numpy
import pytest

import cuconv
from cuconv.algos import winograd
from cuconv.spec import ConvSpec
from cases import Case, _p, make_inputs, noncontiguous, reference, reference_grads, rel_err, tolerance

# Every axis transform at least once per axis (taps 1 to 7), tiles that overhang the output (P, Q not
# multiples of m), padding on every side and asymmetric, batch 1, no bias.
WINO_CASES = [
    _p("k2x2_pad_asym", (2, 5, 11, 13), (3, 5, 2, 2), padding=(1, 0)),
    _p("k3x3_same", (2, 7, 17, 14), (6, 7, 3, 3), padding=1),
    _p("k4x4_valid", (1, 4, 15, 18), (5, 4, 4, 4)),
    _p("k5x5_pad2", (2, 6, 12, 21), (4, 6, 5, 5), padding=2, bias=False),
    _p("k6x6_pad3", (1, 3, 14, 15), (2, 3, 6, 6), padding=(3, 2)),
    _p("k7x7_pad3", (2, 4, 13, 16), (3, 4, 7, 7), padding=3),
    _p("k1x7", (2, 5, 9, 20), (4, 5, 1, 7), padding=(0, 3)),
    _p("k7x1", (1, 5, 20, 9), (4, 5, 7, 1), padding=(3, 0)),
    _p("k5x7_rect", (2, 9, 19, 25), (7, 9, 5, 7)),
    _p("k3x6_same_even", (2, 4, 11, 12), (3, 4, 3, 6), padding="same"),
]


def _spec(case):
    return ConvSpec.from_args(case.x_shape, case.w_shape, **case.kwargs)


# ---- CPU: plan and reasons ----------------------------------------------------------------------------

def test_every_kernel_size_served_has_compiled_instances():
    """What reason_unsupported lets through is what CI compiles (NAME_EXPRESSIONS), and nothing more."""
    served = set()
    for r in range(1, 9):
        for s in range(1, 9):
            spec = ConvSpec.from_args((1, 2, 12, 12), (2, 2, r, s))
            if winograd.reason_unsupported(spec, numpy.float64) is None:
                served.add((r, s))
                for ctype in ("float", "double"):
                    assert set(winograd._names(ctype, r, s)) <= set(winograd.NAME_EXPRESSIONS)
    assert served == {(r, s) for r in range(1, 8) for s in range(1, 8)} - {(1, 1)}
    assert len(winograd.NAME_EXPRESSIONS) == 2 * 3 * len(served)


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("limit", [1 << 30, 1 << 25, 1 << 24])
def test_plan_chunks_fit_the_workspace(dtype, limit):
    spec = ConvSpec.from_args((8, 128, 508, 250), (64, 128, 5, 7), padding=(4, 6))
    pl = winograd.plan(spec, dtype, limit)
    item = numpy.dtype(dtype).itemsize
    assert (pl.m_h, pl.m_w, pl.a_h, pl.a_w) == (2, 2, 6, 8)
    assert (pl.tiles_h, pl.tiles_w) == (256, 128)
    assert pl.rows >= 1
    assert pl.u_bytes + pl.chunk_bytes <= limit
    assert pl.ld % 32 == 0 and pl.ld >= pl.rows * pl.tiles_w
    assert pl.chunk_bytes == pl.ld * pl.points * (spec.c + spec.k) * item
    # as few chunks as the limit allows
    per_column = pl.points * (spec.c + spec.k) * item
    most = max(r for r in range(1, spec.n * pl.tiles_h + 1)
               if pl.u_bytes + winograd._round_up(r * pl.tiles_w, 32) * per_column <= limit)
    total = spec.n * pl.tiles_h
    assert -(-total // pl.rows) == -(-total // most)


def test_plan_tiles_by_taps():
    for taps, m in winograd.TILE_BY_TAPS.items():
        spec = ConvSpec.from_args((1, 2, 40, 40), (2, 2, taps, 3))
        pl = winograd.plan(spec, numpy.float32, 1 << 30)
        assert (pl.m_h, pl.a_h) == (m, m + taps - 1)
        assert pl.a_h <= 8 and (pl.m_w, pl.a_w) == (4, 6)
        assert pl.tiles_h == -(-spec.p // m)


@pytest.mark.parametrize("kwargs,w_shape,dtype,precision,pass_,match", [
    (dict(stride=2), (4, 3, 3, 3), numpy.float32, "ieee", "fprop", "stride 1 and dilation 1"),
    (dict(dilation=(1, 2)), (4, 3, 3, 3), numpy.float32, "ieee", "fprop", "stride 1 and dilation 1"),
    (dict(groups=3), (6, 1, 3, 3), numpy.float32, "ieee", "fprop", "groups=1"),
    ({}, (4, 3, 1, 1), numpy.float32, "ieee", "fprop", "not 1x1"),
    ({}, (4, 3, 3, 9), numpy.float32, "ieee", "fprop", "1 to 7 taps"),
    ({}, (4, 3, 3, 3), numpy.float16, "ieee", "fprop", "float32 or float64"),
    ({}, (4, 3, 3, 3), numpy.float32, "tf32", "fprop", "precision 'ieee' only"),
    ({}, (4, 3, 3, 3), numpy.float32, "ieee", "wgrad", "no wgrad"),
    (dict(stride=2), (4, 3, 3, 3), numpy.float32, "ieee", "dgrad", "stride 1"),
])
def test_reasons(kwargs, w_shape, dtype, precision, pass_, match):
    spec = ConvSpec.from_args((2, 3, 20, 20), w_shape, **kwargs)
    assert match in winograd.reason_unsupported(spec, dtype, pass_, precision)


@pytest.mark.parametrize("r,s,cap", [(3, 3, 512), (5, 5, 512), (2, 2, 512), (6, 6, 192), (6, 3, 192),
                                     (7, 7, 128), (5, 7, 128), (1, 7, 128)])
def test_float32_channel_caps(r, s, cap):
    """float32 stops at the input channels where its error nears half the tolerance; float64 goes on."""
    for c, served in ((cap, True), (cap + 1, False)):
        spec = ConvSpec.from_args((1, c, 16, 16), (8, c, r, s))
        reason = winograd.reason_unsupported(spec, numpy.float32)
        assert (reason is None) == served, reason
        if not served:
            assert f"at most {cap}" in reason and "1e-5" in reason
        assert winograd.reason_unsupported(spec, numpy.float64) is None
    # dgrad reduces over the forward's output channels
    spec = ConvSpec.from_args((1, 8, 16, 16), (cap + 1, 8, r, s), padding=(r - 1, s - 1))
    assert "1e-5" in winograd.reason_unsupported(spec, numpy.float32, "dgrad")


def test_serves_float32_ieee_float64_and_stride_1_dgrad():
    spec = ConvSpec.from_args((2, 3, 20, 20), (4, 3, 5, 7), padding=(1, 2))
    for dtype in (numpy.float32, numpy.float64):
        for pass_ in ("fprop", "dgrad"):
            assert winograd.reason_unsupported(spec, dtype, pass_, "ieee") is None


def test_refuses_a_workspace_without_room_for_one_tile_row():
    spec = ConvSpec.from_args((1, 64, 40, 400), (64, 64, 3, 3))
    with cuconv.config(workspace_limit=1 << 20):
        reason = cuconv.select.reason_unsupported("winograd", spec, numpy.float32)
    assert "workspace" in reason and str(1 << 20) in reason


# ---- GPU --------------------------------------------------------------------------------------------

def _gpu(a, dtype):
    import cupy

    return None if a is None else cupy.asarray(a.astype(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
@pytest.mark.parametrize("case", WINO_CASES)
def test_forward_matches_oracle(case, dtype_name):
    import cupy

    dtype = numpy.dtype(dtype_name)
    x, w, b = (None if a is None else a.astype(dtype).astype(numpy.float64) for a in make_inputs(case, seed=21))
    ref = reference(x, w, b, **case.kwargs)
    out = cupy.full(ref.shape, numpy.nan, dtype=dtype)
    got = cuconv.conv2d(noncontiguous(_gpu(x, dtype), cupy), _gpu(w, dtype), _gpu(b, dtype), algo="winograd",
                        precision="ieee", out=out, **case.kwargs)
    assert got is out
    err = rel_err(cupy.asnumpy(out), ref)
    assert err <= tolerance(dtype), f"{err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
@pytest.mark.parametrize("case", [c for c in WINO_CASES if c.id in ("k3x3_same", "k5x7_rect", "k6x6_pad3",
                                                                     "k1x7")])
def test_dgrad_matches_oracle(case, dtype_name):
    import cupy
    dtype = numpy.dtype(dtype_name)
    x, w, _ = make_inputs(case, seed=22)
    spec = _spec(case)
    dy = numpy.random.default_rng(23).standard_normal(spec.output_shape)
    w, dy = (a.astype(dtype).astype(numpy.float64) for a in (w, dy))
    ref = reference_grads(x, w, dy, **case.kwargs)[0]
    got = cuconv.conv2d_input(x.shape, _gpu(w, dtype), _gpu(dy, dtype), algo="winograd", precision="ieee",
                              **case.kwargs)
    err = rel_err(cupy.asnumpy(got), ref)
    assert err <= tolerance(dtype), f"{err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
@pytest.mark.parametrize("rows", [1, 2, 4, 14])
def test_chunks_of_tile_rows_across_samples(rows, dtype_name):
    """A workspace for ``rows`` rows of 32 tiles: chunks of one row up to 448 tiles (two blocks of the
    transform kernels), ending mid-image and crossing into the next sample, against the oracle."""
    import cupy

    dtype = numpy.dtype(dtype_name)
    case = Case((3, 6, 17, 64), (5, 6, 5, 7), dict(padding=(2, 3)), True)
    spec = _spec(case)
    whole = winograd.plan(spec, dtype, 1 << 30)
    assert whole.tiles_w == 32
    limit = whole.u_bytes + rows * whole.tiles_w * whole.points * (spec.c + spec.k) * dtype.itemsize
    pl = winograd.plan(spec, dtype, limit)
    total = spec.n * pl.tiles_h
    assert pl.rows == rows < total
    assert rows == 1 or any(r0 // pl.tiles_h != (r0 + rows - 1) // pl.tiles_h for r0 in range(0, total, rows))
    x, w, b = (a.astype(dtype).astype(numpy.float64) for a in make_inputs(case, seed=24))
    ref = reference(x, w, b, **case.kwargs)
    out = cupy.full(ref.shape, numpy.nan, dtype=dtype)
    with cuconv.config(workspace_limit=limit):
        cuconv.conv2d(_gpu(x, dtype), _gpu(w, dtype), _gpu(b, dtype), algo="winograd", precision="ieee", out=out,
                      **case.kwargs)
    err = rel_err(cupy.asnumpy(out), ref)
    assert err <= tolerance(dtype), f"{err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("r,s,c", [(3, 3, 512), (5, 5, 512), (6, 6, 192), (7, 7, 128), (5, 7, 128)])
def test_float32_error_at_the_channel_cap(r, s, c):
    """The most input channels float32 is served with, per kernel size: within the float32 tolerance."""
    import cupy

    case = Case((2, c, 18, 20), (24, c, r, s), dict(padding=(r // 2, s // 2)), True)
    assert winograd.reason_unsupported(_spec(case), numpy.float32) is None
    x, w, b = (a.astype(numpy.float32).astype(numpy.float64) for a in make_inputs(case, seed=25))
    ref = reference(x, w, b, **case.kwargs)
    got = cuconv.conv2d(_gpu(x, numpy.float32), _gpu(w, numpy.float32), _gpu(b, numpy.float32), algo="winograd",
                        precision="ieee", **case.kwargs)
    err = rel_err(cupy.asnumpy(got), ref)
    assert err <= tolerance(numpy.float32), f"{err:.2e}"
