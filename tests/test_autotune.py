"""The autotuner (``cuconv.config.benchmark``): every eligible algorithm timed once per signature (an injected timer
on the CPU), the choice kept per device, dtype and geometry, in memory and in the disk cache (stale, unreadable,
unwritable, concurrent and planted-link cases), and on the GPU the timed choice through ``conv2d``."""

from __future__ import annotations

import json
import os

import numpy
import pytest

import cuconv
from cuconv import select
from cuconv.select import autotune
from cuconv.problem import Problem
from cuconv.problems import PROBLEMS
from cases import PROBLEM_CASES, make_inputs, reference, rel_err, tolerance
from fake_device import ENVS

_P = {p.name: p.spec() for p in PROBLEMS}
_F32, _F16, _F64 = numpy.dtype(numpy.float32), numpy.dtype(numpy.float16), numpy.dtype(numpy.float64)


class _FakeTimer:
    """Times candidates from a table instead of the GPU, counting the calls."""

    def __init__(self, ms):
        self.ms, self.timed = ms, []

    def __call__(self, run):
        run()
        return self.ms[self.timed[-1]]



def _choose(timer, spec=_P["square_5x9"], device="NVIDIA H200", dtype=_F32, env=ENVS["sm90"]):
    """The name of the autotuner's choice for the forward of ``spec`` (the disk cache: ``config.benchmark_cache``)."""
    def run(choice):
        timer.timed.append(choice.name)

    problem = Problem.of(spec, dtype, "ieee", "fprop")
    return autotune.choose(problem, env, run, device, cuconv.config.benchmark_cache, timer=timer).name



@pytest.fixture(autouse=True)
def _fresh_autotuner():
    autotune.clear()
    yield
    autotune.clear()



def test_autotune_times_every_eligible_algorithm_once_then_hits():
    timer = _FakeTimer({"im2col_gemm": 12.9, "direct": 141.0, "direct_smem": 10.9})
    assert _choose(timer) == "direct_smem"
    assert sorted(timer.timed) == ["direct", "direct_smem", "im2col_gemm"]  # depthwise is not eligible
    timer.timed.clear()
    assert _choose(timer) == "direct_smem"
    assert timer.timed == [], "a hit must not time anything"



def test_autotune_winner_names_the_timed_choice_for_the_current_device(monkeypatch):
    monkeypatch.setattr(autotune, "_device_name", lambda: "NVIDIA H200")
    spec = _P["square_5x9"]
    assert autotune.winner(spec, _F32, "ieee", "fprop") is None  # nothing timed yet
    _choose(_FakeTimer({"im2col_gemm": 12.9, "direct": 141.0, "direct_smem": 10.9}))
    assert autotune.winner(spec, _F32, "ieee", "fprop").name == "direct_smem"
    assert autotune.winner(spec, _F32, "ieee", "dgrad") is None
    monkeypatch.setattr(autotune, "_device_name", lambda: "NVIDIA H100 80GB HBM3")
    assert autotune.winner(spec, _F32, "ieee", "fprop") is None



def test_memoized_choices_follow_the_workspace_limit():
    """The choices are memoized per call signature (host time of small layers) but a smaller
    workspace_limit still changes what may run: implicit_gemm packs a whole sample into it."""
    spec = _P["square_5x9"]
    assert select.select_algorithm(spec, _F16, "tf32") == "implicit_gemm"
    assert select.reason_unsupported("implicit_gemm", spec, _F16) is None
    with cuconv.config(workspace_limit=1 << 20):
        assert "workspace_limit" in select.reason_unsupported("implicit_gemm", spec, _F16)
        assert select.select_algorithm(spec, _F16, "tf32") != "implicit_gemm"
    assert select.select_algorithm(spec, _F16, "tf32") == "implicit_gemm"



def test_autotune_misses_on_another_device_dtype_or_geometry():
    timer = _FakeTimer({"im2col_gemm": 1.0, "direct": 3.0, "direct_smem": 2.0, "winograd": 4.0})
    _choose(timer)
    for kwargs in (dict(device="NVIDIA H100 80GB HBM3"), dict(dtype=_F64), dict(spec=_P["rect_5x7"])):
        timer.timed.clear()
        assert _choose(timer, **kwargs) == "im2col_gemm"
        assert timer.timed, f"{kwargs} should have missed the cache"



