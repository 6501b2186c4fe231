"""Algorithm ``depthwise``: forward, dgrad and wgrad, one engine a module, each the Python twin of its
``kernels_cu/depthwise/<engine>.cu``: ``nchw_fwd`` (the forward kernels), ``nchw_bwd`` (dgrad and wgrad),
``nhwc`` (every pass on channels-last activations); ``shared`` holds what they share.

Serves ``groups == C`` with one input channel per group (``K = m·C``, channel multiplier ``m``), any kernel,
stride, padding and dilation, every dtype. These convolutions do ~R·S multiply-adds per element moved, so
they are memory-bound: im2col + GEMM would write and re-read R·S copies of the input and run one tiny GEMM
per group. Forward at stride = dilation = 1 (and so dgrad of such a layer at multiplier 1, the same
convolution with the flipped kernel), by preference:

- ``depthwise_fwd_rows`` (``rows_layout``, ``rows_strips``) for 3×3 (and 5×5 summing in float) with the
  kernel's centred padding left and right, rows of whole 16-byte vectors and 16-byte aligned tensors: each
  thread owns one 16-byte vector of a strip of rows (its halo from the neighbouring lanes by shuffles), its
  window in registers, the next step's rows loaded a step early in the 16-bit types, else prefetched into
  L2 (near the time of a same-size copy; docs/perf-notes.md);
- ``depthwise_fwd_plane`` (``plane_plan``) for 3×3 (and 5×5 summing in float) where a padded plane fits in
  shared memory and rows are 16-byte aligned: a persistent grid stages whole input planes by 16-byte
  ``cp.async`` copies, several buffers deep, and walks column strips of output rows from shared memory
  (depthwise_3x3 fp32: 68 µs of GPU time, 3.0 TB/s, against 87 µs for the strips);
- ``depthwise_fwd_strips`` (``strips_plan``) for 3×3, 5×5 and 7×7: a thread walks a column strip of output
  rows with its input rows in registers, reading through L1, no shared memory (small planes: the strips of
  all planes packed into the blocks);
- otherwise 32×64 output tiles, whose input window (``forward_smem``) opts into more than 48 KB of shared
  memory when a large or dilated kernel needs it.

The launch of each problem (kernel, grid, scalar arguments) is memoized per device: host time matters as
much as the kernel's at this size.
"""

from __future__ import annotations

import numpy

from ... import _plan
from ...blocks import dgrad_forward
from ...blocks.epilogue import NO_EPILOGUE, epilogue_codes
from ...problem import ACTIVATIONS, PASSES, Epilogue, Problem
from ...spec import ConvSpec
from ..base import Algorithm
from . import nchw_bwd, nchw_fwd, nhwc
from .nchw_bwd import _dgrad_launch, _wgrad_launches, wgrad_strips_plan
from .nchw_fwd import (FORWARD_KERNELS, _forward_prepared, forward_kernels, forward_smem, plane_plan, rows_layout,
                       rows_strips, rows_vector_bytes, strips_plan)
from .nhwc import _NHWC_Q_PIXELS, _nhwc_prepare, _nhwc_tile, reason_unsupported_nhwc
from .shared import (ALGORITHM_NAME, DW_GEOMETRY_DTYPE, DW_WORK_DTYPE, EPILOGUE_DTYPES, _SMEM_LIMIT, _acc_size,
                     _is_depthwise, _wgrad_threads)

__all__ = ["ALGORITHM", "Depthwise", "prepare", "forward_gpu", "dgrad_gpu", "wgrad_gpu", "reason_unsupported",
           "reason_unsupported_nhwc", "forward_smem", "rows_layout", "rows_strips", "rows_vector_bytes", "plane_plan",
           "strips_plan", "wgrad_strips_plan", "forward_kernels", "FORWARD_KERNELS", "DW_GEOMETRY_DTYPE",
           "DW_WORK_DTYPE", "nchw_fwd", "nchw_bwd", "nhwc"]


def reason_unsupported(spec: ConvSpec, dtype, pass_: str = "fprop", precision: str = "ieee",
                       limits: "_plan.Limits" = None):
    """Why ``depthwise`` cannot run this case under ``limits`` (default: the current device's), or None."""
    if not _is_depthwise(spec):
        return (f"not a depthwise convolution (needs groups == C with one input channel per group; got "
                f"groups={spec.groups}, C={spec.c})")
    acc = _acc_size(dtype)
    if pass_ == "fprop":
        smem = forward_smem(spec, numpy.dtype(dtype).itemsize, acc)
        limit = (limits or _plan.current_limits()).smem_limit
        if smem > limit:
            return f"a 32x64 output tile's input window needs {smem} bytes of shared memory (> {limit})"
    if pass_ == "wgrad" and _wgrad_threads(spec, acc) == 0:
        return f"{spec.r}x{spec.s} taps do not fit per-thread accumulators in {_SMEM_LIMIT} bytes"
    return None


def forward_gpu(x, w, bias, spec: ConvSpec, out, precision: str, kernel: str = None) -> None:
    """out = depthwise conv(x, w) + bias on C-contiguous CuPy arrays (precision: FFMA, none to choose).
    ``kernel`` (one of ``FORWARD_KERNELS``, for tests) forces one forward kernel; it raises
    NotImplementedError where that kernel cannot serve."""
    import cupy

    launch = _forward_prepared(spec, x.dtype, x.data.ptr % 16 == 0, out.data.ptr % 16 == 0, _plan.current_env(),
                               kernel)
    launch(cupy.cuda.get_current_stream().ptr, x.data.ptr, w.data.ptr, 0 if bias is None else bias.data.ptr,
           out.data.ptr, 0)


