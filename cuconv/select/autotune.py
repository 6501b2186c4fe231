"""``cuconv.config.benchmark``: time every eligible algorithm, with each of its knobs, once per problem and remember
the fastest.

Like ``torch.backends.cudnn.benchmark``: the first call with a given signature (device name, dtype,
precision, pass and the full geometry ``ConvSpec``) runs each candidate on the real inputs, timed with CUDA
events on the current stream, and every later call with that signature runs the winner. A candidate is a
``cuconv.select.Choice``: an algorithm that can implement the problem with one of its knob settings
(``Algorithm.knobs``: implicit_gemm's tiles, for instance), the selector's own choice among them. Winners live in
memory for the process and, where ``cuconv.config.benchmark_cache`` names a file, also on disk (JSON: ``"name"``
or ``"name[knob=value,...]"``), so a later process on the same kind of device skips the timing. The file is a
cache, never an authority: an entry that names no candidate of its case (an algorithm that cannot serve it,
knobs it does not offer) is timed afresh, entries it did not write are kept, a damaged file is moved aside with
a warning, one that cannot be read is left alone, and writers (threads and processes) lock, merge and replace it
atomically; a location that cannot be written costs a warning, not the call. Entries carry the device name:
another device misses and times again. During CUDA-graph capture nothing is timed (that would
synchronise): a signature timed before runs its winner, one never timed the heuristic choice.

The configuration arrives as arguments (the caller's ``cuconv._config.Settings`` and ``cuconv._plan.Env``):
nothing here reads ``cuconv.config``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import tempfile
import threading
import warnings
from typing import Callable, Dict, Optional

import numpy

from .. import _backend, algos as _algorithms
from ..problem import Problem
from ..spec import ConvSpec
from . import Choice, can_implement, knobs as _selector_knobs

__all__ = ["candidates", "choose", "pick", "signature", "clear", "time_cuda", "winner", "text", "parse"]

_winners: Dict[str, Choice] = {}
# The winners again by (device name, problem, environment, which decides what may run): a hit costs no text key
# and no re-validation.
_chosen: Dict[tuple, Choice] = {}
# pick's answers again, by the problem and the environment (device id, not name): a tuned layer called again
# costs one lookup, not the device's name and a key built again (host time on every call of a small layer).
_picked: Dict[tuple, Choice] = {}
_lock = threading.Lock()
_disk_lock = threading.Lock()  # the cache file's writers in this process (the file lock covers other processes)


def signature(device_name: str, dtype, precision: str, pass_: str, spec: ConvSpec) -> str:
    """The cache key: stable text, the same across processes."""
    names = sorted(f.name for f in dataclasses.fields(spec))  # the fields only, not cached derived sizes
    fields = ",".join(f"{name}={getattr(spec, name)}" for name in names)
    return f"{device_name}|{numpy.dtype(dtype).name}|{precision}|{pass_}|{fields}"


def clear() -> None:
    """Forget every winner held in memory (the disk cache is left alone)."""
    with _lock:
        _winners.clear()
        _chosen.clear()
        _picked.clear()


_DAMAGED = object()  # _read_disk's answer for a file that holds no JSON object


def _read_disk(path: str):
    """The cache file's JSON object as it is (every entry, cuconv's or not); {} where the file is missing; None
    where it exists but cannot be read (it is then never replaced); ``_DAMAGED`` where it is not a JSON object
    (truncated, malformed, nested deeper than the parser goes, another type)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError):  # a directory, no permission, not text
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return _DAMAGED
    return data if isinstance(data, dict) else _DAMAGED


