"""The one oracle, the tolerance table and the named case table every conv test runs through."""

from __future__ import annotations

import dataclasses

import numpy
import pytest

from cuconv import _dtypes
from cuconv.problems import PROBLEMS

# Normwise relative error ‖y - ref‖ / ‖ref‖ allowed per dtype (and per precision for float32).
TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "tf32": 5e-3, "float16": 2e-3, "bfloat16": 2e-3}
# Low precision must also be no worse than this many times torch's own error in that dtype.
TORCH_ERROR_FACTOR = 2.0


def tolerance(dtype, precision="ieee") -> float:
    name = numpy.dtype(dtype).name
    return TOLERANCE["tf32" if name == "float32" and precision == "tf32" else name]


def rounding_floor(ref, dtype) -> float:
    """Normwise error of the correctly rounded result: no implementation storing ``dtype`` does better."""
    ref = numpy.asarray(ref, dtype=numpy.float64)
    return rel_err(ref.astype(dtype).astype(numpy.float64), ref)


def bound(ref, dtype, precision="ieee") -> float:
    """The error allowed for a result of ``dtype``: the tolerance table, except where rounding the exact
    result once to a half-precision dtype already costs more (a handful of elements: a small dW) — there
    1.5× that rounding floor."""
    tol = tolerance(dtype, precision)
    if numpy.dtype(dtype).itemsize == 2:
        tol = max(tol, 1.5 * rounding_floor(ref, dtype))
    return tol


@dataclasses.dataclass(frozen=True)
class Case:
    x_shape: tuple
    w_shape: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)
    bias: bool = True


def _p(id_, x_shape, w_shape, bias=True, **kwargs):
    return pytest.param(Case(tuple(x_shape), tuple(w_shape), kwargs, bias), id=id_)


# Batch 1, odd sizes, sizes that fit no tile, every parameter per axis, groups in {1, 2, C},
# channel multipliers, 'same' with even kernels, stride and dilation together, unbatched input.
CASES = [
    _p("basic_3x3", (2, 3, 8, 8), (4, 3, 3, 3)),
    _p("batch1_odd", (1, 5, 13, 7), (3, 5, 3, 3), padding=1),
    _p("k5x9_d2x3_p2x4", (2, 4, 23, 37), (6, 4, 5, 9), padding=(2, 4), dilation=(2, 3)),
    _p("k5x7_rect", (3, 6, 17, 11), (5, 6, 5, 7)),
    _p("stride2x3_pad1x2", (2, 3, 19, 23), (4, 3, 3, 4), stride=(2, 3), padding=(1, 2)),
    _p("stride2_dil2_pad3", (2, 4, 21, 20), (5, 4, 3, 3), stride=2, dilation=2, padding=3),
    _p("groups2", (2, 6, 9, 10), (8, 3, 3, 3), groups=2, padding=1),
    _p("groups4_c8", (2, 32, 11, 9), (24, 8, 3, 3), groups=4, padding=1),
    _p("groups3_c16_stride2", (3, 48, 13, 10), (48, 16, 3, 3), groups=3, stride=2, padding=1, bias=False),
    _p("groups5_c16_dil", (2, 80, 10, 13), (80, 16, 3, 3), groups=5, dilation=(2, 1), padding=(2, 1)),
    _p("depthwise", (2, 5, 11, 9), (5, 1, 3, 3), groups=5, padding=1),
    _p("depthwise_mult3_3x1", (2, 4, 10, 9), (12, 1, 3, 1), groups=4, padding=(1, 0)),
    _p("same_even_4x2", (2, 3, 10, 9), (4, 3, 4, 2), padding="same"),
    _p("same_even_dil3", (1, 3, 12, 11), (2, 3, 2, 4), padding="same", dilation=(3, 1)),
    _p("valid", (2, 2, 7, 6), (3, 2, 2, 3), padding="valid"),
    _p("pointwise_1x1", (3, 8, 7, 5), (6, 8, 1, 1)),
    _p("pointwise_1x1_stride2", (2, 8, 9, 7), (4, 8, 1, 1), stride=2),
    _p("pointwise_1x1_pad1", (2, 4, 5, 5), (3, 4, 1, 1), padding=1),
    _p("kernel_equals_input", (2, 3, 5, 4), (2, 3, 5, 4)),
    _p("stem_like_c3_7x7_s2", (2, 3, 30, 28), (8, 3, 7, 7), stride=2, padding=3),
    _p("no_bias", (2, 3, 8, 8), (4, 3, 3, 3), bias=False, padding=(0, 1)),
    _p("empty_batch", (0, 3, 8, 8), (4, 3, 3, 3)),
    _p("unbatched", (3, 9, 8), (4, 3, 3, 3), padding=1),
]

