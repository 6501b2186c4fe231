"""Every ``kernels_cu/**/*.cu`` compiles with NVRTC for sm_90 and sm_80 on a machine with no GPU.

CuPy's own compile path asks the device for its architecture, so CI compiles through ``cuda.core`` instead,
from the source the loader builds (``_loader.kernel_source``) and the options it passes
(``_loader.compile_options()`` plus what CuPy adds implicitly, ``_loader.CUPY_IMPLICIT_OPTIONS``). Every
name expression of the kernel's Python twin must come back mangled and present in the cubin.

Without ``cuda.core`` or NVRTC these tests skip with the reason, except where ``CI`` is set: there a skip is
not a pass, and they fail. The helpers below are also run from a freshly installed wheel by
``test_wheel.py``, so they import ``cuconv`` lazily, from wherever the interpreter finds it.
"""

from __future__ import annotations

import functools
import importlib
import io
import os
import pathlib
import shutil

import numpy
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
REPO_KERNELS = REPO / "kernels_cu"
KERNEL_STEMS = sorted(p.relative_to(REPO_KERNELS).with_suffix("").as_posix() for p in REPO_KERNELS.rglob("*.cu"))
# Hopper (the GPUs we run on) and Ampere (the oldest architecture we promise to build for).
ARCHS = ("sm_90", "sm_80")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def skip_or_fail(reason: str):
    """Skip with ``reason``; under CI, fail instead: a skip is not a pass."""
    __tracebackhide__ = True  # report the caller's line
    if in_ci():
        pytest.fail(f"{reason} (CI is set: a skip is not a pass)", pytrace=False)
    pytest.skip(reason)


@functools.lru_cache(maxsize=None)
def nvrtc_unavailable_reason():
    """None when cuda.core, NVRTC and the CUDA headers work here; otherwise why not."""
    try:
        import cuda.pathfinder
        from cuda.core import Program, ProgramOptions
    except Exception as exc:  # ImportError, or a cuda-bindings/cuda-core version mismatch
        return (f"cuda.core is not importable ({type(exc).__name__}: {exc}); "
                "install cuconv[test] (cuda-core, cuda-bindings, nvidia-cuda-nvrtc, nvidia-cuda-runtime)")
    try:
        cuda_include_dir()
        Program('extern "C" __global__ void probe() {}', "c++", ProgramOptions(arch="sm_80")).compile("cubin")
    except Exception as exc:  # DynamicLibNotFoundError for libnvrtc, headers missing, ...
        return f"NVRTC cannot compile here ({type(exc).__name__}: {exc}); install nvidia-cuda-nvrtc"
    return None


@functools.lru_cache(maxsize=None)
def cuda_include_dir() -> str:
    """The CUDA runtime headers (cuda_fp16.h, cuda_bf16.h): CuPy adds the same directory itself."""
    import cuda.pathfinder

    include = cuda.pathfinder.find_nvidia_header_directory("cudart")
    if include is None or not (pathlib.Path(include) / "cuda_fp16.h").is_file():
        raise FileNotFoundError(f"CUDA runtime headers (cuda_fp16.h) not found (cuda.pathfinder: {include!r}); "
                                "install nvidia-cuda-runtime")
    return include


def nvrtc_options(arch: str, name: str):
    """``ProgramOptions`` equivalent to what ``cupy.RawModule`` passes NVRTC for ``_loader.load`` of
    ``kernels_cu/<name>.cu`` on a device of ``arch`` (the loader may name an arch-specific target)."""
    from cuda.core import ProgramOptions

    from cuconv import _loader

    include_path, define_macro = [], []
    for opt in _loader.compile_options(name, arch.removeprefix("sm_")):
        if opt.startswith("-arch=sm_"):  # an arch-specific target (sm_90a) of this family
            arch = opt.removeprefix("-arch=")
        elif opt.startswith("-I") and len(opt) > 2:
            include_path.append(opt[2:])
        elif opt.startswith("-D") and len(opt) > 2:
            macro, eq, value = opt[2:].partition("=")
            define_macro.append((macro, value) if eq else macro)
        else:  # a new kind of option must be mirrored here, or CI would compile something else
            raise AssertionError(f"nvrtc_options does not know how to translate the loader option {opt!r}")
    include_path.append(cuda_include_dir())
    return ProgramOptions(name=name, arch=arch, include_path=include_path, define_macro=define_macro,
                          **_loader.CUPY_IMPLICIT_OPTIONS)


def twin_name_expressions(stem: str) -> tuple:
    """``NAME_EXPRESSIONS`` of the Python twin (``_loader.twin_module``) of ``kernels_cu/<stem>.cu``."""
    from cuconv import _loader

    module = _loader.twin_module(stem)
    try:
        twin = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        raise AssertionError(f"kernels_cu/{stem}.cu has no Python twin {module}") from None
    assert getattr(twin, "STEM", None) == stem, f"{module}.STEM should be {stem!r}"
    names = getattr(twin, "NAME_EXPRESSIONS", None)
    assert isinstance(names, tuple) and names and all(isinstance(n, str) for n in names), (
        f"{module}.NAME_EXPRESSIONS should be a non-empty tuple of str, got {names!r}")
    assert len(set(names)) == len(names), f"{module}.NAME_EXPRESSIONS has duplicates"
    return names


