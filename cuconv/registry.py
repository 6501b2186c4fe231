"""The registry of GPU algorithms and the pure function that chooses among them.

An algorithm is a family module listed here with the passes it implements, and the plan/run interface of
``cuconv._plan``: ``prepare(pass_, spec, dtype, precision, env, bias=False) -> Plan``, whose ``run(ptrs,
stream, workspace)`` only launches. ``prepare`` here memoizes the families' plans per signature and takes care
of the cases with nothing to compute (an empty output, no input channels, an empty batch). A family's
``reason_unsupported(spec, dtype, pass_, precision) -> str | None`` says why it cannot serve a case; ``auto``
never picks it there and forcing it raises ``NotImplementedError`` with that reason.

NumPy arrays always run the one CPU implementation (``im2col_gemm``'s NumPy twin): algorithms are GPU
strategies, and every one of them computes the same function.
"""

from __future__ import annotations

import functools
from typing import Optional

import numpy

from ._config import config
from .spec import ConvSpec
from . import (_backend, _loader, _plan, bias as _bias, depthwise, direct, direct_smem, elementwise, im2col_gemm,
               implicit_gemm, winograd, winograd_fused)

__all__ = ["PASSES", "algorithms", "select_algorithm", "resolve", "get", "prepare", "cpu", "reason_unsupported"]

PASSES = ("fprop", "dgrad", "wgrad")

# Each family and the passes it implements, in order of preference for `auto` where nothing more specific
# applies.
_REGISTRY = {
    "im2col_gemm": (im2col_gemm, PASSES),
    "depthwise": (depthwise, PASSES),
    "direct": (direct, ("fprop",)),
    "direct_smem": (direct_smem, ("fprop", "dgrad")),
    "implicit_gemm": (implicit_gemm, ("fprop", "dgrad")),
    "winograd": (winograd, ("fprop", "dgrad")),
    "winograd_fused": (winograd_fused, ("fprop", "dgrad")),
}


def algorithms(pass_: str = "fprop") -> tuple:
    """Names of the algorithms that implement ``pass_`` ("fprop", "dgrad" or "wgrad")."""
    _check_pass(pass_)
    return tuple(name for name, (_, passes) in _REGISTRY.items() if pass_ in passes)


def get(name: str):
    """The family module of algorithm ``name``."""
    return _REGISTRY[name][0]


@functools.lru_cache(maxsize=4096)
def prepare(name: str, pass_: str, spec: ConvSpec, dtype, precision: str, env: "_plan.Env",
            bias: bool = False) -> "_plan.Plan":
    """The plan of algorithm ``name`` for ``pass_`` (``cuconv._plan``), made on ``env.device`` (the current
    device), memoized per signature. Nothing to compute: an empty plan; no input channels (a forward of sums
    over nothing) or, backward, an empty batch or no filters: the result filled with the bias or zeros."""
    dtype = numpy.dtype(dtype)
    b = _plan.Builder(pass_, env)
    if pass_ == "fprop":
        if spec.n * spec.k * spec.p * spec.q == 0:
            return b.plan(name)
        if spec.crs_per_group == 0:
            if bias:
                b.launch(_bias.fill_launch(dtype, spec.n, spec.k, spec.p * spec.q), b.ref("out"), b.ref("bias"))
            else:
                b.launch(elementwise.fill(dtype, spec.n * spec.k * spec.p * spec.q), b.ref("out"))
            return b.plan(name)
    elif spec.n == 0 or spec.k == 0 or spec.crs_per_group == 0:
        result = spec.input_shape if pass_ == "dgrad" else spec.weight_shape
        count = int(numpy.prod(result))
        if count:
            b.launch(elementwise.fill(dtype, count), b.ref("dx" if pass_ == "dgrad" else "dw"))
        return b.plan(name)
    return _REGISTRY[name][0].prepare(pass_, spec, dtype, precision, env, bias=bias)


def cpu():
    """The module holding the NumPy implementation of every pass."""
    return im2col_gemm


def _check_pass(pass_: str) -> None:
    if pass_ not in PASSES:
        raise ValueError(f"cuconv: unknown pass {pass_!r}; expected one of {PASSES}")


def reason_unsupported(name: str, spec: ConvSpec, dtype, pass_: str = "fprop",
                       precision: str = "ieee") -> Optional[str]:
    """Why algorithm ``name`` cannot run this case (float32 at ``precision``), or None when it can.

    Memoized with what else the answers depend on, the device's shared-memory limit and wgmma (implicit_gemm's
    tiles, hence its workspace) and ``cuconv.config.workspace_limit``: a layer called again costs a lookup."""
    return _reason_unsupported(name, spec, numpy.dtype(dtype), pass_, precision, *_device_traits(),
                               config.workspace_limit)


_traits_by_device = {}