# Reduced versions of every problem in docs/problems.md (same kernel geometry, small batch and image).
PROBLEM_CASES = [
    pytest.param(Case(p.scaled(n=2, hw=min(p.h, 24 if p.kernel[0] < 7 else 30)).input_shape, p.weight_shape,
                      p.conv_kwargs, False), id=f"reduced_{p.name}")
    for p in PROBLEMS
]


def make_inputs(case: Case, seed: int = 0, integer: bool = False):
    """float64 NumPy (x, w, b-or-None): random normals, or small random integers when ``integer``."""
    rng = numpy.random.default_rng(seed)

    def draw(shape):
        if integer:
            return rng.integers(-3, 4, size=shape).astype(numpy.float64)
        return rng.standard_normal(shape)

    x = draw(case.x_shape)
    w = draw(case.w_shape)
    b = draw((case.w_shape[0],)) if case.bias else None
    return x, w, b


def reference(x, w, b=None, **kwargs) -> numpy.ndarray:
    """The oracle: torch.nn.functional.conv2d in float64 on the CPU."""
    import torch

    t = lambda a: None if a is None else torch.from_numpy(numpy.asarray(a, dtype=numpy.float64))
    return torch.nn.functional.conv2d(t(x), t(w), t(b), **kwargs).numpy()


def reference_grads(x, w, dy, **kwargs) -> tuple:
    """The backward oracle: (dx, dw) of torch.nn.functional.conv2d by autograd on the CPU, in the arrays' dtype
    (float64 for the oracle). Autograd, not torch.nn.grad.conv2d_input/conv2d_weight: those refuse
    padding='same'."""
    import torch

    xt = torch.from_numpy(numpy.asarray(x)).requires_grad_()
    wt = torch.from_numpy(numpy.asarray(w)).requires_grad_()
    dx, dw = torch.autograd.grad(torch.nn.functional.conv2d(xt, wt, None, **kwargs), (xt, wt),
                                 torch.from_numpy(numpy.asarray(dy)))
    return dx.numpy(), dw.numpy()