def test_autotune_disk_cache_round_trip_and_device_invalidation(tmp_path):
    path = tmp_path / "winners.json"
    timer = _FakeTimer({"im2col_gemm": 5.0, "direct": 9.0, "direct_smem": 4.0})
    with cuconv.config(benchmark_cache=path):
        assert _choose(timer) == "direct_smem"
        stored = json.loads(path.read_text())
        assert list(stored.values()) == ["direct_smem"]
        assert next(iter(stored)).startswith("NVIDIA H200|float32|ieee|fprop|")
        autotune.clear()  # a new process: only the disk remembers
        timer.timed.clear()
        assert _choose(timer) == "direct_smem" and timer.timed == []
        timer.timed.clear()
        _choose(timer, device="NVIDIA H100 80GB HBM3")
        assert timer.timed, "another device name must be timed again"
        assert len(json.loads(path.read_text())) == 2



def test_autotune_ignores_an_unreadable_or_stale_disk_cache(tmp_path):
    path = tmp_path / "winners.json"
    path.write_text("{not json")
    timer = _FakeTimer({"im2col_gemm": 1.0, "direct": 2.0, "direct_smem": 3.0})
    with cuconv.config(benchmark_cache=str(path)):
        assert _choose(timer) == "im2col_gemm"
        key = next(iter(json.loads(path.read_text())))
        path.write_text(json.dumps({key: "depthwise"}))  # a winner that cannot serve this case
        autotune.clear()
        timer.timed.clear()
        assert _choose(timer) == "im2col_gemm" and timer.timed



def test_benchmark_settings_are_checked():
    with pytest.raises(TypeError, match="benchmark must be a bool"):
        cuconv.config.benchmark = 1
    with pytest.raises(TypeError, match="benchmark_cache must be a path or None"):
        cuconv.config.benchmark_cache = 3
    with cuconv.config(benchmark=True):
        assert cuconv.config.benchmark is True
    assert cuconv.config.benchmark is False



def test_benchmark_has_no_effect_on_the_cpu_path():
    x = numpy.random.default_rng(0).standard_normal((1, 2, 6, 6))
    w = numpy.random.default_rng(1).standard_normal((3, 2, 3, 3))
    with cuconv.config(benchmark=True):
        y = cuconv.conv2d(x, w)
    numpy.testing.assert_array_equal(y, cuconv.conv2d(x, w))



def _cached_key(path):
    return next(iter(json.loads(path.read_text())))



@pytest.mark.parametrize("content", [
    pytest.param(lambda key: json.dumps({key: "fft"}), id="unknown_algorithm"),
    pytest.param(lambda key: json.dumps({key: 7}), id="not_a_name"),
    pytest.param(lambda key: "[" * 100000 + "]" * 100000, id="nested_too_deep"),
    pytest.param(lambda key: json.dumps([key, "direct"]), id="not_an_object"),
])
def test_autotune_cache_entries_that_cannot_serve_are_timed_afresh(tmp_path, content):
    path = tmp_path / "winners.json"
    timer = _FakeTimer({"im2col_gemm": 1.0, "direct": 2.0, "direct_smem": 3.0})
    with cuconv.config(benchmark_cache=str(path)):
        _choose(timer)
        path.write_text(content(_cached_key(path)))
        autotune.clear()
        timer.timed.clear()
        assert _choose(timer) == "im2col_gemm" and timer.timed  # never KeyError or RecursionError
        assert json.loads(path.read_text())[_cached_key(path)] == "im2col_gemm"  # the cache healed



@pytest.mark.parametrize("where", ["a_directory", "a_missing_directory"])
def test_autotune_cache_that_cannot_be_written_warns_and_keeps_the_choice(tmp_path, where):
    path = tmp_path / "winners.json"
    if where == "a_directory":
        path.mkdir()  # exists, cannot be read as a file: left alone
    else:
        path = tmp_path / "missing" / "winners.json"
    timer = _FakeTimer({"im2col_gemm": 2.0, "direct": 3.0, "direct_smem": 1.0})
    with cuconv.config(benchmark_cache=str(path)):
        with pytest.warns(RuntimeWarning, match="autotune cache"):
            assert _choose(timer) == "direct_smem"
        timer.timed.clear()
        assert _choose(timer) == "direct_smem" and timer.timed == []  # kept in memory
    assert path.is_dir() if where == "a_directory" else not path.exists()