def compile_kernel(stem: str, arch: str) -> dict:
    """Compile ``kernels_cu/<stem>.cu`` as the loader would, for ``arch``; {name expression: mangled name}."""
    from cuda.core import Program

    from cuconv import _loader

    names = twin_name_expressions(stem)
    log = io.StringIO()
    program = Program(_loader.kernel_source(stem), "c++", nvrtc_options(arch, stem))
    # Raises NVRTCError with the compiler log in its message; ``logs`` only gets warnings of a success.
    obj = program.compile("cubin", name_expressions=names, logs=log)
    # ObjectCode.get_kernel needs a CUDA driver; symbol_mapping is NVRTC's own answer and needs none.
    mangled = {name: obj.symbol_mapping.get(name) for name in names}
    missing = [name for name, sym in mangled.items() if not sym]
    assert not missing, f"{stem}.cu ({arch}): NVRTC returned no mangled name for {missing}"
    cubin = bytes(obj.code)
    absent = [name for name, sym in mangled.items() if sym not in cubin]
    assert not absent, f"{stem}.cu ({arch}): the cubin has no symbol for {absent}"
    warnings = log.getvalue().replace("\x00", "").strip()  # NVRTC's log ends in a NUL
    assert not warnings, f"{stem}.cu ({arch}) compiled with warnings:\n{warnings}"
    return {name: sym.decode() for name, sym in mangled.items()}


@pytest.fixture(scope="module")
def nvrtc():
    reason = nvrtc_unavailable_reason()
    if reason is not None:
        skip_or_fail(reason)


def test_kernel_files_found():
    assert KERNEL_STEMS, f"no kernels found in {REPO_KERNELS}"
    assert (REPO_KERNELS / "common.cuh").is_file()


def test_loader_reads_this_checkout():
    from cuconv import _loader

    assert _loader.KERNEL_DIR.resolve() == REPO_KERNELS, (
        f"cuconv was imported from {_loader.__file__}, not from this checkout {REPO}")


@pytest.mark.parametrize("stem", KERNEL_STEMS)
def test_kernel_has_python_twin(stem):
    twin_name_expressions(stem)


def test_structs_match_the_kernels():
    """The structs the plans pass by value (one launch argument instead of 6 to 17): the NumPy dtypes have the
    fields, types and sizes of the kernels' structs, whose sizes the sources static_assert (the compile tests
    build them)."""
    import re

    from cuconv import _loader
    from cuconv.blocks import col2im, dgrad_forward, epilogue
    from cuconv.algos import depthwise, direct_smem, grouped_direct, grouped_mma, winograd, winograd_fused
    from cuconv.algos.implicit_gemm import launch, pack, wgrad_tma

    types = {"int": numpy.int32, "long long": numpy.int64, "float": numpy.float32, "double": numpy.float64}
    for stem, dtype, struct in (("implicit_gemm/pack", pack.PACK_SHAPE_DTYPE, "PackShape"),
                                ("implicit_gemm/igemm.cuh", launch.GEOMETRY_DTYPE, "Geometry"),
                                ("implicit_gemm/igemm.cuh", launch.EPILOGUE_DTYPE, "Epilogue"),
                                ("epilogue.cuh", epilogue.EPILOGUE_ARGS_DTYPE, "EpilogueArgs"),
                                ("implicit_gemm/pack", pack.SPLIT_SUM_DTYPE, "SplitSum"),
                                ("implicit_gemm/pack", pack.PHASE_WEIGHTS_DTYPE, "PhaseWeights"),
                                ("implicit_gemm/pack", pack.SWAP_SHAPE_DTYPE, "SwapShape"),
                                ("implicit_gemm/wgrad_tma", wgrad_tma.WGRAD_TMA_GEOMETRY_DTYPE, "WgradTmaGeometry"),
                                ("implicit_gemm/pack", pack.BLOCK_DIAGONAL_DTYPE, "BlockDiagonal"),
                                ("blocks/dgrad_forward", dgrad_forward.FLIP_SHAPE_DTYPE, "FlipShape"),
                                ("depthwise/depthwise.cuh", depthwise.DW_GEOMETRY_DTYPE, "DwGeometry"),
                                ("depthwise/depthwise.cuh", depthwise.DW_WORK_DTYPE, "DwWork"),
                                ("blocks/col2im", col2im.COL2IM_CHUNK_DTYPE, "Col2imChunk"),
                                ("direct_smem", direct_smem.DIRECT_SMEM_TILING_DTYPE, "DirectSmemTiling"),
                                ("grouped_direct", grouped_direct.GROUPED_TILING_DTYPE, "GroupedTiling"),
                                ("grouped_mma", grouped_mma.GROUPED_MMA_TILING_DTYPE, "GroupedMmaTiling"),
                                ("winograd", winograd.WINO_CHUNK_DTYPE, "WinoChunk"),
                                ("winograd_fused", winograd_fused.FUSED_TILES_DTYPE, "FusedTiles"),
                                ("common.cuh", _loader._conv_geometry_dtype(), "ConvGeometry")):
        source = (REPO_KERNELS / (stem if stem.endswith(".cuh") else f"{stem}.cu")).read_text()
        body = re.search(r"struct %s \{(.*?)\};" % struct, source, re.S).group(1)
        fields = [(name.strip(), types[kind]) for kind, names in re.findall(r"(long long|int|float|double) ([^;]+);", body)
                  for name in names.split(",")]
        assert [(name, dtype.fields[name][0]) for name in dtype.names] == fields
        assert re.search(r"sizeof\(%s\) == %d\b" % (struct, dtype.itemsize), source)