def captured(fn, *args, warmups: int = 1):
    """``fn(*args)`` captured in a CUDA graph after ``warmups`` calls on a side stream (torch's recipe: the
    warm-up makes what the first call allocates and plans outside the capture): (graph, the captured output)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args)
    return graph, out


def rel_err(y, ref) -> float:
    y = numpy.asarray(y, dtype=numpy.float64)
    ref = numpy.asarray(ref, dtype=numpy.float64)
    den = numpy.linalg.norm(ref)
    return float(numpy.linalg.norm(y - ref) / (den if den > 0 else 1.0))


def noncontiguous(a, xp=numpy):
    """The same values as ``a`` in a non-contiguous view (every other element of a wider array)."""
    wide = xp.empty(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
    wide[..., ::2] = a
    view = wide[..., ::2]
    assert not view.flags.c_contiguous or a.shape[-1] <= 1
    return view


def case_spec(case):
    """The ConvSpec of a case (an unbatched input counts as a batch of one)."""
    from cuconv.spec import ConvSpec

    x_shape = case.x_shape if len(case.x_shape) == 4 else (1,) + case.x_shape
    return ConvSpec.from_args(x_shape, case.w_shape, **case.kwargs)


def exact_algo_cases(params, pass_="fprop"):
    """(case, algorithm) pairs for every registered algorithm that serves the case in ``pass_`` and sums
    integer-valued inputs exactly: all but those that declare ``exact_on_integers = False`` (winograd, whose
    transforms multiply by fractions such as 1/6)."""
    from cuconv import algos, select

    out = []
    for param in params:
        case = param.values[0]
        spec = case_spec(case)
        for algo in algos.names(pass_):
            if not algos.get(algo).exact_on_integers:
                continue
            if select.reason_unsupported(algo, spec, numpy.float64, pass_) is None:
                out.append(pytest.param(case, algo, id=f"{param.id}-{algo}"))
    return out


def algo_mode_cases(params, modes, pass_="fprop"):
    """(case, algorithm, mode) triples for every registered algorithm serving the case in ``pass_`` at that
    mode ((dtype name, precision)): tensor-core algorithms serve float32 at "tf32" only, and no float64."""
    from cuconv import _dtypes, select

    out = []
    for param in params:
        case = param.values[0]
        spec = case_spec(case)
        for algo in select.algorithms(pass_):
            for dtype_name, precision in modes:
                dtype = _dtypes.by_name(dtype_name)
                if select.reason_unsupported(algo, spec, dtype, pass_, precision) is None:
                    mode_id = f"{dtype_name}-{precision}" if dtype_name == "float32" else dtype_name
                    out.append(pytest.param(case, algo, (dtype_name, precision),
                                            id=f"{param.id}-{algo}-{mode_id}"))
    return out


# Wider than one direct_smem tile (128 output columns in float, 64 in double, 4 or 2 rows, 32 channels),
# several chunks of input channels in three buffers, k tiles with a tail, two buffers of one channel (a
# 15x15 kernel), and a kernel whose one staged channel needs more than the default 48 KB of shared memory
# (one buffer): the case table's small images cross none of these boundaries.
TILING_CASES = [
    _p("q_tiles_tail", (2, 5, 13, 300), (40, 5, 3, 5), padding=(1, 2)),
    _p("chunks_groups_k_tail", (1, 50, 11, 140), (72, 25, 5, 9), groups=2, dilation=(1, 2), padding=(2, 3)),
    _p("stride_dilation_wide", (2, 6, 30, 700), (33, 6, 3, 3), stride=(2, 3), dilation=(2, 2), padding=(3, 1)),
    _p("k15_two_buffers", (1, 4, 20, 150), (6, 4, 15, 15), padding=3),
    _p("big_kernel_smem_optin", (2, 3, 30, 40), (5, 3, 21, 21), padding=5),
    _p("depthwise_mult2_wide", (2, 4, 9, 260), (8, 1, 3, 3), groups=4, padding=1),
    # depthwise column strips (stride 1): 5x5 with uneven padding and strips of rows that end mid-plane,
    # 7x7 wider than the padding on a plane narrower than the kernel's reach
    _p("depthwise_5x5_strips", (2, 3, 37, 45), (3, 1, 5, 5), groups=3, padding=(0, 2)),
    _p("depthwise_7x7_narrow", (1, 2, 9, 5), (4, 1, 7, 7), groups=2, padding=3),
    # depthwise whole planes in shared memory (rows of 16-byte multiples): padding wider than the kernel
    # needs (zero rows and columns, copies at a shifted lead), 5x5 with multiplier 2, and a plane too large
    # for more than two buffers (float16) or for one block at all (float32, float64: column strips)
    _p("depthwise_plane_wide_padding", (2, 3, 10, 16), (3, 1, 3, 3), groups=3, padding=(2, 3)),
    _p("depthwise_5x5_plane_mult2", (2, 2, 20, 24), (4, 1, 5, 5), groups=2, padding=2),
    _p("depthwise_3x3_big_plane", (1, 2, 150, 128), (2, 1, 3, 3), groups=2, padding=1),
    # depthwise 16-byte row vectors (centred padding left and right): rows of more than 32 vectors cut into
    # segments (5x5: 66 float vectors in 3 segments, 33 half vectors in 2), padding above and below wider
    # than the kernel's with a multiplier, and one vector per row (a warp of 32 planes' strips)
    _p("depthwise_rows_segments_5x5", (2, 3, 13, 264), (6, 1, 5, 5), groups=3, padding=(1, 2)),
    _p("depthwise_rows_tall_padding", (1, 2, 9, 16), (4, 1, 3, 3), groups=2, padding=(2, 1)),
    _p("depthwise_rows_one_vector", (3, 5, 6, 8), (5, 1, 3, 3), groups=5, padding=1),
    # rows of 28 elements: 8-byte vectors in the 16-bit types, 16-byte ones in float32
    _p("depthwise_rows_8byte_5x5", (2, 3, 11, 28), (3, 1, 5, 5), groups=3, padding=2),
    # depthwise a thread per output (strides, dilation, small planes) and the stride-2 dgrad by 2x2 quads of
    # dx: odd sizes (a last quad half outside), no padding with a multiplier, padding on one side wider than
    # the other, 7x7 reaching past a plane smaller than the kernel
    _p("depthwise_s2_5x5_odd", (2, 6, 15, 13), (6, 1, 5, 5), groups=6, stride=2, padding=2),
    _p("depthwise_s2_3x3_mult2_pad0", (1, 3, 12, 9), (6, 1, 3, 3), groups=3, stride=2, bias=False),
    _p("depthwise_s2_7x7_small", (3, 4, 7, 8), (4, 1, 7, 7), groups=4, stride=2, padding=(3, 2)),
    _p("depthwise_7x7_plane_5x5", (2, 5, 7, 7), (5, 1, 5, 5), groups=5, padding=2),
    _p("depthwise_dil2_3x3", (2, 3, 11, 12), (3, 1, 3, 3), groups=3, dilation=2, padding=(2, 1)),
    _p("batch1_q256_no_bias", (1, 3, 3, 257), (4, 3, 3, 2), bias=False),
    # 1x1 on small planes: one GEMM over the batch between swaps of (N, C) (im2col_gemm.batch_folded)
    _p("pointwise_7x7_batch_folded", (5, 40, 7, 7), (24, 40, 1, 1)),
    # implicit_gemm: two 128-filter tiles with a tail, k tiles crossing taps (C = 40), odd sizes
    _p("k200_c40_odd", (2, 40, 19, 33), (200, 40, 3, 3), padding=1),
]


def _gather(id_, n, c, h, w, r, s, stride=(1, 1), pad=(0, 0, 0, 0), dilation=(1, 1)):
    from cuconv.spec import ConvSpec

    # K and groups do not enter the gather (im2col) or its adjoint (col2im).
    return pytest.param(ConvSpec(n, c, h, w, 2, r, s, stride, pad, dilation), id=id_)


# Geometries for the exact gather tests: every padding side, stride and dilation per axis, 1x1 with gaps.
GATHER_GEOMETRIES = [
    _gather("k3x3", 1, 2, 6, 7, 3, 3),
    _gather("k3x3_pad1_batch3", 3, 2, 5, 6, 3, 3, pad=(1, 1, 1, 1)),
    _gather("k5x2_rect", 2, 1, 9, 5, 5, 2),
    _gather("k3x4_s2x3_d2x1_asym_pad", 2, 3, 11, 13, 3, 4, stride=(2, 3), pad=(2, 0, 1, 3), dilation=(2, 1)),
    _gather("k2x3_d3x2_same_even", 2, 2, 8, 7, 2, 3, pad=(1, 2, 2, 2), dilation=(3, 2)),
    _gather("k3x3_s2_d2_pad3", 2, 2, 9, 8, 3, 3, stride=(2, 2), pad=(3, 3, 3, 3), dilation=(2, 2)),
    _gather("k3x2_s2_uncovered_tail", 2, 2, 8, 9, 3, 2, stride=(2, 2)),
    _gather("k1x1", 2, 3, 4, 5, 1, 1),
    _gather("k1x1_s3_gaps", 2, 3, 7, 8, 1, 1, stride=(3, 3)),
    _gather("k1x1_s2_pad1", 2, 3, 5, 5, 1, 1, stride=(2, 2), pad=(1, 1, 1, 1)),
    _gather("kernel_equals_input", 2, 2, 4, 3, 4, 3),
    _gather("pad_only_bottom_right", 1, 2, 5, 5, 3, 3, pad=(0, 2, 0, 2)),
]


def row_ranges(p):
    """(p0, rows): the whole output, the first row, the last row, a tail, and a band touching neither end."""
    ranges = {(0, p), (p - 1, 1)}
    if p > 1:
        ranges |= {(0, 1), (1, p - 1)}
    if p > 2:
        ranges.add((1, p - 2))
    return sorted(ranges)


# dtypes whose GPU results must equal the CPU path bit for bit on integer inputs
EXACT_DTYPES = ["float64", "float32", "float16"] + (["bfloat16"] if _dtypes.bfloat16 is not None else [])


# ----------------------------------------------------------------------------------------------------------
# GPU helpers shared by the GPU test files (CuPy imported only when called)
# ----------------------------------------------------------------------------------------------------------
def to_gpu(a, dtype):
    """A NumPy array (or None) as a CuPy array of ``dtype``."""
    import cupy

    return None if a is None else cupy.asarray(a.astype(dtype))


def assert_forward_equals_cpu_on_integers(case, dtype_name, seed, forward):
    """``forward(x, w, b, spec, out)``, one algorithm's forward_gpu with its options, on the case's integer
    inputs in ``dtype_name`` (a batch of one for an unbatched case) into a NaN-poisoned ``out``, equals the
    CPU path bit for bit."""
    import cupy

    import cuconv
    from cuconv import _dtypes

    x, w, b = make_inputs(case, seed=seed, integer=True)
    dtype = _dtypes.by_name(dtype_name)
    cpu = cuconv.conv2d(x.astype(dtype), w.astype(dtype), None if b is None else b.astype(dtype), **case.kwargs)
    x4 = x if x.ndim == 4 else x[None]
    spec = cuconv.ConvSpec.from_args(x4.shape, w.shape, **case.kwargs)
    out = cupy.full(spec.output_shape, numpy.nan, dtype=dtype)
    forward(to_gpu(x4, dtype), to_gpu(w, dtype), to_gpu(b, dtype), spec, out)
    numpy.testing.assert_array_equal(cupy.asnumpy(out).astype(numpy.float64).reshape(cpu.shape),
                                     cpu.astype(numpy.float64))


def select_auto(spec, dtype, precision, on_gpu, pass_, smem_limit, wgmma, workspace_limit, layout="nchw"):
    """What ``auto`` runs for this case under these limits (given, never read from a device)."""
    from cuconv import _plan, select
    from cuconv.problem import Problem

    return select.algorithm(Problem.of(spec, dtype, precision, pass_, layout),
                            _plan.Limits(smem_limit, wgmma, workspace_limit))


def select_nhwc_auto(algo, spec, dtype, precision, pass_, smem_limit, wgmma, workspace_limit):
    """The algorithm running this case on channels-last activations in place for ``algo`` under these limits, or
    None (NCHW copies)."""
    from cuconv import _plan, select
    from cuconv.problem import Problem

    return select.algorithm(Problem.of(spec, dtype, precision, pass_, "nhwc"),
                            _plan.Limits(smem_limit, wgmma, workspace_limit), algo)


def reason_under(name, spec, dtype, pass_, precision, smem_limit, wgmma, workspace_limit, layout="nchw"):
    """Why algorithm ``name`` cannot run this case under these limits, or None."""
    from cuconv import _plan, algos
    from cuconv.problem import Problem

    return algos.get(name).can_implement(Problem.of(spec, dtype, precision, pass_, layout),
                                         _plan.Limits(smem_limit, wgmma, workspace_limit))


def epilogue_case(x_shape, w_shape, kwargs, epilogue, dtype, layout, seed):
    """A forward with an epilogue on GPU arrays against its oracle: (x, w, b, r on the GPU, laid out as ``layout``
    says; b None without a bias, r None without a residual; ``want``, the float64 convolution of the same rounded
    inputs with the epilogue applied by ``blocks.epilogue.apply_numpy``, NCHW; ``to_nchw``, which turns a result
    laid out so back into NCHW; ``out_shape``, the result's shape laid out so): (x, w, b, r, want, out_shape,
    to_nchw)."""
    import cupy
    import torch

    from cuconv.blocks.epilogue import apply_numpy
    from cuconv.spec import ConvSpec

    spec = ConvSpec.from_args(x_shape, w_shape, **kwargs)
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = (rng.standard_normal(w_shape) / numpy.sqrt(spec.crs_per_group)).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype) if epilogue.bias else None
    r = rng.standard_normal(spec.output_shape).astype(dtype)
    f64 = lambda a: torch.from_numpy(a.astype(numpy.float64))  # noqa: E731
    y64 = torch.nn.functional.conv2d(f64(x), f64(w), None if b is None else f64(b), **kwargs).numpy()
    want = numpy.empty_like(y64)
    apply_numpy(y64, r.astype(numpy.float64), epilogue.activation, epilogue.residual, epilogue.alpha, want)
    nhwc = layout == "nhwc"
    laid = (lambda a: numpy.ascontiguousarray(a.transpose(0, 2, 3, 1))) if nhwc else (lambda a: a)  # noqa: E731
    to_nchw = (lambda a: a.transpose(0, 3, 1, 2)) if nhwc else (lambda a: a)  # noqa: E731
    return (cupy.asarray(laid(x)), cupy.asarray(w), None if b is None else cupy.asarray(b),
            cupy.asarray(laid(r)) if epilogue.residual else None, want, laid(want).shape, to_nchw)