def prepare(pass_: str, spec: ConvSpec, dtype, precision: str, env: "_plan.Env", bias: bool = False,
            kernel: str = None, layout: str = "nchw", epilogue: Epilogue = None) -> "_plan.Plan":
    """The plan of ``pass_`` (see ``cuconv._plan``): the forward is one launch (``kernel`` forces one of
    ``FORWARD_KERNELS``) whose stores apply ``epilogue``'s activation and residual; dgrad one launch of the
    forward kernel on dy reading the weight flipped where that is the same convolution (stride 1, multiplier 1),
    else a gather per dx element (no atomics); wgrad per-chunk
    partial sums in the workspace, then an ordered sum. ``layout="nhwc"``: channels-last activations, every
    pass (``reason_unsupported_nhwc``, ``_nhwc_prepare``)."""
    dtype = numpy.dtype(dtype)
    codes = epilogue_codes(epilogue) if pass_ == "fprop" else NO_EPILOGUE
    if layout == "nhwc":
        return _nhwc_prepare(pass_, spec, dtype, env, bias, kernel, codes)
    b = _plan.Builder(pass_, env)
    if pass_ == "fprop":
        launch = _forward_prepared(spec, dtype, env.aligned, env.aligned, env, kernel, False, codes)
        b.launch(launch, b.ref("x"), b.ref("w"), b.ref("bias"), b.ref("out"),
                 b.ref("residual") if codes[1] else _plan.NULL)
    elif pass_ == "dgrad":
        transposed = dgrad_forward.forward_spec(spec)
        if transposed is not None and reason_unsupported(transposed, dtype, limits=env) is None:
            # (multiplier 1: the transposed convolution's weight is the layer's, flipped, which the forward
            # kernels read in place: one launch, no flipped copy)
            launch = _forward_prepared(transposed, dtype, env.aligned, env.aligned, env, None, True)
            b.launch(launch, b.ref("dy"), b.ref("w"), _plan.NULL, b.ref("dx"), _plan.NULL)
        else:
            b.launch(_dgrad_launch(spec, dtype), b.ref("dy"), b.ref("w"), b.ref("dx"))
    else:
        partial_bytes, partial, reduce = _wgrad_launches(spec, dtype, env.sm_count)
        buffer = b.take(partial_bytes)
        b.launch(partial, b.ref("x"), b.ref("dy"), buffer)
        b.launch(reduce, buffer, b.ref("dw"))
    return b.plan(ALGORITHM_NAME)


def dgrad_gpu(dy, w, spec: ConvSpec, dx, precision: str) -> None:
    """dx = conv2d_input for a depthwise convolution on C-contiguous CuPy arrays (``prepare``)."""
    _plan.run_on_arrays(prepare, "dgrad", spec, precision, dy, w, dx)


def wgrad_gpu(x, dy, spec: ConvSpec, dw, precision: str) -> None:
    """dw = conv2d_weight for a depthwise convolution on C-contiguous CuPy arrays (``prepare``)."""
    _plan.run_on_arrays(prepare, "wgrad", spec, precision, x, dy, dw)



class Depthwise(Algorithm):
    """``depthwise`` behind the algorithm contract (``cuconv.algos.base``)."""

    name = "depthwise"
    passes = PASSES
    layouts = ("nchw", "nhwc")
    activations = ACTIVATIONS  # (every forward kernel has instances whose stores apply the epilogue, kEpi)
    residual = True
    epilogue_dtypes = EPILOGUE_DTYPES
    nchw_limits = staticmethod(reason_unsupported)
    nhwc_limits = staticmethod(reason_unsupported_nhwc)

    def knobs(self, p: Problem, env: "_plan.Env") -> tuple:
        """``{"kernel": k}`` for each forward kernel that can serve the forward on NCHW activations
        (``forward_kernels``), and the forward or stride-1 dgrad on channels-last ones (``nhwc_tile``, ``nhwc_q``,
        ``nhwc``), auto's first; ``({},)`` for the passes with one kernel."""
        from ...select import depthwise as choice  # (the selector imports the algorithms)

        chosen = choice.knobs(p, env)
        if not chosen:
            return ({},)
        if p.layout == "nhwc":
            fspec = p.spec if p.pass_ == "fprop" else dgrad_forward.forward_spec(p.spec)
            kernels = ["nhwc_tile"] if _nhwc_tile(fspec, p.dtype) is not None else []
            kernels += ["nhwc_q"] if fspec.r == fspec.s and fspec.r in _NHWC_Q_PIXELS else []
            kernels += ["nhwc"]
        else:
            kernels = list(forward_kernels(p.spec, p.dtype, env.smem_limit, env.aligned, env.aligned))
        return tuple({"kernel": k} for k in dict.fromkeys([chosen["kernel"]] + kernels))

    def build(self, p: Problem, env: "_plan.Env", **knobs) -> "_plan.Plan":
        return prepare(p.pass_, p.spec, p.dtype, p.precision, env, p.bias, layout=p.layout, epilogue=p.epilogue,
                       **knobs)


ALGORITHM = Depthwise()
