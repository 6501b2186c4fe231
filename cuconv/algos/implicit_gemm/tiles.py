"""implicit_gemm's kernel instances (tiles) of every engine, the tables auto picks them from, and the sizes
they share: padded channels, k tiles, the Plan of one problem, blocks an SM holds and split-K."""

from __future__ import annotations

import dataclasses

from ... import _plan
from ...spec import ConvSpec


_INT_MAX = 2**31 - 1
_MAX_GRID_Z = 65535     # pack_nhwc runs one sample per grid z
_MAX_SIDE = 2**15 - 1    # input rows and columns (padding included) are 16-bit in the loader

# C++ storage types with tensor-core arithmetic here (float means TF32: rounded when packed)
_TENSOR_CORE_TYPES = ("float", "__half", "__nv_bfloat16")


def _tf32(ctype: str) -> str:
    """The pack kernels' kTf32 template argument: float32 is rounded to TF32 once, when packed."""
    return "true" if ctype == "float" else "false"


def _staging_bytes(bm: int, bn: int) -> int:
    """The epilogue's fp32 tile in shared memory: [bn][bm + 4] (NCHW rows) or [bm][bn + 4] (channels-last
    vectors of filters), whichever the output takes."""
    return 4 * max(bn * (bm + 4), bm * (bn + 4))


@dataclasses.dataclass(frozen=True)
class Tile:
    """One kernel instance: a block computes ``bm`` output pixels × ``bn`` output channels with
    ``warps_m × warps_n`` warps and a ``stages``-deep cp.async pipeline."""

    bm: int
    bn: int
    warps_m: int
    warps_n: int
    stages: int
    kbytes: int = 128  # k bytes per shared-memory row and per k tile
    wgmma = False      # an mma.sync instance (sm_80+)
    nchw = False       # reads the packed input (the packing launch runs first)
    tma = False        # loads its tiles through TMA copies (WgmmaTmaTile)

    @property
    def pitch(self) -> int:
        return self.kbytes + 16

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def smem_bytes(self) -> int:
        """The pipeline's tiles, or the epilogue's fp32 staging ([bn][bm + 4], or [bm][bn + 4] for
        channels-last outputs) if larger."""
        return max(self.stages * (self.bm + self.bn) * self.pitch, _staging_bytes(self.bm, self.bn))

    def kernel_name(self, ctype: str, phases: bool = False) -> str:
        """The instance's name; ``phases``: the one running a strided dgrad's phases in one launch."""
        return (f"implicit_gemm_fprop{'_phases' if phases else ''}<{ctype},{self.bm},{self.bn},{self.warps_m},"
                f"{self.warps_n},{self.stages},{self.kbytes}>")


