"""Python twin of ``kernels_cu/blocks/batch_norm.cu``: BatchNorm in train mode on a convolution's output with the
block's epilogue (``cuconv.nn.fuse_train`` on CUDA tensors), its launches prepared once per shape, and the same
arithmetic on NumPy arrays for its tests."""

from __future__ import annotations

import math

import numpy

from .. import _dtypes, _loader
from ..problem import ACTIVATIONS

__all__ = ["supports", "Launches", "launches", "activation_code", "forward_numpy", "backward_numpy",
           "NAME_EXPRESSIONS", "STEM"]

STEM = "blocks/batch_norm"
_TYPES = ("float", "__half", "__nv_bfloat16")
_LAYOUTS = ("true", "false")
NAME_EXPRESSIONS = tuple(
    [f"{k}<{t},{nhwc}>" for k in ("bn_stats", "bn_finalize", "bn_apply", "bn_backward_sums", "bn_backward_dy")
     for t in _TYPES for nhwc in _LAYOUTS] + ["bn_backward_finalize"])
_THREADS = 256
_TARGET_BLOCKS = 1024  # (the sums' blocks: a few waves of an H200's 132 SMs)
_ELEMENTWISE_BLOCKS = 1 << 16  # (the grid-stride loops cover the rest)


def activation_code(activation) -> int:
    """The kernels' code of an activation (cuconv.problem.ACTIVATIONS' position + 1; 0: none)."""
    return 0 if activation is None else ACTIVATIONS.index(activation) + 1


def supports(dtype) -> bool:
    """Whether the kernels take tensors of ``dtype`` (float32 and the half types; the statistics are fp32)."""
    try:
        return _dtypes.ctype_of(dtype) in _TYPES
    except KeyError:
        return False


