"""The notebooks in notebooks/ are valid, committed clean, linked from the README, and run top to bottom.

Structure (fast, always): every ``notebooks/*.ipynb`` validates against the nbformat schema, carries no
outputs, execution counts or stored error outputs, and its code cells are plain Python (no ``%magics`` or
``!shell`` lines, so that the fallback below can run them); the README links every notebook and every
notebook it links exists.

Execution (``slow``; it runs in CI too): each notebook is executed top to bottom by nbclient with a real
ipykernel kernel (``kernel_name="python3"``), from ``notebooks/`` as working directory, with
``CUCONV_FIGURE_DIR`` set to a temporary directory and the repository root on ``PYTHONPATH`` (so the kernel
imports this checkout's cuconv). No cell may raise, and each notebook must save at least one non-empty
``.png`` there. Budget: 600 s per notebook (the per-cell timeout is what is left of it). The notebooks
detect the GPU themselves: on CI (no GPU) this runs their CPU mode, on a GPU machine (``bash .ci/gpu``)
their GPU mode.

Where nbclient/ipykernel are not importable the execution test skips with that reason, except:

- with ``CI`` set it fails (CI installs them through the ``test`` extra);
- with ``CUCONV_REQUIRE_GPU`` set (``.ci/gpu``: GPU machines may have no network and no Jupyter) it runs
  the offline fallback instead: a fresh ``python -c`` subprocess loads the notebook as JSON and ``exec()``s
  its code cells in order in one namespace, with matplotlib's Agg backend, same working directory and
  environment; it must exit with status 0 (and save its figures) within the same 600 s.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))
BUDGET_S = 600  # per notebook

_ids = [p.name for p in NOTEBOOKS]


def _load(path):
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _env(fig_dir: pathlib.Path) -> dict:
    env = dict(os.environ)
    env["CUCONV_FIGURE_DIR"] = str(fig_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _pngs(fig_dir: pathlib.Path):
    return sorted(p for p in fig_dir.rglob("*.png") if p.stat().st_size > 0)


# ----------------------------------------------------------------------------------------------------------
# structure
# ----------------------------------------------------------------------------------------------------------
def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks in {NB_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_is_committed_clean(path):
    nb = _load(path)
    assert nb.get("nbformat") == 4, f"{path.name}: nbformat {nb.get('nbformat')}, expected 4"
    cells = nb.get("cells", [])
    assert cells and cells[0]["cell_type"] == "markdown", f"{path.name}: must open with a markdown cell"
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        outputs = cell.get("outputs", [])
        errors = [o for o in outputs if o.get("output_type") == "error"]
        assert not errors, f"{path.name} cell {i}: stored error output {errors[0].get('ename')}"
        assert not outputs, f"{path.name} cell {i}: stored outputs (commit notebooks with outputs stripped)"
        assert cell.get("execution_count") is None, f"{path.name} cell {i}: stored execution count"
        magic = [line for line in _source(cell).splitlines() if re.match(r"\s*[%!]", line)]
        assert not magic, (f"{path.name} cell {i}: IPython magic/shell line {magic[0]!r}; code cells must be "
                           f"plain Python (the offline fallback exec()s them)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_validates(path):
    try:
        import nbformat
    except ImportError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"nbformat is not importable in CI ({exc}); it is in the `test` extra")
        pytest.skip(f"nbformat is not importable ({exc}): pip install -e '.[notebooks]'")
    nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    nbformat.validate(nb)


def test_readme_links_every_notebook():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\((notebooks/[^)\s]+\.ipynb)\)", readme))
    present = {f"notebooks/{p.name}" for p in NOTEBOOKS}
    assert not present - linked, f"README.md does not link {sorted(present - linked)}"
    assert not linked - present, f"README.md links missing notebooks {sorted(linked - present)}"


# ----------------------------------------------------------------------------------------------------------
# execution
# ----------------------------------------------------------------------------------------------------------
def _jupyter_missing():
    """The reason nbclient + ipykernel cannot run a notebook here, or None."""
    try:
        import ipykernel  # noqa: F401
        import nbclient  # noqa: F401
        import nbformat  # noqa: F401
    except ImportError as exc:
        return f"{exc}"
    return None


def _run_with_kernel(path, fig_dir, monkeypatch):
    import nbclient
    import nbformat
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    for key, value in _env(fig_dir).items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)  # the kernel inherits this process's environment
    nb = nbformat.read(path, as_version=4)
    deadline = time.monotonic() + BUDGET_S
    client = nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=BUDGET_S, startup_timeout=120,
        timeout_func=lambda cell: max(1, int(deadline - time.monotonic())),  # what is left of the budget
        resources={"metadata": {"path": str(NB_DIR)}})
    try:
        client.execute()
    except CellExecutionError as exc:
        plain = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # the kernel's traceback, without terminal colours
        pytest.fail(f"{path.name}: a cell raised:\n{plain}", pytrace=False)
    except (CellTimeoutError, TimeoutError) as exc:
        pytest.fail(f"{path.name}: ran past its {BUDGET_S} s budget: {exc}", pytrace=False)
    except DeadKernelError as exc:
        pytest.fail(f"{path.name}: the kernel died: {exc}", pytrace=False)
    errors = [(i, o) for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name} cell {errors[0][0]}: {errors[0][1].get('ename')}: {errors[0][1].get('evalue')}"


_PLAIN_RUNNER = r"""
import json, sys
import matplotlib
matplotlib.use("Agg")
path = sys.argv[1]
with open(path, encoding="utf-8") as fh:
    nb = json.load(fh)
namespace = {"__name__": "__main__"}
for i, cell in enumerate(nb["cells"]):
    if cell["cell_type"] != "code":
        continue
    src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
    print(f"--- cell {i}", flush=True)
    exec(compile(src, f"{path} [cell {i}]", "exec"), namespace)
"""


def _run_plain(path, fig_dir):
    """Offline fallback: the code cells exec()ed in order in a fresh Python (no Jupyter needed)."""
    try:
        proc = subprocess.run([sys.executable, "-c", _PLAIN_RUNNER, str(path)], cwd=NB_DIR, env=_env(fig_dir),
                              capture_output=True, text=True, timeout=BUDGET_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{path.name}: ran past its {BUDGET_S} s budget (plain-Python fallback)", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(f"{path.name}: exit status {proc.returncode} (plain-Python fallback, no Jupyter here)\n"
                    f"--- stdout (tail)\n{proc.stdout[-6000:]}\n--- stderr (tail)\n{proc.stderr[-6000:]}",
                    pytrace=False)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids)
def test_notebook_runs(path, tmp_path, monkeypatch):
    fig_dir = tmp_path / "figures"
    missing = _jupyter_missing()
    start = time.monotonic()
    if missing is None:
        _run_with_kernel(path, fig_dir, monkeypatch)
    elif os.environ.get("CUCONV_REQUIRE_GPU"):
        _run_plain(path, fig_dir)
    elif os.environ.get("CI"):
        pytest.fail(f"nbclient/ipykernel are not importable in CI ({missing}); they are in the `test` extra")
    else:
        pytest.skip(f"nbclient/ipykernel not importable ({missing}): pip install -e '.[notebooks]' to run "
                    f"the notebooks (on a GPU machine, CUCONV_REQUIRE_GPU=1 runs them without Jupyter)")
    print(f"{path.name}: {time.monotonic() - start:.1f} s ({'nbclient' if missing is None else 'plain Python'})")
    pngs = _pngs(fig_dir)
    assert pngs, f"{path.name} saved no non-empty .png in CUCONV_FIGURE_DIR ({fig_dir})"
