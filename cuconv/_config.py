"""cuconv's defaults: process-wide by assignment, per thread and task for a ``with cuconv.config(...)`` block.

``cuconv.config.precision = "tf32"`` changes the default for the whole process. ``with cuconv.config(
precision="tf32"): ...`` changes it only in the block's own context (a ``contextvars`` context: its thread, or
its asyncio task), so blocks in several threads never see each other's values, and leaving a block restores
what it found there. A new thread starts from the process-wide defaults. Unknown names raise AttributeError.
"""

from __future__ import annotations

import contextlib
import contextvars
import os

__all__ = ["config", "PRECISIONS"]

PRECISIONS = ("ieee", "tf32")
_FIELDS = ("precision", "workspace_limit", "benchmark", "benchmark_cache")
_UNSET = object()

# The current context's overrides by ``with cuconv.config(...)`` blocks: a dict (never mutated once set) or None.
_overrides = contextvars.ContextVar("cuconv_config_overrides", default=None)


def _valid(name: str, value):
    """``value`` for field ``name``, checked; raises TypeError/ValueError in the setters' words."""
    if name == "precision":
        if value not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {value!r}")
        return value
    if name == "workspace_limit":
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"workspace_limit must be a positive int (bytes), got {type(value).__name__} {value!r}")
        if value <= 0:
            raise ValueError(f"workspace_limit must be a positive int (bytes), got {value!r}")
        return value
    if name == "benchmark":
        if not isinstance(value, bool):
            raise TypeError(f"benchmark must be a bool, got {type(value).__name__}")
        return value
    if value is not None and not isinstance(value, (str, os.PathLike)):  # benchmark_cache
        raise TypeError(f"benchmark_cache must be a path or None, got {type(value).__name__}")
    return None if value is None else os.fspath(value)


def _field(name: str, doc: str) -> property:
    def get(self):
        overrides = _overrides.get()
        if overrides is not None:
            value = overrides.get(name, _UNSET)
            if value is not _UNSET:
                return value
        return self._defaults[name]

    def set_(self, value):
        self._defaults[name] = _valid(name, value)

    return property(get, set_, doc=doc)


class _Config:
    """cuconv's defaults (see the module docstring for their scope).

    Attributes
    ----------
    precision : {"ieee", "tf32"}
        How float32 convolutions compute when ``precision=None`` is passed: ``"ieee"`` (plain fp32
        arithmetic, the default) or ``"tf32"`` (tensor cores, 10-bit mantissa inputs, fp32 accumulation).
    workspace_limit : int
        Upper bound in bytes on the temporary buffers (the column matrix) one call may allocate.
        Default 1 GiB. Large problems are chunked over the batch, then over output rows, to stay below it.
    benchmark : bool
        Like ``torch.backends.cudnn.benchmark``: with ``algo="auto"``, the first GPU call of each problem
        signature times every eligible algorithm and later calls run the fastest (default False: a
        heuristic choice, no timing).
    benchmark_cache : str or None
        A JSON file where ``benchmark`` winners are kept across processes, keyed by device name, dtype,
        precision, pass and geometry (default None: in memory only).
    """

    __slots__ = ("_defaults",)

    precision = _field("precision", "float32 arithmetic when a call passes precision=None: 'ieee' or 'tf32'.")
    workspace_limit = _field("workspace_limit", "Upper bound in bytes on one call's temporary buffers.")
    benchmark = _field("benchmark", "Time every eligible algorithm once per signature (auto only).")
    benchmark_cache = _field("benchmark_cache", "A JSON file keeping benchmark winners across processes.")

    def __init__(self):
        object.__setattr__(self, "_defaults", {"precision": "ieee", "workspace_limit": 1 << 30, "benchmark": False,
                                                "benchmark_cache": None})

    def __setattr__(self, name, value):
        if name not in _FIELDS:
            raise AttributeError(f"cuconv.config has no setting {name!r}; the settings are {', '.join(_FIELDS)}")
        object.__setattr__(self, name, value)

    @contextlib.contextmanager
    def __call__(self, **changes):
        """Change defaults in this context for a block: ``with cuconv.config(workspace_limit=1 << 28): ...``.
        Every value is checked first: a bad one changes nothing."""
        unknown = set(changes) - set(_FIELDS)
        if unknown:
            raise TypeError(f"config() got unexpected keyword argument(s) {sorted(unknown)}")
        checked = {name: _valid(name, value) for name, value in changes.items()}
        token = _overrides.set({**(_overrides.get() or {}), **checked})
        try:
            yield self
        finally:
            _overrides.reset(token)

    def __repr__(self) -> str:
        return (f"cuconv.config(precision={self.precision!r}, workspace_limit={self.workspace_limit}, "
                f"benchmark={self.benchmark}, benchmark_cache={self.benchmark_cache!r})")


config = _Config()