class Launches:
    """The six prepared launches of one (dtype, layout, N, C, HW, epilogue): ``stats``, ``finalize``, ``apply``,
    ``backward_sums``, ``backward_finalize``, ``backward_dy``, and the chunks the sums split the rows into."""

    __slots__ = ("chunks", "stats", "finalize", "apply", "backward_sums", "backward_finalize", "backward_dy")

    def __init__(self, dtype, channels_last: bool, n: int, c: int, hw: int, act: int, res: int, alpha: float,
                 eps: float, momentum: float):
        t, nhwc = _dtypes.ctype_of(dtype), "true" if channels_last else "false"
        m = n * hw
        tiles = -(-c // 32) if channels_last else c
        lanes = 8 if channels_last else _THREADS
        # (enough blocks to fill the device, each of at least a few rows a thread)
        self.chunks = max(1, min(-(-_TARGET_BLOCKS // tiles), -(-m // (4 * lanes))))
        rows = -(-m // self.chunks)
        block = (32, 8, 1) if channels_last else (_THREADS, 1, 1)
        sums_grid = (tiles, self.chunks, 1)
        per_channel = (-(-c // _THREADS), 1, 1)
        elements = n * c * hw
        flat = (max(1, min(_ELEMENTWISE_BLOCKS, -(-elements // _THREADS))), 1, 1)
        shape = (numpy.int64(m), numpy.int32(c), numpy.int64(hw))
        self.stats = _loader.prepare(STEM, NAME_EXPRESSIONS, f"bn_stats<{t},{nhwc}>", sums_grid, block, 3,
                                     shape + (numpy.int64(rows),))
        self.finalize = _loader.prepare(STEM, NAME_EXPRESSIONS, f"bn_finalize<{t},{nhwc}>", per_channel,
                                        (_THREADS, 1, 1), 12,
                                        shape + (numpy.int32(self.chunks), numpy.float32(eps),
                                                 numpy.float32(momentum)))
        epilogue = (numpy.int32(act), numpy.int32(res), numpy.float32(alpha))
        self.apply = _loader.prepare(STEM, NAME_EXPRESSIONS, f"bn_apply<{t},{nhwc}>", flat, (_THREADS, 1, 1), 5,
                                     (numpy.int64(elements), numpy.int32(c), numpy.int64(hw)) + epilogue)
        self.backward_sums = _loader.prepare(STEM, NAME_EXPRESSIONS, f"bn_backward_sums<{t},{nhwc}>", sums_grid,
                                             block, 10, shape + (numpy.int64(rows),) + epilogue)
        self.backward_finalize = _loader.prepare(STEM, NAME_EXPRESSIONS, "bn_backward_finalize", per_channel,
                                                 (_THREADS, 1, 1), 6,
                                                 (numpy.int64(m), numpy.int32(c), numpy.int32(self.chunks)))
        self.backward_dy = _loader.prepare(STEM, NAME_EXPRESSIONS, f"bn_backward_dy<{t},{nhwc}>", flat,
                                           (_THREADS, 1, 1), 10,
                                           (numpy.int64(elements), numpy.int32(c), numpy.int64(hw)) + epilogue)


_cache: dict = {}
_CACHE_MAX = 1024


def launches(dtype, channels_last: bool, n: int, c: int, hw: int, activation, res: int, alpha: float, eps: float,
             momentum) -> Launches:
    """The kept ``Launches`` of these arguments on the current device (``momentum`` None: torch's cumulative
    average, the factor 1/num_batches_tracked read on the device)."""
    from .. import _backend

    device = _backend.cupy_or_none().cuda.runtime.getDevice()
    momentum = -1.0 if momentum is None else float(momentum)
    key = (numpy.dtype(dtype).name, channels_last, n, c, hw, activation, res, float(alpha), float(eps), momentum,
           device)
    found = _cache.get(key)
    if found is None:
        if not supports(dtype):
            raise ValueError(f"cuconv: no batch_norm kernels for {numpy.dtype(dtype)}")
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        found = _cache[key] = Launches(dtype, channels_last, n, c, hw, activation_code(activation), res, alpha,
                                       eps, momentum)
    return found


# ----- the arithmetic on NumPy arrays (N, C, H, W), float64: the kernels' twin for tests -----------------------
def _activate(v, act: str, alpha: float):
    if act is None:
        return v
    if act == "relu":
        return numpy.maximum(v, 0)
    if act == "relu6":
        return numpy.clip(v, 0, 6)
    if act == "leaky_relu":
        return numpy.where(v > 0, v, v * alpha)
    if act == "silu":
        return v / (1 + numpy.exp(-v))
    if act == "gelu":
        return 0.5 * v * (1 + numpy.vectorize(math.erf)(v / math.sqrt(2)))
    if act == "gelu_tanh":
        return 0.5 * v * (1 + numpy.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
    if act == "hardswish":
        return v * numpy.clip(v + 3, 0, 6) / 6
    if act == "hardsigmoid":
        return numpy.clip(v + 3, 0, 6) / 6
    return 1 / (1 + numpy.exp(-v))


def _activation_grad(v, act: str, alpha: float):
    if act is None:
        return numpy.ones_like(v)
    if act == "relu":
        return (v > 0).astype(v.dtype)
    if act == "relu6":
        return ((v > 0) & (v < 6)).astype(v.dtype)
    if act == "leaky_relu":
        return numpy.where(v > 0, 1.0, alpha)
    if act in ("silu", "sigmoid"):
        s = 1 / (1 + numpy.exp(-v))
        return s * (1 + v * (1 - s)) if act == "silu" else s * (1 - s)
    if act == "gelu":
        return (0.5 * (1 + numpy.vectorize(math.erf)(v / math.sqrt(2)))
                + v * numpy.exp(-0.5 * v * v) / math.sqrt(2 * math.pi))
    if act == "gelu_tanh":
        b, k = math.sqrt(2 / math.pi), 0.044715
        t = numpy.tanh(b * (v + k * v ** 3))
        return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * b * (1 + 3 * k * v * v)
    if act == "hardswish":
        return numpy.where(v <= -3, 0.0, numpy.where(v < 3, v / 3 + 0.5, 1.0))
    # (torch's sixth is a float's, in every dtype)
    return numpy.where((v > -3) & (v < 3), float(numpy.float32(1 / 6)), 0.0)


def forward_numpy(y, gamma, beta, residual, position, activation, alpha: float, eps: float):
    """(out, mean, invstd): the block's forward on float64 arrays, the batch's statistics (biased variance)."""
    mean = y.mean(axis=(0, 2, 3))
    var = y.var(axis=(0, 2, 3))
    invstd = 1 / numpy.sqrt(var + eps)
    scale = invstd * (1 if gamma is None else gamma)
    shift = (0 if beta is None else beta) - mean * scale
    v = y * scale[:, None, None] + shift[:, None, None]
    if position == "before":
        v = v + residual
    v = _activate(v, activation, alpha)
    return (v + residual if position == "after" else v), mean, invstd


def backward_numpy(dz, y, gamma, beta, residual, position, activation, alpha: float, eps: float):
    """(dy, d_gamma, d_beta, d_residual) of ``forward_numpy`` on float64 arrays."""
    _, mean, invstd = forward_numpy(y, gamma, beta, residual, None, None, alpha, eps)
    scale = invstd * (1 if gamma is None else gamma)
    shift = (0 if beta is None else beta) - mean * scale
    pre = y * scale[:, None, None] + shift[:, None, None] + (residual if position == "before" else 0)
    d = dz * _activation_grad(pre, activation, alpha)
    xhat = (y - mean[:, None, None]) * invstd[:, None, None]
    m = y.size // y.shape[1]
    s1, s2 = d.sum(axis=(0, 2, 3)), (d * xhat).sum(axis=(0, 2, 3))
    dy = scale[:, None, None] * (d - (s1 / m)[:, None, None] - xhat * (s2 / m)[:, None, None])
    d_res = dz if position == "after" else (d if position == "before" else None)
    return dy, s2, s1, d_res
