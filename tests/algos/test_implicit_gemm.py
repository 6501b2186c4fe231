"""implicit_gemm on the GPU: every tile bit for bit against the CPU path on integers, forward, dgrad (stride 1 and by
phases) and wgrad (split over k or not), the NCHW tiles' unaligned weights and vector stores, and the NHWC pack
with its zero channels."""

from __future__ import annotations

import numpy
import pytest

import cuconv
from cuconv import _dtypes
from cases import (CASES, EXACT_DTYPES, PROBLEM_CASES, TILING_CASES, assert_forward_equals_cpu_on_integers, case_spec,
                   make_inputs, to_gpu)

pytestmark = pytest.mark.gpu


def _implicit_gemm_tile_cases():
    from cuconv.algos import implicit_gemm

    out = []
    for param in TILING_CASES + [c for c in CASES if c.id in ("k5x9_d2x3_p2x4", "stride2_dil2_pad3", "same_even_dil3",
                                                               "groups4_c8", "groups3_c16_stride2")]:
        case = param.values[0]
        if implicit_gemm.reason_unsupported(case_spec(case), numpy.float16) is None:
            out += [pytest.param(case, t, id=f"{param.id}-{t}") for t in implicit_gemm.TILES]
    return out



@pytest.mark.parametrize("dtype_name", [d for d in EXACT_DTYPES if d != "float64"])
@pytest.mark.parametrize("case,tile", _implicit_gemm_tile_cases())
def test_implicit_gemm_tiles_equal_cpu_exactly_on_integers(case, tile, dtype_name):
    """Every tile instance of implicit_gemm, across M, N and k tile tails: small integers are exact in TF32,
    fp16 and bf16 and every fp32 partial sum is exact, so each dtype equals the CPU path bit for bit."""
    from cuconv.algos import implicit_gemm

    if implicit_gemm.TILES[tile].wgmma and not implicit_gemm.wgmma_available():
        pytest.skip(f"tile {tile} runs wgmma, which needs compute capability 9.0")
    assert_forward_equals_cpu_on_integers(
        case, dtype_name, 16, lambda x, w, b, spec, out: implicit_gemm.forward_gpu(x, w, b, spec, out, "tf32",
                                                                                   tile=implicit_gemm.TILES[tile]))


@pytest.mark.parametrize("dtype_name", [d for d in EXACT_DTYPES if d != "float64"])
@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("case,tile", [p for p in _implicit_gemm_tile_cases() if not p.values[1].startswith("nchw")])
def test_implicit_gemm_split_forward_equals_cpu_exactly_on_integers(case, tile, splits, dtype_name):
    """The forward split over k ranges: fp32 partial sums, then one launch adds them and the bias in order and
    rounds once; on integers bit for bit the CPU path, every packed tile."""
    from cuconv.algos import implicit_gemm

    if implicit_gemm.TILES[tile].wgmma and not implicit_gemm.wgmma_available():
        pytest.skip(f"tile {tile} runs wgmma, which needs compute capability 9.0")
    assert_forward_equals_cpu_on_integers(
        case, dtype_name, 17, lambda x, w, b, spec, out: implicit_gemm.forward_gpu(
            x, w, b, spec, out, "tf32", tile=implicit_gemm.TILES[tile], splits=splits))


def _wgrad_tile_cases():
    from cuconv.algos import implicit_gemm

    out = []
    # the tiling cases, odd sizes, strides, dilations, paddings, batch 1 and groups (filters of a group that
    # fill no tile, a group's rows over two tiles, depthwise; every case runs the tile auto picks against the
    # oracle in test_backward_gpu)
    picked = ("k5x9_d2x3_p2x4", "stride2_dil2_pad3", "same_even_dil3", "batch1_odd", "pointwise_1x1_stride2",
              "kernel_equals_input", "groups2", "groups4_c8", "groups3_c16_stride2", "depthwise",
              "depthwise_mult3_3x1", "chunks_groups_k_tail")
    for param in TILING_CASES + [c for c in CASES + PROBLEM_CASES if c.id in picked or c.id.startswith("reduced_stem")]:
        case = param.values[0]
        if 0 in case.x_shape or implicit_gemm.reason_unsupported(case_spec(case), numpy.float16, "wgrad") is not None:
            continue
        out += [pytest.param(case, t, id=f"{param.id}-{t}") for t, tile in implicit_gemm.TILES.items() if not tile.nchw]
    return out


