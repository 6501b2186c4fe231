"""Depthwise forward on NCHW activations: Python twin of ``kernels_cu/depthwise/nchw_fwd.cu``. Its kernels, by
preference (``forward_kernels``): ``depthwise_fwd_rows`` (``rows_layout``, ``rows_strips``), ``depthwise_fwd_plane``
(``plane_plan``), ``depthwise_fwd_strips`` (``strips_plan``), the gathers (a thread per output or two) and the
32×64 output tiles of ``depthwise_fwd`` (``forward_smem``); see the package's docstring. The stride-1 dgrad of a
multiplier-1 layer runs these too, as the forward of dy reading the weight flipped (``_forward_prepared``)."""

from __future__ import annotations

import functools

import numpy

from ... import _dtypes, _loader, _plan  # noqa: F401  (_plan: annotations)
from ...blocks.epilogue import NO_EPILOGUE, epilogue_args
from ...spec import ConvSpec
from .shared import (_FIXED_KERNELS, _MAX_GRID_Y, _THREADS, _acc_size, _dw_geometry, _fits_int, _geometry,
                     epilogue_instances, fused_instance, with_epilogue_flag)

STEM = "depthwise/nchw_fwd"
# Kernel sizes of depthwise_fwd_plane, for double and for float sums: its window and weights live in
# registers, and larger ones spill (7x7 in float, 5x5 in double) or leave one block per SM.
_PLANE_KERNELS = {False: ((3, 3),), True: ((3, 3), (5, 5))}
# Kernel sizes of depthwise_fwd_rows: the same limits (5x5 in double needs ~185 registers and spills at 128).
_ROWS_KERNELS = _PLANE_KERNELS


NAME_EXPRESSIONS = tuple(epilogue_instances(
    [f"depthwise_fwd<{t},{r},{s},{u}>" for t in _dtypes.ALL_CTYPE_NAMES
     for r, s, u in [(r, s, u) for r, s in ((3, 3), (5, 5), (7, 7)) for u in ("true", "false")] + [(0, 0, "false")]]
    + [f"depthwise_fwd_strips<{t},{r},{s},{f}>" for t in _dtypes.ALL_CTYPE_NAMES for r, s in ((3, 3), (5, 5), (7, 7))
       for f in ("false", "true")]
    + [f"depthwise_fwd_plane<{t},{r},{s}>" for t in _dtypes.ALL_CTYPE_NAMES for r, s in _PLANE_KERNELS[t != "double"]]
    + [f"depthwise_fwd_rows<{t},{r},{s},{seg},{vb}>" for t in _dtypes.ALL_CTYPE_NAMES
       for r, s in _ROWS_KERNELS[t != "double"] for seg in ("false", "true")
       for vb in ((16, 8) if t in ("__half", "__nv_bfloat16") else (16,))]
    + [f"depthwise_fwd_gather<{t},{r},{r}>" for t in _dtypes.ALL_CTYPE_NAMES for r in (3, 5, 7)]
    + [f"depthwise_fwd_gather2<{t},{r},{r},{sw}>" for t in _dtypes.ALL_CTYPE_NAMES for r in (3, 5, 7)
       for sw in (1, 2)]))


_TILE_P, _TILE_Q = 32, 64  # kTileP, kTileQ in depthwise/nchw_fwd.cu
_STRIP_ROWS = (4, 16)  # output rows per thread in depthwise_fwd_strips and _plane, shortest and longest


_PLANE_STAGES = (2, 4)  # depthwise_fwd_plane's plane buffers per block, fewest and most


_PLANE_BLOCK_SMEM = 48 << 10  # buffers beyond two stay within this (four blocks per SM)


_PLANE_SMEM = 96 << 10  # two buffers at most this: planes up to 48 KB, two blocks per SM


_PLANE_BLOCKS_PER_SM = {True: 4, False: 2}  # plane_min_blocks in the kernel: 3x3 summing in float, others


