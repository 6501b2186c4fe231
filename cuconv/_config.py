"""Process-wide defaults, changeable for a block with ``with cuconv.config(precision="tf32"): ...``."""

from __future__ import annotations

import contextlib
import os
import threading

__all__ = ["config", "PRECISIONS"]

PRECISIONS = ("ieee", "tf32")


class _Config:
    """cuconv's defaults.

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

    _lock = threading.Lock()

    def __init__(self):
        self._precision = "ieee"
        self._workspace_limit = 1 << 30
        self._benchmark = False
        self._benchmark_cache = None

    @property
    def benchmark(self) -> bool:
        return self._benchmark

    @benchmark.setter
    def benchmark(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"benchmark must be a bool, got {type(value).__name__}")
        self._benchmark = value

    @property
    def benchmark_cache(self):
        return self._benchmark_cache

    @benchmark_cache.setter
    def benchmark_cache(self, value) -> None:
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"benchmark_cache must be a path or None, got {type(value).__name__}")
        self._benchmark_cache = None if value is None else os.fspath(value)

    @property
    def precision(self) -> str:
        return self._precision

    @precision.setter
    def precision(self, value: str) -> None:
        if value not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {value!r}")
        self._precision = value

    @property
    def workspace_limit(self) -> int:
        return self._workspace_limit

    @workspace_limit.setter
    def workspace_limit(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"workspace_limit must be a positive int (bytes), got {type(value).__name__} {value!r}")
        if value <= 0:
            raise ValueError(f"workspace_limit must be a positive int (bytes), got {value!r}")
        self._workspace_limit = value

    @contextlib.contextmanager
    def __call__(self, **changes):
        """Temporarily change defaults: ``with cuconv.config(workspace_limit=1 << 28): ...``."""
        unknown = set(changes) - {"precision", "workspace_limit", "benchmark", "benchmark_cache"}
        if unknown:
            raise TypeError(f"config() got unexpected keyword argument(s) {sorted(unknown)}")
        with self._lock:
            saved = {name: getattr(self, name) for name in changes}
            try:
                for name, value in changes.items():
                    setattr(self, name, value)
            except Exception:  # a bad value: undo the ones already applied, change nothing
                for name, value in saved.items():
                    setattr(self, name, value)
                raise
        try:
            yield self
        finally:
            with self._lock:
                for name, value in saved.items():
                    setattr(self, name, value)

    def __repr__(self) -> str:
        return (f"cuconv.config(precision={self.precision!r}, workspace_limit={self.workspace_limit}, "
                f"benchmark={self.benchmark}, benchmark_cache={self.benchmark_cache!r})")


config = _Config()