def _device_traits() -> tuple:
    """(shared-memory opt-in limit, wgmma) of the current device: what the algorithms' limits depend on
    besides the problem. Asked once per device; a call costs one device lookup (host time per call)."""
    if not _backend.gpu_available():
        return _loader.smem_limit(), False
    device = _backend.cupy_or_none().cuda.runtime.getDevice()
    traits = _traits_by_device.get(device)
    if traits is None:
        traits = _traits_by_device[device] = (_loader.smem_limit(), implicit_gemm.wgmma_available())
    return traits


@functools.lru_cache(maxsize=4096)
def _reason_unsupported(name, spec, dtype, pass_, precision, smem_limit, wgmma, workspace_limit) -> Optional[str]:
    module, passes = _REGISTRY[name]
    if pass_ not in passes:
        return f"it implements no {pass_}"
    check = getattr(module, "reason_unsupported", None)
    return check(spec, dtype, pass_, precision) if check is not None else None


def select_algorithm(spec: ConvSpec, dtype, precision: str = "ieee", on_gpu: bool = True,
                     pass_: str = "fprop") -> str:
    """The algorithm ``algo="auto"`` runs for this problem and pass: a pure function of its arguments (and
    of the device's shared-memory limit and ``cuconv.config.workspace_limit``, through the algorithms'
    limits; memoized with them)."""
    return _select_algorithm(spec, numpy.dtype(dtype), precision, on_gpu, pass_, *_device_traits(),
                             config.workspace_limit)


@functools.lru_cache(maxsize=4096)
def _select_algorithm(spec, dtype, precision, on_gpu, pass_, smem_limit, wgmma, workspace_limit) -> str:
    _check_pass(pass_)
    for name in _preference(spec, dtype, precision, pass_, wgmma):
        if name in _REGISTRY and reason_unsupported(name, spec, dtype, pass_, precision) is None:
            return name
    raise NotImplementedError(f"cuconv: no algorithm supports {spec} in {dtype} for {pass_}")  # pragma: no cover


# winograd_fused's tile holds 64 filters: with 16 (square_3x3_1024's fp32-IEEE dgrad) it ran 33.9 ms against
# 18.4 for winograd on an H200.
_WINOGRAD_FUSED_MIN_FILTERS = 64
# Its products cost 16 per 4 outputs and channel against winograd's 36 per 16 (F(4x4, 3x3)), whose price is the
# traffic of its transformed operands: with few channels that traffic wins (16 channels, 128 filters: 14.0 ms
# against 18.4), with more the products do (resnet_3x3_64, 64 channels: 0.150 against 0.131 ms in a loop, 0.232
# against 0.186 one call). The line is drawn at 32, between the two measured points.
_WINOGRAD_FUSED_MAX_CHANNELS = 32

# 1x1 stride-1 forwards at tensor-core precisions: cuBLASLt's GEMM per sample (im2col_gemm) against implicit_gemm's
# NCHW kernel (wgmma), measured on ResNet-50's 1x1 layers at batch 32 through conv2d (H200, session 13; µs one call /
# in a loop). On 56x56 and 28x28 planes the GEMM runs as fast as cuDNN and the NCHW kernel does not
# (resnet_1x1_256 fp16: 36.2/22.2 against cuDNN's 34.8/22.1 and the NCHW kernel's 46.7/38.1; TF32 55.1/39.6, 53.1/41.2
# and 53.1/45.1). On 7x7 planes batches of 49-column GEMMs are slow (fp16 512->2048: 89.5 against 35.1). On 14x14
# it depends on the precision: in the half types the GEMM wins (1024->256: 38.2 against 45.4), at TF32 it can lose
# by 1.4x (1024->512: 91.6 against 66.5). The GEMM takes planes of at least this many pixels:
_POINTWISE_GEMM_MIN_PIXELS_HALF = 14 * 14
_POINTWISE_GEMM_MIN_PIXELS_TF32 = 28 * 28


def _pointwise_gemm_min_pixels(dtype) -> int:
    return _POINTWISE_GEMM_MIN_PIXELS_HALF if numpy.dtype(dtype).itemsize == 2 else _POINTWISE_GEMM_MIN_PIXELS_TF32


# implicit_gemm's narrowest tile holds 64 filters: with fewer than 32 in the pass most of it idles (TF32
# square_3x3_1024 dgrad, 16 filters: 24.5 ms against 14.4 for im2col_gemm on an H200).
_IMPLICIT_GEMM_MIN_FILTERS = 32