def test_autotune_cache_concurrent_writers_keep_every_entry(tmp_path):
    """Threads and processes storing into one file at once: every entry survives (a lock, a re-read before
    each replace, a unique temporary file each)."""
    import subprocess
    import sys
    import threading

    path = str(tmp_path / "winners.json")
    threads = [threading.Thread(target=lambda i=i: [autotune._store_disk(path, f"t{i}-{j}", "direct")
                                                    for j in range(25)]) for i in range(8)]
    script = ("import sys; from cuconv.select import autotune\n"
              "for j in range(40): autotune._store_disk(sys.argv[1], f'p{sys.argv[2]}-{j}', 'im2col_gemm')")
    procs = [subprocess.Popen([sys.executable, "-c", script, path, str(i)]) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(p.wait(timeout=120) == 0 for p in procs)
    data = json.loads(open(path).read())
    assert len(data) == 8 * 25 + 2 * 40
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]



def test_autotune_cache_write_follows_no_planted_link(tmp_path):
    """A symbolic link planted where a predictable temporary name would be is never written through."""
    path = tmp_path / "winners.json"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for name in (f"{path}.{os.getpid()}.tmp", f"{path}.tmp"):
        os.symlink(victim, name)
    autotune._store_disk(str(path), "k", "direct")
    assert victim.read_text() == "keep me"
    assert json.loads(path.read_text()) == {"k": "direct"}



@pytest.mark.gpu
def test_benchmark_mode_times_and_remembers_the_fastest(tmp_path):
    import cupy

    from cuconv.select import autotune

    case = PROBLEM_CASES[0].values[0]
    x, w, b = make_inputs(case, seed=41)
    ref = reference(x, w, b, **case.kwargs)
    autotune.clear()
    path = tmp_path / "winners.json"
    with cuconv.config(benchmark=True, benchmark_cache=path):
        y = cuconv.conv2d(cupy.asarray(x), cupy.asarray(w), None if b is None else cupy.asarray(b), **case.kwargs)
        dx = cuconv.conv2d_input(x.shape, cupy.asarray(w), cupy.asarray(y), **case.kwargs)
    assert rel_err(cupy.asnumpy(y), ref) <= tolerance(numpy.float64)
    assert dx.shape == x.shape
    import json

    passes = sorted(key.split("|")[3] for key in json.loads(path.read_text()))
    assert passes == ["dgrad", "fprop"]


@pytest.mark.gpu
def test_benchmark_mode_times_the_tiles_and_runs_the_winner():
    """float16 through the torch-free door with ``config.benchmark``: implicit_gemm's tiles are candidates; the
    winner (an algorithm and its knobs) runs, and its result matches the reference."""
    import cupy

    rng = numpy.random.default_rng(7)
    x = rng.standard_normal((4, 64, 20, 20)).astype(_F16).astype(numpy.float64)
    w = rng.standard_normal((96, 64, 3, 3)).astype(_F16).astype(numpy.float64)
    ref = reference(x, w, padding=1)
    autotune.clear()
    with cuconv.config(benchmark=True):
        y = cuconv.conv2d(cupy.asarray(x, dtype=_F16), cupy.asarray(w, dtype=_F16), padding=1)
    choice = autotune.winner(cuconv.ConvSpec.from_args(x.shape, w.shape, padding=1), _F16, "ieee", "fprop")
    assert choice is not None and (choice.name != "implicit_gemm" or dict(choice.knobs)["tile"] is not None)
    assert rel_err(cupy.asnumpy(y).astype(numpy.float64), ref) <= tolerance(numpy.float16)



@pytest.mark.gpu
def test_benchmark_mode_times_a_signature_once_until_cleared(monkeypatch):
    """A tuned layer called again runs its winner from one lookup (no timing, no key built again);
    ``autotune.clear()`` forgets it, and another dtype is another signature."""
    import cupy

    from cuconv.select import autotune

    x = cupy.random.standard_normal((2, 8, 12, 12), dtype=numpy.float32)
    w = cupy.random.standard_normal((16, 8, 3, 3), dtype=numpy.float32)
    timed = []
    real_choose = autotune.choose
    monkeypatch.setattr(autotune, "choose", lambda *a, **k: (timed.append(a[0].pass_), real_choose(*a, **k))[1])
    autotune.clear()
    with cuconv.config(benchmark=True):
        y = [cuconv.conv2d(x, w, padding=1) for _ in range(3)]
        assert len(timed) == 1
        cuconv.conv2d(x.astype(numpy.float64), w.astype(numpy.float64), padding=1)
        assert len(timed) == 2
        autotune.clear()
        cuconv.conv2d(x, w, padding=1)
        assert len(timed) == 3
    ref = reference(cupy.asnumpy(x).astype(numpy.float64), cupy.asnumpy(w).astype(numpy.float64), padding=1)
    for yi in y:
        assert rel_err(cupy.asnumpy(yi), ref) <= tolerance(numpy.float32)