def _integer_backward_operands(case, tile: str, seed: int):
    """(x as a batch, w, dy, spec) of small integers for a backward pass through ``tile`` (skipped where the
    device cannot run it); dy from ``seed + 1``."""
    from cuconv.algos import implicit_gemm

    if implicit_gemm.TILES[tile].wgmma and not implicit_gemm.wgmma_available():
        pytest.skip(f"tile {tile} runs wgmma, which needs compute capability 9.0")
    x, w, _ = make_inputs(case, seed=seed, integer=True)
    x4 = x if x.ndim == 4 else x[None]
    spec = cuconv.ConvSpec.from_args(x4.shape, w.shape, **case.kwargs)
    dy = numpy.random.default_rng(seed + 1).integers(-3, 4, size=spec.output_shape).astype(numpy.float64)
    return x4, w, dy, spec


@pytest.mark.parametrize("dtype_name", [d for d in EXACT_DTYPES if d != "float64"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("case,tile", _wgrad_tile_cases())
def test_implicit_gemm_wgrad_equals_cpu_exactly_on_integers(case, tile, splits, dtype_name):
    """wgrad through every packed tile, whole or split over k (fp32 partial sums, then their sum): on integers
    every partial sum is exact, so each dtype equals the CPU path bit for bit, into a NaN-poisoned dW."""
    import cupy

    from cuconv.algos import implicit_gemm

    dtype = _dtypes.by_name(dtype_name)
    x4, w, dy, spec = _integer_backward_operands(case, tile, 23)
    cpu = cuconv.conv2d_weight(x4.astype(dtype), w.shape, dy.astype(dtype), **case.kwargs)
    dw = cupy.full(w.shape, numpy.nan, dtype=dtype)
    implicit_gemm.wgrad_gpu(to_gpu(x4, dtype), to_gpu(dy, dtype), spec, dw, "tf32", tile=implicit_gemm.TILES[tile],
                            splits=splits)
    numpy.testing.assert_array_equal(cupy.asnumpy(dw).astype(numpy.float64), cpu.astype(numpy.float64))


@pytest.mark.parametrize("dtype_name", [d for d in EXACT_DTYPES if d != "float64"])
@pytest.mark.parametrize("tile", ["nchw64", "nchw128"])
@pytest.mark.parametrize("shape", [((3, 8, 9, 37), (72, 8, 3, 3)), ((2, 24, 17, 19), (40, 24, 1, 1))],
                         ids=["3x3", "1x1"])
def test_implicit_gemm_nchw_tiles_read_an_unaligned_weight(shape, tile, dtype_name):
    """An NchwTile reads the weight as it is: in 16-byte vectors where C·R·S and the pointer allow, element by
    element otherwise; a weight one element into its allocation (C·R·S a whole number of vectors) takes the
    second way, and rows past the last pixel and filter (M and K tails) stay out of the output."""
    import cupy

    from cuconv.algos import implicit_gemm

    if not implicit_gemm.wgmma_available():
        pytest.skip("the NchwTiles run wgmma, which needs compute capability 9.0")
    dtype = _dtypes.by_name(dtype_name)
    (xs, ws), rng = shape, numpy.random.default_rng(7)
    x = rng.integers(-4, 5, xs).astype(dtype)
    w = rng.integers(-4, 5, ws).astype(dtype)
    b = rng.integers(-4, 5, ws[0]).astype(dtype)
    spec = cuconv.ConvSpec.from_args(xs, ws, padding=ws[2] // 2)
    want = cuconv.conv2d(x, w, b, padding=ws[2] // 2)
    wg = cupy.empty(w.size + 1, dtype=dtype)[1:].reshape(ws)
    wg[...] = cupy.asarray(w)
    assert wg.flags.c_contiguous and wg.data.ptr % 16 != 0
    out = cupy.full(spec.output_shape, numpy.nan, dtype=dtype)
    implicit_gemm.forward_gpu(cupy.asarray(x), wg, cupy.asarray(b), spec, out, "tf32", tile=implicit_gemm.TILES[tile])
    numpy.testing.assert_array_equal(cupy.asnumpy(out).astype(numpy.float64), want.astype(numpy.float64))



@pytest.mark.parametrize("dtype_name", [d for d in EXACT_DTYPES if d != "float64"])
@pytest.mark.parametrize("tile", ["128x64", "wg64x128s3", "wg128x128r", "wg128x256", "nchw64"])
@pytest.mark.parametrize("out_offset", [0, 1], ids=["aligned-out", "unaligned-out"])
def test_implicit_gemm_stores_whole_tiles_as_vectors_where_aligned(out_offset, tile, dtype_name):
    """The epilogue writes a tile of 128 or 256 pixels inside one image as 4-pixel vectors (P·Q = 384, a
    multiple of 4: three 128-pixel tiles per image; 256-pixel tiles at pixels 0 and 512 lie inside an image,
    the one at 256 crosses two), pixel by pixel where a tile crosses images or the output is not aligned for
    them (one element into its allocation); bias added: all equal the CPU path bit for bit."""
    import cupy

    from cuconv.algos import implicit_gemm

    t = implicit_gemm.TILES[tile]
    if t.wgmma and not implicit_gemm.wgmma_available():
        pytest.skip(f"tile {tile} runs wgmma, which needs compute capability 9.0")
    dtype = _dtypes.by_name(dtype_name)
    rng = numpy.random.default_rng(11)
    x = rng.integers(-4, 5, (2, 8, 16, 24)).astype(dtype)
    w = rng.integers(-4, 5, (40, 8, 3, 3)).astype(dtype)
    b = rng.integers(-4, 5, 40).astype(dtype)
    spec = cuconv.ConvSpec.from_args(x.shape, w.shape, padding=1)
    assert spec.p * spec.q == 384
    want = cuconv.conv2d(x, w, b, padding=1)
    size = int(numpy.prod(spec.output_shape))
    out = cupy.full(size + out_offset, numpy.nan, dtype)[out_offset:].reshape(spec.output_shape)
    assert (out.data.ptr % 8 == 0) == (out_offset == 0)
    implicit_gemm.forward_gpu(cupy.asarray(x), cupy.asarray(w), cupy.asarray(b), spec, out, "tf32", tile=t)
    numpy.testing.assert_array_equal(cupy.asnumpy(out).astype(numpy.float64), want.astype(numpy.float64))



@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("c", [1, 3, 8, 16, 20, 33, 64, 72, 136])
@pytest.mark.parametrize("image", [(3, 13, 11), (1, 190, 180)], ids=["odd", "more-tiles-than-the-grid"])
def test_implicit_gemm_pack_is_nhwc_with_zero_channels(image, c, dtype_name):
    """Both pack kernels (pixels up to 256 bytes one thread per vector, 32 x 64 transposes above): NHWC with
    the channels padded to cp with zeros, TF32-rounded for float32, over several samples and an odd image
    size (and one of more than 512 tiles, which the grid walks); and the weight, packed by the same launch,
    (kp, w_row) with k index (r·S + s)·cp + c and zeros elsewhere."""
    import cupy

    from cuconv.algos import implicit_gemm

    dtype = _dtypes.by_name(dtype_name)
    n, h, w_ = image
    spec = cuconv.ConvSpec.from_args((n, c, h, w_), (5, c, 3, 2))
    pl = implicit_gemm.plan(spec, dtype, implicit_gemm.choose_tile(spec, dtype, nchw=False))  # a packing tile
    rng = numpy.random.default_rng(c)
    x = rng.integers(-8, 9, (n, c, h, w_)).astype(dtype)
    w = rng.integers(-8, 9, (5, c, 3, 2)).astype(dtype)
    packed_x = cupy.full(n * h * w_ * pl.cp, numpy.nan, dtype=dtype)
    packed_w = cupy.full(pl.kp * pl.w_row, numpy.nan, dtype=dtype)
    implicit_gemm.pack_operands(to_gpu(x, dtype), to_gpu(w, dtype), spec, pl, packed_x, packed_w)
    want_x = numpy.zeros((n, h, w_, pl.cp), dtype)
    want_x[..., :c] = x.transpose(0, 2, 3, 1)
    want_w = numpy.zeros((pl.kp, pl.w_row), dtype)
    for tap in range(3 * 2):
        want_w[:5, tap * pl.cp:tap * pl.cp + c] = w[:, :, tap // 2, tap % 2]
    for got, want in ((packed_x, want_x), (packed_w, want_w)):
        numpy.testing.assert_array_equal(cupy.asnumpy(got).reshape(want.shape).astype(numpy.float64),
                                         want.astype(numpy.float64))
    packed_x.fill(numpy.nan)  # without a weight: the input alone
    implicit_gemm.pack_operands(to_gpu(x, dtype), None, spec, pl, packed_x)
    numpy.testing.assert_array_equal(cupy.asnumpy(packed_x).reshape(want_x.shape).astype(numpy.float64),
                                     want_x.astype(numpy.float64))



def _phase_tile_cases():
    """dgrad cases no single forward convolution of dy serves (a stride above 1, padding wider than the kernel),
    each through every packed tile: the phases of the stride, phases without taps, groups."""
    from cuconv.blocks import dgrad_forward
    from cuconv.algos import implicit_gemm

    out = []
    for param in TILING_CASES + CASES + PROBLEM_CASES:
        case = param.values[0]
        spec = case_spec(case)
        if (0 in case.x_shape or dgrad_forward.forward_spec(spec) is not None
                or implicit_gemm.reason_unsupported(spec, numpy.float16, "dgrad") is not None):
            continue
        out += [pytest.param(case, t, id=f"{param.id}-{t}") for t, tile in implicit_gemm.TILES.items() if not tile.nchw]
    return out


def _stride1_dgrad_tile_cases():
    """dgrad cases that are one forward convolution of dy (stride 1), each through every tile: the packed ones
    pack the layer's weight transposed and flipped themselves, the NchwTiles read dgrad_forward's flipped copy;
    groups, dilation, one-sided and non-square kernels among them."""
    from cuconv.blocks import dgrad_forward
    from cuconv.algos import implicit_gemm

    out = []
    for param in TILING_CASES + [c for c in CASES if c.id in ("k5x9_d2x3_p2x4", "same_even_dil3", "same_even_4x2",
                                                               "groups4_c8", "groups3_c16_stride2", "pointwise_1x1")]:
        case = param.values[0]
        spec = case_spec(case)
        if (0 in case.x_shape or dgrad_forward.forward_spec(spec) is None
                or implicit_gemm.reason_unsupported(spec, numpy.float16, "dgrad") is not None):
            continue
        out += [pytest.param(case, t, id=f"{param.id}-{t}") for t in implicit_gemm.TILES]
    return out


@pytest.mark.parametrize("dtype_name", [d for d in EXACT_DTYPES if d != "float64"])
@pytest.mark.parametrize("case,tile", _phase_tile_cases() + _stride1_dgrad_tile_cases())
def test_implicit_gemm_dgrad_equals_cpu_exactly_on_integers(case, tile, dtype_name):
    """dgrad through every tile, at a stride above 1 as one GEMM per phase of the stride, at stride 1 as the
    forward of dy: on integers each dtype equals the CPU path bit for bit, into a NaN-poisoned dx (every pixel
    written, the phases without taps with zeros)."""
    import cupy

    from cuconv.algos import implicit_gemm

    dtype = _dtypes.by_name(dtype_name)
    x4, w, dy, spec = _integer_backward_operands(case, tile, 29)
    cpu = cuconv.conv2d_input(x4.shape, w.astype(dtype), dy.astype(dtype), **case.kwargs)
    dx = cupy.full(x4.shape, numpy.nan, dtype=dtype)
    implicit_gemm.dgrad_gpu(to_gpu(dy, dtype), to_gpu(w, dtype), spec, dx, "tf32", tile=implicit_gemm.TILES[tile])
    numpy.testing.assert_array_equal(cupy.asnumpy(dx).astype(numpy.float64), cpu.astype(numpy.float64))


def _nhwc_cases(pass_="fprop"):
    """(case, dtype) of the table whose ``pass_`` implicit_gemm runs on channels-last tensors (in place, or packed
    from channels-last pixels), float32 at TF32."""
    from cuconv import _plan
    from cuconv.algos import implicit_gemm

    out = []
    limits = _plan.Limits(232448, True, 1 << 30)  # (the cases' support is the same on the devices we run)
    for param in CASES + PROBLEM_CASES + TILING_CASES:
        case = param.values[0]
        spec = case_spec(case)
        if 0 in case.x_shape or spec.n * spec.k * spec.p * spec.q * spec.crs_per_group == 0:
            continue  # (empty problems: the registry's fills, test_conv_gpu)
        for dtype_name in ("float16", "bfloat16", "float32"):
            if _dtypes.bfloat16 is None and dtype_name == "bfloat16":
                continue
            dtype = _dtypes.by_name(dtype_name)
            if (implicit_gemm.reason_unsupported_nhwc(spec, dtype, pass_, "tf32", limits) is None
                    and implicit_gemm.reason_unsupported(spec, dtype, pass_, "tf32", limits) is None):
                out.append(pytest.param(case, dtype_name, id=f"{param.id}-{dtype_name}"))
    return out


def _nhwc(a):
    """A C-contiguous (N, C, H, W) CuPy array's values as a dense (N, H, W, C) one."""
    import cupy

    return cupy.ascontiguousarray(a.transpose(0, 2, 3, 1))


def _nhwc_backward_operands(case, dtype_name: str, seed: int):
    """(dtype, x as a batch, w, dy of ``dtype``, spec) of small integers for a channels-last backward test; dy from
    ``seed + 1``."""
    x, w, _ = make_inputs(case, seed=seed, integer=True)
    dtype = _dtypes.by_name(dtype_name)
    x4 = x if x.ndim == 4 else x[None]
    spec = cuconv.ConvSpec.from_args(x4.shape, w.shape, **case.kwargs)
    dy = numpy.random.default_rng(seed + 1).integers(-3, 4, spec.output_shape).astype(dtype)
    return dtype, x4, w, dy, spec


def _unaligned_copy(a):
    """A copy of CuPy array ``a`` (its strides kept) starting one element into its allocation."""
    import cupy

    flat = cupy.empty(a.size + 1, dtype=a.dtype)[1:]
    flat[...] = cupy.ascontiguousarray(a.transpose(*numpy.argsort(a.strides)[::-1])).ravel()
    out = cupy.ndarray(a.shape, a.dtype, flat.data, a.strides)
    assert out.data.ptr % 16 != 0 and bool((out == a).all())
    return out


def _weight(w, dtype, weights: str):
    """The weight on the GPU in ``weights``' layout: KCRS, or channels-last ((K, R, S, C/groups) in memory)."""
    import cupy

    wg = cupy.asarray(w.astype(dtype))
    return _nhwc(wg) if weights == "krsc" else wg


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["kcrs", "krsc"])
@pytest.mark.parametrize("case,dtype_name", _nhwc_cases())
def test_forward_on_channels_last_tensors(case, dtype_name, weights):
    """x and out channels-last in memory: in place where a group's channels fill 16-byte vectors in the half
    types (the weight's pack, one GEMM reading x where it is), else packed from channels-last pixels; NHWC rows
    stored; the weight KCRS or channels-last; on integers, bit for bit the CPU path's result, into a NaN-poisoned
    out."""
    import cupy

    from cuconv import _plan
    from cuconv.algos import implicit_gemm

    x, w, b = make_inputs(case, seed=41, integer=True)
    dtype = _dtypes.by_name(dtype_name)
    x4 = x if x.ndim == 4 else x[None]
    spec = cuconv.ConvSpec.from_args(x4.shape, w.shape, **case.kwargs)
    want = cuconv.conv2d(x4.astype(dtype), w.astype(dtype), None if b is None else b.astype(dtype), **case.kwargs)
    xg = _nhwc(cupy.asarray(x4.astype(dtype)))
    out = cupy.full((spec.n, spec.p, spec.q, spec.k), numpy.nan, dtype=dtype)
    wg, bg = _weight(w, dtype, weights), None if b is None else cupy.asarray(b.astype(dtype))
    plan = implicit_gemm.prepare("fprop", spec, dtype, "tf32", _plan.current_env(xg, wg, bg, out), b is not None,
                                 layout="nhwc", weights=weights)
    _plan.run_arrays(plan, xg, wg, bg, out)
    numpy.testing.assert_array_equal(cupy.asnumpy(out.transpose(0, 3, 1, 2)).astype(numpy.float64),
                                     want.astype(numpy.float64))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("x_shape,w_shape,kwargs", [
    ((2, 64, 9, 7), (64, 64, 3, 3), dict(padding=1)),
    ((3, 128, 5, 6), (128, 64, 1, 1), dict(groups=2)),
    ((1, 64, 8, 8), (128, 64, 3, 3), dict(stride=2, padding=1)),
], ids=["3x3", "1x1_two_groups", "3x3_s2_n1"])
def test_channels_last_weight_read_in_place_by_the_forward(x_shape, w_shape, kwargs, dtype_name):
    """A channels-last weight whose every row is whole k tiles and whose filters fill whole tiles is the packed
    weight itself: the in-place forward is one GEMM launch, no pack, reading it where it is (bit for bit the CPU
    path on integers, into a NaN-poisoned out)."""
    import cupy

    from cuconv import _plan
    from cuconv.algos import implicit_gemm

    dtype = _dtypes.by_name(dtype_name)
    rng = numpy.random.default_rng(47)
    x = rng.integers(-3, 4, x_shape).astype(dtype)
    w = rng.integers(-3, 4, w_shape).astype(dtype)
    b = rng.integers(-3, 4, w_shape[0]).astype(dtype)
    spec = cuconv.ConvSpec.from_args(x_shape, w_shape, **kwargs)
    xg, wg, bg = _nhwc(cupy.asarray(x)), _nhwc(cupy.asarray(w)), cupy.asarray(b)
    out = cupy.full((spec.n, spec.p, spec.q, spec.k), numpy.nan, dtype=dtype)
    plan = implicit_gemm.prepare("fprop", spec, dtype, "ieee", _plan.current_env(xg, wg, bg, out), True,
                                 layout="nhwc", weights="krsc")
    assert len(plan.steps) == 1 and plan.workspace == 0
    _plan.run_arrays(plan, xg, wg, bg, out)
    numpy.testing.assert_array_equal(cupy.asnumpy(out.transpose(0, 3, 1, 2)).astype(numpy.float64),
                                     cuconv.conv2d(x, w, b, **kwargs).astype(numpy.float64))


@pytest.mark.gpu
@pytest.mark.parametrize("case,dtype_name", [p for p in _nhwc_cases() if p.values[1] == "float32"])
def test_packed_channels_last_forward_split_and_chunked(case, dtype_name):
    """The channels-last forward through packs (float32 at TF32 packs every case), split over 3 k ranges (fp32
    partial sums summed with the bias per pixel's filters) and, under a workspace limit of one sample, chunked over
    the batch: bit for bit the CPU path on integers, into a NaN-poisoned out."""
    import cupy

    from cuconv import _plan
    from cuconv.algos import implicit_gemm

    x, w, b = make_inputs(case, seed=46, integer=True)
    dtype = _dtypes.by_name(dtype_name)
    x4 = x if x.ndim == 4 else x[None]
    spec = cuconv.ConvSpec.from_args(x4.shape, w.shape, **case.kwargs)
    want = cuconv.conv2d(x4.astype(dtype), w.astype(dtype), None if b is None else b.astype(dtype), **case.kwargs)
    xg = _nhwc(cupy.asarray(x4.astype(dtype)))
    wg, bg = cupy.asarray(w.astype(dtype)), None if b is None else cupy.asarray(b.astype(dtype))
    tile = implicit_gemm.choose_tile(spec, dtype, nchw=False)
    pl = implicit_gemm.plan(spec, dtype, tile, 1 << 30)
    one_sample = pl.sample_bytes(spec, dtype.itemsize) + pl.weight_bytes(dtype.itemsize)
    for splits, limit in ((3, None), (None, one_sample)):
        out = cupy.full((spec.n, spec.p, spec.q, spec.k), numpy.nan, dtype=dtype)
        env = _plan.current_env(xg, wg, bg, out, workspace_limit=limit)
        plan = implicit_gemm.prepare("fprop", spec, dtype, "tf32", env, b is not None, splits=splits, layout="nhwc")
        _plan.run_arrays(plan, xg, wg, bg, out)
        numpy.testing.assert_array_equal(cupy.asnumpy(out.transpose(0, 3, 1, 2)).astype(numpy.float64),
                                         want.astype(numpy.float64))


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["kcrs", "krsc", "krsc_unaligned"])
@pytest.mark.parametrize("case,dtype_name", _nhwc_cases("dgrad"))
def test_dgrad_on_channels_last_tensors(case, dtype_name, weights):
    """dy and dx channels-last in memory: at stride 1 the forward GEMM of dy (the layer's weight packed transposed
    and flipped), at a stride a GEMM per phase, dy read in place or packed from channels-last pixels, dx's NHWC
    rows (every stride-th pixel for a phase) stored; on integers, bit for bit the CPU path's result, into a
    NaN-poisoned dx. The weight packs transpose a 16-bit channels-last weight in 16-byte vectors, one that starts
    an element into its allocation element by element."""
    import cupy

    from cuconv import _plan
    from cuconv.algos import implicit_gemm

    dtype, x4, w, dy, spec = _nhwc_backward_operands(case, dtype_name, 42)
    want = cuconv.conv2d_input(x4.shape, w.astype(dtype), dy, **case.kwargs)
    dyg = _nhwc(cupy.asarray(dy))
    dx = cupy.full((spec.n, spec.h, spec.w, spec.c), numpy.nan, dtype=dtype)
    wg = _weight(w, dtype, weights.removesuffix("_unaligned"))
    if weights.endswith("_unaligned"):
        wg = _unaligned_copy(wg)
    plan = implicit_gemm.prepare("dgrad", spec, dtype, "tf32", _plan.current_env(dyg, wg, dx), layout="nhwc",
                                 weights=weights.removesuffix("_unaligned"))
    _plan.run_arrays(plan, dyg, wg, dx)
    numpy.testing.assert_array_equal(cupy.asnumpy(dx.transpose(0, 3, 1, 2)).astype(numpy.float64),
                                     want.astype(numpy.float64))


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["kcrs", "krsc"])
@pytest.mark.parametrize("splits", [None, 3])
@pytest.mark.parametrize("case,dtype_name", _nhwc_cases("wgrad"))
def test_wgrad_on_channels_last_tensors(case, dtype_name, splits, weights):
    """x and dy channels-last in memory: both packed with samples and channels swapped (``pack_swap``), the GEMM,
    whole or split over k, into dW KCRS or channels-last; on integers, bit for bit the CPU path's dW, into a
    NaN-poisoned one."""
    import cupy

    from cuconv import _plan
    from cuconv.algos import implicit_gemm

    dtype, x4, w, dy, spec = _nhwc_backward_operands(case, dtype_name, 44)
    want = cuconv.conv2d_weight(x4.astype(dtype), w.shape, dy, **case.kwargs)
    xg, dyg = _nhwc(cupy.asarray(x4.astype(dtype))), _nhwc(cupy.asarray(dy))
    krsc = weights == "krsc"
    dw = cupy.full((w.shape[0],) + w.shape[2:] + (w.shape[1],) if krsc else w.shape, numpy.nan, dtype=dtype)
    plan = implicit_gemm.prepare("wgrad", spec, dtype, "tf32", _plan.current_env(xg, dyg, dw), splits=splits,
                                 layout="nhwc", weights=weights)
    _plan.run_arrays(plan, xg, dyg, dw)
    got = cupy.asnumpy(dw.transpose(0, 3, 1, 2) if krsc else dw)
    numpy.testing.assert_array_equal(got.astype(numpy.float64), want.astype(numpy.float64))


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

