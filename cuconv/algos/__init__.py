"""Every GPU algorithm, behind one contract (``base.Algorithm``), listed in one place: ``ALGORITHMS``.

Adding an algorithm is one module (its class, an instance named ``ALGORITHM``) and one entry in the tuple; the
selector (``cuconv.select``) and ``config.benchmark`` find it here. The order is ``auto``'s last resort: where no
rule of the selector names an algorithm for a problem, the first one here that can implement it runs.

NumPy arrays and CPU tensors run the one CPU reference (``cuconv.cpu``): algorithms are GPU strategies, and every
one of them computes the same function.
"""

from __future__ import annotations

from . import (depthwise, direct, direct_smem, grouped_direct, grouped_mma, im2col_gemm, implicit_gemm, winograd,
               winograd_fused)
from .base import Algorithm

__all__ = ["ALGORITHMS", "Algorithm", "get", "names", "takes_krsc"]

ALGORITHMS = (
    im2col_gemm.ALGORITHM,
    depthwise.ALGORITHM,
    direct.ALGORITHM,
    direct_smem.ALGORITHM,
    grouped_direct.ALGORITHM,
    grouped_mma.ALGORITHM,
    implicit_gemm.ALGORITHM,
    winograd.ALGORITHM,
    winograd_fused.ALGORITHM,
)

_by_name = (None, {})  # (the tuple it was made from, name -> algorithm): follows ALGORITHMS if it is replaced


def get(name: str) -> Algorithm:
    """The algorithm called ``name`` (``KeyError`` for another name)."""
    global _by_name
    made_from, table = _by_name
    if made_from is not ALGORITHMS:
        table = {a.name: a for a in ALGORITHMS}
        _by_name = (ALGORITHMS, table)
    return table[name]


def takes_krsc(name: str) -> bool:
    """Whether algorithm ``name``'s channels-last plans read a channels-last weight (and wgrad writes dW so)."""
    return "krsc" in get(name).weight_layouts


def names(pass_: str = None) -> tuple:
    """The algorithms' names, in ``ALGORITHMS``' order; with ``pass_``, of those that implement it."""
    return tuple(a.name for a in ALGORITHMS if pass_ is None or pass_ in a.passes)
