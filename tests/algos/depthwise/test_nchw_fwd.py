"""depthwise's forward kernels on NCHW activations (``cuconv.algos.depthwise.nchw_fwd``): their plans (CPU) -
which cases take ``depthwise_fwd_plane`` (``plane_plan``: a whole padded plane in shared memory),
``depthwise_fwd_strips`` (``strips_plan``) or ``depthwise_fwd_rows`` (``rows_layout``, ``rows_strips``), and how a
plane is cut - and on the GPU every forward kernel bit for bit against the CPU path on integers (also as the
stride-1 dgrad reading the weight flipped) and the rows kernel's fallback on misaligned tensors. The case table runs
the algorithm in test_conv_gpu.py and test_backward_gpu.py."""

import numpy
import pytest

import cuconv
from cases import (CASES, EXACT_DTYPES, PROBLEM_CASES, TILING_CASES, assert_forward_equals_cpu_on_integers,
                   case_spec, make_inputs)
from cuconv import _dtypes
from cuconv.algos import depthwise
from cuconv.algos.depthwise import nchw_fwd
from cuconv.select import depthwise as choice
from cuconv.problems import PROBLEMS
from cuconv.spec import ConvSpec

_THREADS = 256
_SMEM = cuconv._plan.SMEM_OPTIN_WITHOUT_DEVICE  # a block's shared-memory opt-in on H100/H200


def _device_smem() -> int:
    """The current device's opt-in where a GPU is visible (the kernels its GPU tests list must serve there)."""
    try:
        return cuconv._plan.device_limits()[0]
    except Exception:  # (no CuPy, no device: the lists are only collected)
        return _SMEM


@pytest.mark.parametrize("p,q", [(1, 1), (3, 5), (56, 56), (57, 300), (112, 112), (1022, 1022), (17, 1)])
@pytest.mark.parametrize("k", [3, 5, 7])
def test_strips_cover_every_output_once(p, q, k):
    spec = ConvSpec(2, 4, p + k - 1, q + k - 1, 4, k, k, groups=4)
    rows, strips = depthwise.strips_plan(spec)
    assert 4 <= rows <= 16
    assert (strips - 1) * rows < spec.p <= strips * rows


def test_strips_only_for_unit_stride_and_dilation_and_compiled_kernels():
    shapes = ((1, 4, 20, 20), (4, 1, 3, 3))
    assert depthwise.strips_plan(ConvSpec.from_args(*shapes, groups=4, padding=1)) is not None
    for kwargs in (dict(stride=2), dict(dilation=2), dict(stride=(1, 2))):
        assert depthwise.strips_plan(ConvSpec.from_args(*shapes, groups=4, **kwargs)) is None
    assert depthwise.strips_plan(ConvSpec.from_args((1, 4, 20, 20), (4, 1, 3, 1), groups=4)) is None


