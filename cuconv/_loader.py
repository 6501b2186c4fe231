"""The one place kernel sources are read and compiled.

``load(stem, name_expressions)`` reads ``kernels_cu/<stem>.cu``, prepends ``#line 1 "<path>"`` so compiler
errors name the real file and line, compiles it with ``cupy.RawModule`` (CuPy's on-disk cache applies),
and memoizes the module per device. ``get_function`` compiles each kernel alone, on first use: a process
builds only the instances it runs, and threads warming up different layers compile at once.
``compile_options()`` is also what the CPU-only compile check in the test suite passes to NVRTC, so CI builds
exactly what the GPU will.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pathlib
import tempfile
import threading
import warnings

from . import _plan

__all__ = ["KERNEL_DIR", "kernel_dir", "arch_specific", "twin_module", "kernel_stems", "kernel_source", "compile_options", "load", "get_function",
           "KernelLaunchError", "PreparedLaunch", "prepare", "smem_limit", "SMEM_DEFAULT"]

SMEM_DEFAULT = 48 << 10  # dynamic shared memory a block gets without opting in
# The block of the one-dimensional kernels (grid-stride loops, per-row passes): their __launch_bounds__(256),
# kThreads in direct_smem.cu, kBiasGradThreads in bias.cu.
THREADS = 256


# cuconv::ConvGeometry in kernels_cu/common.cuh: a ConvSpec as one struct argument.
CONV_GEOMETRY_FIELDS = ("n", "c", "h", "w", "k", "p", "q", "r", "s", "groups", "stride_h", "stride_w", "pad_top",
                        "pad_left", "dil_h", "dil_w")


@functools.lru_cache(maxsize=None)
def _conv_geometry_dtype():
    import numpy

    return numpy.dtype([(f, numpy.int64) for f in CONV_GEOMETRY_FIELDS])


def conv_geometry(spec):
    """``spec`` (a ConvSpec) as a ``cuconv::ConvGeometry`` value for a launch's scalars."""
    import numpy

    return numpy.array((spec.n, spec.c, spec.h, spec.w, spec.k, spec.p, spec.q, spec.r, spec.s, spec.groups,
                        spec.stride[0], spec.stride[1], spec.pad[0], spec.pad[2], spec.dilation[0],
                        spec.dilation[1]), dtype=_conv_geometry_dtype())[()]