def _preference(spec: ConvSpec, dtype, precision: str, pass_: str, wgmma: bool = False):
    """Candidates, best first, from what each family is good at (measured on an H200; README "Algorithms").

    - depthwise layers: ``depthwise`` (memory-bound; im2col_gemm runs one tiny GEMM per group, 4-7x slower);
    - float32 at "ieee", 3x3, stride 1, no dilation, one group, at least 64 filters and 16 to 32 input channels
      in the pass: ``winograd_fused`` (F(2x2, 3x3) in one kernel, no transformed operand in memory:
      square_3x3_1024 14.0 ms against 18.4 for winograd and 17.8 for im2col_gemm; 1.6e-7 error against
      winograd's 1e-6; with 64 channels winograd's fewer products win, resnet_3x3_64 0.131 against 0.150 ms);
    - plain fp32 "ieee" and fp64 arithmetic, stride 1, no dilation, one group, kernels up to 7x7 with at
      least 16 input channels and 16 filters in the pass (and, in float32, at most 128-512 input channels:
      its error limit): ``winograd`` (2.9x fewer multiplications for 5x7, 4x for 3x3; rect_5x7 fprop 8.6 ms
      against 15.3 for direct_smem, its dgrad 8.3 against 15.8; resnet_3x3_64 0.18 ms against 0.41 for
      im2col_gemm; with 3 input channels it is slower than im2col_gemm, 0.27 against 0.16 ms);
    - plain-FFMA arithmetic (fp32 "ieee", fp64) on large layers with many taps and up to 128 filters per
      group: ``direct_smem`` (no column matrix; square_5x9 9.7 ms, dilated_padded_5x9 10.0 ms and rect_5x7
      15.4 ms against 12.9, 12.6 and 15.8 for im2col_gemm), while with 9 taps cuBLAS's GEMM wins
      (square_3x3_1024: 17.9 against 22.9 ms); with tensor cores (TF32, fp16, bf16) FFMA kernels are out of
      the race. dgrad at
      stride 1 is a forward convolution with C/groups filters (``dgrad_forward``): the same rule applies
      with C/groups in place of K/groups, against im2col_gemm's dgrad whose GEMM reduces over K/groups only;
    - tensor-core arithmetic (float32 "tf32", float16, bfloat16), forward and stride-1 dgrad with at least
      32 filters in the pass, except 1x1 stride-1 unpadded layers (a plain GEMM for im2col_gemm) unless the
      pass is a forward on a device that runs wgmma (``wgmma``) on small planes (below 14x14 pixels in the half
      types, 28x28 at TF32: ``_POINTWISE_GEMM_MIN_PIXELS_*``), where implicit_gemm's NchwTile reads them as they
      are and cuBLASLt's batches of short GEMMs are slow (the dgrad, 256 filters over 64 channels: a GEMM,
      0.094 against 0.152 ms):
      ``implicit_gemm``, which never writes the column matrix (TF32 square_5x9 3.0 ms against 6.9 ms for
      im2col_gemm; stem_7x7_s2 1.2x cuDNN);
    - otherwise ``im2col_gemm``.
    """
    depthwise = spec.groups == spec.c and spec.groups > 1 and spec.c_per_group == 1
    if depthwise:
        yield "depthwise"
    dtype = numpy.dtype(dtype)
    ffma = dtype == numpy.float64 or (dtype == numpy.float32 and precision == "ieee")
    # the pass's output: a dgrad is a forward convolution producing dx
    pixels = spec.n * (spec.h * spec.w if pass_ == "dgrad" else spec.p * spec.q)
    large = pixels >= (1 << 19)
    filters = {"fprop": spec.k_per_group, "dgrad": spec.c_per_group}.get(pass_)
    channels = {"fprop": spec.c_per_group, "dgrad": spec.k_per_group}.get(pass_)
    pointwise = spec.is_pointwise_identity and not (wgmma and pass_ == "fprop" and implicit_gemm.nchw_fits(spec, dtype)
                                                    and spec.p * spec.q < _pointwise_gemm_min_pixels(dtype))
    if not ffma and filters is not None and filters >= _IMPLICIT_GEMM_MIN_FILTERS and not pointwise:
        yield "implicit_gemm"
    if (filters is not None and ffma and dtype == numpy.float32 and filters >= _WINOGRAD_FUSED_MIN_FILTERS
            and 16 <= channels <= _WINOGRAD_FUSED_MAX_CHANNELS):
        yield "winograd_fused"
    if filters is not None and ffma and min(filters, channels) >= 16:
        yield "winograd"
    if filters is not None and ffma and large and spec.r * spec.s >= 25 and filters <= 128:
        yield "direct_smem"
    yield "im2col_gemm"
    yield from _REGISTRY  # anything else that serves the case


def resolve(algo: str, spec: ConvSpec, dtype, precision: str, on_gpu: bool, pass_: str = "fprop") -> str:
    """Validate a user's ``algo=`` and turn ``"auto"`` into a concrete name for ``pass_``."""
    if not isinstance(algo, str):
        raise TypeError(f"conv2d(): argument 'algo' must be str, not {type(algo).__name__}")
    if algo == "auto":
        return select_algorithm(spec, dtype, precision, on_gpu, pass_)
    if algo not in _REGISTRY:
        raise ValueError(f"cuconv: unknown algo {algo!r}; expected 'auto' or one of {tuple(_REGISTRY)}")
    if not on_gpu:
        return algo  # the CPU path serves every algorithm name
    reason = reason_unsupported(algo, spec, dtype, pass_, precision)
    if reason is not None:
        raise NotImplementedError(f"cuconv: algo {algo!r} cannot run this {pass_}: {reason}")
    return algo
