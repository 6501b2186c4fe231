"""CUCONV_SHARD (tests/conftest.py): the parts cover the suite once, whole files but a file over its fair share,
which is dealt by test function."""

import types

import conftest
import pytest


class _Config:
    def __init__(self):
        self.deselected = []
        self.hook = types.SimpleNamespace(pytest_deselected=lambda items: self.deselected.extend(items))


def _items():
    items = []
    for path, functions in (("a.py", {"f": 60, "g": 30, "h": 10}), ("b.py", {"k": 20}), ("c.py", {"m": 15}),
                            ("d.py", {"n": 5})):
        for function, count in functions.items():
            items += [types.SimpleNamespace(path=path, originalname=function, name=f"{function}[{i}]")
                      for i in range(count)]
    return items


def test_parts_cover_the_suite_once_and_split_only_an_oversized_file(monkeypatch):
    parts = []
    for i in range(3):
        monkeypatch.setenv("CUCONV_SHARD", f"{i}/3")
        items, config = _items(), _Config()
        conftest._keep_shard(config, items)
        assert len(items) + len(config.deselected) == 140
        parts.append({(t.path, t.name) for t in items})
    everything = {(t.path, t.name) for t in _items()}
    assert set().union(*parts) == everything and sum(map(len, parts)) == len(everything)
    for part in parts:  # a file within its fair share (47 of 140) stays whole; a.py's functions stay whole
        for path, function in (("b.py", "k"), ("c.py", "m"), ("d.py", "n"), ("a.py", "f"), ("a.py", "g")):
            names = {n for p, n in part if p == path and n.startswith(function + "[")}
            assert not names or len(names) == sum(1 for t in _items() if t.path == path and t.originalname == function)
    assert max(map(len, parts)) - min(map(len, parts)) <= 30


def test_a_bad_shard_is_a_usage_error(monkeypatch):
    monkeypatch.setenv("CUCONV_SHARD", "3/3")
    with pytest.raises(pytest.UsageError, match="CUCONV_SHARD must read i/n"):
        conftest._keep_shard(_Config(), _items())


def test_a_costly_file_weighs_its_cost(monkeypatch):
    """A test function listed in ``_COST`` counts each of its tests that many times: dealt first, its part gets less
    else."""
    monkeypatch.setattr(conftest, "_COST", {("d.py", "n"): 10})  # (d.py's 5 tests weigh 50)
    sizes = {}
    for i in range(3):
        monkeypatch.setenv("CUCONV_SHARD", f"{i}/3")
        items, config = _items(), _Config()
        conftest._keep_shard(config, items)
        sizes[i] = ({t.path for t in items}, len(items))
    (paths, n), = [v for v in sizes.values() if "d.py" in v[0]]
    assert n < min(v[1] for v in sizes.values() if "d.py" not in v[0])