def forward_smem(spec: ConvSpec, itemsize: int, acc_size: int = 4) -> int:
    """Dynamic shared memory of one forward block: the R·S weights and the input tile with its halo."""
    rows = (_TILE_P - 1) * spec.stride[0] + (spec.r - 1) * spec.dilation[0] + 1
    cols = (_TILE_Q - 1) * spec.stride[1] + (spec.s - 1) * spec.dilation[1] + 1
    return -(-spec.r * spec.s * acc_size // 16) * 16 + rows * cols * itemsize


def _fn(name: str):
    return _loader.get_function(STEM, NAME_EXPRESSIONS, name)


def _strips(spec: ConvSpec):
    """(rows per strip, strips per plane, passes of 256 threads over them) of the column-strip kernels: the
    strip length, 4 to 16 rows, that wastes the fewest thread-rows in the last pass; ties go to longer
    strips (fewer reloaded window rows)."""
    best = None
    for rows in range(_STRIP_ROWS[1], _STRIP_ROWS[0] - 1, -1):
        strips = -(-spec.p // rows)
        passes = -(-strips * spec.q // _THREADS)
        slots = passes * _THREADS * rows
        if best is None or slots < best[0]:
            best = (slots, rows, strips, passes)
    return best[1:]


def strips_plan(spec: ConvSpec):
    """(rows per strip, strips per plane) for ``depthwise_fwd_strips`` (``_strips``), or None where that kernel
    does not apply (it needs stride = dilation = 1, a 3×3, 5×5 or 7×7 kernel, and fewer than 2^31 items:
    (plane, strip, column) triples, a thread each, and at most 65535 blocks of them a plane)."""
    if spec.stride != (1, 1) or spec.dilation != (1, 1) or (spec.r, spec.s) not in _FIXED_KERNELS:
        return None
    rows, strips, _ = _strips(spec)
    if spec.n * spec.k * strips * spec.q >= 2**31 - _THREADS or -(-strips * spec.q // _THREADS) > _MAX_GRID_Y:
        return None
    return rows, strips


def plane_plan(spec: ConvSpec, dtype, smem_limit: int):
    """(rows per strip, strips per plane, lead, pitch, buffers, shared-memory bytes) for
    ``depthwise_fwd_plane``, or None where it does not apply: it needs stride = dilation = 1, a kernel of
    ``_PLANE_KERNELS`` (3×3, and 5×5 where sums are in float), rows of a multiple of 16 bytes (its copies;
    without them the strips kernel is as fast) and two padded input planes within
    ``_PLANE_SMEM`` and ``smem_limit`` (a block's opt-in). The input's base address must be 16-byte aligned too (the
    launcher's check).

    A staged plane has P + R - 1 rows of ``pitch`` elements; image column 0 sits at ``lead``, the left
    padding rounded up to 16 bytes, so that 16-byte copies land aligned; ``pitch`` covers the right
    padding, rounded to 16 bytes. Buffers: as many as fit ``_PLANE_BLOCK_SMEM`` (two to four), so that
    several planes per block are in flight while one is convolved. The strip length, 4 to 16 rows, wastes
    the fewest thread-rows over the block's passes of 256 threads; ties go to longer strips (fewer reloaded
    window rows)."""
    if spec.stride != (1, 1) or spec.dilation != (1, 1):
        return None
    if (spec.r, spec.s) not in _PLANE_KERNELS[_acc_size(dtype) == 4]:
        return None
    itemsize = numpy.dtype(dtype).itemsize
    per_vector = 16 // itemsize
    if spec.w % per_vector:
        return None
    lead = -(-spec.pad[2] // per_vector) * per_vector
    pitch = -(-(lead + spec.w + spec.pad[3]) // per_vector) * per_vector
    plane_bytes = (spec.p + spec.r - 1) * pitch * itemsize
    if _PLANE_STAGES[0] * plane_bytes > min(_PLANE_SMEM, smem_limit):
        return None
    stages = max(_PLANE_STAGES[0], min(_PLANE_STAGES[1], _PLANE_BLOCK_SMEM // plane_bytes))
    rows, strips, _ = _strips(spec)
    return rows, strips, lead, pitch, stages, stages * plane_bytes


def _plane_grid(spec: ConvSpec, dtype, smem: int, env: "_plan.Env") -> int:
    """Persistent grid of ``depthwise_fwd_plane`` on ``env``'s device: the blocks that are resident at once
    (registers: four per SM for 3×3 summing in float, else two, as ``plane_min_blocks`` in the kernel; shared
    memory), at most one per input plane."""
    by_regs = _PLANE_BLOCKS_PER_SM[spec.r <= 3 and _acc_size(dtype) == 4]
    by_smem = env.smem_per_sm // (smem + 1024)  # 1 KB per block is reserved
    return max(1, min(spec.n * spec.c, env.sm_count * max(1, min(by_regs, by_smem))))


def rows_vector_bytes(spec: ConvSpec, dtype):
    """The bytes of ``depthwise_fwd_rows``' row vectors for rows of ``spec.w`` elements: 16 where a row is a
    multiple of 16 bytes; in the 16-bit types 8 where it is a multiple of 8 (rows of 28 or 20 halves, which
    16-byte vectors miss: without them those layers took the strips kernel at twice float32's time); else
    None."""
    row_bytes = spec.w * numpy.dtype(dtype).itemsize
    if row_bytes % 16 == 0:
        return 16
    if numpy.dtype(dtype).itemsize == 2 and row_bytes % 8 == 0:
        return 8
    return None


def rows_layout(spec: ConvSpec, dtype):
    """(segments per row, lanes per segment, slots per warp) of ``depthwise_fwd_rows``, or None where it does
    not apply: it needs stride = dilation = 1, a kernel of ``_ROWS_KERNELS`` with its centred padding left
    and right (so Q == W: output rows are input rows' width, vector for vector) and rows of whole vectors
    (``rows_vector_bytes``). The input and output base addresses must be 16-byte aligned too (the
    launcher's check).

    A thread owns V = vector bytes / itemsize consecutive columns (one load and one store per row). A row's
    G = W / V vectors are cut into segments of at most 32 lanes, as even as they go; a warp serves
    32 // lanes slots side by side, a slot being one segment of one strip of output rows of one plane."""
    if spec.stride != (1, 1) or spec.dilation != (1, 1):
        return None
    if (spec.r, spec.s) not in _ROWS_KERNELS[_acc_size(dtype) == 4]:
        return None
    if spec.pad[2] != (spec.s - 1) // 2 or spec.pad[3] != spec.s - 1 - spec.pad[2]:
        return None
    vector_bytes = rows_vector_bytes(spec, dtype)
    if vector_bytes is None:
        return None
    vectors = spec.w // (vector_bytes // numpy.dtype(dtype).itemsize)
    segs = -(-vectors // 32)
    lanes = -(-vectors // segs)
    if spec.n * spec.k * segs * spec.p >= 2**31:  # slot indices are 32-bit (at most P strips per plane)
        return None
    return segs, lanes, 32 // lanes


_ROWS_SLOT_ROWS = 2  # a slot's fixed cost (decode, taps, the first KR - 1 rows' latency), in output rows


def rows_strips(spec: ConvSpec, segs: int, per_warp: int, resident_warps: int):
    """(rows per strip, strips per plane) of ``depthwise_fwd_rows`` for a persistent grid of
    ``resident_warps`` warps. Strips are a multiple of R rows long (the kernel steps R rows at a time; the
    last strip of a plane computes past P and stores only its rows). The length is the one whose rounds
    over the grid cost the fewest rows, a round costing its strips' rows plus the R - 1 rows above them and
    ``_ROWS_SLOT_ROWS``; for each strip count, the shortest length that gives it."""
    best = None
    resident = resident_warps * per_warp
    planes = spec.n * spec.k
    last = None
    for steps in range(1, -(-spec.p // spec.r) + 1):
        rows = steps * spec.r
        strips = -(-spec.p // rows)
        if strips == last:
            continue
        last = strips
        rounds = -(-planes * strips * segs // resident)
        cost = rounds * (rows + spec.r - 1 + _ROWS_SLOT_ROWS)
        if best is None or cost < best[0]:
            best = (cost, rows, strips)
    return best[1:]


def _rows_launch(spec: ConvSpec, dtype, layout, sm_count: int, fused: bool = False):
    """(kernel, grid, scalar arguments) of ``depthwise_fwd_rows`` (``fused``: its instance applying an epilogue):
    a persistent grid of the blocks that are resident at once (the kernel's registers decide), strips cut for it
    (``rows_strips``)."""
    segs, lanes, per_warp = layout
    name = with_epilogue_flag(f"depthwise_fwd_rows<{_dtypes.ctype_of(dtype)},{spec.r},{spec.s},"
                              f"{'true' if segs > 1 else 'false'},{rows_vector_bytes(spec, dtype)}>", fused)
    regs = -(-max(1, _fn(name).num_regs) // 8) * 8
    blocks_per_sm = max(1, min(2048 // _THREADS, 65536 // (regs * _THREADS)))
    resident_warps = sm_count * blocks_per_sm * (_THREADS // 32)
    rows, strips = rows_strips(spec, segs, per_warp, resident_warps)
    slots = spec.n * spec.k * strips * segs
    blocks = min(-(-slots // (per_warp * (_THREADS // 32))), sm_count * blocks_per_sm)
    return name, (blocks, 1, 1), _geometry(spec, slots=slots, strips=strips, segs=segs, seg_lanes=lanes, rows=rows)


FORWARD_KERNELS = ("gather", "rows", "plane", "strips", "tiles")
# depthwise_fwd_strips packs the strips of planes up to this many output pixels flat into its blocks: a block
# per plane would hold a few busy threads (a 7x7 plane: 7 of 256), and the SM's limit of resident blocks would
# leave it nearly idle. On larger planes a block per plane is as fast or faster (5x5, 7x7 kernels on 56x56: 1.3-
# 1.9x).
_FLAT_STRIPS_MAX_PIXELS = 14 * 14


@functools.lru_cache(maxsize=1024)
def _forward_prepared(spec: ConvSpec, dtype, x_aligned: bool, out_aligned: bool, env: "_plan.Env",
                      kernel: str = None, flip: bool = False, codes: tuple = NO_EPILOGUE) -> "_loader.PreparedLaunch":
    """``_forward_launch`` prepared (``_loader.PreparedLaunch``) on ``env``'s device: a call passes five pointers
    (x, w, bias, out, the residual or 0) to one driver call instead of CuPy marshalling sixteen arguments (~8 µs of
    host time on a 0.06 ms layer). ``flip``: the kernel reads the weight flipped in both axes (dgrad at stride 1 as
    this forward of dy); ``codes``: the epilogue its stores apply (``blocks.epilogue.epilogue_codes``; a kEpi
    instance: ``fused_instance``)."""
    fused = fused_instance(codes, dtype)
    name, grid, block, smem, geometry = _forward_launch(spec, dtype, x_aligned, out_aligned, env, kernel, fused)
    if flip:
        geometry = tuple(_flipped(g) for g in geometry)
    return _loader.PreparedLaunch(_fn(name), name, grid, block, 5, geometry + (epilogue_args(codes),), smem)


def _flipped(struct):
    """A copy of a kernel's struct argument with its ``flip`` field set (structs without one as they are)."""
    if "flip" not in (struct.dtype.names or ()):
        return struct
    copy = numpy.array(struct, dtype=struct.dtype)
    copy["flip"] = 1
    return copy[()]


def forward_kernels(spec: ConvSpec, dtype, smem_limit: int, x_aligned: bool = True, out_aligned: bool = True) -> tuple:
    """The forward kernels that can serve this depthwise convolution, in ``FORWARD_KERNELS``'s order (which runs
    is the selector's: ``cuconv.select.depthwise.forward_kernel``): ``gather`` (3x3, 5x5, 7x7, tensors below 2^31
    elements), ``rows`` (``rows_layout``; 16-byte aligned input and output), ``plane`` (``plane_plan``; aligned
    input, its planes within ``smem_limit``), ``strips`` (``strips_plan``), ``tiles`` (any geometry whose tiles
    fit the grid)."""
    usable = {
        "gather": (spec.r, spec.s) in _FIXED_KERNELS and spec.r == spec.s and _fits_int(spec),
        "rows": rows_layout(spec, dtype) is not None and x_aligned and out_aligned,
        "plane": plane_plan(spec, dtype, smem_limit) is not None and x_aligned,
        "strips": strips_plan(spec) is not None,
        "tiles": -(-spec.p // _TILE_P) * -(-spec.q // _TILE_Q) <= _MAX_GRID_Y,
    }
    return tuple(k for k in FORWARD_KERNELS if usable[k])


def _forward_launch(spec: ConvSpec, dtype, x_aligned: bool, out_aligned: bool, env: "_plan.Env", kernel: str = None,
                    fused: bool = False):
    """(kernel, grid, block, shared memory, scalar arguments) of the forward: ``kernel`` (None: the one auto runs,
    ``cuconv.select.depthwise.forward_kernel``), its instance applying an epilogue where ``fused``. Planned once
    per problem, alignment and device: its one caller, ``_forward_prepared``, is memoized."""
    flag = lambda name: with_epilogue_flag(name, fused)  # noqa: E731
    ctype = _dtypes.ctype_of(dtype)
    if kernel not in (None,) + FORWARD_KERNELS:
        raise ValueError(f"cuconv: unknown depthwise forward kernel {kernel!r}; expected one of {FORWARD_KERNELS}")
    usable = forward_kernels(spec, dtype, env.smem_limit, x_aligned, out_aligned)
    if kernel is None:
        if not usable:
            raise NotImplementedError(f"cuconv: depthwise needs more than {_MAX_GRID_Y} tiles per output plane")
        from ...select import depthwise as choice  # (the selector imports the algorithms)

        kernel = choice.forward_kernel(spec, usable)
    elif kernel not in usable:
        raise NotImplementedError(f"cuconv: depthwise's {kernel} forward kernel cannot serve this convolution")
    if kernel == "gather":  # two outputs a thread where their windows share columns (dilation 1, stride_w <= 2)
        if spec.dilation == (1, 1) and spec.stride[1] in (1, 2):
            total = spec.n * spec.k * spec.p * -(-spec.q // 2)
            name = f"depthwise_fwd_gather2<{ctype},{spec.r},{spec.s},{spec.stride[1]}>"
        else:
            total = spec.n * spec.k * spec.p * spec.q
            name = f"depthwise_fwd_gather<{ctype},{spec.r},{spec.s}>"
        return flag(name), (_loader.blocks(total, 1 << 20), 1, 1), (_THREADS, 1, 1), 0, (_dw_geometry(spec, total),)
    if kernel == "rows":
        name, grid, geometry = _rows_launch(spec, dtype, rows_layout(spec, dtype), env.sm_count, fused)
        return name, grid, (_THREADS, 1, 1), 0, geometry
    if kernel == "plane":
        rows, count, lead, pitch, stages, smem = plane_plan(spec, dtype, env.smem_limit)
        geometry = _geometry(spec, rows=rows, strips=count, lead=lead, pitch=pitch, stages=stages)
        return (flag(f"depthwise_fwd_plane<{ctype},{spec.r},{spec.s}>"), (_plane_grid(spec, dtype, smem, env), 1, 1),
                (_THREADS, 1, 1), smem, geometry)
    if kernel == "strips":
        rows, count = strips_plan(spec)
        items = spec.n * spec.k * count * spec.q
        geometry = _geometry(spec, rows=rows, strips=count, items=items)
        flat = spec.p * spec.q <= _FLAT_STRIPS_MAX_PIXELS
        grid = (_loader.blocks(items, None), 1, 1) if flat else (spec.n * spec.k, _loader.blocks(count * spec.q), 1)
        return (flag(f"depthwise_fwd_strips<{ctype},{spec.r},{spec.s},{'true' if flat else 'false'}>"), grid,
                (_THREADS, 1, 1), 0, geometry)
    smem = forward_smem(spec, dtype.itemsize, _acc_size(dtype))
    tiles_q = -(-spec.q // _TILE_Q)
    tiles = -(-spec.p // _TILE_P) * tiles_q
    kr, ks = (spec.r, spec.s) if (spec.r, spec.s) in _FIXED_KERNELS else (0, 0)
    unit = "true" if kr and spec.stride == (1, 1) and spec.dilation == (1, 1) else "false"
    return (flag(f"depthwise_fwd<{ctype},{kr},{ks},{unit}>"), (spec.n * spec.k, tiles, 1), (32, 8, 1), smem,
            _geometry(spec, tiles_q=tiles_q))
