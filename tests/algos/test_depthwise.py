"""depthwise: its plans (CPU) - which cases take ``depthwise_fwd_plane`` (``plane_plan``: a whole padded plane in
shared memory) or ``depthwise_fwd_strips`` (``strips_plan``), and how a plane is cut - and on the GPU every forward
kernel bit for bit against the CPU path on integers, the rows kernel's fallback on misaligned tensors and a
deterministic wgrad over many chunks. The case table runs it with every algorithm in test_conv_gpu.py and
test_backward_gpu.py."""

import numpy
import pytest

import cuconv
from cases import (CASES, EXACT_DTYPES, PROBLEM_CASES, TILING_CASES, assert_forward_equals_cpu_on_integers,
                   case_spec, make_inputs, reference, rel_err, tolerance)
from cuconv import _dtypes
from cuconv.algos import depthwise
from cuconv.problems import PROBLEMS
from cuconv.spec import ConvSpec

_THREADS = 256


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
    name, grid, _, _, geometry = depthwise._forward_launch(spec, numpy.dtype(numpy.float32), False, False, 0, 0,
                                                           "strips")
    rows, strips = depthwise.strips_plan(spec)
    assert name == f"depthwise_fwd_strips<float,5,5,{'true' if flat else 'false'}>"
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
    plan = depthwise.plane_plan(spec, dtype)
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
    assert depthwise.plane_plan(ConvSpec.from_args(*shapes, groups=4, padding=1), numpy.float32) is not None
    for kwargs in (dict(stride=2), dict(dilation=2)):
        assert depthwise.plane_plan(ConvSpec.from_args(*shapes, groups=4, **kwargs), numpy.float32) is None
    assert depthwise.plane_plan(ConvSpec.from_args((1, 4, 20, 20), (4, 1, 7, 7), groups=4), numpy.float32) is None
    # rows of a multiple of 16 bytes only (57 floats are not; 20 halves are not, 20 floats are)
    assert depthwise.plane_plan(ConvSpec.from_args((1, 4, 57, 57), (4, 1, 3, 3), groups=4), numpy.float32) is None
    assert depthwise.plane_plan(ConvSpec.from_args(*shapes, groups=4), numpy.float16) is None
    # two buffers in 96 KB at most: a 112x112 float plane (51 KB with its padding) is over, in float16 not
    big = ConvSpec.from_args((1, 4, 112, 112), (4, 1, 3, 3), groups=4, padding=1)
    assert depthwise.plane_plan(big, numpy.float32) is None
    assert depthwise.plane_plan(big, numpy.float16)[4] == 2


def test_depthwise_problem_is_staged_whole():
    spec = next(p for p in PROBLEMS if p.name == "depthwise_3x3").spec()
    for dtype in (numpy.float16, numpy.float32):
        rows, strips, lead, pitch, stages, smem = depthwise.plane_plan(spec, dtype)
        assert (rows, strips) == (14, 4) and stages >= 3 and smem <= 48 << 10


# ---- depthwise_fwd_rows: 16-byte (or, in the 16-bit types, 8-byte) vectors of rows ----------------------

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
    assert depthwise.forward_kernels(spec, numpy.float16) == ("rows", "plane", "strips", "gather", "tiles")
    assert depthwise.forward_kernels(spec, numpy.float16, out_aligned=False) == ("plane", "strips", "gather", "tiles")
    assert depthwise.forward_kernels(spec, numpy.float16, x_aligned=False) == ("strips", "gather", "tiles")
    strided = ConvSpec.from_args((1, 4, 20, 32), (4, 1, 3, 3), groups=4, padding=1, stride=2)
    assert depthwise.forward_kernels(strided, numpy.float32) == ("gather", "tiles")
    small = ConvSpec.from_args((32, 960, 7, 7), (960, 1, 5, 5), groups=960, padding=2)
    assert depthwise.forward_kernels(small, numpy.float32) == ("strips", "gather", "tiles")
    rect = ConvSpec.from_args((1, 4, 20, 32), (4, 1, 3, 5), groups=4, padding=1, stride=2)
    assert depthwise.forward_kernels(rect, numpy.float32) == ("tiles",)  # gather: 3x3, 5x5, 7x7 only