def compile_all(jobs, workers=None) -> dict:
    """{(stem, arch): future of ``compile_kernel``} on a thread pool: NVRTC releases the GIL, so the
    compiles run side by side (largest source first), one per core."""
    import concurrent.futures

    from cuda.core import Program  # noqa: F401  imported here first: concurrent first imports race

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1)
    jobs = sorted(jobs, key=lambda job: -(REPO_KERNELS / f"{job[0]}.cu").stat().st_size)
    futures = {job: pool.submit(compile_kernel, *job) for job in jobs}
    pool.shutdown(wait=False)
    return futures


@pytest.fixture(scope="module")
def compiled(nvrtc):
    return compile_all([(stem, arch) for stem in KERNEL_STEMS for arch in ARCHS])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("stem", KERNEL_STEMS)
def test_kernel_compiles(compiled, stem, arch):
    compiled[(stem, arch)].result()


def test_options_match_the_loader(nvrtc):
    """Every loader option and CuPy's implicit ones reach NVRTC, in NVRTC's own spelling."""
    from cuconv import _loader

    flags = [f.decode() for f in nvrtc_options("sm_90", "probe").as_bytes("nvrtc")]
    # What CuPy 14 adds to every RawModule: spelled out here, not read back from the loader.
    expected = ["-arch=sm_90", "--std=c++17", "--ftz=true", f"--include-path={cuda_include_dir()}"]
    for opt in _loader.compile_options():
        expected.append(("--include-path=" if opt.startswith("-I") else "--define-macro=") + opt[2:])
    assert sorted(flags) == sorted(expected)


@pytest.mark.parametrize("arch", ARCHS)
def test_arch_specific_families_target_sm_90a_on_hopper_only(nvrtc, arch):
    from cuconv import _loader

    for stem in KERNEL_STEMS:
        flags = [f.decode() for f in nvrtc_options(arch, stem).as_bytes("nvrtc")]
        specific = _loader.arch_specific(stem) and arch == "sm_90"
        assert f"-arch={arch}a" in flags if specific else f"-arch={arch}" in flags, (stem, flags)


def test_nvrtc_builds_sm_90a_when_cupy_appends_sm_90(nvrtc):
    """CuPy adds its own -arch=sm_90 after the loader's -arch=sm_90a; NVRTC must still build sm_90a code."""
    from cuda.bindings import nvrtc as nv

    src = b"#ifndef __CUDA_ARCH_FEAT_SM90_ALL\n#error not sm_90a\n#endif\n__global__ void probe() {}\n"
    err, prog = nv.nvrtcCreateProgram(src, b"probe.cu", 0, [], [])
    assert err == nv.nvrtcResult.NVRTC_SUCCESS
    try:
        (result,) = nv.nvrtcCompileProgram(prog, 2, [b"-arch=sm_90a", b"-arch=sm_90"])
        assert result == nv.nvrtcResult.NVRTC_SUCCESS
    finally:
        nv.nvrtcDestroyProgram(prog)


def test_compile_error_names_the_file(nvrtc, tmp_path, monkeypatch):
    """A syntax error is reported at its real file and line, through the loader's ``#line`` prefix."""
    from cuda.core import Program

    from cuconv import _loader

    shutil.copy(_loader.KERNEL_DIR / "common.cuh", tmp_path / "common.cuh")
    broken = tmp_path / "broken.cu"
    broken.write_text('#include "common.cuh"\n'
                      "template <typename T>\n"
                      "__global__ void broken(T* x) {\n"
                      "    x[0] = ;\n"  # line 4
                      "}\n")
    monkeypatch.setattr(_loader, "KERNEL_DIR", tmp_path)
    source = _loader.kernel_source("broken")
    assert source.startswith(f'#line 1 "{broken}"\n')
    log = io.StringIO()
    with pytest.raises(Exception) as excinfo:
        Program(source, "c++", nvrtc_options("sm_90", "broken")).compile(
            "cubin", name_expressions=("broken<float>",), logs=log)
    message = f"{excinfo.value}\n{log.getvalue()}"
    assert f"{broken}(4): error" in message, message
