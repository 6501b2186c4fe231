"""Tensor maps for the tensor memory accelerator (compute capability 9.0) and a prepared launch that encodes its
kernel's maps from the pointers it is given.

A tensor map (``CUtensorMap``, 128 opaque bytes) describes a global tensor and the box a bulk copy moves; a
kernel takes it by value as a ``__grid_constant__`` parameter. It holds the tensor's address, so a launch on other
operands needs maps of its own: ``TmaLaunch`` encodes them when its pointers change (a host call of the driver,
no device work) and keeps the maps of its last few pointer sets (``MAP_SETS``): a layer called again and again
in a loop meets the few buffers torch's caching allocator hands it in turn, and copies their maps back with one
``memmove`` where encoding took ~8 µs of host time a map (under cProfile). CuPy exposes no tensor-map encoding:
the driver's ``cuTensorMapEncodeIm2col`` and ``cuTensorMapEncodeTiled`` are called through ctypes.
"""

from __future__ import annotations

import ctypes
import functools
import operator
import threading

import numpy

from . import _loader

__all__ = ["im2col_map", "tiled_map", "rows_map", "nhwc_rows_map", "TmaLaunch", "EncodeError", "MAP_BYTES"]

MAP_BYTES = 128
_MAP_ALIGN = 64
# CUtensorMapDataType: a bulk copy moves bits, so the 16-bit storage types share UINT16 (whose out-of-bounds
# fill is zero, as float16's and bfloat16's would be)
_UINT16 = 1
_INTERLEAVE_NONE = 0
# CUtensorMapSwizzle by a box row's bytes: the swizzle of that width (wgmma's descriptors read the same)
_SWIZZLE = {32: 1, 64: 2, 128: 3}
_SWIZZLE_NONE = 0
_L2_PROMOTION_128B = 2
_OOB_FILL_ZEROS = 0
# im2col maps of rank 4 take bounding-box corners in [-2^7, 2^7) (the driver's limits), copies' tap offsets in
# 16 bits, traversal strides up to 8
CORNER_RANGE = (-128, 127)
MAX_OFFSET = 1 << 16
MAX_STRIDE = 8


@functools.lru_cache(maxsize=1)
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    u32, u64, i32 = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int
    im2col = lib.cuTensorMapEncodeIm2col
    im2col.restype = i32
    im2col.argtypes = [ctypes.c_void_p, i32, u32, ctypes.c_void_p, ctypes.POINTER(u64), ctypes.POINTER(u64),
                       ctypes.POINTER(i32), ctypes.POINTER(i32), u32, u32, ctypes.POINTER(u32), i32, i32, i32, i32]
    tiled = lib.cuTensorMapEncodeTiled
    tiled.restype = i32
    tiled.argtypes = [ctypes.c_void_p, i32, u32, ctypes.c_void_p, ctypes.POINTER(u64), ctypes.POINTER(u64),
                      ctypes.POINTER(u32), ctypes.POINTER(u32), i32, i32, i32, i32]
    return im2col, tiled