def _load_disk(path: str) -> Optional[Dict[str, str]]:
    """The cache file's entries that can be winners (pairs of strings): {} where the file is missing or damaged;
    None where it cannot be read."""
    data = _read_disk(path)
    if data is None or data is _DAMAGED:
        return None if data is None else {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


@contextlib.contextmanager
def _file_lock(path: str):
    """Exclusive use of the cache file across threads and processes: a lock file beside it (``flock``; opened
    without following a symbolic link), where the platform has one."""
    with _disk_lock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: threads only
            yield
            return
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # (releases the lock)


def _store_disk(path: str, key: str, name: str) -> None:
    """Add one winner to the cache file: read, merge and replace under the file lock, through a fresh temporary
    file in the same directory (``mkstemp``: a unique name, created exclusively), so that concurrent writers
    keep each other's entries and readers never see half a file. Entries cuconv did not write stay as they are;
    a damaged file is moved aside (``<path>.damaged``) with a warning before a new one is written. A location
    that cannot be written is a warning, not an error: the winner is still used from memory."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        with _file_lock(path):
            data = _read_disk(path)
            if data is _DAMAGED:
                aside = f"{path}.damaged"
                os.replace(path, aside)
                warnings.warn(f"cuconv: the autotune cache {path} holds no JSON object (truncated or damaged); it "
                              f"was moved to {aside} and a new one started", RuntimeWarning, stacklevel=3)
                data = {}
            if data is None:
                warnings.warn(f"cuconv: the autotune cache {path} cannot be read; it is left as it is and this "
                              f"process keeps its choices in memory", RuntimeWarning, stacklevel=3)
                return
            data[key] = name
            fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(data, fh, indent=1, sort_keys=True)
                os.replace(tmp, path)  # atomic: readers see the old file or the new one
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
    except OSError as exc:
        warnings.warn(f"cuconv: could not write the autotune cache {path} ({exc}); this process keeps its "
                      f"choices in memory", RuntimeWarning, stacklevel=3)


def time_cuda(run: Callable[[], None], reps: int = 3, warmup: int = 1, calls: int = 1) -> float:
    """Median milliseconds of ``run`` on CuPy's current stream, timed with CUDA events after warm-up; with
    ``calls`` > 1, of ``calls`` runs back to back between the two events, per run.

    The one timer of cuconv: the autotuner and ``python -m cuconv bench`` both use it.
    """
    import cupy

    stream = cupy.cuda.get_current_stream()
    for _ in range(warmup):
        run()
    times = []
    for _ in range(reps):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        for _ in range(calls):
            run()
        stop.record(stream)
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / calls)
    return statistics.median(times)


def _candidate_time(run: Callable[[], None]) -> float:
    """The autotuner's time of one candidate: after two warm-up calls (compiles, allocations), the median
    per-call time of calls back to back, as many as fill ~2 ms. A single call of a small layer is mostly
    host time and its noise: timed one call at a time, the tuner picked algorithms measurably slower than the
    best (docs/perf-notes.md)."""
    one = time_cuda(run, reps=1, warmup=2)
    return time_cuda(run, reps=3, warmup=0, calls=max(1, min(20, int(2.0 / max(one, 1e-3)))))


def candidates(problem: Problem, env) -> list:
    """Every ``Choice`` that can run ``problem`` on ``env``: each algorithm of its pass that can implement it, with
    each of its knob settings (the selector's knobs filled in where a setting leaves one out)."""
    out = []
    for name in _algorithms.names(problem.pass_):
        if can_implement(name, problem, env) is not None:
            continue
        chosen = dict(_selector_knobs(name, problem, env))
        for setting in _algorithms.get(name).knobs(problem, env):
            out.append(Choice(name, tuple(sorted({**chosen, **setting}.items()))))
    return list(dict.fromkeys(out))


def text(choice: Choice) -> str:
    """``choice`` as the cache file holds it: ``name`` or ``name[knob=value,...]``."""
    knobs = _algorithms.get(choice.name).knob_text(dict(choice.knobs)) if choice.knobs else ""
    return f"{choice.name}[{knobs}]" if knobs else choice.name


def parse(entry: str, options: list) -> Optional[Choice]:
    """The candidate of ``options`` a cache entry names, or None: ``text`` of one, or a bare algorithm name (an
    entry of a cache written before knobs were timed: that algorithm with the selector's knobs, its first)."""
    for choice in options:
        if text(choice) == entry:
            return choice
    return next((c for c in options if c.name == entry), None)


def choose(problem: Problem, env, run: Callable[[Choice], None], device_name: str, cache: Optional[str] = None,
           timer: Optional[Callable[[Callable[[], None]], float]] = None) -> Choice:
    """The fastest candidate for this signature, timing each (``run(choice)``) on a miss; ``cache``: the disk
    cache's path (``config.benchmark_cache``), or None."""
    fast_key = (device_name, problem, env)
    choice = _chosen.get(fast_key)
    if choice is not None:
        return choice
    choice = _choose(problem, env, run, device_name, cache, timer)
    with _lock:
        _chosen[fast_key] = choice
    return choice


def _choose(problem: Problem, env, run, device_name, cache, timer) -> Choice:
    key = signature(device_name, problem.dtype, problem.precision, problem.pass_, problem.spec)
    ep = problem.epilogue
    if ep.fused:  # (an activation or residual pass changes what is timed: its own entry)
        key += f"|{ep.activation},{ep.alpha},{ep.residual}"
    options = candidates(problem, env)
    with _lock:
        choice = _winners.get(key)
    if choice not in options:  # (none yet, or a winner of another environment: another workspace limit, say)
        entry = (_load_disk(cache) or {}).get(key) if cache else None
        choice = None if entry is None else parse(entry, options)
    if choice is not None:
        with _lock:
            _winners[key] = choice
        return choice
    timer = timer or _candidate_time
    timings = {c: timer(lambda c=c: run(c)) for c in options}
    choice = min(timings, key=timings.get)
    with _lock:
        _winners[key] = choice
    if cache:
        _store_disk(cache, key, text(choice))
    return choice


def winner(spec: ConvSpec, dtype, precision: str, pass_: str) -> Optional[Choice]:
    """The ``Choice`` the autotuner made for this signature on the current device in this process, or None
    (nothing timed yet): what ``auto`` runs with ``config.benchmark`` on."""
    with _lock:
        return _winners.get(signature(_device_name(), dtype, precision, pass_, spec))


_device_names: Dict[int, str] = {}


def _device_name() -> str:
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    name = _device_names.get(dev)
    if name is None:
        raw = cupy.cuda.runtime.getDeviceProperties(dev)["name"]
        name = _device_names[dev] = raw.decode() if isinstance(raw, bytes) else str(raw)
    return name


def pick(requested: str, heuristic: str, problem: Problem, env, settings, run: Callable[[Choice], None]) -> Choice:
    """The ``Choice`` a GPU call runs under ``settings`` (``cuconv._config.Settings``): ``heuristic`` with the
    selector's knobs unless ``auto`` was asked with ``settings.benchmark`` on, in which case the timed winner. A
    signature not timed yet is timed now, unless the stream is being captured into a CUDA graph (timing would
    synchronise): then the heuristic runs. A winner known already runs inside a capture too: nothing needs timing."""
    if requested != "auto" or not settings.benchmark:
        return Choice(heuristic, _selector_knobs(heuristic, problem, env))
    key = (problem, env)
    choice = _picked.get(key)
    if choice is not None:
        return choice
    cupy = _backend.cupy_or_none()
    stream = cupy.cuda.get_current_stream().ptr
    if stream and cupy.cuda.runtime.streamIsCapturing(stream) != 0:
        return Choice(heuristic, _selector_knobs(heuristic, problem, env))
    choice = choose(problem, env, run, _device_name(), settings.benchmark_cache)
    with _lock:
        _picked[key] = choice
    return choice
