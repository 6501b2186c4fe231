"""cuconv's defaults: process-wide by assignment, per thread and task for a ``with cuconv.config(...)`` block.

``cuconv.config.precision = "tf32"`` changes the default for the whole process. ``with cuconv.config(
precision="tf32"): ...`` changes it only in the block's own context (a ``contextvars`` context: its thread, or
its asyncio task), so blocks in several threads never see each other's values, and leaving a block restores
what it found there. A new thread starts from the process-wide defaults. Unknown names raise AttributeError.

The public entry points read the settings once per call, ``config.settings()`` (a frozen ``Settings``), and pass
that value down: nothing below them reads the configuration.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Any, Iterator, NamedTuple, Optional

__all__ = ["config", "PRECISIONS", "Settings"]

PRECISIONS = ("ieee", "tf32")
_FIELDS = ("precision", "workspace_limit", "benchmark", "benchmark_cache")
_UNSET = object()



class Settings(NamedTuple):
    """The settings in force for one call (``config.settings()``), as the entry points pass them down."""

    precision: str
    workspace_limit: int
    benchmark: bool
    benchmark_cache: Optional[str]


class _Block:
    """The overrides of the current context's ``with cuconv.config(...)`` blocks (``changes``, never mutated once
    set) and ``cached``: (the defaults' version, the ``Settings`` they make with it), one attribute so that a
    reader never pairs one version with another's settings."""

    __slots__ = ("changes", "cached")

    def __init__(self, changes: dict):
        self.changes, self.cached = changes, (-1, None)


_overrides = contextvars.ContextVar("cuconv_config_overrides", default=None)  # a _Block or None


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
        block = _overrides.get()
        if block is not None:
            value = block.changes.get(name, _UNSET)
            if value is not _UNSET:
                return value
        return self._defaults[name]

    def set_(self, value):
        self._defaults[name] = _valid(name, value)
        self._refresh()

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

    __slots__ = ("_defaults", "_version", "_settings")

    precision = _field("precision", "float32 arithmetic when a call passes precision=None: 'ieee' or 'tf32'.")
    workspace_limit = _field("workspace_limit", "Upper bound in bytes on one call's temporary buffers.")
    benchmark = _field("benchmark", "Time every eligible algorithm once per signature (auto only).")
    benchmark_cache = _field("benchmark_cache", "A JSON file keeping benchmark winners across processes.")

    def __init__(self):
        object.__setattr__(self, "_defaults", {"precision": "ieee", "workspace_limit": 1 << 30, "benchmark": False,
                                                "benchmark_cache": None})
        object.__setattr__(self, "_version", 0)
        self._refresh()

    def _refresh(self) -> None:
        """Rebuild the defaults' ``Settings`` after a change (a new version: blocks rebuild theirs on next read)."""
        object.__setattr__(self, "_version", self._version + 1)
        object.__setattr__(self, "_settings", Settings(**self._defaults))

    def settings(self) -> Settings:
        """The settings in force in this context, as one frozen value (one lookup once made: the entry points'
        per-call read)."""
        block = _overrides.get()
        if block is None:
            return self._settings
        version, settings = block.cached
        if version != self._version:
            version = self._version
            settings = Settings(**{**self._defaults, **block.changes})
            block.cached = (version, settings)
        return settings

    def __setattr__(self, name, value):
        if name not in _FIELDS:
            raise AttributeError(f"cuconv.config has no setting {name!r}; the settings are {', '.join(_FIELDS)}")
        object.__setattr__(self, name, value)

    @contextlib.contextmanager
    def __call__(self, **changes: Any) -> Iterator[None]:
        """Change defaults in this context for a block: ``with cuconv.config(workspace_limit=1 << 28): ...``.
        Every value is checked first: a bad one changes nothing."""
        unknown = set(changes) - set(_FIELDS)
        if unknown:
            raise TypeError(f"config() got unexpected keyword argument(s) {sorted(unknown)}")
        checked = {name: _valid(name, value) for name, value in changes.items()}
        outer = _overrides.get()
        token = _overrides.set(_Block({**(outer.changes if outer is not None else {}), **checked}))
        try:
            yield self
        finally:
            _overrides.reset(token)

    def __repr__(self) -> str:
        return (f"cuconv.config(precision={self.precision!r}, workspace_limit={self.workspace_limit}, "
                f"benchmark={self.benchmark}, benchmark_cache={self.benchmark_cache!r})")


config = _Config()