def test_autotune_times_every_knob_setting_and_remembers_it(tmp_path):
    """``config.benchmark`` times an algorithm's knobs as well as the algorithms: each implicit_gemm tile the
    problem offers is a candidate; the winner, tile and all, goes to the disk cache as ``name[knobs]`` and comes
    back from it; a bare name there means the algorithm with the selector's knobs; knobs it does not offer are timed
    afresh."""
    from cuconv.algos import implicit_gemm

    env, spec = ENVS["sm90"], _P["square_5x9"]
    problem = Problem.of(spec, _F16, "ieee", "fprop")
    options = autotune.candidates(problem, env)
    tiles = [dict(c.knobs)["tile"] for c in options if c.name == "implicit_gemm"]
    assert len(tiles) >= 4 and tiles[0] is dict(select.knobs("implicit_gemm", problem, env))["tile"]
    slowest_first = {c: 10.0 + i for i, c in enumerate(reversed(options))}  # the selector's first choice is slowest
    expected = min(slowest_first, key=slowest_first.get)
    timed = []

    def run(choice):
        timed.append(choice)

    path = str(tmp_path / "winners.json")
    timer = lambda run_one: (run_one(), slowest_first[timed[-1]])[1]
    assert autotune.choose(problem, env, run, "NVIDIA H200", path, timer) == expected
    assert sorted(map(autotune.text, timed)) == sorted(map(autotune.text, options))
    ((key, entry),) = json.loads(open(path).read()).items()
    assert entry == autotune.text(expected) and ("[tile=" in entry) == bool(expected.knobs)
    autotune.clear()
    timed.clear()
    assert autotune.choose(problem, env, run, "NVIDIA H200", path, timer) == expected and not timed
    for stored, ok in ((f"implicit_gemm[tile={implicit_gemm.tile_name(tiles[0])}]", True), ("implicit_gemm", True),
                       ("implicit_gemm[tile=nchw64]", False), ("implicit_gemm[tile=no_such_tile]", False)):
        with open(path, "w") as fh:
            json.dump({key: stored}, fh)
        autotune.clear()
        timed.clear()
        choice = autotune.choose(problem, env, run, "NVIDIA H200", path, timer)
        if ok:  # (a bare name: the selector's knobs, implicit_gemm's first setting)
            assert choice == next(c for c in options if c.name == "implicit_gemm") and not timed, stored
        else:
            assert choice == expected and timed, stored


def test_pick_without_benchmark_is_the_selectors_choice():
    env, spec = ENVS["sm90"], _P["square_5x9"]
    problem = Problem.of(spec, _F16, "ieee", "fprop")
    settings = cuconv.config.settings()
    assert not settings.benchmark
    choice = autotune.pick("auto", "implicit_gemm", problem, env, settings, lambda c: pytest.fail("timed"))
    assert choice == select.Choice("implicit_gemm", select.knobs("implicit_gemm", problem, env))


def test_autotune_cache_keeps_entries_it_does_not_own(tmp_path):
    path = tmp_path / "winners.json"
    foreign = {"someone else's": {"nested": [1, 2]}, "a number": 7, "a name": "not ours"}
    path.write_text(json.dumps(foreign))
    timer = _FakeTimer({"im2col_gemm": 1.0, "direct": 2.0, "direct_smem": 3.0})
    with cuconv.config(benchmark_cache=str(path)):
        assert _choose(timer) == "im2col_gemm"
    stored = json.loads(path.read_text())
    assert {k: stored[k] for k in foreign} == foreign and len(stored) == len(foreign) + 1


@pytest.mark.parametrize("content", ['{"truncated": "im2c', "[1, 2]"], ids=["truncated", "not_an_object"])
def test_autotune_cache_damaged_is_moved_aside_with_a_warning(tmp_path, content):
    path = tmp_path / "winners.json"
    path.write_text(content)
    timer = _FakeTimer({"im2col_gemm": 1.0, "direct": 2.0, "direct_smem": 3.0})
    with cuconv.config(benchmark_cache=str(path)), \
            pytest.warns(RuntimeWarning, match="moved to .*winners.json.damaged"):
        assert _choose(timer) == "im2col_gemm"
    assert (tmp_path / "winners.json.damaged").read_text() == content
    assert list(json.loads(path.read_text()).values()) == ["im2col_gemm"]
