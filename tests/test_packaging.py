"""What a newcomer installing cuconv meets: one source of the version, a console script, type information a
strict type checker reads (``py.typed``, the public API annotated), and an sdist that holds its tests."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys
import tarfile

import pytest

try:
    import tomllib
except ImportError:  # (Python 3.10)
    tomllib = pytest.importorskip("tomli")

REPO = pathlib.Path(__file__).resolve().parent.parent


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_version_has_one_source():
    project = _pyproject()
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "cuconv.__version__"}


def test_console_script_is_the_cli():
    import cuconv.__main__

    assert _pyproject()["project"]["scripts"]["cuconv"] == "cuconv.__main__:main"
    assert cuconv.__main__.main(["--help"]) == 0


def test_sdist_holds_its_tests_kernels_and_type_marker(tmp_path):
    from setuptools import build_meta

    import os

    cwd = pathlib.Path.cwd()
    try:
        os.chdir(REPO)
        name = build_meta.build_sdist(str(tmp_path))
    finally:
        os.chdir(cwd)
    with tarfile.open(tmp_path / name) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    for needed in ("tests/conftest.py", "tests/cases.py", "tests/fake_device.py", "cuconv/py.typed",
                   "kernels_cu/implicit_gemm/igemm.cuh", "kernels_cu/epilogue.cuh", "pyproject.toml", "README.md"):
        assert needed in names, needed
    assert not any("__pycache__" in n for n in names)


_SNIPPET = '''
import numpy as np
import cuconv

x = np.random.default_rng(0).standard_normal((1, 2, 5, 5))
w = np.random.default_rng(1).standard_normal((4, 2, 3, 3))
y = cuconv.conv2d(x, w, padding=1, activation="relu", residual=None)
dx = cuconv.conv2d_input(x.shape, w, y, padding=1)
dw = cuconv.conv2d_weight(x, w.shape, y, stride=(1, 1), padding="same")
spec = cuconv.ConvSpec.from_args(x.shape, w.shape, padding=(1, 1))
names: tuple[str, ...] = cuconv.algorithms("dgrad")
with cuconv.config(precision="tf32"):
    print(spec.output_shape, names, cuconv.__version__)
'''


def test_a_user_snippet_passes_mypy_strict(tmp_path):
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not importable here (pip install -e '.[test]')")
    snippet = tmp_path / "snippet.py"
    snippet.write_text(_SNIPPET)
    assert (REPO / "cuconv" / "py.typed").is_file()
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                           "--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(snippet)],
                          capture_output=True, text=True, cwd=tmp_path, env={"MYPYPATH": str(REPO), "PATH": ""})
    assert done.returncode == 0, done.stdout + done.stderr
