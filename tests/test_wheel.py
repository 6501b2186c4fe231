"""The wheel ships kernels_cu/ as cuconv/kernels_cu/, and an installed cuconv compiles every kernel from it.

Builds the wheel from a copy of this checkout (so a stale ``build/`` in the checkout can neither leak into
the wheel nor be written by concurrent runs), installs it into a fresh venv and, from a directory outside
the repository, imports cuconv from that venv and compiles every kernel through NVRTC exactly as
``test_kernels_compile.py`` does.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest

from test_kernels_compile import ARCHS, REPO, REPO_KERNELS, in_ci, nvrtc_unavailable_reason, skip_or_fail

pytestmark = pytest.mark.slow

# Runs in the fresh venv: lets it see this interpreter's packages (numpy, cuda.core) after its own, so that
# cuconv keeps coming from the wheel, then compiles every kernel the wheel ships. Appending to sys.path
# does not process .pth files, so an editable cuconv of this interpreter stays invisible. cuda.pathfinder
# looks for libnvrtc and the CUDA headers in site.getsitepackages(), built from site.PREFIXES: extend that too.
_SNIPPET = textwrap.dedent("""
    import importlib.util, json, site, sys

    args = json.loads(sys.argv[1])
    sys.path.extend(p for p in args["extra_path"] if p not in sys.path)
    site.PREFIXES.extend(p for p in args["extra_prefixes"] if p not in site.PREFIXES)
    import cuconv
    from cuconv import _loader

    report = {"cuconv": cuconv.__file__, "kernel_dir": str(_loader.KERNEL_DIR), "compiled": {}}
    print("KERNEL_DIR", _loader.KERNEL_DIR, flush=True)
    # cuconv.nn from the wheel: a module forward and backward on CPU tensors, against torch
    import torch
    import cuconv.nn

    report["nn"] = cuconv.nn.__file__
    torch.manual_seed(0)
    conv = cuconv.nn.Conv2d(3, 4, 3, padding=1).double()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64, requires_grad=True)
    y = conv(x)
    y.square().sum().backward()
    ref = torch.nn.functional.conv2d(x, conv.weight, conv.bias, padding=1)
    (ref_grad,) = torch.autograd.grad(ref.square().sum(), x)
    report["nn_errors"] = [float((y - ref).abs().max()), float((x.grad - ref_grad).abs().max())]
    if args["compile"]:
        spec = importlib.util.spec_from_file_location("kernel_compile_check", args["helpers"])
        helpers = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(helpers)
        jobs = [(stem, arch) for stem in _loader.kernel_stems() for arch in args["archs"]]
        for (stem, arch), done in helpers.compile_all(jobs).items():
            report["compiled"][f"{stem}-{arch}"] = done.result()
    print("REPORT", json.dumps(report), flush=True)
""")


def _run(cmd, **kwargs):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, (f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
                                  f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc


def _copy_checkout(dest):
    """This checkout's files as a clone would have them, plus uncommitted and untracked (not ignored) work."""
    try:
        listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                 cwd=REPO, capture_output=True, check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist, say): copy it whole
        shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(
            ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".venv"))
        return
    for rel in filter(None, listing.split("\0")):
        src = REPO / rel
        if src.is_file():  # deleted-but-tracked files are skipped
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def _site_dirs():
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return list(dict.fromkeys(d for d in dirs if os.path.isdir(d)))


def _no_wheel_build_reason():
    """Why this interpreter cannot build our wheel without build isolation, or None."""
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return "setuptools is not installed: cannot build the wheel without build isolation"
    major_minor = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if major_minor < (64, 0):
        return f"setuptools {version} is older than pyproject.toml's setuptools>=64"
    # bdist_wheel moved into setuptools in 70.1; older ones need the `wheel` package beside them.
    if major_minor < (70, 1) and importlib.util.find_spec("wheel") is None:
        return f"setuptools {version} needs the `wheel` package to build wheels (or setuptools>=70.1)"
    return None


def test_wheel_ships_and_compiles_kernels(tmp_path):
    reason = _no_wheel_build_reason()
    if reason is not None:
        skip_or_fail(reason)
    nvrtc_reason = nvrtc_unavailable_reason()
    if nvrtc_reason is not None and in_ci():
        skip_or_fail(nvrtc_reason)  # fails: under CI the compile part must run

    # Child processes must not find cuconv through the caller's PYTHONPATH (.ci/gpu sets it to the repo).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}

    # 1. Build the wheel.
    src, dist = tmp_path / "src", tmp_path / "dist"
    _copy_checkout(src)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", dist, src], env=env)
    (wheel,) = dist.glob("cuconv-*.whl")

    # 2. It carries the header and every kernel under cuconv/kernels_cu/.
    with zipfile.ZipFile(wheel) as zf:
        shipped = set(zf.namelist())
    expected = {f"cuconv/kernels_cu/{p.relative_to(REPO_KERNELS).as_posix()}"
                for pattern in ("*.cu", "*.cuh") for p in REPO_KERNELS.rglob(pattern)}
    assert expected <= shipped, f"{wheel.name} lacks {sorted(expected - shipped)}"

    # 3. Install it into a fresh venv, offline and alone.
    venv = tmp_path / "venv"
    try:
        subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True, check=True, env=env)
    except subprocess.CalledProcessError as exc:  # Debian's python3 without python3-venv (no ensurepip)
        skip_or_fail(f"python -m venv failed here: {exc.stderr.strip()}")
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check", wheel],
         env=env)

    # 4. From outside the repository: cuconv comes from the venv, finds its kernels there, compiles them.
    away = tmp_path / "elsewhere"
    away.mkdir()
    args = {"extra_path": _site_dirs(), "extra_prefixes": list(dict.fromkeys([sys.prefix, sys.exec_prefix])),
            "compile": nvrtc_reason is None, "archs": list(ARCHS),
            "helpers": str(REPO / "tests" / "test_kernels_compile.py")}
    proc = _run([python, "-c", _SNIPPET, json.dumps(args)], cwd=away, env=env)
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    report = json.loads(line[len("REPORT "):])
    venv_root = venv.resolve()
    cuconv_file = pathlib.Path(report["cuconv"]).resolve()
    assert venv_root in cuconv_file.parents, f"cuconv imported from {cuconv_file}, not from the venv {venv_root}"
    nn_file = pathlib.Path(report["nn"]).resolve()
    assert venv_root in nn_file.parents, f"cuconv.nn imported from {nn_file}, not from the venv {venv_root}"
    assert max(report["nn_errors"]) < 1e-12, report["nn_errors"]
    kernel_dir = pathlib.Path(report["kernel_dir"]).resolve()
    assert venv_root in kernel_dir.parents, f"KERNEL_DIR {kernel_dir} is not inside the venv {venv_root}"
    assert kernel_dir.parts[-2:] == ("cuconv", "kernels_cu"), kernel_dir

    if nvrtc_reason is not None:
        pytest.skip(f"wheel contents and install checked; compiling from the wheel skipped: {nvrtc_reason}")
    # Every kernel under kernels_cu/, subfolders included, named as the loader names it ("blocks/bias").
    stems = sorted(p.relative_to(REPO_KERNELS).with_suffix("").as_posix() for p in REPO_KERNELS.rglob("*.cu"))
    assert sorted(report["compiled"]) == sorted(f"{s}-{a}" for s in stems for a in ARCHS)
