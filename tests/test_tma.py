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


def test_the_oldest_set_is_dropped_past_map_sets():
    log = []
    t = _launch(1, log)
    for i in range(_tma.MAP_SETS + 1):
        t._remap((i * 64,))
    assert len(t._kept_maps) == _tma.MAP_SETS and (0,) not in t._kept_maps
    del log[:]
    t._remap((64,))  # (kept)
    assert log == [] and _maps_of(t) == [640]
    t._remap((0,))  # (dropped: encoded again)
    assert log == [(0, 0)] and _maps_of(t) == [0]
