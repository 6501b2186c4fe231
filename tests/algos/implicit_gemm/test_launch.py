"""implicit_gemm's kernels are fetched from the file that holds them (CPU): every instance of every engine's twin
maps to that twin's stem, and every GEMM tile's kernel to the stem of its engine."""

from __future__ import annotations

import importlib

import pytest

from cuconv import _loader
from cuconv.algos import implicit_gemm
from cuconv.algos.implicit_gemm import launch

STEMS = [s for s in _loader.kernel_stems() if s.startswith("implicit_gemm/")]


@pytest.mark.parametrize("stem", STEMS)
def test_every_instance_is_fetched_from_its_own_file(stem):
    twin = importlib.import_module(_loader.twin_module(stem))
    assert [n for n in twin.NAME_EXPRESSIONS if launch.kernel_stem(n) != stem] == []


def test_the_engines_share_no_instance():
    names = [n for s in STEMS for n in importlib.import_module(_loader.twin_module(s)).NAME_EXPRESSIONS]
    assert len(names) == len(set(names))
    tiles = {**implicit_gemm.TILES, **implicit_gemm.TMA_TILES, **implicit_gemm.TMA_ROWS_TILES,
             **implicit_gemm.WGRAD_TMA_TILES}
    # (a persistent tile has only its TMA-store instance)
    assert {t.kernel_name("__half") for t in tiles.values() if not getattr(t, "persistent", False)} <= set(names)