class EncodeError(_loader.KernelLaunchError):
    """A tensor map the driver would not encode; ``status`` is its CUresult."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def _check(status: int, what: str) -> None:
    if status != 0:
        raise EncodeError(f"cuconv: {what} failed (CUresult {status})", status)


def im2col_map(n: int, h: int, w: int, pitch: int, lower: tuple, upper: tuple, stride: tuple, channels: int,
               pixels: int):
    """The encoder of an im2col map over an NHWC tensor of 16-bit elements (``n`` images of ``h`` × ``w``
    pixels, ``pitch`` elements a pixel): a copy moves ``pixels`` window origins' ``channels`` channels (16, 32 or
    64: one swizzled row of 32, 64 or 128 bytes each), the origins walking the bounding box from ``lower`` (h, w)
    to (h - 1, w - 1) + ``upper`` at ``stride`` (h, w). Returns ``encode(dst_address, tensor_address)``."""
    dims = (ctypes.c_uint64 * 4)(pitch, w, h, n)
    strides = (ctypes.c_uint64 * 3)(2 * pitch, 2 * pitch * w, 2 * pitch * w * h)
    low = (ctypes.c_int * 2)(lower[1], lower[0])
    high = (ctypes.c_int * 2)(upper[1], upper[0])
    steps = (ctypes.c_uint32 * 4)(1, stride[1], stride[0], 1)
    swizzle = _SWIZZLE[2 * channels]

    def encode(dst: int, address: int) -> None:
        _check(_driver()[0](dst, _UINT16, 4, address, dims, strides, low, high, channels, pixels, steps,
                            _INTERLEAVE_NONE, swizzle, _L2_PROMOTION_128B, _OOB_FILL_ZEROS),
               f"cuTensorMapEncodeIm2col(n={n}, h={h}, w={w}, pitch={pitch}, lower={lower}, upper={upper}, "
               f"stride={stride}, channels={channels}, pixels={pixels})")
    return encode


def tiled_map(cols: int, rows: int, box_cols: int, box_rows: int):
    """The encoder of a tiled map over a row-major matrix of 16-bit elements (``rows`` × ``cols``): a copy moves
    ``box_rows`` rows of ``box_cols`` columns (16, 32 or 64: 32, 64 or 128 bytes a row, swizzled). Returns
    ``encode(dst, address)``."""
    return _tiled((cols, rows), (box_cols, box_rows), f"cols={cols}, rows={rows}, box={box_cols}x{box_rows}")


def rows_map(cols: int, mid: int, rows: int, box_cols: int, box_mid: int):
    """The encoder of a tiled map over a row-major (``rows`` × ``mid`` × ``cols``) tensor of 16-bit elements whose
    copies move ``box_mid`` × ``box_cols`` of one row (``box_cols`` 16, 32 or 64: 32, 64 or 128 bytes, swizzled):
    a channels-last output as N·P rows of Q pixels of K filters, a box ending where its row does. Returns
    ``encode(dst, address)``."""
    return _tiled((cols, mid, rows), (box_cols, box_mid, 1),
                  f"rows={rows}, mid={mid}, cols={cols}, box={box_cols}x{box_mid}")


def _tiled(sizes: tuple, box: tuple, what: str):
    """The encoder of a tiled map over a dense row-major tensor of 16-bit elements of ``sizes`` (innermost first),
    copies of ``box``, swizzled by the box's row of ``2 · box[0]`` bytes; ``what`` names it in errors."""
    rank = len(sizes)
    dims = (ctypes.c_uint64 * rank)(*sizes)
    pitches = [2 * sizes[0]]
    for size in sizes[1:-1]:
        pitches.append(pitches[-1] * size)
    strides = (ctypes.c_uint64 * (rank - 1))(*pitches)
    boxes = (ctypes.c_uint32 * rank)(*box)
    steps = (ctypes.c_uint32 * rank)(*([1] * rank))
    swizzle = _SWIZZLE[2 * box[0]]

    def encode(dst: int, address: int) -> None:
        _check(_driver()[1](dst, _UINT16, rank, address, dims, strides, boxes, steps, _INTERLEAVE_NONE, swizzle,
                            _L2_PROMOTION_128B, _OOB_FILL_ZEROS),
               f"cuTensorMapEncodeTiled({what})")
    return encode


def nhwc_rows_map(n: int, h: int, w: int, pitch: int, box: int):
    """The encoder of a tiled map over an NHWC tensor of 16-bit elements (``n`` images of ``h`` × ``w`` pixels,
    ``pitch`` elements a pixel) whose copies move ``box`` pixels of one row, 8 channels each (16 bytes, no
    swizzle): a pixel's chunk right after the previous pixel's. Returns ``encode(dst, address)``."""
    dims = (ctypes.c_uint64 * 4)(pitch, w, h, n)
    strides = (ctypes.c_uint64 * 3)(2 * pitch, 2 * pitch * w, 2 * pitch * w * h)
    boxes = (ctypes.c_uint32 * 4)(8, box, 1, 1)
    steps = (ctypes.c_uint32 * 4)(1, 1, 1, 1)

    def encode(dst: int, address: int) -> None:
        _check(_driver()[1](dst, _UINT16, 4, address, dims, strides, boxes, steps, _INTERLEAVE_NONE, _SWIZZLE_NONE,
                            _L2_PROMOTION_128B, _OOB_FILL_ZEROS),
               f"cuTensorMapEncodeTiled(NHWC rows: n={n}, h={h}, w={w}, pitch={pitch}, box={box})")
    return encode


