"""``cuconv._tma``: a launch's tensor maps kept per pointer set (CPU: the encoders stood in for by functions that
write a pattern of their address; the driver's encoding runs in the GPU tests of the TMA kernels)."""

from __future__ import annotations

import ctypes

import numpy

from cuconv import _tma


def _launch(n_maps: int, log: list):
    """A ``TmaLaunch`` of ``n_maps`` maps over pointers 0.., without a kernel: only its maps' state."""
    t = _tma.TmaLaunch.__new__(_tma.TmaLaunch)

    def encoder(k):
        def encode(dst, address):
            log.append((k, address))
            ctypes.memmove(dst, (address * 10 + k).to_bytes(8, "little") * (_tma.MAP_BYTES // 8), _tma.MAP_BYTES)
        return encode

    t._maps = tuple((k, encoder(k)) for k in range(n_maps))
    t._map_storage = numpy.zeros(n_maps * _tma.MAP_BYTES + 64, dtype=numpy.uint8)
    first = -t._map_storage.ctypes.data % 64 + t._map_storage.ctypes.data
    t._map_addresses = tuple(first + _tma.MAP_BYTES * k for k in range(n_maps))
    t._mapped, t._kept_maps = None, {}
    return t


def _maps_of(t) -> list:
    """The first 8 bytes of each map in the parameter buffer, as ints."""
    return [int.from_bytes(ctypes.string_at(a, 8), "little") for a in t._map_addresses]


def test_maps_of_a_pointer_set_met_before_are_copied_back_not_encoded():
    log = []
    t = _launch(2, log)
    t._remap((1000, 2000))
    assert log == [(0, 1000), (1, 2000)] and _maps_of(t) == [10000, 20001]
    t._remap((3000, 4000))
    assert log[2:] == [(0, 3000), (1, 4000)] and _maps_of(t) == [30000, 40001]
    del log[:]
    t._remap((1000, 2000))  # (met before: copied back)
    assert log == [] and _maps_of(t) == [10000, 20001] and t._mapped == (1000, 2000)


def test_the_least_recently_used_set_is_dropped_past_map_sets():
    log = []
    t = _launch(1, log)
    for i in range(_tma.MAP_SETS):
        t._remap((i * 64,))
    t._remap((0,))  # (a hit: the first set becomes the most recently used)
    t._remap((_tma.MAP_SETS * 64,))  # (one set too many: the second, now the least recently used, goes)
    assert len(t._kept_maps) == _tma.MAP_SETS and (64,) not in t._kept_maps and (0,) in t._kept_maps
    del log[:]
    t._remap((0,))  # (kept)
    assert log == [] and _maps_of(t) == [0]
    t._remap((64,))  # (dropped: encoded again)
    assert log == [(0, 64)] and _maps_of(t) == [640]


def test_an_encode_that_fails_leaves_no_set_matched():
    """An encoder raising part way through a launch's maps leaves the buffer partly rewritten: no pointer set is
    taken as mapped then, so the next launch on the old pointers remaps them."""
    log = []
    t = _launch(2, log)
    t._remap((1000, 2000))
    good = t._maps[1][1]

    def failing(dst, address):
        raise _tma.EncodeError("cuconv: stand-in failure", 1)

    t._maps = (t._maps[0], (1, failing))
    try:
        t._remap((3000, 4000))
    except _tma.EncodeError:
        pass
    assert t._mapped is None and (3000, 4000) not in t._kept_maps
    t._maps = (t._maps[0], (1, good))
    t._remap((1000, 2000))  # (kept: copied back over the partial write)
    assert _maps_of(t) == [10000, 20001]
