"""Docstring examples are executed, so they cannot rot."""

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import cuconv


def _modules_with_examples():
    names = ["cuconv"] + [m.name for m in pkgutil.walk_packages(cuconv.__path__, "cuconv.")]
    found = []
    for name in sorted(set(names)):
        origin = importlib.util.find_spec(name).origin
        if origin and origin.endswith(".py"):
            with open(origin, encoding="utf-8") as fh:
                if ">>>" in fh.read():
                    found.append(name)
    return found


MODULES = _modules_with_examples()


def test_conv_module_has_examples():
    assert "cuconv.conv" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (see stdout)"