@pytest.mark.parametrize("hw,flat", [(7, True), (14, True), (15, False), (56, False)])
def test_strips_pack_small_planes_flat(hw, flat):
    """Planes up to 14x14 outputs: the strips of all planes flat over the blocks; larger: a block row per plane."""
    spec = ConvSpec.from_args((32, 96, hw, hw), (96, 1, 5, 5), groups=96, padding=2)
    env = cuconv._plan.Env(0, 1 << 30, _SMEM, True, 132, 228 << 10)
    name, grid, _, _, geometry = nchw_fwd._forward_launch(spec, numpy.dtype(numpy.float32), False, False, env,
                                                           "strips")
    rows, strips = depthwise.strips_plan(spec)
    assert name == f"depthwise_fwd_strips<float,5,5,{'true' if flat else 'false'},false>"
    items = spec.n * spec.k * strips * spec.q
    assert int(geometry[1]["items"]) == items
    if flat:
        assert grid == (-(-items // _THREADS), 1, 1)
    else:
        assert grid == (spec.n * spec.k, -(-strips * spec.q // _THREADS), 1)


def test_depthwise_problem_fills_its_blocks():
    spec = next(p for p in PROBLEMS if p.name == "depthwise_3x3").spec()
    assert depthwise.strips_plan(spec) == (14, 4)  # 4 strips x 56 columns: 224 threads per plane


@pytest.mark.parametrize("dtype", [numpy.float16, numpy.float32, numpy.float64])
@pytest.mark.parametrize("h,w,pad", [(56, 56, 1), (57, 64, 1), (10, 16, (2, 3)), (7, 296, 1), (1, 8, None)])
@pytest.mark.parametrize("k", [3, 5])
def test_plane_plan_stages_the_padded_plane_aligned(dtype, h, w, pad, k):
    spec = ConvSpec.from_args((2, 4, h, w), (4, 1, k, k), groups=4, padding=k // 2 if pad is None else pad)
    plan = depthwise.plane_plan(spec, dtype, _SMEM)
    if k == 5 and dtype == numpy.float64:
        assert plan is None  # its window and weights would spill registers
        return
    rows, strips, lead, pitch, stages, smem = plan
    per_vector = 16 // numpy.dtype(dtype).itemsize
    # image column 0 and every row start 16-byte aligned; the window's columns lie inside a row
    assert lead % per_vector == 0 and pitch % per_vector == 0 and lead >= spec.pad[2]
    assert lead - spec.pad[2] + spec.q + k - 1 <= pitch and lead + spec.w <= pitch
    plane_bytes = (spec.p + k - 1) * pitch * numpy.dtype(dtype).itemsize
    assert 2 <= stages <= 4 and smem == stages * plane_bytes
    assert stages == 2 or smem <= 48 << 10
    assert 4 <= rows <= 16 and (strips - 1) * rows < spec.p <= strips * rows


def test_plane_plan_limits():
    shapes = ((1, 4, 20, 20), (4, 1, 3, 3))
    assert depthwise.plane_plan(ConvSpec.from_args(*shapes, groups=4, padding=1), numpy.float32, _SMEM) is not None
    for kwargs in (dict(stride=2), dict(dilation=2)):
        assert depthwise.plane_plan(ConvSpec.from_args(*shapes, groups=4, **kwargs), numpy.float32, _SMEM) is None
    assert depthwise.plane_plan(ConvSpec.from_args((1, 4, 20, 20), (4, 1, 7, 7), groups=4), numpy.float32, _SMEM) is None
    # rows of a multiple of 16 bytes only (57 floats are not; 20 halves are not, 20 floats are)
    assert depthwise.plane_plan(ConvSpec.from_args((1, 4, 57, 57), (4, 1, 3, 3), groups=4), numpy.float32, _SMEM) is None
    assert depthwise.plane_plan(ConvSpec.from_args(*shapes, groups=4), numpy.float16, _SMEM) is None
    # two buffers in 96 KB at most: a 112x112 float plane (51 KB with its padding) is over, in float16 not
    big = ConvSpec.from_args((1, 4, 112, 112), (4, 1, 3, 3), groups=4, padding=1)
    assert depthwise.plane_plan(big, numpy.float32, _SMEM) is None
    assert depthwise.plane_plan(big, numpy.float16, _SMEM)[4] == 2


def test_depthwise_problem_is_staged_whole():
    spec = next(p for p in PROBLEMS if p.name == "depthwise_3x3").spec()
    for dtype in (numpy.float16, numpy.float32):
        rows, strips, lead, pitch, stages, smem = depthwise.plane_plan(spec, dtype, _SMEM)
        assert (rows, strips) == (14, 4) and stages >= 3 and smem <= 48 << 10


@pytest.mark.parametrize("dtype,w,want", [
    (numpy.float32, 56, (1, 14, 2)), (numpy.float16, 56, (1, 7, 4)), (numpy.float64, 56, (1, 28, 1)),
    (numpy.float32, 128, (1, 32, 1)), (numpy.float32, 132, (2, 17, 1)), (numpy.float32, 264, (3, 22, 1)),
    (numpy.float16, 264, (2, 17, 1)), (numpy.float16, 8, (1, 1, 32)), (numpy.float32, 12, (1, 3, 10)),
    (numpy.float16, 28, (1, 7, 4)), (numpy.float16, 260, (3, 22, 1)), (numpy.float16, 4, (1, 1, 32)),
])
def test_rows_layout_cuts_rows_into_even_segments(dtype, w, want):
    spec = ConvSpec.from_args((2, 4, 9, w), (4, 1, 3, 3), groups=4, padding=1)
    segs, lanes, per_warp = depthwise.rows_layout(spec, dtype)
    assert (segs, lanes, per_warp) == want
    vectors = w * numpy.dtype(dtype).itemsize // depthwise.rows_vector_bytes(spec, dtype)
    assert lanes <= 32 and segs * lanes >= vectors > (segs - 1) * lanes and per_warp * lanes <= 32


def test_rows_layout_limits():
    shapes = ((1, 4, 20, 32), (4, 1, 3, 3))
    assert depthwise.rows_layout(ConvSpec.from_args(*shapes, groups=4, padding=1), numpy.float32) is not None
    assert depthwise.rows_layout(ConvSpec.from_args(*shapes, groups=4, padding=(3, 1)), numpy.float32) is not None
    for kwargs in (dict(stride=2, padding=1), dict(dilation=2, padding=2), dict(padding=0), dict(padding=(1, 2)),
                   dict(padding="same", dilation=(1, 2))):
        assert depthwise.rows_layout(ConvSpec.from_args(*shapes, groups=4, **kwargs), numpy.float32) is None
    # rows of whole 16-byte vectors, or 8-byte ones in the 16-bit types; 5x5 in double and 7x7 not compiled
    narrow = {w: ConvSpec.from_args((1, 4, 20, w), (4, 1, 3, 3), groups=4, padding=1) for w in (30, 34, 36)}
    assert depthwise.rows_layout(narrow[30], numpy.float32) is None
    assert depthwise.rows_vector_bytes(narrow[36], numpy.float16) == 8
    assert depthwise.rows_layout(narrow[36], numpy.float16) is not None
    assert depthwise.rows_layout(narrow[34], numpy.float16) is None
    assert depthwise.rows_vector_bytes(narrow[36], numpy.float32) == 16
    five = ConvSpec.from_args((1, 4, 20, 32), (4, 1, 5, 5), groups=4, padding=2)
    assert depthwise.rows_layout(five, numpy.float32) is not None
    assert depthwise.rows_layout(five, numpy.float64) is None
    assert depthwise.rows_layout(ConvSpec.from_args((1, 4, 20, 32), (4, 1, 7, 7), groups=4, padding=3),
                                 numpy.float32) is None


@pytest.mark.parametrize("p", [1, 2, 3, 7, 56, 57, 112, 1000])
@pytest.mark.parametrize("planes,resident", [(1, 2112), (8192, 2112), (8192, 3168), (100000, 4224)])
@pytest.mark.parametrize("k", [3, 5])
def test_rows_strips_are_whole_steps_and_cover_every_row(p, planes, resident, k):
    spec = ConvSpec(planes, 1, p + k - 1, 64, 1, k, k, groups=1)
    rows, strips = depthwise.rows_strips(spec, 1, 2, resident)
    assert rows % k == 0 and rows >= k
    assert (strips - 1) * rows < p <= strips * rows


def test_rows_strips_fill_the_grid_on_the_depthwise_problem():
    spec = next(q for q in PROBLEMS if q.name == "depthwise_3x3").spec()
    # 8192 planes of 56 rows, 2 float32 slots per warp: one strip each fills 4096 of 4224 resident warps
    assert depthwise.rows_strips(spec, 1, 2, 132 * 32) == (57, 1)
    # with 3168 warps resident: 4 rounds of 3 strips of 21 rows (+4 each) beat 2 rounds of 57 (+4)
    assert depthwise.rows_strips(spec, 1, 2, 132 * 24) == (21, 3)


def test_forward_kernels_by_preference_and_alignment():
    spec = next(q for q in PROBLEMS if q.name == "depthwise_3x3").spec()
    """The kernels that serve (the algorithm's, in FORWARD_KERNELS order) and the one auto runs (the selector's)."""
    def usable_and_auto(spec, dtype, **aligned):
        usable = depthwise.forward_kernels(spec, dtype, _SMEM, **aligned)
        return usable, choice.forward_kernel(spec, usable)

    spec = next(q for q in PROBLEMS if q.name == "depthwise_3x3").spec()
    assert usable_and_auto(spec, numpy.float16) == (("gather", "rows", "plane", "strips", "tiles"), "rows")
    assert usable_and_auto(spec, numpy.float16, out_aligned=False) == (("gather", "plane", "strips", "tiles"), "plane")
    assert usable_and_auto(spec, numpy.float16, x_aligned=False) == (("gather", "strips", "tiles"), "strips")
    strided = ConvSpec.from_args((1, 4, 20, 32), (4, 1, 3, 3), groups=4, padding=1, stride=2)
    assert usable_and_auto(strided, numpy.float32) == (("gather", "tiles"), "gather")
    small = ConvSpec.from_args((32, 960, 7, 7), (960, 1, 5, 5), groups=960, padding=2)
    assert usable_and_auto(small, numpy.float32) == (("gather", "strips", "tiles"), "strips")
    rect = ConvSpec.from_args((1, 4, 20, 32), (4, 1, 3, 5), groups=4, padding=1, stride=2)
    assert usable_and_auto(rect, numpy.float32) == (("tiles",), "tiles")  # gather: 3x3, 5x5, 7x7 only


@pytest.mark.gpu
def _depthwise_kernel_cases():
    from cuconv.algos import depthwise

    out = []
    for param in CASES + PROBLEM_CASES + TILING_CASES:
        case = param.values[0]
        spec = case_spec(case)
        if depthwise.reason_unsupported(spec, numpy.float32) is not None:
            continue
        for dtype_name in EXACT_DTYPES:
            for kernel in depthwise.forward_kernels(spec, _dtypes.by_name(dtype_name), _device_smem()):
                out.append(pytest.param(case, kernel, dtype_name, id=f"{param.id}-{kernel}-{dtype_name}"))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("case,kernel,dtype_name", _depthwise_kernel_cases())
def test_depthwise_forward_kernels_equal_cpu_exactly_on_integers(case, kernel, dtype_name):
    """Each forward kernel of depthwise (rows, plane, strips, tiles) wherever it serves, on integer inputs:
    every sum is exact in the float/double accumulator, so each dtype equals the CPU path bit for bit; the
    outputs are poisoned with NaN first."""
    from cuconv.algos import depthwise

    assert_forward_equals_cpu_on_integers(
        case, dtype_name, 21, lambda x, w, b, spec, out: depthwise.forward_gpu(x, w, b, spec, out, "ieee",
                                                                               kernel=kernel))


def _flipped_dgrad_cases():
    """(case, kernel, dtype) for every forward kernel that serves the stride-1, multiplier-1 depthwise cases'
    dgrad as the forward of dy (the kernel reading the weight flipped)."""
    from cuconv.algos import depthwise
    from cuconv.blocks import dgrad_forward

    out = []
    for param in CASES + PROBLEM_CASES + TILING_CASES:
        case = param.values[0]
        spec = case_spec(case)
        if depthwise.reason_unsupported(spec, numpy.float32) is not None or spec.k != spec.c:
            continue
        transposed = dgrad_forward.forward_spec(spec)
        if transposed is None:
            continue
        for dtype_name in ("float32", "float16"):
            for kernel in depthwise.forward_kernels(transposed, _dtypes.by_name(dtype_name), _device_smem()):
                out.append(pytest.param(case, kernel, dtype_name, id=f"{param.id}-{kernel}-{dtype_name}"))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("case,kernel,dtype_name", _flipped_dgrad_cases())
def test_depthwise_dgrad_reads_the_weight_flipped_in_every_forward_kernel(case, kernel, dtype_name):
    """dgrad at stride 1 (multiplier 1) is one launch of a forward kernel on dy reading the weight flipped in
    place: each kernel, on integer inputs, equals the CPU path's dgrad bit for bit, into a NaN-poisoned dx."""
    import cupy

    from cuconv.blocks import dgrad_forward

    x, w, _ = make_inputs(case, seed=31, integer=True)
    dtype = _dtypes.by_name(dtype_name)
    x4 = x if x.ndim == 4 else x[None]
    spec = cuconv.ConvSpec.from_args(x4.shape, w.shape, **case.kwargs)
    dy = numpy.random.default_rng(32).integers(-3, 4, spec.output_shape).astype(dtype)
    want = cuconv.conv2d_input(x4.shape, w.astype(dtype), dy, **case.kwargs)
    launch = nchw_fwd._forward_prepared(dgrad_forward.forward_spec(spec), numpy.dtype(dtype), True, True,
                                         cuconv._plan.current_env(), kernel, True)
    dx = cupy.full(spec.input_shape, numpy.nan, dtype=dtype)
    wg, dyg = cupy.asarray(w.astype(dtype)), cupy.asarray(dy)
    launch(cupy.cuda.get_current_stream().ptr, dyg.data.ptr, wg.data.ptr, 0, dx.data.ptr)
    numpy.testing.assert_array_equal(cupy.asnumpy(dx).astype(numpy.float64), want.astype(numpy.float64))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float32", "float16"])
def test_depthwise_rows_fall_back_on_misaligned_tensors(dtype_name):
    """16-byte vectors need 16-byte aligned input and output: contiguous views one element off their
    allocation take another kernel, with the same result."""
    import cupy

    from cuconv.algos import depthwise

    dtype = _dtypes.by_name(dtype_name)
    case = next(p.values[0] for p in TILING_CASES if p.id == "depthwise_rows_tall_padding")
    x, w, _ = make_inputs(case, seed=22, integer=True)
    spec = cuconv.ConvSpec.from_args(x.shape, w.shape, groups=2, padding=(2, 1))
    assert depthwise.rows_layout(spec, dtype) is not None
    xs = cupy.empty(x.size + 1, dtype)[1:].reshape(x.shape)
    xs[...] = cupy.asarray(x.astype(dtype))
    want = cuconv.conv2d(x.astype(dtype), w.astype(dtype), groups=2, padding=(2, 1))
    for x_off, out_off in ((1, 0), (0, 1)):
        xg = xs if x_off else cupy.asarray(x.astype(dtype))
        out = cupy.full(want.size + 1, numpy.nan, dtype)[out_off:out_off + want.size].reshape(want.shape)
        assert (xg.data.ptr % 16 != 0) or (out.data.ptr % 16 != 0)
        cuconv.conv2d(xg, cupy.asarray(w.astype(dtype)), groups=2, padding=(2, 1), out=out, algo="depthwise")
        numpy.testing.assert_array_equal(cupy.asnumpy(out), want)