@pytest.mark.parametrize("stride,dilation,kernel,want", [
    (2, 1, 3, "depthwise_dgrad_s2<float,3,3>"), (2, 1, 7, "depthwise_dgrad_s2<float,7,7>"),
    ((2, 1), 1, 3, "depthwise_dgrad<"), (2, 2, 3, "depthwise_dgrad<"), (3, 1, 3, "depthwise_dgrad<"),
    (2, 1, 4, "depthwise_dgrad<")])
def test_strided_dgrad_takes_the_quad_kernel_at_stride_2(stride, dilation, kernel, want, monkeypatch):
    """depthwise_dgrad_s2 (a thread per 2x2 quad of dx) at stride 2x2, dilation 1, 3x3/5x5/7x7; the gather
    per dx element elsewhere. The launch's kernel name, read without a GPU."""
    names = []
    monkeypatch.setattr(depthwise, "_fn", lambda name: None)
    monkeypatch.setattr(depthwise._loader, "PreparedLaunch", lambda fn, name, *args, **kwargs: names.append(name))
    spec = ConvSpec.from_args((2, 4, 20, 31), (4, 1, kernel, kernel), groups=4, padding=1, stride=stride,
                              dilation=dilation)
    depthwise._dgrad_launch(spec, numpy.dtype(numpy.float32))
    assert len(names) == 1 and names[0].startswith(want)


@pytest.mark.parametrize("shape,r,stride", [((32, 960, 7, 7), 5, 1), ((32, 96, 112, 112), 3, 2), ((1, 4, 3, 300), 7, 1),
                                             ((16, 4, 130, 70), 5, 1), ((2, 3, 9, 9), 3, (2, 1))])
