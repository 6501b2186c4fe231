"""implicit_gemm on the GPU across its engines: every tile bit for bit against the CPU path on integers, forward,
dgrad (stride 1 and by phases) and wgrad (split over k or not), vector stores, and the passes on channels-last
tensors."""

from __future__ import annotations

import numpy
import pytest

import cuconv
from cuconv import _dtypes
from cases import (CASES, EXACT_DTYPES, PROBLEM_CASES, TILING_CASES, assert_forward_equals_cpu_on_integers, case_spec,
                   make_inputs, to_gpu)
from igemm_cases import _nhwc, _weight
from cuconv.select import implicit_gemm as choice

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
@pytest.mark.parametrize("x_shape,w_shape,kwargs,weights", [
    ((2, 64, 9, 7), (64, 64, 3, 3), dict(padding=1), "krsc"),
    ((3, 128, 5, 6), (128, 64, 1, 1), dict(groups=2), "krsc"),
    ((3, 128, 5, 6), (128, 64, 1, 1), dict(groups=2), "kcrs"),
    ((2, 256, 7, 9), (128, 256, 1, 1), dict(stride=2), "kcrs"),
    ((1, 64, 8, 8), (128, 64, 3, 3), dict(stride=2, padding=1), "krsc"),
], ids=["3x3", "1x1_two_groups", "1x1_two_groups_kcrs", "1x1_s2_kcrs", "3x3_s2_n1"])
def test_channels_last_weight_read_in_place_by_the_forward(x_shape, w_shape, kwargs, weights, dtype_name):
    """A channels-last weight whose every row is whole k tiles and whose filters fill whole tiles is the packed
    weight itself: the in-place forward is one GEMM launch, no pack, reading it where it is (bit for bit the CPU
    path on integers, into a NaN-poisoned out); so is a 1x1 weight told KCRS (the same memory)."""
    import cupy

    from cuconv import _plan
    from cuconv.algos import implicit_gemm

    dtype = _dtypes.by_name(dtype_name)
    rng = numpy.random.default_rng(47)
    x = rng.integers(-3, 4, x_shape).astype(dtype)
    w = rng.integers(-3, 4, w_shape).astype(dtype)
    b = rng.integers(-3, 4, w_shape[0]).astype(dtype)
    spec = cuconv.ConvSpec.from_args(x_shape, w_shape, **kwargs)
    xg, wg, bg = _nhwc(cupy.asarray(x)), _weight(w, dtype, weights), cupy.asarray(b)
    out = cupy.full((spec.n, spec.p, spec.q, spec.k), numpy.nan, dtype=dtype)
    plan = implicit_gemm.prepare("fprop", spec, dtype, "ieee", _plan.current_env(xg, wg, bg, out), True,
                                 layout="nhwc", weights=weights)
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
    tile = choice.choose_tile(spec, dtype, nchw=False)
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
