"""Algorithm ``direct``: Python twin of ``kernels_cu/direct.cu``, one thread per output element.

The simple baseline: every output sums its group's ``C/groups · R · S`` taps straight from global memory,
so it needs no workspace and serves every geometry and dtype, but it reloads each input value once per
tap and output channel that reads it. Faster families are measured against it; ``direct_smem`` is the
same loop with the operands staged in shared memory and register tiles.
"""

from __future__ import annotations

from .. import _dtypes, _loader, _plan
from ..spec import ConvSpec
from ..problem import Problem
from .base import Algorithm

__all__ = ["ALGORITHM", "Direct", "prepare", "forward_gpu", "reason_unsupported", "NAME_EXPRESSIONS", "STEM"]

STEM = "direct"
_MAX_BLOCKS = 1 << 20  # the grid-stride loop covers the rest

NAME_EXPRESSIONS = tuple(f"direct<{t}>" for t in _dtypes.ALL_CTYPE_NAMES)


def reason_unsupported(spec: ConvSpec, dtype, pass_: str = "fprop", precision: str = "ieee", limits=None):
    """Why ``direct`` cannot run this case, or None: it has a forward pass only, for every geometry and under any
    limits."""
    if pass_ != "fprop":
        return f"it implements no {pass_}"
    return None


def prepare(pass_: str, spec: ConvSpec, dtype, precision: str, env: "_plan.Env", bias: bool = False) -> "_plan.Plan":
    """The forward plan (see ``cuconv._plan``): one launch (``precision``: FFMA, nothing to choose; half types
    sum in float32)."""
    b = _plan.Builder(pass_, env)
    total = spec.n * spec.k * spec.p * spec.q
    if total:
        name = f"direct<{_dtypes.ctype_of(dtype)}>"
        grid = (_loader.blocks(total, _MAX_BLOCKS), 1, 1)
        b.launch(_loader.prepare(STEM, NAME_EXPRESSIONS, name, grid, (_loader.THREADS, 1, 1), 4,
                                 (_loader.conv_geometry(spec),)),
                 b.ref("x"), b.ref("w"), b.ref("bias"), b.ref("out"))
    return b.plan(STEM)


def forward_gpu(x, w, bias, spec: ConvSpec, out, precision: str) -> None:
    """out = conv(x, w) + bias on C-contiguous CuPy arrays, current stream (``prepare`` and run)."""
    _plan.run_on_arrays(prepare, "fprop", spec, precision, x, w, bias, out)


class Direct(Algorithm):
    """``direct`` behind the algorithm contract (``cuconv.algos.base``)."""

    name = "direct"
    passes = ("fprop",)
    nchw_limits = staticmethod(reason_unsupported)

    def build(self, p: Problem, env: "_plan.Env", **knobs) -> "_plan.Plan":
        return prepare(p.pass_, p.spec, p.dtype, p.precision, env, p.bias)


ALGORITHM = Direct()