_PLACEHOLDER = numpy.zeros((), dtype=numpy.dtype((numpy.void, MAP_BYTES)))
# pointer sets a launch keeps the encoded maps of (the least recently used dropped first): an eager loop's buffers
# of one layer come from torch's caching allocator in a short cycle (a fused resnet50 forward re-encoded 80% of its
# launches' maps with one set kept)
MAP_SETS = 8
# a 16-byte aligned address the encoders accept when a launch is prepared (the maps are checked then, before any
# kernel runs, and encoded again for the real pointers)
_TRIAL_ADDRESS = 1 << 20


class TmaLaunch(_loader.PreparedLaunch):
    """A ``PreparedLaunch`` whose kernel takes, after its pointers and ``scalars``, one tensor map per entry of
    ``maps``: ``(pointer index, encode)``, the map of the tensor at that pointer. A launch whose mapped pointers
    differ from the last launch's copies their maps in from its ``MAP_SETS`` kept sets, or encodes them, under the
    launch's lock (the parameter buffer is shared)."""

    __slots__ = ("_maps", "_map_storage", "_map_addresses", "_mapped", "_mapped_pointers", "_kept_maps")

    def __init__(self, fn, name: str, grid: tuple, block: tuple, n_pointers: int, scalars: tuple, maps: tuple,
                 smem: int = 0):
        super().__init__(fn, name, grid, block, n_pointers, tuple(scalars) + (_PLACEHOLDER,) * len(maps), smem)
        self._lock = threading.RLock()  # (launch encodes and then enqueues through the base class's launch)
        self._maps = tuple(maps)
        # (the mapped pointers of a launch as one tuple, without a generator on the launch's host path)
        indices = [i for i, _ in self._maps]
        self._mapped_pointers = operator.itemgetter(*indices) if len(indices) > 1 else \
            (lambda pointers, i=indices[0]: (pointers[i],))
        self._map_storage = numpy.zeros(len(maps) * MAP_BYTES + _MAP_ALIGN, dtype=numpy.uint8)
        first = -self._map_storage.ctypes.data % _MAP_ALIGN + self._map_storage.ctypes.data
        self._map_addresses = tuple(first + MAP_BYTES * i for i in range(len(maps)))
        params = self._keep[-1]  # the kernel's parameter addresses: the maps are the last ones
        params[len(params) - len(maps):] = self._map_addresses
        self._encode((_TRIAL_ADDRESS,) * len(maps))
        self._mapped = None
        self._kept_maps = {}  # mapped pointers -> their maps' bytes, least recently used first

    def _encode(self, addresses: tuple) -> None:
        """The maps of the tensors at ``addresses``. The driver encodes them in the calling thread's current
        context: a thread that has none (a warmup's worker thread; see ``PreparedLaunch.launch``) has the
        device's primary context made current (the runtime's cudaSetDevice), and its maps encoded again."""
        for (_, encode), dst, address in zip(self._maps, self._map_addresses, addresses):
            try:
                encode(dst, address)
            except EncodeError as exc:
                if exc.status != _loader._CUDA_ERROR_INVALID_CONTEXT:
                    raise
                self._runtime.setDevice(self.device)
                encode(dst, address)

    def launch(self, stream: int, pointers, _after_set_device: bool = False) -> None:
        with self._lock:
            mapped = self._mapped_pointers(pointers)
            if mapped != self._mapped:
                self._remap(mapped)
            super().launch(stream, pointers, _after_set_device)

    def _remap(self, mapped: tuple) -> None:
        """The maps of the tensors at ``mapped`` into the parameter buffer: copied from the kept sets, or encoded
        and kept (a map depends on nothing else: the sizes, strides and boxes are the launch's own)."""
        kept, first, nbytes = self._kept_maps, self._map_addresses[0], MAP_BYTES * len(self._maps)
        maps = kept.pop(mapped, None)
        if maps is None:
            self._mapped = None  # (an encode that raises part way leaves the buffer matching no pointer set)
            self._encode(mapped)
            if len(kept) >= MAP_SETS:
                del kept[next(iter(kept))]  # (the least recently used: a hit moves its set to the end)
            maps = ctypes.string_at(first, nbytes)
        else:
            ctypes.memmove(first, maps, nbytes)
        kept[mapped] = maps
        self._mapped = mapped