def test_wgrad_strips_cover_every_item_once(shape, r, stride):
    """depthwise_wgrad_strips: strips of at most 16 rows cover each plane; blocks of whole passes of 256
    threads cover a channel's (sample, strip, column) items; about eight blocks per SM over the channels."""
    spec = ConvSpec.from_args(shape, (shape[1], 1, r, r), groups=shape[1], padding=r // 2, stride=stride)
    rows, strips, chunk, blocks = depthwise.wgrad_strips_plan(spec, 132)
    assert rows <= 16 and (strips - 1) * rows < spec.p <= strips * rows
    items = spec.n * strips * spec.q
    assert chunk % _THREADS == 0 and (blocks - 1) * chunk < items <= blocks * chunk
    assert spec.k * blocks <= max(spec.k, 8 * 132 + spec.k)


def test_wgrad_strips_only_for_compiled_kernels_dilation_1_and_row_strides_1_2():
    shapes = ((2, 4, 20, 20), (4, 1, 3, 3))
    for kwargs in (dict(dilation=2), dict(stride=3), dict(stride=(3, 1))):
        assert depthwise.wgrad_strips_plan(ConvSpec.from_args(*shapes, groups=4, **kwargs), 132) is None
    assert depthwise.wgrad_strips_plan(ConvSpec.from_args(*shapes, groups=4, stride=(1, 3)), 132) is not None
    assert depthwise.wgrad_strips_plan(ConvSpec.from_args((2, 4, 20, 20), (4, 1, 3, 5), groups=4), 132) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float64", "float32"])
@pytest.mark.parametrize("shape,r,stride", [((16, 4, 130, 70), 5, 1), ((32, 8, 61, 45), 3, 2),
                                             ((16, 2, 66, 80), 7, 2)])
def test_depthwise_wgrad_strips_over_many_blocks_equal_cpu_and_repeat(shape, r, stride, dtype_name):
    """Several blocks per channel (strips' partial sums, then the ordered reduce): integer inputs give the CPU
    path's sums exactly, and two runs agree bit for bit."""
    import cupy

    dtype = numpy.dtype(dtype_name)
    c = shape[1]
    kwargs = dict(stride=stride, padding=r // 2, groups=c)
    spec = ConvSpec.from_args(shape, (c, 1, r, r), **kwargs)
    assert depthwise.wgrad_strips_plan(spec, 132)[3] > 1
    rng = numpy.random.default_rng(41)
    x = rng.integers(-3, 4, size=shape).astype(dtype)
    dy = rng.integers(-3, 4, size=spec.output_shape).astype(dtype)
    want = cuconv.conv2d_weight(x, spec.weight_shape, dy, **kwargs)
    runs = [cupy.asnumpy(cuconv.conv2d_weight(cupy.asarray(x), spec.weight_shape, cupy.asarray(dy), algo="depthwise",
                                              **kwargs)) for _ in range(2)]
    numpy.testing.assert_array_equal(runs[0], want)
    numpy.testing.assert_array_equal(runs[1], want)


@pytest.mark.gpu
def test_depthwise_wgrad_many_chunks_and_big_taps_is_deterministic():
    """The wgrad partial sums split N·P·Q into many chunks; two runs agree bit for bit, and with the oracle."""
    import cupy

    from cases import Case

    case = Case((6, 4, 40, 37), (8, 1, 7, 5), dict(padding=(3, 2), dilation=(1, 2), groups=4), False)
    x, w, _ = make_inputs(case, seed=31)
    ref_out = reference(x, w, **case.kwargs)
    dy = numpy.random.default_rng(32).standard_normal(ref_out.shape)
    import torch

    xt, wt = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    torch.nn.functional.conv2d(xt, wt, **case.kwargs).backward(torch.from_numpy(dy))
    runs = [cupy.asnumpy(cuconv.conv2d_weight(cupy.asarray(x), w.shape, cupy.asarray(dy), algo="depthwise",
                                              **case.kwargs)) for _ in range(2)]
    numpy.testing.assert_array_equal(runs[0], runs[1])
    assert rel_err(runs[0], wt.grad.numpy()) <= tolerance(numpy.float64)



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
            for kernel in depthwise.forward_kernels(spec, _dtypes.by_name(dtype_name)):
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
            for kernel in depthwise.forward_kernels(transposed, _dtypes.by_name(dtype_name)):
                out.append(pytest.param(case, kernel, dtype_name, id=f"{param.id}-{kernel}-{dtype_name}"))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("case,kernel,dtype_name", _flipped_dgrad_cases())
def test_depthwise_dgrad_reads_the_weight_flipped_in_every_forward_kernel(case, kernel, dtype_name):
    """dgrad at stride 1 (multiplier 1) is one launch of a forward kernel on dy reading the weight flipped in
    place: each kernel, on integer inputs, equals the CPU path's dgrad bit for bit, into a NaN-poisoned dx."""
    import cupy

    from cuconv.algos import depthwise
    from cuconv.blocks import dgrad_forward

    x, w, _ = make_inputs(case, seed=31, integer=True)
    dtype = _dtypes.by_name(dtype_name)
    x4 = x if x.ndim == 4 else x[None]
    spec = cuconv.ConvSpec.from_args(x4.shape, w.shape, **case.kwargs)
    dy = numpy.random.default_rng(32).integers(-3, 4, spec.output_shape).astype(dtype)
    want = cuconv.conv2d_input(x4.shape, w.astype(dtype), dy, **case.kwargs)
    launch = depthwise._forward_prepared(dgrad_forward.forward_spec(spec), numpy.dtype(dtype), True, True,
                                         depthwise._loader.smem_limit(), cupy.cuda.runtime.getDevice(), kernel, True)
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



# ---- channels-last activations (depthwise_nhwc_*) -----------------------------------------------------------
# (x shape, kernel, conv2d keywords): unrolled 3x3/5x5/7x7 and run-time R x S taps, strides, dilation, asymmetric
# and wide padding, batch 1, 16 to 48 channels (2 to 6 vectors of 16 bytes in halves, 8 to 24 in double), a bias
_NHWC_CASES = [
    pytest.param((2, 16, 9, 11), (3, 3), dict(padding=1), id="3x3"),
    pytest.param((1, 16, 13, 10), (5, 5), dict(padding=2, stride=2), id="5x5_s2_n1"),
    pytest.param((2, 32, 12, 12), (7, 7), dict(padding=3), id="7x7"),
    pytest.param((2, 16, 11, 9), (3, 3), dict(padding=(2, 1), dilation=2), id="3x3_dil2"),
    pytest.param((2, 16, 8, 15), (1, 3), dict(padding=(0, 2), stride=(1, 2)), id="1x3_runtime_taps"),
    pytest.param((3, 48, 7, 7), (3, 3), dict(padding=0), id="valid_7x7_plane"),
    pytest.param((2, 16, 10, 10), (5, 5), dict(padding=(1, 3)), id="5x5_asym_pad"),
    pytest.param((2, 24, 15, 14), (3, 3), dict(padding=1, stride=2), id="3x3_s2_odd"),
    pytest.param((1, 16, 12, 13), (7, 7), dict(padding=3, stride=2), id="7x7_s2"),
    pytest.param((2, 16, 11, 12), (3, 3), dict(padding=(0, 1), stride=(2, 3), dilation=(2, 1)), id="3x3_s2x3_dil"),
    pytest.param((3, 16, 9, 9), (5, 5), dict(padding=4), id="5x5_pad_wider_than_kernel"),
    pytest.param((2, 16, 8, 9), (2, 4), dict(padding=(1, 2), stride=(2, 1)), id="2x4_runtime_width_s2"),
    pytest.param((1, 16, 7, 12), (3, 1), dict(padding=(1, 0)), id="3x1_runtime_width"),
    pytest.param((2, 16, 6, 11), (1, 8), dict(padding=(0, 3)), id="1x8_widest_wgrad"),
    pytest.param((4, 80, 17, 23), (5, 5), dict(padding=2), id="5x5_partial_channel_block_many_rows"),
    pytest.param((3, 16, 9, 21), (3, 3), dict(padding=(1, 0), stride=2), id="3x3_s2_unread_last_column"),
    # several tiles of depthwise_nhwc_fwd_tile (8 rows x 16 or 8 columns, 32 channels) and partial ones
    pytest.param((2, 40, 23, 37), (3, 3), dict(padding=1), id="3x3_tiles_c40"),
    pytest.param((1, 64, 19, 30), (7, 7), dict(padding=3), id="7x7_tiles_c64"),
    pytest.param((2, 72, 29, 31), (5, 5), dict(padding=2, stride=2), id="5x5_s2_tiles_c72"),
    pytest.param((2, 96, 17, 18), (7, 7), dict(padding=(3, 2), stride=2), id="7x7_s2_tiles_asym"),
]


def test_nhwc_reasons():
    """Channels-last in place: multiplier 1, channels in whole 16-byte vectors, every pass (wgrad for kernels of
    up to 8 columns); everything else refused with its reason (the bridge runs it on NCHW copies)."""
    f16, f32 = numpy.dtype(numpy.float16), numpy.dtype(numpy.float32)
    spec = ConvSpec.from_args((2, 16, 9, 9), (16, 1, 3, 3), groups=16, padding=1)
    for pass_ in ("fprop", "dgrad", "wgrad"):
        assert depthwise.reason_unsupported_nhwc(spec, f16, pass_) is None
    assert "columns" in depthwise.reason_unsupported_nhwc(
        ConvSpec.from_args((2, 16, 9, 19), (16, 1, 1, 9), groups=16), f16, "wgrad")
    assert "16-byte" in depthwise.reason_unsupported_nhwc(
        ConvSpec.from_args((2, 12, 9, 9), (12, 1, 3, 3), groups=12, padding=1), f16)
    assert depthwise.reason_unsupported_nhwc(
        ConvSpec.from_args((2, 12, 9, 9), (12, 1, 3, 3), groups=12, padding=1), f32) is None
    assert "multiplier" in depthwise.reason_unsupported_nhwc(
        ConvSpec.from_args((2, 16, 9, 9), (32, 1, 3, 3), groups=16, padding=1), f16)
    strided = ConvSpec.from_args((2, 16, 9, 9), (16, 1, 3, 3), groups=16, padding=1, stride=2)
    for pass_ in ("fprop", "dgrad", "wgrad"):
        assert depthwise.reason_unsupported_nhwc(strided, f16, pass_) is None


def _nhwc(a):
    import cupy

    return cupy.ascontiguousarray(cupy.asarray(a).transpose(0, 2, 3, 1))


@pytest.mark.gpu
@pytest.mark.parametrize("fwd_kernel", ["nhwc", "nhwc_q", "nhwc_tile"])
@pytest.mark.parametrize("dtype_name", EXACT_DTYPES)
@pytest.mark.parametrize("x_shape,kernel,kwargs", _NHWC_CASES)
def test_nhwc_passes_equal_cpu_exactly_on_integers(x_shape, kernel, kwargs, dtype_name, fwd_kernel):
    """x, out, dy and dx channels-last in memory: the forward (with a bias), the dgrad (at stride 1 the forward of
    dy with the weight transposed and flipped, else the gather) and wgrad (slices of dy's rows, then their ordered
    sum) bit for bit the CPU path's on integers, into NaN-poisoned outputs; the forward and stride-1 dgrad through
    each forward kernel (``nhwc_q``: several output pixels a thread, for square 3x3, 5x5 and 7x7 kernels;
    ``nhwc_tile``: a tile's input window staged in shared memory, the 16-bit types' square kernels at stride 1
    or 2)."""
    import cupy

    from cuconv import _plan

    dtype = _dtypes.by_name(dtype_name)
    c = x_shape[1]
    rng = numpy.random.default_rng(51)
    x = rng.integers(-3, 4, x_shape).astype(dtype)
    w = rng.integers(-3, 4, (c, 1) + kernel).astype(dtype)
    b = rng.integers(-3, 4, c).astype(dtype)
    spec = ConvSpec.from_args(x.shape, w.shape, groups=c, **kwargs)
    assert depthwise.reason_unsupported_nhwc(spec, dtype, "fprop") is None
    want = cuconv.conv2d(x, w, b, groups=c, **kwargs)
    xg, wg, bg = _nhwc(x), cupy.asarray(w), cupy.asarray(b)
    out = cupy.full((spec.n, spec.p, spec.q, spec.k), numpy.nan, dtype=dtype)
    plan = depthwise.prepare("fprop", spec, dtype, "ieee", _plan.current_env(xg, wg, bg, out), True, kernel=fwd_kernel,
                             layout="nhwc")
    _plan.run_arrays(plan, xg, wg, bg, out)
    numpy.testing.assert_array_equal(cupy.asnumpy(out.transpose(0, 3, 1, 2)).astype(numpy.float64),
                                     want.astype(numpy.float64))
    dy = rng.integers(-3, 4, spec.output_shape).astype(dtype)
    want = cuconv.conv2d_input(x.shape, w, dy, groups=c, **kwargs)
    dyg = _nhwc(dy)
    dx = cupy.full((spec.n, spec.h, spec.w, spec.c), numpy.nan, dtype=dtype)
    plan = depthwise.prepare("dgrad", spec, dtype, "ieee", _plan.current_env(dyg, wg, dx), kernel=fwd_kernel,
                             layout="nhwc")
    _plan.run_arrays(plan, dyg, wg, dx)
    numpy.testing.assert_array_equal(cupy.asnumpy(dx.transpose(0, 3, 1, 2)).astype(numpy.float64),
                                     want.astype(numpy.float64))
    want = cuconv.conv2d_weight(x, w.shape, dy, groups=c, **kwargs)
    dw = cupy.full(w.shape, numpy.nan, dtype=dtype)
    plan = depthwise.prepare("wgrad", spec, dtype, "ieee", _plan.current_env(xg, dyg, dw), layout="nhwc")
    _plan.run_arrays(plan, xg, dyg, dw)
    numpy.testing.assert_array_equal(cupy.asnumpy(dw).astype(numpy.float64), want.astype(numpy.float64))
