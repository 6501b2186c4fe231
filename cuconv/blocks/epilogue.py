"""Python twin of ``kernels_cu/blocks/epilogue.cu``: a convolution's epilogue (activation, residual add) as one
pass over its output, for the algorithms that do not apply it in their own kernels; the codes and the struct
(``epilogue_codes``, ``epilogue_args``: ``EpilogueArgs`` of ``kernels_cu/epilogue.cuh``) by which the kernels that
apply it in their stores take it; and the same epilogue on NumPy arrays for the CPU path."""

from __future__ import annotations

import math

import numpy

from .. import _dtypes, _loader
from ..problem import ACTIVATIONS

__all__ = ["launch", "apply_numpy", "epilogue_codes", "epilogue_args", "ACT_CODES", "RES_CODES", "NO_EPILOGUE",
           "EPILOGUE_ARGS_DTYPE", "NAME_EXPRESSIONS", "STEM"]

STEM = "blocks/epilogue"
_MAX_BLOCKS = 1 << 16
ACT_CODES = {None: 0, **{name: i + 1 for i, name in enumerate(ACTIVATIONS)}}  # (epilogue.cuh's ACT)
RES_CODES = {None: 0, "before": 1, "after": 2}  # (the kernels' res: where the residual is added)
NAME_EXPRESSIONS = tuple(f"epilogue<{t}>" for t in _dtypes.ALL_CTYPE_NAMES)
NO_EPILOGUE = (0, 0, 0.0)  # epilogue_codes of none: the bias alone (backward passes, plain forwards)
# epilogue.cuh's EpilogueArgs: the activation's code, where the residual is added, leaky_relu's slope (a double)
EPILOGUE_ARGS_DTYPE = numpy.dtype([("act", numpy.int32), ("res", numpy.int32), ("alpha", numpy.float64)],
                                  align=True)


def epilogue_codes(ep) -> tuple:
    """(activation code, residual code, slope) of an ``Epilogue`` (None: none): the hashable form the memoized
    launches are keyed by (the slope 0 but for leaky_relu, so that one epilogue has one form)."""
    if ep is None:
        return NO_EPILOGUE
    alpha = float(ep.alpha) if ep.activation == "leaky_relu" else 0.0
    return (ACT_CODES[ep.activation], RES_CODES[ep.residual], alpha)


def epilogue_args(codes: tuple = NO_EPILOGUE):
    """``EPILOGUE_ARGS_DTYPE`` of ``epilogue_codes``: the kernels' last argument."""
    return numpy.array(codes, dtype=EPILOGUE_ARGS_DTYPE)[()]


def launch(dtype, n: int, activation, residual, alpha: float = 0.0) -> "_loader.PreparedLaunch":
    """A launch applying ``activation`` (of ``ACTIVATIONS``, or None) and a residual added ``residual`` ("before"
    or "after" it, or None) to ``n`` elements of ``dtype``; pointers: the convolution's output y, the residual (or
    0), the result (may be y)."""
    if activation is None and residual is None:
        raise ValueError("cuconv: an epilogue launch needs an activation or a residual")
    name = f"epilogue<{_dtypes.ctype_of(dtype)}>"
    return _loader.prepare(STEM, NAME_EXPRESSIONS, name, (_loader.blocks(n, _MAX_BLOCKS), 1, 1),
                           (_loader.THREADS, 1, 1), 3, (numpy.int64(n), numpy.int32(ACT_CODES[activation]),
                                                         numpy.int32(RES_CODES[residual]), numpy.float64(alpha)))


def _erf(v: numpy.ndarray) -> numpy.ndarray:
    return numpy.vectorize(math.erf, otypes=[v.dtype])(v)


def _activate(v: numpy.ndarray, activation, alpha: float) -> numpy.ndarray:
    if activation is None:
        return v
    one = v.dtype.type(1)
    if activation == "relu":
        return numpy.where(v < 0, v.dtype.type(0), v)
    if activation == "relu6":
        return numpy.where(v < 0, v.dtype.type(0), numpy.where(v > 6, v.dtype.type(6), v))
    if activation == "leaky_relu":
        return numpy.where(v > 0, v, v * v.dtype.type(alpha))
    if activation == "silu":
        return v / (one + numpy.exp(-v))
    if activation == "gelu":
        return v.dtype.type(0.5) * v * (one + _erf(v / v.dtype.type(math.sqrt(2.0))))
    if activation == "gelu_tanh":
        inner = v.dtype.type(math.sqrt(2.0 / math.pi)) * (v + v.dtype.type(0.044715) * v * v * v)
        return v.dtype.type(0.5) * v * (one + numpy.tanh(inner))
    if activation == "hardswish":
        return v * numpy.clip(v + 3, 0, 6) / v.dtype.type(6)
    if activation == "hardsigmoid":
        return numpy.clip(v + 3, 0, 6) / v.dtype.type(6)
    if activation == "sigmoid":
        return one / (one + numpy.exp(-v))
    raise ValueError(f"cuconv: unknown activation {activation!r}; expected None or one of {ACTIVATIONS}")


def apply_numpy(y: numpy.ndarray, r, activation, residual, alpha: float, out: numpy.ndarray) -> None:
    """``out[...] = `` the epilogue of ``y`` (residual ``r`` added ``residual``: of ``RESIDUALS`` or None), computed
    in float32 (float64 for float64) and rounded once; ``out`` may be ``y``."""
    acc = numpy.float64 if y.dtype == numpy.float64 else numpy.float32
    v = y.astype(acc)
    if residual == "before":
        v = v + r.astype(acc)
    v = _activate(v, activation, alpha)
    if residual == "after":
        v = v + r.astype(acc)
    out[...] = v.astype(y.dtype)