@dataclasses.dataclass(frozen=True)
class WgmmaTile:
    """One ``implicit_gemm_wgmma`` instance (sm_90a): a block computes ``bn`` filters × ``bm`` output pixels
    with ``bn / 64 × wg_p`` warpgroups, each 64 filters × ``bm / wg_p`` pixels, through a ``stages``-deep
    cp.async pipeline of 128-byte k tiles stored with the 128-byte swizzle."""

    bn: int      # filters per block (the wgmma's M, 64 per warpgroup)
    bm: int      # output pixels per block (the wgmma's N, 128 per instruction)
    wg_p: int    # warpgroups along the pixels
    stages: int
    retire: bool = False  # retire each k tile's wgmmas before the next: loads run stages - 1 tiles ahead
    kbytes = 128
    wgmma = True
    nchw = False
    tma = False

    @property
    def threads(self) -> int:
        return 128 * (self.bn // 64) * self.wg_p

    @property
    def smem_bytes(self) -> int:
        """The pipeline's slots or the epilogue's fp32 staging (``_staging_bytes``), if larger, plus 1024 bytes
        to align them for the swizzle."""
        return max(self.stages * (self.bm + self.bn) * self.kbytes, _staging_bytes(self.bm, self.bn)) + 1024

    def kernel_name(self, ctype: str) -> str:
        return (f"implicit_gemm_wgmma<{ctype},{self.bn},{self.bm},{self.wg_p},{self.stages},"
                f"{str(self.retire).lower()}>")


def _tma_block_threads(filters: int) -> int:
    """A TMA-fed block's threads: a warpgroup of wgmmas per 64 filters, then the producer warp."""
    return 128 * (filters // 64) + 32


@dataclasses.dataclass(frozen=True)
class WgmmaTmaTile:
    """One ``implicit_gemm_wgmma_tma`` instance (sm_90a): ``bn`` filters × ``bm`` output pixels on ``bn / 64``
    warpgroups of wgmmas and a producer warp that issues each k tile as two TMA copies (the input's im2col column,
    the weight's rows) into a ``stages``-deep ring of slots; at least ``min_blocks`` blocks an SM. A k tile is
    ``kbytes`` of one tap's channels (128: 64 channels; 64 and 32 for layers of 32 and 16). Serves the 16-bit
    types where a group's padded channels are whole k tiles and the input is one group (``tma_reason``);
    ``tma_tile`` picks one."""

    bn: int
    bm: int
    stages: int
    min_blocks: int = 1
    kbytes: int = 128
    persistent: bool = False  # implicit_gemm_wgmma_tma_pst where it serves (_persistent_blocks), else its _twin
    wg_p = 1
    retire = False
    wgmma = True
    nchw = False
    tma = True

    @property
    def threads(self) -> int:
        return _tma_block_threads(self.bn)

    @property
    def smem_bytes(self) -> int:
        """The slots or the epilogue's staging, if larger, 1024 bytes to align them, two 8-byte barriers a slot
        and 16 bytes for a flag. Persistent: ``resident_smem`` but for the weight."""
        if self.persistent:
            return self.stages * self.bm * self.kbytes + 2 * self.bm * self.bn + 1024 + 16 * self.stages + 8
        return (max(self.stages * (self.bm + self.bn) * self.kbytes, _staging_bytes(self.bm, self.bn)) + 1024
                + 16 * self.stages + 16)

    def resident_smem(self, k_tiles: int) -> int:
        """A persistent block's shared memory on a reduction of ``k_tiles`` k tiles: its filters' weight (every k
        tile), slots of im2col columns alone, the staging of 16-bit outputs, 1024 bytes to align them, the ring's
        barriers and the weight's."""
        return k_tiles * self.bn * self.kbytes + self.smem_bytes

    def kernel_name(self, ctype: str, phases: bool = False, store_tma: bool = False) -> str:
        """The instance's name; ``phases``: the one running a strided dgrad's phases in one launch; ``store_tma``:
        the one storing a dense channels-last output through the TMA (persistent: the only one)."""
        if self.persistent and (phases or not store_tma):
            raise ValueError(f"implicit_gemm: {self} stores its output through the TMA, and only so")
        kind = "_phases" if phases else "_pst" if self.persistent else "_st" if store_tma else ""
        return (f"implicit_gemm_wgmma_tma{kind}<{ctype},{self.bn},{self.bm},{self.stages},{self.min_blocks},"
                f"{self.kbytes}>")


@dataclasses.dataclass(frozen=True)
class WgradTmaTile:
    """One ``implicit_gemm_wgrad_tma`` instance (sm_90a): a block computes ``bf`` filters × ``bc`` channels of one
    tap of dW on ``bf / 64`` warpgroups of wgmmas with both operands MN-major, and a producer warp that copies a
    k tile (64 output pixels: dy's rows and the tap's im2col column) into a ``stages``-deep ring of slots; at least
    ``min_blocks`` blocks an SM. Serves channels-last wgrads in the 16-bit types (``wgrad_tma_reason``)."""

    bf: int
    bc: int
    stages: int
    min_blocks: int = 1
    tma = True
    wgmma = True
    nchw = False

    @property
    def threads(self) -> int:
        return _tma_block_threads(self.bf)

    @property
    def smem_bytes(self) -> int:
        """The slots (64-pixel boxes of 64 filters or channels, 8 KB each), 1024 bytes to align them, and two 8-byte
        barriers a slot."""
        return self.stages * (self.bf + self.bc) // 64 * _MN_BOX_BYTES + 1024 + 16 * self.stages

    def kernel_name(self, ctype: str, groups: bool = False) -> str:
        """The instance's name; ``groups``: the one for groups of channels (64 x 64 tiles only)."""
        return (f"implicit_gemm_wgrad_tma<{ctype},{self.bf},{self.bc},{self.stages},{self.min_blocks},"
                f"{'true' if groups else 'false'}>")


_MN_BOX_BYTES = 64 * 128  # kMnBoxBytes: one copy's box, 64 pixels × 64 filters or channels


@dataclasses.dataclass(frozen=True)
class WgmmaTmaRowsTile:
    """One ``implicit_gemm_wgmma_tma_rows`` instance (sm_90a): ``bn`` filters × ``bm`` output pixels of one output
    row, on ``bn / 64`` warpgroups of wgmmas and a producer warp that copies each kernel row's band of input pixels
    once (every tap of the row reads it from its own pixel on) and the weight a tap at a time into a ``stages``-deep
    ring; at least ``min_blocks`` blocks an SM. A k tile is one tap's ``cp`` channels (16, 32 or 64: a group's
    padded channels, exactly). Serves the 16-bit types at stride 1, one group (``rows_reason``)."""

    bn: int
    bm: int
    stages: int
    min_blocks: int
    cp: int
    wg_p = 1
    retire = False
    wgmma = True
    nchw = False
    tma = True
    rows = True

    @property
    def kbytes(self) -> int:
        return 2 * self.cp

    @property
    def threads(self) -> int:
        return _tma_block_threads(self.bn)

    def smem_for(self, spec: ConvSpec) -> int:
        """The weight's slots and two bands of ``spec``'s input rows, or the epilogue's staging if larger, 1024
        bytes to align them, two barriers a slot and two a band."""
        band = _rows_band(self.bm, spec.s, spec.dilation[1])
        slots = self.stages * self.bn * self.kbytes + 2 * (self.cp // 8) * band * 16
        return max(slots, _staging_bytes(self.bm, self.bn)) + 1024 + 16 * self.stages + 32

    def kernel_name(self, ctype: str, store_tma: bool = False) -> str:
        """The instance's name; ``store_tma``: the one storing a dense channels-last output through the TMA."""
        return (f"implicit_gemm_wgmma_tma_rows{'_st' if store_tma else ''}<{ctype},{self.bn},{self.bm},{self.stages},"
                f"{self.min_blocks},{self.cp}>")


def _rows_band(bm: int, s: int, dil_w: int) -> int:
    """A band's pixels (rows_band in implicit_gemm/wgmma_tma.cu): bm + (s - 1)·dil_w rounded up to 8, above 256 to 16."""
    band = -(-(bm + (s - 1) * dil_w) // 8) * 8
    return band if band <= 256 else -(-band // 16) * 16


def _rows_box(band: int) -> int:
    """Pixels a band's copy moves (rows_box): the band, or half of it above 256 (a box holds at most 256)."""
    return band if band <= 256 else band // 2


@dataclasses.dataclass(frozen=True)
class NchwTile:
    """One ``implicit_gemm_wgmma_nchw`` instance (sm_90a): ``bn`` filters × 128 output pixels with ``bn / 64``
    warpgroups, gathering both operands itself from the NCHW input and KCRS weight (no packing launch, no
    workspace) into two swizzled slots; at least ``min_blocks`` blocks per SM (register budget)."""

    bn: int
    min_blocks: int
    bm = 128
    wg_p = 1
    stages = 2
    retire = True
    kbytes = 128
    wgmma = True
    nchw = True
    tma = False

    @property
    def threads(self) -> int:
        return 128 * (self.bn // 64)

    @property
    def smem_bytes(self) -> int:
        """The two slots or the epilogue's staging, if larger, plus 1024 bytes of alignment; the k table
        comes on top (``table_bytes``)."""
        return max(2 * (self.bm + self.bn) * self.kbytes, _staging_bytes(self.bm, self.bn)) + 1024

    def table_bytes(self, k_tiles: int, itemsize: int) -> int:
        """8 bytes per k of the padded reduction (input offset, tap bit)."""
        return k_tiles * (self.kbytes // itemsize) * 8

    def kernel_name(self, ctype: str) -> str:
        return f"implicit_gemm_wgmma_nchw<{ctype},{self.bn},{self.bm},{self.min_blocks}>"


# Measured on an H200 (docs/perf-notes.md, "implicit_gemm"). mma.sync (any sm_80+ device): of ten
# candidates these three were the fastest somewhere; 8 warps of 64x32 on 128 filters; 4 warps of 64x32 on
# 64 filters, with 128-byte k tiles for long reductions and 64-byte ones (61 KB, three blocks per SM) for
# short ones. wgmma (compute capability 9.0): of eight candidates, blocks small enough for two or three per
# SM won everywhere but TF32 rect_5x7 (long reduction, 128 filters: 128 x 256, one block per SM); blocks of
# 256 and 512 pixels with two warpgroups were 10-40% slower.
TILES = {
    "128x16": Tile(128, 16, 4, 1, 3),             # narrow groups: 4 warps of 32 pixels x 16 filters
    "128x32": Tile(128, 32, 4, 1, 4, 64),
    "128x128": Tile(128, 128, 2, 4, 3),
    "128x64": Tile(128, 64, 2, 2, 4),
    "128x64_k64": Tile(128, 64, 2, 2, 4, 64),
    "wg64x128": WgmmaTile(64, 128, 1, 4),          # 97 KB: two blocks per SM
    "wg64x128s3": WgmmaTile(64, 128, 1, 3),        # 73 KB: three
    "wg128x128r": WgmmaTile(128, 128, 1, 3, True),  # 97 KB: two, loads two tiles ahead
    "wg128x256": WgmmaTile(128, 256, 1, 4),        # 193 KB: one
    "nchw64": NchwTile(64, 3),                     # 49 KB + table: three blocks per SM
    "nchw128": NchwTile(128, 2),                   # 69 KB + table: two
}

# The TMA-fed kernel's instances, which auto takes for the 16-bit types (tma_tile): 128-byte k tiles (64 channels
# a tap), then 64- and 32-byte ones for narrower layers, where 64 x 256 blocks take two an SM.
TMA_TILES = {
    "tma64x128": WgmmaTmaTile(64, 128, 4, 2),      # 97 KB: two blocks an SM
    "tma128x128": WgmmaTmaTile(128, 128, 3, 2),    # 97 KB: two
    "tma128x256": WgmmaTmaTile(128, 256, 4),       # 193 KB: one
    "tma64x128_k64": WgmmaTmaTile(64, 128, 6, 3, 64),     # 73 KB: three
    "tma64x256_k64": WgmmaTmaTile(64, 256, 4, 2, 64),     # 81 KB: two
    "tma128x128_k64": WgmmaTmaTile(128, 128, 6, 2, 64),   # 97 KB: two
    "tma128x256_k64": WgmmaTmaTile(128, 256, 8, 1, 64),   # 193 KB: one
    "tma64x128_k32": WgmmaTmaTile(64, 128, 8, 3, 32),     # 49 KB: four
    "tma64x256_k32": WgmmaTmaTile(64, 256, 8, 2, 32),     # 81 KB: two
    "tma128x128_k32": WgmmaTmaTile(128, 128, 8, 2, 32),   # 69 KB: three
    "tma128x256_k32": WgmmaTmaTile(128, 256, 8, 1, 32),   # 133 KB (the staging): one
    # persistent, the weight resident (implicit_gemm_wgmma_tma_pst; KB + ring + staging, then 2 / 4 / 8 KB a k
    # tile of the weight): the short reductions of 16 and 32 channels a tap
    "ptma64x256_k32": WgmmaTmaTile(64, 256, 6, 2, 32, True),       # 81 KB + 2 KB a k tile
    "ptma128x128_k32": WgmmaTmaTile(128, 128, 8, 2, 32, True),     # 65 KB + 4 KB
    "ptma128x256_k32": WgmmaTmaTile(128, 256, 8, 1, 32, True),     # 129 KB + 4 KB
    "ptma64x256_k64": WgmmaTmaTile(64, 256, 4, 2, 64, True),       # 97 KB + 4 KB
    "ptma128x128_k64": WgmmaTmaTile(128, 128, 4, 2, 64, True),     # 65 KB + 8 KB
    "ptma128x256_k64": WgmmaTmaTile(128, 256, 4, 1, 64, True),     # 129 KB + 8 KB
}

# wgrad's TMA-fed instances (wgrad_tma_tile): 64 filters x 64 channels up to 64 channels, 64 x 128 up to 128 (or
# up to 64 filters), 128 x 256 beyond (H200, bf16, the dense layers of ResNet-18/50, VGG-11 and ConvNeXt: the
# fastest, or within 5% of it, on 26 of 32; docs/perf-notes.md). 128 x 128 was never the fastest by more than 5%.
WGRAD_TMA_TILES = {
    "wt64x64": WgradTmaTile(64, 64, 6, 2),      # 97 KB: two blocks an SM
    "wt64x128": WgradTmaTile(64, 128, 4, 2),    # 97 KB: two
    "wt128x128": WgradTmaTile(128, 128, 3, 2),  # 97 KB: two
    "wt128x256": WgradTmaTile(128, 256, 4, 1),  # 193 KB: one
}

# The row-band instances (tma_tile takes them for long rows at stride 1; opt-in elsewhere): 64 filters × 256 pixels
# and 128 × 128, each for a tap of 16, 32 or 64 channels, two blocks an SM (the registers of 128 fp32 accumulators
# and of two warpgroups' 64 leave no room for three).
TMA_ROWS_TILES = {
    "rows64x256_k16": WgmmaTmaRowsTile(64, 256, 8, 2, 16),
    "rows64x256_k32": WgmmaTmaRowsTile(64, 256, 8, 2, 32),
    "rows64x256_k64": WgmmaTmaRowsTile(64, 256, 4, 2, 64),
    "rows128x128_k16": WgmmaTmaRowsTile(128, 128, 8, 2, 16),
    "rows128x128_k32": WgmmaTmaRowsTile(128, 128, 8, 2, 32),
    "rows128x128_k64": WgmmaTmaRowsTile(128, 128, 4, 2, 64),
}


def tile_name(tile) -> str:
    """The name a tile has in ``TILES``, ``TMA_TILES``, ``WGRAD_TMA_TILES`` or ``TMA_ROWS_TILES`` (the text of a
    knob in the autotuner's cache)."""
    for table in (TILES, TMA_TILES, WGRAD_TMA_TILES, TMA_ROWS_TILES):
        for name, t in table.items():
            if t is tile:
                return name
    raise ValueError(f"implicit_gemm: {tile} is none of the instances")


def wgmma_available() -> bool:
    """Whether the current device runs the sm_90a wgmma kernels: compute capability 9.0 exactly
    (``_plan.device_limits``, which keeps the devices' answers)."""
    return _plan.device_limits()[1]


def _padded_channels(spec: ConvSpec, itemsize: int) -> int:
    """cp: the channels of a group rounded up to whole 16-byte vectors."""
    vec = 16 // itemsize
    return -(-spec.c_per_group // vec) * vec


def _packed_k_tiles(spec: ConvSpec, itemsize: int, kbytes: int) -> int:
    """k tiles of ``kbytes`` in the packed reduction (R·S·cp)."""
    return -(-(spec.r * spec.s * _padded_channels(spec, itemsize) * itemsize) // kbytes)


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one problem runs: the tile, a group's padded channels ``cp``, the k tiles, packed weight rows (``kp``
    per group × ``w_row``), samples per chunk, the groups and the packed input's pixel stride ``pix`` (all
    groups' channels: ``groups · cp``). An ``NchwTile`` packs nothing: ``cp`` is C and ``w_row`` C·R·S, the
    weight's own rows."""

    tile: Tile
    cp: int
    k_tiles: int
    w_row: int
    kp: int
    samples: int
    groups: int = 1

    @property
    def pix(self) -> int:
        return self.groups * self.cp

    def sample_bytes(self, spec: ConvSpec, itemsize: int) -> int:
        """One packed sample of the workspace (none for an NchwTile)."""
        return 0 if self.tile.nchw else spec.h * spec.w * self.pix * itemsize

    def weight_bytes(self, itemsize: int) -> int:
        """The packed weight, which shares the workspace with a chunk of packed samples (none for an
        NchwTile)."""
        return 0 if self.tile.nchw else self.groups * self.kp * self.w_row * itemsize


def resident_blocks(tile, smem_per_sm: int) -> int:
    """Blocks of ``tile`` an SM holds at once as their shared memory goes (1 KB a block is reserved)."""
    return max(1, smem_per_sm // (tile.smem_bytes + 1024))


_MAX_GRID_Y = 65535
