"""implicit_gemm's forward (and stride-1 dgrad as the forward of dy): the tile choice, the plan, the chunks' launches
on NCHW and channels-last tensors, and the GEMM launch of any engine's tile."""

from __future__ import annotations

import functools

import numpy

from ... import _dtypes, _loader, _plan, _tma
from ...blocks import dgrad_forward
from ...spec import ConvSpec
from .tiles import (
    Plan, Tile, _INT_MAX, _MAX_GRID_Z, _MAX_SIDE, _TENSOR_CORE_TYPES, _packed_k_tiles, _padded_channels, _rows_band,
    _rows_box)
from .launch import GEMM_POINTERS, NAME, NO_EPILOGUE, _fn, _gemm_geometry, _kernel, choice, epilogue_struct
from .pack import _pack_kernel, _sum_kernel
from .wgmma_nchw import nchw_fits
from .wgmma_tma import (
    _TMA_STORE, _block_diagonal_plan, _check_tma_store, _persistent_blocks, _tma_gemm_maps, _twin, _weight_map,
    block_diagonal_tile, tma_reason)


def plan(spec: ConvSpec, dtype, tile: Tile, workspace_limit: int) -> Plan:
    """The plan of ``tile`` (None: ``choose_tile``'s), its chunks of samples within ``workspace_limit``; an NchwTile
    that cannot serve the problem (``nchw_fits``) gives way to the packed wgmma tile ``choose_tile`` picks."""
    itemsize = numpy.dtype(dtype).itemsize
    tile = tile or choice().choose_tile(spec, dtype)
    if tile.nchw and not nchw_fits(spec, dtype):  # (an NchwTile runs wgmma: so does its stand-in)
        tile = choice().choose_tile(spec, dtype, wgmma=True, nchw=False)
    tile_k = tile.kbytes // itemsize
    kp = -(-spec.k_per_group // tile.bn) * tile.bn
    if tile.nchw:  # int offsets in the kernel: a chunk's input and its GEMM rows stay below 2^31
        k_tiles = -(-spec.crs_per_group // tile_k)
        samples = max(1, min(spec.n, _INT_MAX // max(1, spec.c * spec.h * spec.w),
                             _INT_MAX // max(1, spec.p * spec.q)))
        return Plan(tile, spec.c, k_tiles, spec.crs_per_group, kp, samples)
    cp = _padded_channels(spec, itemsize)
    k_tiles = _packed_k_tiles(spec, itemsize, tile.kbytes)
    w_row = k_tiles * tile_k
    per_sample = max(1, spec.h * spec.w * cp * spec.groups)
    # the workspace: the packed weight, then the chunk. int offsets in the kernel: a chunk's packed input and
    # its GEMM rows stay below 2^31
    samples = max(1, min(spec.n, (workspace_limit - spec.groups * kp * w_row * itemsize) // (per_sample * itemsize),
                         _INT_MAX // per_sample, _INT_MAX // max(1, spec.p * spec.q), _MAX_GRID_Z))
    return Plan(tile, cp, k_tiles, w_row, kp, samples, spec.groups)


def _arithmetic_reason(dtype, precision: str):
    if dtype not in _dtypes.CTYPES or _dtypes.ctype_of(dtype) not in _TENSOR_CORE_TYPES:
        return f"it runs on tensor cores, which have no {dtype} arithmetic here (float64 uses FFMA algorithms)"
    if _dtypes.ctype_of(dtype) == "float" and precision != "tf32":
        return ("float32 with precision='ieee' needs plain fp32 arithmetic; its tensor cores compute TF32 "
                "(precision='tf32')")
    return None


def _forward_reason(spec: ConvSpec, dtype, precision: str, limits: "_plan.Limits", tile=None):
    """Why the forward of ``spec`` cannot run on ``tile`` (None: the one auto takes) under ``limits``, or None."""
    dtype = numpy.dtype(dtype)
    reason = _arithmetic_reason(dtype, precision)
    if reason is not None:
        return reason
    if spec.groups != 1 and spec.c_per_group * dtype.itemsize % 16:
        return (f"a group's channels (C/groups = {spec.c_per_group}) must fill whole 16-byte vectors (a multiple "
                f"of {16 // dtype.itemsize} in {dtype})")
    if max(*spec.stride, *spec.dilation, *spec.pad, spec.p, spec.q) > _INT_MAX:
        return "its geometry struct holds strides, dilations, paddings and output sizes in 32 bits"
    pl = plan(spec, dtype, tile or choice().choose_tile(spec, dtype, limits.wgmma), limits.workspace_limit)
    padded_h, padded_w = spec.h + spec.pad[0] + spec.pad[1], spec.w + spec.pad[2] + spec.pad[3]
    if max(padded_h, padded_w) > _MAX_SIDE:
        return f"its padded image ({padded_h} x {padded_w}) exceeds the kernel's 16-bit pixel coordinates"
    if padded_h * padded_w * pl.pix > _INT_MAX:
        return "one sample's padded image is too large for the kernel's 32-bit in-sample offsets"
    need = pl.sample_bytes(spec, dtype.itemsize) + pl.weight_bytes(dtype.itemsize)
    if need > limits.workspace_limit:
        return (f"one sample packed to NHWC and the packed weight need {need} bytes, more than "
                f"cuconv.config.workspace_limit ({limits.workspace_limit})")
    return None


def _gemm_kernel(spec: ConvSpec, dtype, pl: Plan, samples: int, splits: int = 1,
                 split_tiles: int = None, nhwc: bool = False, codes: tuple = NO_EPILOGUE) -> "_loader.PreparedLaunch":
    """The implicit GEMM of ``samples`` packed samples into their NCHW output (``nhwc``: channels-last), bias and
    the epilogue ``codes`` (``launch.epilogue_codes``) fused; over ``splits`` ranges of ``split_tiles`` k tiles
    (grid z), each writing fp32 partial sums, one output apart, where ``splits`` > 1 (their sum applies the
    epilogue). Groups split the channels (``Geometry``)."""
    m = samples * spec.p * spec.q
    pq = spec.p * spec.q
    return _gemm_launch(spec, dtype, pl, m, spec.k_per_group, pl.groups, pl.cp, pl.kp,
                        (spec.k * pq, 1 if nhwc else pq), splits, split_tiles or pl.k_tiles,
                        (spec.q * spec.k, spec.k) if nhwc else None, codes=codes if splits == 1 else NO_EPILOGUE)


def _gemm_launch(spec: ConvSpec, dtype, pl: Plan, m: int, filters: int, groups: int, grp_a: int, w_rows: int,
                 out_strides: tuple, splits: int, split_tiles: int, out_pixel: tuple = None,
                 store_tma: bool = False, resident: int = 0, codes: tuple = NO_EPILOGUE) -> "_loader.PreparedLaunch":
    """The GEMM kernel of ``pl`` on ``spec``'s geometry: ``m`` rows and ``filters`` filters in each of ``groups``
    groups, a group's packed input ``grp_a`` elements and its packed weight ``w_rows`` rows after the previous
    one's, images and filters of the output ``out_strides`` elements apart, its rows and columns
    ``out_pixel`` (default dense: Q and 1; ``Geometry``). A TMA tile's launch encodes its maps of the input and
    the weight from the pointers it is given (``_tma.TmaLaunch``); ``store_tma``: and of the output, a dense
    channels-last (N·P·Q) × K matrix its ``implicit_gemm_wgmma_tma_st`` instance stores through the TMA, or a
    persistent tile's ``implicit_gemm_wgmma_tma_pst`` on ``resident`` blocks (``_persistent_blocks``, with
    ``store_tma`` only; 0: a persistent tile runs its ``_twin``). ``codes``: the epilogue the kernel applies
    (``launch.epilogue_codes``; a TMA store's residual copied by the TMA through a map of its own, of the residual
    pointer as the output's is of the output's, else of the output again). Pointers: x, w, bias, y, residual."""
    t = pl.tile if resident else _twin(pl.tile)
    geometry = _gemm_geometry(spec, pl, m, filters, groups, grp_a, w_rows, out_strides, splits, split_tiles,
                              out_pixel)
    scalars = (geometry, epilogue_struct(codes))
    grid = (-(-m // t.bm), groups * pl.kp // t.bn, splits)
    rows = getattr(t, "rows", False)
    smem = t.smem_for(spec) if rows else \
        t.smem_bytes + (t.table_bytes(pl.k_tiles, numpy.dtype(dtype).itemsize) if t.nchw else 0)
    if not t.tma:
        return _kernel(t.kernel_name(_dtypes.ctype_of(dtype)), grid, (t.threads, 1, 1), scalars, smem=smem,
                       pointers=GEMM_POINTERS)
    reason = tma_reason(spec, dtype, pl)
    if reason is not None:
        raise ValueError(f"implicit_gemm: tile {t} cannot run {spec}: {reason}")
    if store_tma:
        _check_tma_store(spec, splits, groups, out_strides, filters)
    name = t.kernel_name(_dtypes.ctype_of(dtype), store_tma=store_tma)
    samples = m // (spec.p * spec.q)
    if rows:  # a block per segment of bm pixels of an output row, the whole reduction (no split)
        if splits != 1:
            raise ValueError(f"implicit_gemm: tile {t} reduces every tap in its block: no split over k")
        box = _rows_box(_rows_band(t.bm, spec.s, spec.dilation[1]))
        maps = ((0, _tma.nhwc_rows_map(samples, spec.h, spec.w, pl.pix, box)), _weight_map(pl, groups * w_rows))
        if store_tma:
            out_map = _tma.rows_map(filters, spec.q, samples * spec.p, 64, t.bm)
            maps += ((3, out_map), (4 if codes[1] else 3, out_map))
        grid = (samples * spec.p * -(-spec.q // t.bm), groups * pl.kp // t.bn, 1)
        return _tma.TmaLaunch(_fn(name), name, grid, (t.threads, 1, 1), GEMM_POINTERS, scalars, maps, smem=smem)
    maps = _tma_gemm_maps(spec, pl, samples, groups * w_rows)
    if store_tma:
        out_map = _tma.tiled_map(filters, m, 64, t.bm)
        maps += ((3, out_map), (4 if codes[1] else 3, out_map))
        if t.persistent:
            grid, smem = (resident, 1, 1), t.resident_smem(pl.k_tiles)
    return _tma.TmaLaunch(_fn(name), name, grid, (t.threads, 1, 1), GEMM_POINTERS, scalars, maps, smem=smem)


@functools.lru_cache(maxsize=1024)
def _launches(spec: ConvSpec, dtype, tile, device: int, workspace_limit: int, sm_count: int, smem_per_sm: int,
              splits: int = None, flip: bool = False, nhwc: bool = False, krsc: bool = False,
              codes: tuple = NO_EPILOGUE):
    """(plan, workspace bytes, partial-sum bytes, chunks) of a forward; each chunk (x byte offset, out byte
    offset, packing, GEMM, sum of the splits or None), the first chunk's packing with the weight's. The
    workspace holds the packed weight (kp · w_row elements: whole 128-byte rows), then one chunk's packed input,
    then where the GEMM is split over k (``splits_for``, or ``splits``) the fp32 partial sums. An NchwTile
    packs nothing and is not split: no workspace, packing None. ``flip``: the weight given is a dgrad's layer
    weight, packed transposed and flipped (``_pack_kernel``). ``nhwc``: x and out channels-last in memory (a
    sample's offset is the same; the pack reads pixels, the GEMM and the sum of the splits write them); ``krsc``:
    the weight channels-last (the pack reads it so; an NchwTile, reading KCRS, takes none). ``codes``: the
    epilogue (``launch.epilogue_codes``), applied by the GEMM or, split, by the sum. Memoized per problem, tile,
    device, workspace limit, SMs and epilogue: a layer called again spends no host time planning."""
    pl = plan(spec, dtype, tile, workspace_limit)
    itemsize = numpy.dtype(dtype).itemsize
    packed = pl.weight_bytes(itemsize) + pl.samples * pl.sample_bytes(spec, itemsize)
    m = pl.samples * spec.p * spec.q
    if pl.tile.nchw:  # (its kernel reduces every k tile itself: a split asked for does not apply)
        splits = 1
    if splits is None:
        splits = choice().splits_for(m, spec.k, pl.tile, pl.k_tiles, sm_count, smem_per_sm, workspace_limit - packed,
                            spec.groups)
    split_tiles = -(-pl.k_tiles // splits)
    splits = -(-pl.k_tiles // split_tiles)  # (no empty range)
    chunks = []
    for n0 in range(0, spec.n, pl.samples):
        nb = min(pl.samples, spec.n - n0)
        pack = None if pl.tile.nchw else _pack_kernel(spec, dtype, pl.pix, nb, pl if n0 == 0 else None, flip, nhwc,
                                                      krsc)
        # (a filter's outputs: planes of P·Q in NCHW, every K-th element in channels-last)
        sums = None if splits == 1 else _sum_kernel(dtype, nb * spec.k * spec.p * spec.q, splits,
                                                     1 if nhwc else spec.p * spec.q, spec.k, sm_count, codes)
        chunks.append((n0 * spec.c * spec.h * spec.w * itemsize, n0 * spec.k * spec.p * spec.q * itemsize, pack,
                       _gemm_kernel(spec, dtype, pl, nb, splits=splits, split_tiles=split_tiles, nhwc=nhwc,
                                    codes=codes), sums))
    return pl, packed, 0 if splits == 1 else splits * m * spec.k * 4, tuple(chunks)


def _forward_plan(pass_: str, spec: ConvSpec, dtype, env: "_plan.Env", tile, splits: int, operands: tuple,
                  nhwc: bool = False, krsc: bool = False, codes: tuple = NO_EPILOGUE) -> "_plan.Plan":
    """The forward ``spec``'s launches as ``pass_``'s plan, its input, weight, bias (None: none) and output the
    plan's ``operands`` (``nhwc``: the input and output channels-last in memory; ``krsc``: the weight), the
    epilogue ``codes`` applied where the output is written (the residual, where there is one, the plan's
    ``residual`` operand at the output's offsets); a dgrad's (the forward of dy) packs the layer's weight
    flipped."""
    b = _plan.Builder(pass_, env)
    if spec.n * spec.k * spec.p * spec.q == 0:
        return b.plan(NAME)
    x, w, bias, out = operands
    bias_ref = _plan.NULL if bias is None else b.ref(bias)
    pl, packed, partial_bytes, chunks = _launches(spec, dtype, tile, env.device, env.workspace_limit, env.sm_count,
                                                  env.smem_per_sm, splits, pass_ == "dgrad", nhwc, krsc, codes)

    def residual(offset):  # (it lies as the output does: the same byte offset)
        return b.ref("residual", offset) if codes[1] else _plan.NULL

    if not packed:  # an NchwTile: the GEMM reads x and w as they are
        for x_offset, out_offset, _, gemm, _ in chunks:
            b.launch(gemm, b.ref(x, x_offset), b.ref(w), bias_ref, b.ref(out, out_offset), residual(out_offset))
        return b.plan(NAME)
    packed_w = b.take(packed)  # the packed weight, then the input
    packed_x = (packed_w[0], packed_w[1] + pl.weight_bytes(dtype.itemsize))
    partials = b.take(partial_bytes) if partial_bytes else None
    for x_offset, out_offset, pack, gemm, sums in chunks:  # the first chunk's pack also packs the weight; the
        b.launch(pack, b.ref(x, x_offset), packed_x, b.ref(w), packed_w)  # others ignore its weight pointers
        if sums is None:
            b.launch(gemm, packed_x, packed_w, bias_ref, b.ref(out, out_offset), residual(out_offset))
        else:  # fp32 partial sums of the k ranges, then their sum with the bias and the epilogue
            b.launch(gemm, packed_x, packed_w, _plan.NULL, partials, _plan.NULL)
            b.launch(sums, partials, bias_ref, b.ref(out, out_offset), residual(out_offset))
    return b.plan(NAME)


def _nhwc_forward_spec(spec: ConvSpec, pass_: str):
    """The forward convolution a channels-last ``pass_`` runs as one (the layer's, or for a dgrad at stride 1 that
    of dy), or None (a phased dgrad, wgrad)."""
    if pass_ == "fprop":
        return spec
    if pass_ == "dgrad":
        return dgrad_forward.forward_spec(spec)
    return None


def nhwc_in_place(spec: ConvSpec, dtype) -> bool:
    """Whether the packed tiles read a channels-last input where it is, with no pack: a group's channels fill
    whole 16-byte vectors, so that the packed input's pixel (groups · cp channels; the pack pads no rows or
    columns) is the input's own pixel of C channels; float16 and bfloat16 (float32's pack rounds to TF32 on the
    way, which an input read as stored would not have)."""
    itemsize = numpy.dtype(dtype).itemsize
    return itemsize == 2 and spec.c_per_group == _padded_channels(spec, itemsize)


def _packed_as_krsc(spec: ConvSpec, dtype, pl: Plan) -> bool:
    """Whether the packed weight of ``pl`` is, element for element, the channels-last weight (K, R, S, C/groups)
    itself: a half type (float32 is rounded to TF32 when packed), a group's channels in whole 16-byte vectors
    (no channel padding), its rows whole k tiles (no row padding) and its filters whole tiles of filters (no
    padded rows). Then the forward reads the layer's weight where it is."""
    return (numpy.dtype(dtype).itemsize == 2 and pl.cp == spec.c_per_group and pl.kp == spec.k_per_group
            and pl.w_row == spec.r * spec.s * spec.c_per_group)


def takes_block_diagonal(spec: ConvSpec, dtype, tile) -> bool:
    """Whether a channels-last grouped forward on ``tile`` (the one given or ``tile_for``'s) runs through the
    block-diagonal weight (``_block_diagonal_plan``)."""
    if spec.groups == 1:
        return False
    diagonal = block_diagonal_tile(spec, dtype)
    return diagonal is not None and tile is diagonal


def _nhwc_forward_plan(pass_: str, spec: ConvSpec, dtype, env: "_plan.Env", tile, bias: bool,
                       krsc: bool = False, splits: int = None, codes: tuple = NO_EPILOGUE) -> "_plan.Plan":
    """A forward or stride-1 dgrad on channels-last activations (the forward of dy into dx, the pack reading the
    layer's weight transposed and flipped). Where ``nhwc_in_place`` holds: one GEMM over every pixel of the batch,
    reading its input in place and storing NHWC rows (the epilogue's output strides: an image P·Q·K elements, a
    row Q·K, a pixel K, a filter 1), after the weight's packing launch alone (no samples; ``splits`` does not apply),
    or with none where a channels-last weight, or any 1x1 weight, is its own pack (``_packed_as_krsc``).
    Elsewhere the NCHW plan's chunks, the pack reading channels-last pixels and the GEMM storing them, split over
    ``splits`` k ranges (default ``splits_for``). A grouped forward that ``block_diagonal_tile`` serves (on a
    wgmma device, or asked for with that tile) runs through a block-diagonal weight (``_block_diagonal_plan``, the
    bias its only epilogue). ``codes``: the epilogue (``launch.epilogue_codes``)."""
    fspec = _nhwc_forward_spec(spec, pass_)
    b = _plan.Builder(pass_, env)
    if spec.n * spec.k * spec.p * spec.q == 0 or fspec.n * fspec.k * fspec.p * fspec.q == 0:
        return b.plan(NAME)
    tile = tile or choice().tile_for(pass_, spec, dtype, True, env, splits)
    if pass_ == "fprop" and takes_block_diagonal(spec, dtype, tile):
        if codes != NO_EPILOGUE:
            raise ValueError("implicit_gemm: the block-diagonal grouped forward applies the bias alone")
        return _block_diagonal_plan(spec, dtype, env, bias, krsc)
    if tile.nchw:
        raise ValueError(f"implicit_gemm: tile {tile} gathers NCHW; channels-last inputs take a packed tile")
    if tile.wgmma and not env.wgmma:
        raise ValueError(f"implicit_gemm: tile {tile} needs a device of compute capability 9.0 (wgmma)")
    operands = ("x", "w", "bias" if bias and pass_ == "fprop" else None, "out") if pass_ == "fprop" else \
        ("dy", "w", None, "dx")
    if not nhwc_in_place(fspec, dtype):
        return _forward_plan(pass_, fspec, dtype, env, tile, splits, operands, nhwc=True, krsc=krsc, codes=codes)
    x, _, bias_operand, out = operands
    # (what a TMA store takes: the residual's copies, where there is one, need its base aligned as the output's)
    dense_out = (_TMA_STORE and fspec.k % 8 == 0 and b.base_aligned(b.ref(out))
                 and (not codes[1] or b.base_aligned(b.ref("residual"))))
    pl = plan(fspec, dtype, tile, env.workspace_limit)
    m = fspec.n * fspec.p * fspec.q
    if m * fspec.k >= _INT_MAX or fspec.n * fspec.h * fspec.w * fspec.c >= _INT_MAX:
        raise NotImplementedError("cuconv: implicit_gemm's channels-last GEMM indexes its input and output in 32 bits")
    # (a 1x1 weight is (K, R, S, C) in memory whichever layout it is said to have: KCRS and KRSC are one order)
    if pass_ == "fprop" and (krsc or fspec.r * fspec.s == 1) and _packed_as_krsc(fspec, dtype, pl) \
            and b.base_aligned(b.ref("w")):
        packed_w = b.ref("w")  # (the channels-last weight is its own pack: no launch)
    else:
        packed_w = b.take(pl.weight_bytes(dtype.itemsize))
        b.launch(_pack_kernel(fspec, dtype, pl.pix, 0, pl, flip=pass_ == "dgrad", krsc=krsc), _plan.NULL, _plan.NULL,
                 b.ref("w"), packed_w)
    store_tma = dense_out and tile.tma
    gemm = _gemm_launch(fspec, dtype, pl, m, fspec.k_per_group, pl.groups, pl.cp, pl.kp,
                        (fspec.p * fspec.q * fspec.k, 1), 1, pl.k_tiles, out_pixel=(fspec.q * fspec.k, fspec.k),
                        store_tma=store_tma, resident=_persistent_blocks(tile, pl, m, env) if store_tma else 0,
                        codes=codes)
    b.launch(gemm, b.ref(x), packed_w, _plan.NULL if bias_operand is None else b.ref(bias_operand), b.ref(out),
             b.ref("residual") if codes[1] else _plan.NULL)
    return b.plan(NAME)