def blocks(n: int, cap: int = 1 << 16, threads: int = THREADS) -> int:
    """Blocks of ``threads`` covering ``n`` items one a thread, at least one, at most ``cap`` (None: no cap;
    a grid-stride loop walks the rest)."""
    count = -(-n // threads)
    return max(1, count if cap is None else min(cap, count))

_HERE = pathlib.Path(__file__).resolve().parent


def kernel_dir() -> pathlib.Path:
    """``kernels_cu/``: inside the installed package (wheel) or beside it (source checkout)."""
    for candidate in (_HERE / "kernels_cu", _HERE.parent / "kernels_cu"):
        if (candidate / "common.cuh").is_file():
            return candidate
    raise FileNotFoundError(f"cuconv: kernels_cu/ not found next to {_HERE}; the installation is broken")


KERNEL_DIR = kernel_dir()


def twin_module(stem: str) -> str:
    """The Python module that plans the kernels of ``kernels_cu/<stem>.cu`` (its ``STEM`` and ``NAME_EXPRESSIONS``):
    ``blocks/<name>`` -> ``cuconv.blocks.<name>``, any other ``<path>`` -> ``cuconv.algos.<path>`` (a folder
    of ``kernels_cu/`` is the package of one algorithm's engines)."""
    return "cuconv." + (stem if stem.startswith("blocks/") else "algos/" + stem).replace("/", ".")


def kernel_stems() -> tuple:
    """Every ``kernels_cu/**/<stem>.cu`` as its stem (a path relative to ``kernels_cu/``, without ``.cu``)."""
    return tuple(sorted(p.relative_to(KERNEL_DIR).with_suffix("").as_posix() for p in KERNEL_DIR.rglob("*.cu")))


def kernel_source(stem: str) -> str:
    """Source of ``kernels_cu/<stem>.cu`` with a ``#line`` directive naming the real file."""
    path = KERNEL_DIR / f"{stem}.cu"
    return f'#line 1 "{path}"\n' + path.read_text()


@functools.lru_cache(maxsize=None)
def _headers_digest() -> str:
    # CuPy's disk cache keys on source and options, not on included headers: fold their content
    # into a -D option so that editing common.cuh recompiles every kernel.
    h = hashlib.sha256()
    for header in sorted(KERNEL_DIR.rglob("*.cuh")):
        h.update(header.relative_to(KERNEL_DIR).as_posix().encode())
        h.update(header.read_bytes())
    return h.hexdigest()[:16]


# Sources with instructions of compute capability 9.0 only (wgmma, the TMA): a stem equal to one of these or
# inside one of these folders. On such a device they compile for the arch-specific target sm_90a; CuPy appends
# its own -arch=sm_90 after ours, and NVRTC then builds for sm_90a.
ARCH_SPECIFIC_STEMS = frozenset({"implicit_gemm"})


def arch_specific(stem: str) -> bool:
    """Whether ``kernels_cu/<stem>.cu`` compiles for sm_90a on a device of compute capability 9.0."""
    return stem.split("/", 1)[0] in ARCH_SPECIFIC_STEMS


def compile_options(stem: str = None, compute_capability: str = None) -> tuple:
    """NVRTC options we add for ``kernels_cu/<stem>.cu`` on a device of ``compute_capability`` ("90");
    CuPy itself adds ``--std=c++17``, ``-ftz=true`` and ``-arch=sm_XX``."""
    options = (f"-I{KERNEL_DIR}", f"-DCUCONV_HEADERS_DIGEST=0x{_headers_digest()}")
    if stem is not None and arch_specific(stem) and compute_capability == "90":
        options += ("-arch=sm_90a",)
    return options


# CuPy's own additions, mirrored by the compile check that runs without a GPU.
CUPY_IMPLICIT_OPTIONS = {"std": "c++17", "ftz": True}

_modules = {}
_functions = {}
_lock = threading.Lock()  # guards _module_locks
_module_locks = {}  # (stem, name_expressions, device) -> the lock its one compile holds


def load(stem: str, name_expressions: tuple):
    """The ``cupy.RawModule`` for ``kernels_cu/<stem>.cu`` on the current device (memoized)."""
    import cupy

    device = cupy.cuda.runtime.getDevice()
    key = (stem, name_expressions, device)
    module = _modules.get(key)
    if module is None:
        # one lock per module: threads compiling different modules run NVRTC at once (it releases the GIL),
        # threads asking for the same one wait for its single compile
        with _lock:
            module_lock = _module_locks.setdefault(key, threading.Lock())
        with module_lock:
            module = _modules.get(key)
            if module is None:
                cc = cupy.cuda.Device(device).compute_capability
                module = cupy.RawModule(code=kernel_source(stem), options=compile_options(stem, cc),
                                        name_expressions=name_expressions)
                _with_writable_cache(module.compile)  # (CuPy compiles lazily: here, under the module's lock)
                _modules[key] = module
    return module


def compile_all(threads: int = 16) -> tuple:
    """Every kernel instance of every source (``kernel_stems``, their twins' ``NAME_EXPRESSIONS``) compiled for the
    current device, ``threads`` at a time (NVRTC releases the GIL), into this process and CuPy's disk cache: what a
    machine with an empty cache does once before a test run, instead of compiling each instance where a test first
    calls it. Returns (instances, the exceptions of those that failed)."""
    import concurrent.futures
    import importlib

    import cupy

    device = cupy.cuda.runtime.getDevice()
    jobs = [(stem, name, importlib.import_module(twin_module(stem)).NAME_EXPRESSIONS) for stem in kernel_stems()
            for name in importlib.import_module(twin_module(stem)).NAME_EXPRESSIONS]

    def one(stem, name, names):
        with cupy.cuda.Device(device):
            get_function(stem, names, name)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        futures = [pool.submit(one, *job) for job in jobs]
    return len(jobs), [f.exception() for f in futures if f.exception() is not None]


def get_function(stem: str, name_expressions: tuple, name: str):
    """A kernel of ``kernels_cu/<stem>.cu`` for the current device; ``name`` is one of the family's
    ``name_expressions`` (all of which CI compiles) and is compiled alone, in a module of its own.

    Why alone: a family's instances compiled as one module cost the first call all of them (the 33 of
    ``implicit_gemm`` take seconds of NVRTC), and one module cannot be built by several threads at once."""
    import cupy

    key = (stem, name, cupy.cuda.runtime.getDevice())
    fn = _functions.get(key)
    if fn is None:
        if name not in name_expressions:
            raise ValueError(f"cuconv: {name} is not an instance of kernels_cu/{stem}.cu")
        module = load(stem, (name,))
        fn = _with_writable_cache(lambda: module.get_function(name))  # (compiled in load: a lookup)
        _functions[key] = fn
    return fn


def _cupy_cache_dir() -> str:
    """The directory CuPy's kernel cache writes to now."""
    from cupy.cuda import compiler

    # CuPy 14 keeps the directory its disk backend was made with at import (CUPY_CACHE_DIR then); older CuPy
    # reads the variable on every compile
    backend_dir = getattr(getattr(compiler, "_kernel_cache_backend", None), "_cache_dir", None)
    if backend_dir is not None:
        return backend_dir
    return os.environ.get("CUPY_CACHE_DIR", os.path.expanduser("~/.cupy/kernel_cache"))


def _with_writable_cache(build):
    """``build()``; where it fails writing CuPy's kernel cache (a read-only or unusable ``CUPY_CACHE_DIR``), CuPy
    is pointed at a private writable cache for the rest of the process, with a warning, and ``build`` runs
    again. Every first use of a kernel would fail otherwise."""
    try:
        return build()
    except OSError as exc:
        cache = os.path.abspath(_cupy_cache_dir())
        where = os.path.abspath(os.fsdecode(exc.filename)) if exc.filename is not None else ""
        if not (where == cache or where.startswith(cache + os.sep)) or cache == _private_cache:
            raise
        _use_private_cache(cache, exc)
    return build()


_private_cache = None


def _use_private_cache(cache: str, exc: OSError) -> None:
    global _private_cache
    from cupy.cuda import compiler

    private = tempfile.mkdtemp(prefix="cuconv-kernel-cache-")
    os.environ["CUPY_CACHE_DIR"] = _private_cache = private
    backend = getattr(compiler, "_kernel_cache_backend", None)
    if getattr(backend, "_cache_dir", None) is not None:  # (see _cupy_cache_dir)
        backend._cache_dir = private
    warnings.warn(f"cuconv: CuPy's kernel cache {cache} cannot be written ({exc.strerror}); kernels compile into "
                  f"{private} for this process instead (set CUPY_CACHE_DIR to a writable directory to keep them)",
                  RuntimeWarning, stacklevel=4)


class KernelLaunchError(RuntimeError):
    """A cuconv kernel failed to launch; the message names the kernel."""


_smem_opted_in = {}  # id(function) -> (function, bytes opted into)


def smem_limit() -> int:
    """Dynamic shared memory a block may opt into on the current device; 227 KB (H100/H200) without one
    (``_plan.device_limits``, which keeps the devices' answers)."""
    return _plan.device_limits()[0]


def _opt_in(fn, nbytes: int) -> None:
    """Raise ``fn``'s dynamic shared-memory limit to ``nbytes`` (> 48 KB), once. The function objects are
    per device (``get_function``), so the key needs no device lookup."""
    done = _smem_opted_in.get(id(fn))
    if done is None or done[1] < nbytes:
        fn.max_dynamic_shared_size_bytes = nbytes
        _smem_opted_in[id(fn)] = (fn, nbytes)  # fn held: its id stays its own


_CUDA_ERROR_INVALID_CONTEXT = 201  # CUresult (cuda.h)


class PreparedLaunch:
    """A launch whose parameter buffer is built once: a kernel taking ``n_pointers`` pointers and then the
    ``scalars`` (NumPy scalars or structs, passed by value). A call ``launch(stream, *pointers)`` writes the
    pointers (ints) into the buffer and enqueues the kernel on ``stream`` (a raw ``cudaStream_t``) with one
    driver call.

    Why: CuPy's ``Function.__call__`` marshals every argument on every launch, 5.8-6.9 µs of host time for four
    pointers and a struct (H200 host), as long as a small layer's whole kernel runs. Calls from several
    threads are serialised around the shared buffer (the driver copies the parameters when it enqueues).
    Made on the device it launches on (the function handle belongs to that device's context)."""

    __slots__ = ("fn", "name", "grid", "block", "smem", "device", "_handle", "_pointers", "_n_pointers", "_keep",
                 "_params",
                 "_lock", "_driver", "_runtime")

    def __init__(self, fn, name: str, grid: tuple, block: tuple, n_pointers: int, scalars: tuple = (),
                 smem: int = 0):
        import numpy

        from . import _backend

        cuda = _backend.cupy_or_none().cuda
        self._driver, self._runtime = cuda.driver, cuda.runtime  # (an import statement per launch costs host time)
        self.fn, self.name, self.grid, self.block, self.smem = fn, name, tuple(grid), tuple(block), smem
        self.device = self._runtime.getDevice()
        self._handle = fn.kernel.ptr  # the CUfunction of the RawKernel (on the current device)
        # (a ctypes array: a call writes all its pointers with one slice assignment)
        self._pointers = (ctypes.c_uint64 * max(1, n_pointers))()
        self._n_pointers = n_pointers
        self._keep = [numpy.array(v) for v in scalars]  # 0-d arrays: stable storage of each value
        base = ctypes.addressof(self._pointers)
        addresses = [base + 8 * i for i in range(n_pointers)]
        addresses += [a.ctypes.data for a in self._keep]
        params = numpy.array(addresses, dtype=numpy.uint64)
        self._keep.append(params)
        self._params = int(params.ctypes.data)
        self._lock = threading.Lock()
        if smem > SMEM_DEFAULT:
            try:
                _opt_in(fn, smem)
            except Exception as exc:  # CUDADriverError: more than the device gives a block
                raise KernelLaunchError(f"cuconv: kernel {name} cannot have {smem} bytes of shared memory: "
                                        f"{exc}") from exc

    @property
    def n_pointers(self) -> int:
        """How many pointers a launch passes (every one, null included: a launch writes only those it is given)."""
        return self._n_pointers

    def __call__(self, stream: int, *pointers: int) -> None:
        self.launch(stream, pointers)

    def launch(self, stream: int, pointers, _after_set_device: bool = False) -> None:
        """``self(stream, *pointers)`` with the pointers as one sequence (what plans' steps call: no argument
        packing)."""
        (gx, gy, gz), (bx, by, bz) = self.grid, self.block
        try:
            with self._lock:
                self._pointers[:len(pointers)] = pointers
                self._driver.launchKernel(self._handle, gx, gy, gz, bx, by, bz, self.smem, stream, self._params, 0)
        except Exception as exc:  # CUDADriverError
            if _after_set_device or getattr(exc, "status", None) != _CUDA_ERROR_INVALID_CONTEXT:
                raise self._error(exc) from exc
            # A thread whose CUDA calls so far were all driver calls or none (a fresh Python thread, autograd's
            # device thread before any torch kernel ran on it) has no current context: torch's device guards
            # skip cudaSetDevice when the device number is already the current one. The runtime's
            # cudaSetDevice makes the device's primary context (torch's and CuPy's) current; then launch again.
            try:
                self._runtime.setDevice(self.device)
            except Exception as again:
                raise self._error(again) from again
            self.launch(stream, pointers, True)

    def _error(self, exc) -> KernelLaunchError:
        return KernelLaunchError(f"cuconv: launching kernel {self.name} with grid={self.grid}, block={self.block} "
                                 f"failed: {exc}")


def prepare(stem: str, name_expressions: tuple, name: str, grid: tuple, block: tuple, n_pointers: int,
            scalars: tuple = (), smem: int = 0) -> PreparedLaunch:
    """``PreparedLaunch`` of kernel ``name`` of ``kernels_cu/<stem>.cu`` on the current device."""
    return PreparedLaunch(get_function(stem, name_expressions, name), name, grid, block, n_pointers, scalars, smem)
