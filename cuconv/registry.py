"""The registry of forward algorithms and the pure function that chooses among them.

Each algorithm names a module with ``forward_gpu(x, w, bias, spec, out, precision)`` and
``forward_cpu(x, w, bias, spec, out)`` (bias fused: added before the result is rounded), and a ``reason_unsupported(spec, dtype)`` that returns why it cannot
serve a case (``None`` when it can). ``select_algorithm`` never picks one that refuses.
"""

from __future__ import annotations

from typing import Optional

from .spec import ConvSpec
from . import im2col_gemm

__all__ = ["algorithms", "select_algorithm", "resolve", "get"]

_REGISTRY = {
    "im2col_gemm": im2col_gemm,
}


def algorithms() -> tuple:
    """Names of the forward algorithms available; any of them may be forced with ``algo=``."""
    return tuple(_REGISTRY)


def get(name: str):
    return _REGISTRY[name]


def _reason_unsupported(name: str, spec: ConvSpec, dtype) -> Optional[str]:
    check = getattr(_REGISTRY[name], "reason_unsupported", None)
    return check(spec, dtype) if check is not None else None


def select_algorithm(spec: ConvSpec, dtype, precision: str, on_gpu: bool) -> str:
    """The algorithm ``algo="auto"`` runs for this problem: a pure function of its arguments."""
    for name in _REGISTRY:  # in order of preference; only one family exists so far
        if _reason_unsupported(name, spec, dtype) is None:
            return name
    raise NotImplementedError(f"cuconv: no algorithm supports {spec} in {dtype}")  # pragma: no cover


def resolve(algo: str, spec: ConvSpec, dtype, precision: str, on_gpu: bool) -> str:
    """Validate a user's ``algo=`` and turn ``"auto"`` into a concrete name."""
    if not isinstance(algo, str):
        raise TypeError(f"conv2d(): argument 'algo' must be str, not {type(algo).__name__}")
    if algo == "auto":
        return select_algorithm(spec, dtype, precision, on_gpu)
    if algo not in _REGISTRY:
        raise ValueError(f"cuconv: unknown algo {algo!r}; expected 'auto' or one of {algorithms()}")
    reason = _reason_unsupported(algo, spec, dtype)
    if reason is not None:
        raise NotImplementedError(f"cuconv: algo {algo!r} cannot run this convolution: {reason}")
    return algo
