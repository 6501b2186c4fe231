"""Algorithm ``implicit_gemm``: Python twin of ``kernels_cu/implicit_gemm.cu``, tensor-core implicit GEMM.

Forward, dgrad (at stride 1 the forward convolution of ``dy``, ``dgrad_forward``; at a larger stride one forward
convolution of dy per phase of the stride, ``phase_specs``) and wgrad (the forward convolution of x by dy with
samples and channels swapped, ``transposed_spec``) for float32 at ``precision="tf32"``, float16 and bfloat16, fp32
accumulation; grouped forward and dgrad where the pass's channels per group fill 16-byte vectors, grouped wgrad
at any group size (groups are blocks of the filter grid). Per chunk of samples:

1. ``pack_nhwc`` (``pack_nhwc_narrow`` for few channels) copies the input to NHWC with channels padded to
   ``cp`` (a multiple of one 16-byte vector), rounding float32 to TF32 on the way (the workspace:
   ``n·H·W·cp`` elements per chunk, bounded by ``cuconv.config.workspace_limit``, after the packed weight);
2. ``implicit_gemm_fprop`` computes ``out (n·P·Q, K) = A (n·P·Q, R·S·cp) @ Wpᵀ`` without ever writing A:
   each block gathers its A tile with cp.async straight from the packed input, feeds ``mma.sync`` through
   ``ldmatrix`` and writes NCHW rows through shared memory, bias fused. On compute capability 9.0,
   ``implicit_gemm_wgmma`` does the same with warpgroup MMAs reading both tiles from shared memory
   (the loader compiles the file for sm_90a there).

The weight is packed once per call, by the first chunk's packing launch ((Kp, R·S·cp) zero-padded to
whole tiles). On compute capability 9.0 ``implicit_gemm_wgmma_nchw`` (an ``NchwTile``) skips both packs:
it gathers the NCHW input and the KCRS weight itself, through registers, which pays where the pack weighs
most (1x1 layers; float32 with few filters and taps: ``prefers_nchw``). Tiles (``Tile``, ``WgmmaTile``,
``NchwTile``) are template instances; ``choose_tile`` picks one from the device, the filters and the
reduction length. The launches of a problem are planned once (``_launches``) and prepared
(``_loader.PreparedLaunch``): a call costs two launches per chunk and one allocation of host time, an
NchwTile one launch per chunk and no allocation.
float32 "ieee" and float64 are refused (they need FFMA arithmetic: ``direct_smem`` / ``im2col_gemm``), as are dilated
dgrads at a stride above 1. Where the grid would leave SMs idle the GEMM is split over k ranges (``splits_for``):
fp32 partial sums that ``sum_splits`` adds in a fixed order with the bias.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy

from .. import _dtypes, _loader, _plan, _tma
from ..blocks import dgrad_forward, elementwise
from .._config import config
from ..spec import ConvSpec
from ..problem import PASSES, Problem
from .base import Algorithm

__all__ = ["ALGORITHM", "ImplicitGemm", "forward_gpu", "dgrad_gpu", "wgrad_gpu", "wgrad_tma_tile", "wgrad_tma_reason", "wgrad_tma_splits",
           "WgradTmaTile", "WGRAD_TMA_TILES", "block_diagonal_tile", "reason_unsupported", "reason_unsupported_nhwc",
           "nhwc_in_place",
           "Tile", "WgmmaTile", "WgmmaTmaTile", "WgmmaTmaRowsTile", "NchwTile", "TILES", "TMA_TILES", "TMA_ROWS_TILES",
           "tma_reason", "rows_reason", "persistent_tile",
           "transposed_spec", "phase_specs", "phase_tile", "wgrad_tile", "wgrad_splits", "splits_for",
           "resident_blocks", "wgmma_available", "choose_tile", "prefers_nchw", "nchw_fits", "narrow_group_tile",
           "Plan", "plan", "pack_operands", "prepare", "NAME_EXPRESSIONS", "STEM"]

STEM = "implicit_gemm"
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
    """A band's pixels (rows_band in implicit_gemm.cu): bm + (s - 1)·dil_w rounded up to 8, above 256 to 16."""
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

NAME_EXPRESSIONS = tuple(
    [t.kernel_name(c) for c in _TENSOR_CORE_TYPES for t in TILES.values()]
    + [t.kernel_name(c, phases=True) for c in _TENSOR_CORE_TYPES for t in TILES.values() if type(t) is Tile]
    + [t.kernel_name(c, phases, store) for c in ("__half", "__nv_bfloat16") for t in TMA_TILES.values()
       for phases, store in (((False, True),) if t.persistent else ((False, False), (True, False), (False, True)))]
    + [t.kernel_name(c, store) for c in ("__half", "__nv_bfloat16") for t in TMA_ROWS_TILES.values()
       for store in (False, True)]
    + [t.kernel_name(c) for c in ("__half", "__nv_bfloat16") for t in WGRAD_TMA_TILES.values()]
    + [WGRAD_TMA_TILES["wt64x64"].kernel_name(c, groups=True) for c in ("__half", "__nv_bfloat16")]
    + [f"{k}<{c},{_tf32(c)}>" for k in ("pack_nhwc", "pack_nhwc_narrow", "pack_dgrad_phases", "pack_swap")
       for c in _TENSOR_CORE_TYPES]
    + [f"sum_splits<{c}>" for c in _TENSOR_CORE_TYPES]
    + [f"pack_block_diagonal<{c}>" for c in ("__half", "__nv_bfloat16")])


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


# An NchwTile instead of packing where the pack costs as much as the gather it saves (docs/perf-notes.md, v6):
# the pack moves the input twice, the GEMM reads it K·R·S / (tile) times more, so the pack weighs most where
# K·R·S is small: 1x1 layers, and float32 up to K·R·S = 576 (one launch and no allocation fewer); float16
# gathers two bytes per load and loses on 3x3.
_NCHW_MAX_FILTER_TAPS_FP32 = 576


def prefers_nchw(spec: ConvSpec, dtype) -> bool:
    """Whether ``choose_tile`` takes an NchwTile (where it fits) on a wgmma device: layers whose windows do not
    overlap (1x1, patchify: the pack would copy what the GEMM reads once), float32 with few filters and taps,
    and inputs of fewer channels than one 16-byte vector (a stem's 3: packed, each pixel would take a whole
    vector)."""
    taps, itemsize = spec.r * spec.s, numpy.dtype(dtype).itemsize
    disjoint = all(st >= d * (k - 1) + 1 for st, d, k in zip(spec.stride, spec.dilation, (spec.r, spec.s)))
    return (taps == 1 or disjoint or (itemsize == 4 and spec.k_per_group * taps <= _NCHW_MAX_FILTER_TAPS_FP32)
            or spec.c_per_group * itemsize < 16)


# Measured per tile on the layers of five torchvision models (H100, docs/perf-notes.md): an NchwTile reduces
# every k tile in its block (no split-K), so where its reduction is longer than _NCHW_MAX_SHORT_K_TILES tiles
# of 32 k and more than 3/4 of such a tile per block of its grid (7x7 planes with few filters, squeeze-excitation's 1x1)
# the packed tiles, split over k, win (2-3x on squeeze-excitation layers); on one row of pixel blocks 64
# filters a block win. Above 64 filters a wgmma block of 64 filters wins below _WIDE_TILE_MIN_M output pixels
# (more blocks: 10-25% on 14x14 and 7x7 layers) unless the GEMM has _LONG_TILE_MIN_MACS multiply-adds or more:
# there 128 x 256 blocks, one an SM, win by 10-30% (14x14 and 7x7 planes of 512 and 1024 channels, batch 64,
# detection heads' 256 channels at 50x76), and lose by 50% at 7.4 GFLOP (256 channels at 14x14, batch 32).
_NCHW_MAX_SHORT_K_TILES = 4
_WIDE_TILE_MIN_M = 16384
_LONG_TILE_MIN_MACS = 5 * 10**9


def narrow_group_tile(spec: ConvSpec):
    """For several groups of up to 32 filters each, the mma.sync tile of 16 or 32 filters a block (any
    device): the wgmma tiles' 64 filters a warpgroup would compute zeros for the rest. None otherwise."""
    if spec.groups == 1 or spec.k_per_group > 32:
        return None
    return TILES["128x16" if spec.k_per_group <= 16 else "128x32"]


def choose_tile(spec: ConvSpec, dtype, wgmma: bool = None, nchw: bool = None, tma: bool = True,
                rows: bool = True):
    """``wgmma`` defaults to whether the current device has it (compute capability 9.0), ``nchw`` to
    ``prefers_nchw`` but for long reductions over few blocks (``_NCHW_MAX_SHORT_K_TILES``). Several
    groups of up to 32 filters take ``narrow_group_tile`` on any device. Else, on a wgmma device: an NchwTile
    where it is preferred and fits (64 filters per block up to 64 filters or on one row of pixel blocks, else
    128); otherwise, where ``tma`` allows, the TMA tile ``tma_tile`` picks (the 16-bit types, one group, channels
    in whole 16s); otherwise 64 filters per block where K/groups <= 64, with four slots for float32 reductions of 16 k
    tiles or more and three (three blocks per SM) otherwise; above 64 filters, 64 x 128 blocks below
    ``_WIDE_TILE_MIN_M`` output pixels (128 x 256 ones where the GEMM has ``_LONG_TILE_MIN_MACS``
    multiply-adds or more), else 128 x 256 blocks for float32 reductions of 32 k tiles or more and 128 x 128 ones
    (two per SM) otherwise. Elsewhere (mma.sync): 128 filters per block where
    K/groups > 64; else 64, with 128-byte k tiles where the reduction (R·S·C/groups bytes) spans at least
    32 of them and 64-byte tiles (more blocks per SM) below."""
    if wgmma is None:
        wgmma = wgmma_available()
    itemsize = numpy.dtype(dtype).itemsize
    narrow = narrow_group_tile(spec)
    if narrow is not None:
        return narrow
    if wgmma:
        m = spec.n * spec.p * spec.q
        m_blocks = -(-m // 128)
        nchw_tile = TILES["nchw64" if spec.k_per_group <= 64 or m_blocks == 1 else "nchw128"]
        if nchw is None:
            k_tiles = -(-spec.crs_per_group // 32)  # float32 k tiles: a gather costs per element, not per byte
            blocks = m_blocks * -(-spec.k_per_group // nchw_tile.bn)
            nchw = prefers_nchw(spec, dtype) and not (k_tiles > _NCHW_MAX_SHORT_K_TILES and 4 * k_tiles > 3 * blocks)
        if nchw and nchw_fits(spec, dtype):
            return nchw_tile
        tma_choice = tma_tile(spec, dtype, rows) if tma else None
        if tma_choice is not None:
            return tma_choice
        k_tiles = _packed_k_tiles(spec, itemsize, WgmmaTile.kbytes)
        long_fp32 = itemsize == 4 and k_tiles >= (16 if spec.k_per_group <= 64 else 32)
        if spec.k_per_group <= 64:
            return TILES["wg64x128" if long_fp32 else "wg64x128s3"]
        if m < _WIDE_TILE_MIN_M:
            long_gemm = m * spec.k_per_group * spec.crs_per_group >= _LONG_TILE_MIN_MACS
            return TILES["wg128x256" if long_gemm else "wg64x128"]
        return TILES["wg128x256" if long_fp32 else "wg128x128r"]
    if spec.k_per_group > 64:
        return TILES["128x128"]
    reduction = spec.r * spec.s * spec.c_per_group * itemsize
    return TILES["128x64"] if reduction >= 4096 else TILES["128x64_k64"]


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


# An NchwTile's k table (8 bytes per k in shared memory) up to this many k: reductions up to C·R·S = 2048
# (16 KB), past which the pack is a small part of the time anyway; and kernels of up to 31 taps (one bit each
# in a 32-bit word per pixel)
_NCHW_MAX_K = 2048
_NCHW_MAX_TAPS = 31


def nchw_fits(spec: ConvSpec, dtype) -> bool:
    """Whether an ``NchwTile`` can serve this problem: one group, its k table fits (``_NCHW_MAX_K``) and the
    kernel's taps fit a 32-bit word (``_NCHW_MAX_TAPS``)."""
    tile_k = WgmmaTile.kbytes // numpy.dtype(dtype).itemsize
    return (spec.groups == 1 and -(-spec.crs_per_group // tile_k) * tile_k <= _NCHW_MAX_K
            and spec.r * spec.s <= _NCHW_MAX_TAPS)


# The TMA tiles auto takes (docs/perf-notes.md, "auto takes the TMA tiles"), on the devices with wgmma (H100/H200:
# 132 SMs of 228 KB): the first of a list with blocks for at least _TMA_FILL of the SMs (a 128 x 128 block alone
# on an SM outruns two of 64 x 128: 98 blocks of it beat 196 by 15% on ResNet-50's 256@14², 52 lose to 104 by
# 18% on 512@7²). Over 64 filters: 128 x 256 blocks (one an SM) for reductions of _TMA_LONG_REDUCTION bytes or
# more, but not for a wave and a half of them (their second wave half empty: 128 x 128 ones 7-12% faster); then
# 128 x 128 (two an SM: 10% faster than 128 x 256 on short reductions, whose epilogue one block an SM leaves
# bare), then 64 x 128. Up to 64 filters, or where 128-filter blocks would compute more of them than 64-filter
# ones (192: a third more; 96 takes 128, which computes no more than two of 64 and wins by 30%), 64 x 128
# blocks, or 64 x 256 ones with narrow k tiles where they run _TMA_MANY_WAVES waves or more (the large problems).
_TMA_FILL = 0.55
_TMA_SMS, _TMA_SMEM_PER_SM = 132, 228 << 10
_TMA_LONG_REDUCTION = 4096
_TMA_MANY_WAVES = 8


# The row-band tiles where output rows are long: whole segments of 256 (128) pixels cover 90% of a row or more
# (the large problems' 250- to 1022-pixel rows; the models' rows of 112 and fewer would leave blocks part empty).
_ROWS_MIN_FILL = 0.9


def _rows_tile(spec: ConvSpec, cp: int):
    """The row-band tile for a stride-1 layer of long output rows whose padded channels are one of the tiles' (16,
    32, 64), or None: 64 × 256 up to 64 filters, else 128 × 128."""
    if spec.stride != (1, 1) or cp not in (16, 32, 64):
        return None
    t = TMA_ROWS_TILES[("rows64x256" if spec.k <= 64 else "rows128x128") + f"_k{cp}"]
    return t if spec.q >= t.bm and spec.q / (-(-spec.q // t.bm) * t.bm) >= _ROWS_MIN_FILL else None


def tma_tile(spec: ConvSpec, dtype, rows: bool = True):
    """The TMA tile for ``spec`` in ``dtype`` (see above), or None where none serves it (``tma_reason``): a row-band
    tile where ``rows`` allows and ``_rows_tile`` finds one, else k tiles of 128 bytes where a group's channels are
    whole 64s, else of 64 or 32 bytes (whole 32s, 16s)."""
    itemsize = numpy.dtype(dtype).itemsize
    if itemsize != 2 or spec.groups != 1:
        return None
    cp = _padded_channels(spec, itemsize)
    kbytes = next((kb for kb in (128, 64, 32) if cp * itemsize % kb == 0), None)
    if kbytes is None:
        return None
    band_tile = _rows_tile(spec, cp) if rows else None
    if band_tile is not None and tma_reason(spec, dtype, Plan(band_tile, cp, spec.r * spec.s, 0, 0, spec.n)) is None:
        return band_tile
    if spec.k <= 64 or -(-spec.k // 128) * 128 > -(-spec.k // 64) * 64:
        names = ["64x128"] if kbytes == 128 else ["64x256", "64x128"]
    else:
        long = spec.r * spec.s * cp * itemsize >= _TMA_LONG_REDUCTION
        names = (["128x256"] if long else []) + ["128x128", "64x128"]
    m = spec.n * spec.p * spec.q
    for name in names:
        t = TMA_TILES[f"tma{name}" + ("" if kbytes == 128 else f"_k{kbytes}")]
        blocks = -(-m // t.bm) * -(-spec.k // t.bn)
        wave_and_a_half = name == "128x256" and _TMA_SMS < blocks < 2 * _TMA_SMS
        few_waves = name == "64x256" and blocks < _TMA_MANY_WAVES * _TMA_SMS * resident_blocks(t, _TMA_SMEM_PER_SM)
        if wave_and_a_half or few_waves:
            continue
        if blocks >= _TMA_FILL * _TMA_SMS:
            break
    pl = Plan(t, cp, _packed_k_tiles(spec, itemsize, kbytes), 0, 0, spec.n)
    return t if tma_reason(spec, dtype, pl) is None else None


def plan(spec: ConvSpec, dtype, tile: Tile = None, workspace_limit: int = None) -> Plan:
    """The plan of ``tile`` (default ``choose_tile``); an NchwTile that cannot serve the problem
    (``nchw_fits``) gives way to the packed wgmma tile ``choose_tile`` picks."""
    itemsize = numpy.dtype(dtype).itemsize
    tile = tile or choose_tile(spec, dtype)
    if tile.nchw and not nchw_fits(spec, dtype):  # (an NchwTile runs wgmma: so does its stand-in)
        tile = choose_tile(spec, dtype, wgmma=True, nchw=False)
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
    limit = config.workspace_limit if workspace_limit is None else workspace_limit
    per_sample = max(1, spec.h * spec.w * cp * spec.groups)
    # the workspace: the packed weight, then the chunk. int offsets in the kernel: a chunk's packed input and
    # its GEMM rows stay below 2^31
    samples = max(1, min(spec.n, (limit - spec.groups * kp * w_row * itemsize) // (per_sample * itemsize),
                         _INT_MAX // per_sample, _INT_MAX // max(1, spec.p * spec.q), _MAX_GRID_Z))
    return Plan(tile, cp, k_tiles, w_row, kp, samples, spec.groups)


def reason_unsupported(spec: ConvSpec, dtype, pass_: str = "fprop", precision: str = "ieee",
                       limits: "_plan.Limits" = None):
    """Why ``implicit_gemm`` cannot run this case under ``limits`` (default: the current device's), or None."""
    if pass_ == "wgrad":
        return _wgrad_reason(spec, dtype, precision, limits or _plan.current_limits())
    if pass_ == "dgrad" and dgrad_forward.forward_spec(spec) is None:
        return _phases_reason(spec, dtype, precision, limits or _plan.current_limits())
    return dgrad_forward.reason_unsupported(spec, dtype, pass_, precision, _forward_reason, limits)


def _arithmetic_reason(dtype, precision: str):
    if dtype not in _dtypes.CTYPES or _dtypes.ctype_of(dtype) not in _TENSOR_CORE_TYPES:
        return f"it runs on tensor cores, which have no {dtype} arithmetic here (float64 uses FFMA algorithms)"
    if _dtypes.ctype_of(dtype) == "float" and precision != "tf32":
        return ("float32 with precision='ieee' needs plain fp32 arithmetic; its tensor cores compute TF32 "
                "(precision='tf32')")
    return None


def _forward_reason(spec: ConvSpec, dtype, precision: str, limits: "_plan.Limits"):
    dtype = numpy.dtype(dtype)
    reason = _arithmetic_reason(dtype, precision)
    if reason is not None:
        return reason
    if spec.groups != 1 and spec.c_per_group * dtype.itemsize % 16:
        return (f"a group's channels (C/groups = {spec.c_per_group}) must fill whole 16-byte vectors (a multiple "
                f"of {16 // dtype.itemsize} in {dtype})")
    if max(*spec.stride, *spec.dilation, *spec.pad, spec.p, spec.q) > _INT_MAX:
        return "its geometry struct holds strides, dilations, paddings and output sizes in 32 bits"
    pl = plan(spec, dtype, choose_tile(spec, dtype, limits.wgmma), limits.workspace_limit)
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


def _fn(name: str):
    return _loader.get_function(STEM, NAME_EXPRESSIONS, name)


def _kernel(name: str, grid: tuple, block: tuple, scalars: tuple, smem: int = 0) -> "_loader.PreparedLaunch":
    """One launch but its pointer arguments (x, w or packed operands, bias, output): built once per problem
    (``_launches``), called with raw pointers, so that a layer called again spends no host time planning or
    marshalling arguments."""
    return _loader.PreparedLaunch(_fn(name), name, grid, block, 4, scalars, smem)


# The kernels' structs, passed by value: one argument instead of 9 or 17 (host time per launch).
PACK_SHAPE_DTYPE = numpy.dtype([(f, numpy.int32) for f in ("c", "cp", "hw", "units", "in_blocks", "k_valid", "rs",
                                                             "w_c", "w_cp", "w_kp", "w_flip", "w_krsc")]
                               + [(f, numpy.int64) for f in ("w_row", "w_total", "src_sample", "src_channel",
                                                             "dst_sample", "src_pixel")], align=True)
_GEOMETRY_FIELDS = ("h", "w", "cp", "k", "p", "q", "r", "s", "stride_h", "stride_w", "pad_h", "pad_w", "dil_h",
                    "dil_w", "m", "k_tiles")
GEOMETRY_DTYPE = numpy.dtype([(f, numpy.int32) for f in _GEOMETRY_FIELDS]
                             + [(f, numpy.int64) for f in ("w_row", "out_img", "out_k", "split_stride")]
                             + [(f, numpy.int32) for f in ("split_tiles", "pix", "kp", "grp_a", "w_rows", "out_row",
                                                           "out_col", "block_diag")], align=True)
PHASE_GEMMS_DTYPE = numpy.dtype([("g", GEOMETRY_DTYPE, (4,)), ("y_offset", numpy.int64, (4,)),
                                 ("w_offset", numpy.int64, (4,))], align=True)
PHASE_WEIGHTS_DTYPE = numpy.dtype([(f, numpy.int32) for f in ("groups", "kg", "cg", "kp", "cp", "r", "s", "stride_h",
                                                                "stride_w", "pad_h", "pad_w", "krsc")]
                                  + [(f, numpy.int64) for f in ("w_row", "rows")], align=True)

# pack_nhwc_narrow up to this many bytes per packed pixel: as fast as pack_nhwc or faster on every benchmark
# layer (H200: 64-256 bytes, e.g. fp16 rect_5x7 96 against 117 us, fp32 square_5x9 151 against 177 us)
_NARROW_PIXEL_BYTES = 256
_WEIGHT_BLOCKS = 1024     # at most this many blocks of 256 threads pack the weight (one row each)


def _pack_kernel(spec: ConvSpec, dtype, cp: int, samples: int, weight: "Plan" = None,
                 flip: bool = False, nhwc: bool = False, krsc: bool = False) -> "_loader.PreparedLaunch":
    """One launch packing ``samples`` samples (C, H, W) -> (H, W, cp), channels zero-padded (``cp`` the pixel
    stride: all groups' channels), and with a ``weight`` plan also the weight, KCRS -> (groups, kp, w_row)
    zero-padded with k index (r·S + s)·cp + c; float32 rounded to TF32 on the way; with ``flip`` the weight
    given is the layer's whose dgrad ``spec`` is the forward of (``dgrad_forward.forward_weight`` of it is
    packed); ``nhwc``: the samples are channels-last in memory, (H, W, C); ``krsc``: so is the weight (the
    layer's). Pointers: x, packed x, w, packed w (ignored without a weight)."""
    hw = spec.h * spec.w
    if nhwc:
        return _pack_launch(dtype, spec.c, cp, hw, samples, spec.c * hw, 1, hw * cp, weight, spec.k_per_group,
                            spec.r * spec.s, spec.c_per_group, flip, src_pixel=spec.c, krsc=krsc)
    return _pack_launch(dtype, spec.c, cp, hw, samples, spec.c * hw, hw, hw * cp, weight, spec.k_per_group,
                        spec.r * spec.s, spec.c_per_group, flip, krsc=krsc)


def _pack_launch(dtype, c: int, cp: int, hw: int, samples: int, src_sample: int, src_channel: int, dst_sample: int,
                 weight: "Plan" = None, k_valid: int = 0, rs: int = 0, w_c: int = 0,
                 flip: bool = False, src_pixel: int = 1, krsc: bool = False) -> "_loader.PreparedLaunch":
    """The packing launch: ``samples`` samples of ``c`` channels of ``hw`` pixels, ``src_sample`` and
    ``src_channel`` elements apart (pixels ``src_pixel`` apart: 1 for NCHW, C for channels-last), to (hw, cp)
    each, ``dst_sample`` elements apart, and with a ``weight`` plan the KCRS weight of ``k_valid`` filters per
    group, ``w_c`` channels and ``rs`` taps too (``flip``: read transposed and flipped from a dgrad's layer
    weight, see ``_pack_kernel``; ``krsc``: the weight channels-last). Pixels of up to 256 bytes, and
    channels-last inputs, take one thread per
    16-byte output vector (``pack_nhwc_narrow``: 2-10x faster than pack_nhwc below 64 bytes, where its
    32-channel tiles idle, and up to 20% at 128-256; on a channels-last input its loads are contiguous), wider
    NCHW ones 32 x 64 transposes in shared memory; the weight takes extra blocks of the same launch, one per
    row."""
    dtype = numpy.dtype(dtype)
    ctype = _dtypes.ctype_of(dtype)
    w_total = 0 if weight is None else weight.groups * weight.kp * weight.w_row
    w_row = 0 if weight is None else weight.w_row
    w_kp = 1 if weight is None else weight.kp
    w_cp = 1 if weight is None else weight.cp
    w_blocks = min(_WEIGHT_BLOCKS, w_total // w_row if w_row else 0)  # a block per row

    def shape(units: int, in_blocks: int = 0):
        return numpy.array((c, cp, hw, units, in_blocks, k_valid, rs, w_c, w_cp, w_kp, flip, krsc, w_row, w_total,
                            src_sample, src_channel, dst_sample, src_pixel), dtype=PACK_SHAPE_DTYPE)[()]

    if cp * dtype.itemsize <= _NARROW_PIXEL_BYTES or src_pixel != 1:
        vecs = samples * hw * cp * dtype.itemsize // 16
        blocks = _loader.blocks(vecs, None)  # one vector a thread (a capped grid walking them was up to 11% slower)
        return _kernel(f"pack_nhwc_narrow<{ctype},{_tf32(ctype)}>", (blocks + w_blocks, 1, 1), (_loader.THREADS, 1, 1),
                       (shape(vecs, blocks),))
    tiles = -(-hw // 64)  # pack_nhwc's tiles: 32 channels x 64 pixels
    # the weight's z slice has gx x gy blocks: at least w_blocks (the input's extra blocks find no tile)
    gx, gy = min(tiles, 512), -(-cp // 32)
    gx = max(gx, -(-w_blocks // gy))
    return _kernel(f"pack_nhwc<{ctype},{_tf32(ctype)}>", (gx, gy, samples + (w_total > 0)), (32, 8, 1), (shape(tiles),))


def _gemm_kernel(spec: ConvSpec, dtype, pl: Plan, samples: int, splits: int = 1,
                 split_tiles: int = None, nhwc: bool = False) -> "_loader.PreparedLaunch":
    """The implicit GEMM of ``samples`` packed samples into their NCHW output (``nhwc``: channels-last), bias
    fused; over ``splits`` ranges of ``split_tiles`` k tiles (grid z), each writing fp32 partial sums, one output
    apart, where ``splits`` > 1. Groups split the channels (``Geometry``)."""
    m = samples * spec.p * spec.q
    pq = spec.p * spec.q
    return _gemm_launch(spec, dtype, pl, m, spec.k_per_group, pl.groups, pl.cp, pl.kp,
                        (spec.k * pq, 1 if nhwc else pq), splits, split_tiles or pl.k_tiles,
                        (spec.q * spec.k, spec.k) if nhwc else None)


def rows_reason(spec: ConvSpec, dtype, pl: Plan):
    """Why ``implicit_gemm_wgmma_tma_rows`` cannot run ``pl`` on ``spec`` (None: it can): stride 1, a k tile is one
    tap's channels exactly (a group's padded channels are the tile's ``cp``), a band of at most 512 pixels (two
    boxes), output rows and pixels within the grid and 32-bit offsets."""
    t = pl.tile
    if spec.stride != (1, 1):
        return "its bands are input rows read at stride 1"
    if pl.cp != t.cp:
        return f"its k tile is one tap's {t.cp} channels: the layer's padded channels are {pl.cp}"
    if _rows_band(t.bm, spec.s, spec.dilation[1]) > 512:
        return "its band of input pixels is copied in at most two boxes of 256"
    if spec.n * spec.p * -(-spec.q // t.bm) > _INT_MAX or spec.n * spec.p * spec.q * spec.k >= _INT_MAX:
        return "its grid of output-row segments and its output offsets are 32-bit"
    return None


def tma_reason(spec: ConvSpec, dtype, pl: Plan):
    """Why ``implicit_gemm_wgmma_tma`` (or, for a rows tile, ``implicit_gemm_wgmma_tma_rows``: ``rows_reason``)
    cannot run ``pl`` on ``spec`` (None: it can): a k tile is ``kbytes`` of one tap's channels of one group's 16-bit
    input, and the im2col map's limits (``_tma``) hold."""
    if numpy.dtype(dtype).itemsize != 2:
        return "its TMA tiles move 16-bit elements"
    if pl.groups != 1:
        return "its TMA tiles read one group"
    if getattr(pl.tile, "rows", False):
        return rows_reason(spec, dtype, pl)
    if pl.cp % (pl.tile.kbytes // 2):
        return f"its TMA tile takes whole taps of {pl.tile.kbytes // 2} channels a k tile"
    return _im2col_map_reason(spec)


def _im2col_map_reason(spec: ConvSpec):
    """Why an im2col map over ``spec``'s input (the TMA forward's and wgrad's) cannot be encoded, or None: the
    driver's limits (``_tma``) on its bounding box corners, traversal strides and copies' tap offsets."""
    lower, upper = _tma_corners(spec)
    lo, hi = _tma.CORNER_RANGE
    if not all(lo <= v <= hi for v in lower + upper):
        return f"its im2col map's bounding box corners {lower}, {upper} are outside [{lo}, {hi}]"
    if max(spec.stride) > _tma.MAX_STRIDE:
        return f"its im2col map walks strides up to {_tma.MAX_STRIDE}"
    if max((spec.r - 1) * spec.dilation[0], (spec.s - 1) * spec.dilation[1]) >= _tma.MAX_OFFSET:
        return "its copies' tap offsets are 16-bit"
    return None


def _tma_corners(spec: ConvSpec) -> tuple:
    """The im2col map's bounding box of window origins, (h, w) from the image's top-left pixel and from its
    bottom-right one: from -padding to the last output pixel's origin, so that a column wraps to the next row
    after Q origins and to the next image after P rows."""
    lower = (-spec.pad[0], -spec.pad[2])
    upper = ((spec.p - 1) * spec.stride[0] - spec.pad[0] - (spec.h - 1),
             (spec.q - 1) * spec.stride[1] - spec.pad[2] - (spec.w - 1))
    return lower, upper


def _gemm_launch(spec: ConvSpec, dtype, pl: Plan, m: int, filters: int, groups: int, grp_a: int, w_rows: int,
                 out_strides: tuple, splits: int, split_tiles: int, out_pixel: tuple = None,
                 store_tma: bool = False, resident: int = 0) -> "_loader.PreparedLaunch":
    """The GEMM kernel of ``pl`` on ``spec``'s geometry: ``m`` rows and ``filters`` filters in each of ``groups``
    groups, a group's packed input ``grp_a`` elements and its packed weight ``w_rows`` rows after the previous
    one's, images and filters of the output ``out_strides`` elements apart, its rows and columns
    ``out_pixel`` (default dense: Q and 1; ``Geometry``). A TMA tile's launch encodes its maps of the input and
    the weight from the pointers it is given (``_tma.TmaLaunch``); ``store_tma``: and of the output, a dense
    channels-last (N·P·Q) × K matrix its ``implicit_gemm_wgmma_tma_st`` instance stores through the TMA, or a
    persistent tile's ``implicit_gemm_wgmma_tma_pst`` on ``resident`` blocks (``_persistent_blocks``, with
    ``store_tma`` only; 0: a persistent tile runs its ``_twin``)."""
    t = pl.tile if resident else _twin(pl.tile)
    geometry = _gemm_geometry(spec, pl, m, filters, groups, grp_a, w_rows, out_strides, splits, split_tiles,
                              out_pixel)
    grid = (-(-m // t.bm), groups * pl.kp // t.bn, splits)
    rows = getattr(t, "rows", False)
    smem = t.smem_for(spec) if rows else \
        t.smem_bytes + (t.table_bytes(pl.k_tiles, numpy.dtype(dtype).itemsize) if t.nchw else 0)
    if not t.tma:
        return _kernel(t.kernel_name(_dtypes.ctype_of(dtype)), grid, (t.threads, 1, 1), (geometry,), smem=smem)
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
            maps += ((3, _tma.rows_map(filters, spec.q, samples * spec.p, 64, t.bm)),)
        grid = (samples * spec.p * -(-spec.q // t.bm), groups * pl.kp // t.bn, 1)
        return _tma.TmaLaunch(_fn(name), name, grid, (t.threads, 1, 1), 4, (geometry,), maps, smem=smem)
    maps = _tma_gemm_maps(spec, pl, samples, groups * w_rows)
    if store_tma:
        maps += ((3, _tma.tiled_map(filters, m, 64, t.bm)),)
        if t.persistent:
            grid, smem = (resident, 1, 1), t.resident_smem(pl.k_tiles)
    return _tma.TmaLaunch(_fn(name), name, grid, (t.threads, 1, 1), 4, (geometry,), maps, smem=smem)


def _persistent_blocks(tile, pl: Plan, m: int, env: "_plan.Env") -> int:
    """The blocks a persistent ``tile`` runs ``pl``'s GEMM of ``m`` pixels on (``implicit_gemm_wgmma_tma_pst``):
    as many as the SMs hold at once (by its shared memory with the weight resident, at most its ``min_blocks`` an
    SM, what its registers were fitted to), a multiple of the blocks of filters, none idle; 0 where its weight and
    ring do not fit a block's shared memory, or for another tile."""
    per_sm = _persistent_per_sm(tile, pl.k_tiles, env) if getattr(tile, "persistent", False) else 0
    if not per_sm:
        return 0
    n_blocks = pl.groups * pl.kp // tile.bn
    return n_blocks * max(1, min(-(-m // tile.bm), env.sm_count * per_sm // n_blocks))


def _persistent_per_sm(tile, k_tiles: int, env: "_plan.Env") -> int:
    """Blocks of a persistent ``tile`` an SM holds on a reduction of ``k_tiles`` k tiles (its weight resident), at
    most its ``min_blocks`` (what its registers were fitted to); 0 where one does not fit a block's shared memory."""
    smem = tile.resident_smem(k_tiles)
    return 0 if smem > env.smem_limit else min(tile.min_blocks, env.smem_per_sm // (smem + 1024))


def _twin(tile):
    """A persistent tile's twin: the TMA tile of its shape that runs where the output is not stored through the
    TMA (an NCHW output, a split reduction, a strided dgrad's phases); any other tile itself."""
    if not getattr(tile, "persistent", False):
        return tile
    return next(t for t in TMA_TILES.values()
                if not t.persistent and (t.bn, t.bm, t.kbytes) == (tile.bn, tile.bm, tile.kbytes))


def _check_tma_store(spec: ConvSpec, splits: int, groups: int, out_strides: tuple, filters: int) -> None:
    """A TMA store's output: one k range of one group into a dense channels-last output of whole 16-byte pixels."""
    if splits != 1 or groups != 1 or out_strides != (spec.p * spec.q * filters, 1) or filters % 8:
        raise ValueError("implicit_gemm: a TMA store takes one k range of one group into a dense channels-last "
                         "output of whole 16-byte pixels")


def _gemm_geometry(spec: ConvSpec, pl: Plan, m: int, filters: int, groups: int, grp_a: int, w_rows: int,
                   out_strides: tuple, splits: int, split_tiles: int, out_pixel: tuple = None, pix: int = None,
                   block_diag: int = 0):
    """The GEMM kernels' ``Geometry`` (GEOMETRY_DTYPE) of ``_gemm_launch``'s arguments; ``pix`` the input's pixel
    pitch where it is not the plan's (a block-diagonal forward reads the layer's C channels), ``block_diag`` the
    width of its groups."""
    split_stride = 0 if splits == 1 else m * filters * groups
    out_row, out_col = out_pixel or (spec.q, 1)
    return numpy.array((spec.h, spec.w, pl.cp, filters, spec.p, spec.q, spec.r, spec.s, spec.stride[0],
                        spec.stride[1], spec.pad[0], spec.pad[2], spec.dilation[0], spec.dilation[1], m,
                        pl.k_tiles, pl.w_row, *out_strides, split_stride, split_tiles, pix or pl.pix, pl.kp, grp_a,
                        w_rows, out_row, out_col, block_diag), dtype=GEOMETRY_DTYPE)[()]


def _tma_gemm_maps(spec: ConvSpec, pl: Plan, samples: int, weight_rows: int, pix: int = None) -> tuple:
    """implicit_gemm_wgmma_tma's maps: the input's im2col map (pointer 0; pixels ``pix`` apart, default the
    plan's), the packed weight's ``weight_rows`` rows (pointer 1)."""
    lower, upper = _tma_corners(spec)
    return ((0, _tma.im2col_map(samples, spec.h, spec.w, pix or pl.pix, lower, upper, spec.stride,
                                pl.tile.kbytes // 2, pl.tile.bm)),
            _weight_map(pl, weight_rows))


def _weight_map(pl: Plan, weight_rows: int) -> tuple:
    """A TMA forward's map of its packed weight (pointer 1): ``weight_rows`` rows of ``pl.w_row``, a k tile's
    columns by the tile's filters a copy."""
    return (1, _tma.tiled_map(pl.w_row, weight_rows, pl.tile.kbytes // 2, pl.tile.bn))


SPLIT_SUM_DTYPE = numpy.dtype([("n", numpy.int64), ("splits", numpy.int32), ("pq", numpy.int32), ("k", numpy.int32),
                                ("unused", numpy.int32)], align=True)


def _sum_kernel(dtype, n: int, splits: int, pq: int, k: int, sm_count: int) -> "_loader.PreparedLaunch":
    """Split-K's last launch (pointers: partial sums, bias or null, output): ``n`` outputs of filter (i / pq) % k."""
    name = f"sum_splits<{_dtypes.ctype_of(dtype)}>"
    scalars = numpy.array((n, splits, pq, k, 0), dtype=SPLIT_SUM_DTYPE)[()]
    return _loader.PreparedLaunch(_fn(name), name, (_loader.blocks(n, 8 * sm_count), 1, 1), (_loader.THREADS, 1, 1),
                                  3, (scalars,))


# Split-K: about one block per SM over the device (the measured best from 1 to 16 splits followed SMs / blocks,
# rounded, on every wgrad layer of the sweep in docs/perf-notes.md), each split at least this many k tiles, at
# most this many splits.
_SPLIT_MIN_TILES = 4
_MAX_SPLITS = 128


def resident_blocks(tile, smem_per_sm: int) -> int:
    """Blocks of ``tile`` an SM holds at once as their shared memory goes (1 KB a block is reserved)."""
    return max(1, smem_per_sm // (tile.smem_bytes + 1024))


def splits_for(m: int, filters: int, tile, k_tiles: int, sm_count: int, smem_per_sm: int, room: int,
               groups: int = 1) -> int:
    """How many k ranges a GEMM of ``m`` rows and ``filters`` filters in ``groups`` groups (``k_tiles`` k tiles) on
    ``tile`` is split into on a device of ``sm_count`` SMs of ``smem_per_sm`` bytes of shared memory, with
    ``room`` bytes for the fp32 partial sums of m x filters outputs each; 1 for an NchwTile (its kernel reduces
    every k tile itself). Never more blocks than the SMs hold at once: for a tile of one block an SM, 144
    blocks on 132 SMs would run a second wave as long as the first (1.2x slower than 72 unsplit ones)."""
    if tile.nchw or getattr(tile, "rows", False):
        return 1
    blocks = -(-m // tile.bm) * groups * -(-filters // groups // tile.bn)
    splits = min(round(sm_count / blocks), sm_count * resident_blocks(tile, smem_per_sm) // blocks,
                 k_tiles // _SPLIT_MIN_TILES, _MAX_SPLITS, room // max(1, 4 * m * filters))
    return splits if splits >= 2 else 1


@functools.lru_cache(maxsize=1024)
def _launches(spec: ConvSpec, dtype, tile, device: int, workspace_limit: int, sm_count: int, smem_per_sm: int,
              splits: int = None, flip: bool = False, nhwc: bool = False, krsc: bool = False):
    """(plan, workspace bytes, partial-sum bytes, chunks) of a forward; each chunk (x byte offset, out byte
    offset, packing, GEMM, sum of the splits or None), the first chunk's packing with the weight's. The
    workspace holds the packed weight (kp · w_row elements: whole 128-byte rows), then one chunk's packed input,
    then where the GEMM is split over k (``splits_for``, or ``splits``) the fp32 partial sums. An NchwTile
    packs nothing and is not split: no workspace, packing None. ``flip``: the weight given is a dgrad's layer
    weight, packed transposed and flipped (``_pack_kernel``). ``nhwc``: x and out channels-last in memory (a
    sample's offset is the same; the pack reads pixels, the GEMM and the sum of the splits write them); ``krsc``:
    the weight channels-last (the pack reads it so; an NchwTile, reading KCRS, takes none). Memoized
    per problem, tile, device, workspace limit and SMs: a layer called again spends no host time planning."""
    pl = plan(spec, dtype, tile, workspace_limit)
    itemsize = numpy.dtype(dtype).itemsize
    packed = pl.weight_bytes(itemsize) + pl.samples * pl.sample_bytes(spec, itemsize)
    m = pl.samples * spec.p * spec.q
    if splits is None:
        splits = splits_for(m, spec.k, pl.tile, pl.k_tiles, sm_count, smem_per_sm, workspace_limit - packed,
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
                                                     1 if nhwc else spec.p * spec.q, spec.k, sm_count)
        chunks.append((n0 * spec.c * spec.h * spec.w * itemsize, n0 * spec.k * spec.p * spec.q * itemsize, pack,
                       _gemm_kernel(spec, dtype, pl, nb, splits=splits, split_tiles=split_tiles, nhwc=nhwc), sums))
    return pl, packed, 0 if splits == 1 else splits * m * spec.k * 4, tuple(chunks)


def pack_operands(x, w, spec: ConvSpec, pl: Plan, packed_x, packed_w=None) -> None:
    """Pack x (n, C, H, W) into ``packed_x`` (n, H, W, cp) and, given ``packed_w`` (kp · w_row elements), the
    weight too, in one launch (``_pack_kernel``) on CuPy's current stream."""
    import cupy

    kernel = _pack_kernel(spec, x.dtype, pl.pix, x.shape[0], None if packed_w is None else pl)
    kernel(cupy.cuda.get_current_stream().ptr, x.data.ptr, packed_x.data.ptr, 0 if packed_w is None else w.data.ptr,
           0 if packed_w is None else packed_w.data.ptr)


# ----------------------------------------------------------------------------------------------------------
# wgrad: dW (K, C/groups, R, S) = Σ over n, p, q of dy[n, k, p, q] · x[n, c, p·stride + r·dilation - pad, ...] is
# the forward convolution of x with its samples and channels swapped (C images of N channels) by dy likewise (K
# filters of N channels with P x Q taps, dilated by the stride), at a stride of the dilation, whose R x S
# output images (one per input channel c) the GEMM writes as dW's columns. Its M is C·R·S, its N the filters
# and its reduction N·P·Q: the same kernels as the forward, both operands packed by the forward's pack (the
# strides of PackShape), no column matrix. Groups pair a group's filters with its own images only: one GEMM
# of (C/groups)·R·S rows by K/groups filters per group, all in one launch (``Geometry``: grp_a, w_rows), the
# reduction whole in each (any C/groups: the packed channels are the samples). Reductions are long and the
# GEMMs often small: split over k (``wgrad_splits``) into fp32 partial sums added in a fixed order
# (deterministic).
# ----------------------------------------------------------------------------------------------------------
def transposed_spec(spec: ConvSpec) -> ConvSpec:
    """The forward convolution whose output images are dW's (c, r, s) columns (see above), as one group: every
    filter over every image (a grouped wgrad runs the pairs of each group). Its bottom and right padding
    (negative where the last input rows are not read) make its output exactly R x S."""
    (sh, sw), (dh, dw) = spec.stride, spec.dilation
    pt, pl = spec.pad[0], spec.pad[2]
    pb = (spec.r - 1) * dh + sh * (spec.p - 1) + 1 - spec.h - pt
    pr = (spec.s - 1) * dw + sw * (spec.q - 1) + 1 - spec.w - pl
    return ConvSpec(spec.c, spec.n, spec.h, spec.w, spec.k, spec.p, spec.q, (dh, dw), (pt, pb, pl, pr), (sh, sw))


# wgrad's GEMMs with wgmma: 128 filters x 256 of dW's columns (one block an SM, split over k to about one block
# an SM) where a group has more than 64 filters and both dW's columns and the reduction are long (3x3 layers of
# 256 channels and more with N·P·Q of 2500 and up: 20-40% faster than 64 x 128 blocks, up to 1.7x on 28x28
# planes; at 1568 slower); 64 x 128 blocks elsewhere (shorter reductions, 1x1 layers, narrow groups:
# docs/perf-notes.md).
_WGRAD_WIDE_MIN = 2048  # dW's columns (C/groups·R·S) and the reduction (N·P·Q)


def wgrad_tile(spec: ConvSpec, dtype, wgmma: bool):
    """wgrad's tile: with wgmma 128 filters x 256 of dW's columns for long GEMMs of more than 64 filters a group
    (``_WGRAD_WIDE_MIN``), else 64 filters x 128 columns, four slots; elsewhere the packed tile ``choose_tile``
    picks for ``transposed_spec`` (an NchwTile would read x and dy as NCHW images; they are not)."""
    if wgmma:
        wide = spec.k_per_group > 64 and min(spec.crs_per_group, spec.n * spec.p * spec.q) >= _WGRAD_WIDE_MIN
        return TILES["wg128x256" if wide else "wg64x128"]
    return choose_tile(transposed_spec(spec), dtype, wgmma, nchw=False)


_UNCHUNKED = 1 << 62  # wgrad's plan has one chunk: the whole transposed batch (its samples are x's channels)


def wgrad_splits(spec: ConvSpec, dtype, tile, sm_count: int, smem_per_sm: int, workspace_limit: int) -> int:
    """How many k ranges the wgrad GEMM of ``spec`` is split into on a device of ``sm_count`` SMs of
    ``smem_per_sm`` bytes of shared memory, the partial sums within what ``workspace_limit`` leaves beside the
    packed operands."""
    pl, x_bytes, dy_bytes, _ = _wgrad_sizes(spec, dtype, tile, 1)
    return splits_for(spec.crs_per_group, spec.k, tile, pl.k_tiles, sm_count, smem_per_sm,
                      workspace_limit - x_bytes - dy_bytes, spec.groups)


@dataclasses.dataclass(frozen=True)
class WgradLaunches:
    """A wgrad's launches (pointers: source, packed, null, null for the packs; packed x, packed dy, null and dW
    or the partial sums for the GEMM; partial sums, null, dW for ``sums``) and workspace bytes of each part."""

    pack_x: "_loader.PreparedLaunch"
    pack_dy: "_loader.PreparedLaunch"
    gemm: "_loader.PreparedLaunch"
    sums: "_loader.PreparedLaunch"  # None: one split, the GEMM writes dW
    x_bytes: int
    dy_bytes: int
    partial_bytes: int


def _wgrad_sizes(spec: ConvSpec, dtype, tile, splits: int):
    """(plan of ``transposed_spec`` with a group's filters in ``kp``, packed x bytes, packed dy bytes,
    partial-sum bytes). Packed dy holds K rows and, after them, the rows the last group's tile reads past its
    filters (their products land in columns no one stores)."""
    t = transposed_spec(spec)
    pl = plan(t, dtype, tile, workspace_limit=_UNCHUNKED)
    pl = dataclasses.replace(pl, kp=-(-spec.k_per_group // pl.tile.bn) * pl.tile.bn)
    item = numpy.dtype(dtype).itemsize
    partials = 0 if splits == 1 else splits * spec.k * spec.crs_per_group * 4
    dy_rows = spec.k + pl.kp - spec.k_per_group
    return pl, spec.c * spec.h * spec.w * pl.cp * item, dy_rows * pl.w_row * item, partials


SWAP_SHAPE_DTYPE = numpy.dtype([(f, numpy.int32) for f in ("a", "b", "c", "ap")]
                                + [(f, numpy.int64) for f in ("src_a", "l", "dst_c", "c_magic")]
                                + [(f, numpy.int32) for f in ("c_shift", "unused")], align=True)


def division_magic(d: int) -> tuple:
    """(m, p) with n // d == (n · m) >> p for every 0 <= n < 2^31 (d >= 1): p = 31 + ceil(log2 d), m = ceil(2^p /
    d), whose error m·d - 2^p < d keeps n·m / 2^p below the next integer; m < 2^33, so the product fits 64 bits."""
    p = 31 + (d - 1).bit_length()
    return -(-(1 << p) // d), p
_SWAP_MAX_COLUMN_BLOCKS = 4096  # pack_swap's blocks along a sample's run: more tiles are walked


def _swap_launch(dtype, a: int, b: int, c: int, ap: int, dst_c: int) -> "_loader.PreparedLaunch":
    """``pack_swap``: a channels-last (a, b, c) array (samples, pixels, channels) to (c, b, ap), samples
    zero-padded to ``ap``, each c ``dst_c`` elements after the previous (pointers: source, packed)."""
    ctype = _dtypes.ctype_of(dtype)
    name = f"pack_swap<{ctype},{_tf32(ctype)}>"
    shape = numpy.array((a, b, c, ap, b * c, b * c, dst_c, *division_magic(c), 0), dtype=SWAP_SHAPE_DTYPE)[()]
    columns = min(max(1, -(-b * c // 64)), _SWAP_MAX_COLUMN_BLOCKS)
    return _loader.PreparedLaunch(_fn(name), name, (columns, -(-ap // 32), 1), (32, 8, 1), 2, (shape,))


@functools.lru_cache(maxsize=1024)
def _wgrad_launches(spec: ConvSpec, dtype, tile, splits: int, device: int, sm_count: int,
                    nhwc: bool = False, krsc: bool = False) -> WgradLaunches:
    """Memoized per problem, tile, splits, device and SMs (a layer called again plans nothing). ``nhwc``: x and
    dy channels-last in memory (``pack_swap`` packs them); ``krsc``: dW written channels-last, (K, R, S, C/groups)
    in memory (the GEMM's images, x's channels, then 1 apart; its R x S pixels S·C/groups and C/groups)."""
    t = transposed_spec(spec)
    pl, x_bytes, dy_bytes, partial_bytes = _wgrad_sizes(spec, dtype, tile, splits)
    hw, pq, rs = spec.h * spec.w, spec.p * spec.q, spec.r * spec.s
    # x as C images of N channels (n·C·H·W + c·H·W + pixel), dy as K filters of N channels and P·Q taps
    if nhwc:
        pack_x = _swap_launch(dtype, spec.n, hw, spec.c, pl.cp, hw * pl.cp)
        pack_dy = _swap_launch(dtype, spec.n, pq, spec.k, pl.cp, pl.w_row)
    else:
        pack_x = _pack_launch(dtype, spec.n, pl.cp, hw, spec.c, hw, spec.c * hw, hw * pl.cp)
        pack_dy = _pack_launch(dtype, spec.n, pl.cp, pq, spec.k, pq, spec.k * pq, pl.w_row)
    split_tiles = -(-pl.k_tiles // splits)
    splits = -(-pl.k_tiles // split_tiles)  # (no empty range)
    cg, kg = spec.c_per_group, spec.k_per_group
    if krsc:
        gemm = _gemm_launch(t, dtype, pl, cg * rs, kg, spec.groups, cg * hw * pl.cp, kg, (1, cg * rs), splits,
                            split_tiles, (spec.s * cg, cg))
    else:
        gemm = _gemm_launch(t, dtype, pl, cg * rs, kg, spec.groups, cg * hw * pl.cp, kg, (rs, cg * rs), splits,
                            split_tiles)
    sums = None if splits == 1 else _sum_kernel(dtype, spec.k * cg * rs, splits, 1, 1, sm_count)
    return WgradLaunches(pack_x, pack_dy, gemm, sums, x_bytes, dy_bytes, partial_bytes)


def _wgrad_reason(spec: ConvSpec, dtype, precision: str, limits: "_plan.Limits"):
    dtype = numpy.dtype(dtype)
    reason = _arithmetic_reason(dtype, precision)
    if reason is not None:
        return reason
    t = transposed_spec(spec)
    if max(*spec.stride, *spec.dilation, *spec.pad, spec.p, spec.q) > _INT_MAX:
        return "its geometry struct holds strides, dilations, paddings and output sizes in 32 bits"
    if max(spec.h + max(t.pad[0], 0) + max(t.pad[1], 0), spec.w + max(t.pad[2], 0) + max(t.pad[3], 0)) > _MAX_SIDE:
        return "its padded image exceeds the kernel's 16-bit pixel coordinates"
    if max(spec.c, spec.k) > _MAX_GRID_Z:
        return f"its packing runs one input channel or filter per grid z (at most {_MAX_GRID_Z})"
    tile = wgrad_tile(spec, dtype, limits.wgmma)
    pl, x_bytes, dy_bytes, _ = _wgrad_sizes(spec, dtype, tile, 1)
    if max(x_bytes // dtype.itemsize, dy_bytes // dtype.itemsize, spec.k * spec.crs_per_group) > _INT_MAX:
        return "x or grad_output packed with channels and samples swapped, or dW, holds 2^31 elements or more " \
               "(32-bit offsets)"
    if x_bytes + dy_bytes > limits.workspace_limit:
        return (f"x and grad_output packed need {x_bytes + dy_bytes} bytes, more than "
                f"cuconv.config.workspace_limit ({limits.workspace_limit})")
    return None


# ----------------------------------------------------------------------------------------------------------
# wgrad on channels-last activations fed by the TMA (``implicit_gemm_wgrad_tma``, kernels_cu/implicit_gemm.cu): per
# tap of the kernel a GEMM of dyᵀ by the tap's im2col columns, reducing over the output pixels, both operands
# copied from x and dy where they lie (no pack of either, no column matrix), split over pixel ranges into fp32
# partial sums that sum_splits adds in a fixed order.
# ----------------------------------------------------------------------------------------------------------
WGRAD_TMA_GEOMETRY_DTYPE = numpy.dtype([(f, numpy.int32) for f in (
    "p", "q", "s", "stride_h", "stride_w", "pad_h", "pad_w", "dil_h", "dil_w", "k", "c", "c_tiles", "k_tiles",
    "split_tiles", "group_width", "unused")] + [(f, numpy.int64) for f in ("out_k", "out_c", "out_r", "out_s",
                                                                           "split_stride")], align=True)
# Groups the TMA wgrad serves: channels and filters a group (64 of them a block, the diagonal blocks of its product
# kept: 64 / width times the group's products, and its operands' bytes once)
_WGRAD_TMA_GROUP_WIDTHS = (16, 32, 64)
_WGRAD_TMA_PIXELS = 64  # a k tile's output pixels
_WGRAD_TMA_MIN_WIDTH = 32  # filters and channels: below, most of a 64-wide box would be zeros


def wgrad_tma_reason(spec: ConvSpec, dtype, tile: "WgradTmaTile" = None):
    """Why ``implicit_gemm_wgrad_tma`` (with ``tile``, that instance) cannot run the channels-last wgrad of
    ``spec`` (None: it can): 16-bit elements, one group or groups of 16, 32 or 64 channels and as many filters (on
    the 64 × 64 tile), filters and channels in whole 16-byte vectors (the maps' row pitches) and at least
    ``_WGRAD_TMA_MIN_WIDTH`` of each, output pixels to reduce over in 32 bits, and the im2col map's limits."""
    if numpy.dtype(dtype).itemsize != 2:
        return "its TMA tiles move 16-bit elements"
    if spec.groups != 1:
        if spec.c_per_group != spec.k_per_group or spec.c_per_group not in _WGRAD_TMA_GROUP_WIDTHS:
            return f"its groups have as many filters as channels, {_WGRAD_TMA_GROUP_WIDTHS} of each"
        if tile is not None and (tile.bf, tile.bc) != (64, 64):
            return "its groups run on 64 x 64 blocks"
    if spec.c % 8 or spec.k % 8:
        return "its tensor maps take channels and filters in whole 16-byte vectors"
    if -(-spec.k // 64) > _MAX_GRID_Y:
        return f"more than {_MAX_GRID_Y} blocks of 64 filters (a grid dimension)"
    if min(spec.c, spec.k) < _WGRAD_TMA_MIN_WIDTH:
        return f"fewer than {_WGRAD_TMA_MIN_WIDTH} channels or filters fill too little of its 64-wide boxes"
    m = spec.n * spec.p * spec.q
    if m == 0 or m + _WGRAD_TMA_PIXELS >= _INT_MAX:
        return "it reduces over 1 to 2^31 - 65 output pixels"
    return _im2col_map_reason(spec)


def wgrad_tma_tile(spec: ConvSpec, dtype):
    """The TMA wgrad tile for ``spec`` (see WGRAD_TMA_TILES), or None where it cannot run (``wgrad_tma_reason``)."""
    if wgrad_tma_reason(spec, dtype) is not None:
        return None
    if spec.c <= 64 or spec.groups != 1:
        return WGRAD_TMA_TILES["wt64x64"]
    return WGRAD_TMA_TILES["wt64x128" if spec.c <= 128 or spec.k <= 64 else "wt128x256"]


def wgrad_tma_splits(spec: ConvSpec, tile: WgradTmaTile, sm_count: int, smem_per_sm: int, room: int) -> int:
    """Pixel ranges the TMA wgrad of ``spec`` is split into: as many as fill the SMs' resident blocks, each at
    least ``_SPLIT_MIN_TILES`` k tiles, their fp32 partial sums within ``room`` bytes."""
    blocks = -(-spec.k // tile.bf) * _wgrad_tma_c_tiles(spec, tile) * spec.r * spec.s
    k_tiles = -(-spec.n * spec.p * spec.q // _WGRAD_TMA_PIXELS)
    splits = min(sm_count * resident_blocks(tile, smem_per_sm) // blocks, k_tiles // _SPLIT_MIN_TILES, _MAX_SPLITS,
                 room // max(1, 4 * spec.k * spec.crs_per_group))
    return splits if splits >= 2 else 1


def _wgrad_tma_c_tiles(spec: ConvSpec, tile: WgradTmaTile) -> int:
    """Channel blocks a tap: C / bc, or one for groups (a block's channels are its filters' groups')."""
    return 1 if spec.groups != 1 else -(-spec.c // tile.bc)


@functools.lru_cache(maxsize=1024)
def _wgrad_tma_launches(spec: ConvSpec, dtype, tile: WgradTmaTile, splits: int, device: int, sm_count: int,
                        krsc: bool) -> WgradLaunches:
    """The TMA wgrad's GEMM (pointers: x, dy, dW or the partial sums; its maps encoded from x and dy) and, split,
    the sum of its partial sums (partial sums, null, dW); memoized per problem, tile, splits and device."""
    m = spec.n * spec.p * spec.q
    k_tiles = -(-m // _WGRAD_TMA_PIXELS)
    split_tiles = -(-k_tiles // splits)
    splits = -(-k_tiles // split_tiles)  # (no empty range)
    rs, cg = spec.r * spec.s, spec.c_per_group
    strides = (rs * cg, 1, spec.s * cg, cg) if krsc else (cg * rs, rs, spec.s, 1)  # (k, c, r, s)
    dw_elements = spec.k * cg * rs  # (and a split's partial sums, one dW apart)
    c_tiles = _wgrad_tma_c_tiles(spec, tile)
    geometry = numpy.array((spec.p, spec.q, spec.s, *spec.stride, spec.pad[0], spec.pad[2], *spec.dilation, spec.k,
                            spec.c, c_tiles, k_tiles, split_tiles, 0 if spec.groups == 1 else cg, 0, *strides,
                            0 if splits == 1 else dw_elements), dtype=WGRAD_TMA_GEOMETRY_DTYPE)[()]
    lower, upper = _tma_corners(spec)
    maps = ((0, _tma.im2col_map(spec.n, spec.h, spec.w, spec.c, lower, upper, spec.stride, 64, _WGRAD_TMA_PIXELS)),
            (1, _tma.tiled_map(spec.k, m, 64, _WGRAD_TMA_PIXELS)))
    name = tile.kernel_name(_dtypes.ctype_of(dtype), groups=spec.groups != 1)
    grid = (c_tiles * rs, -(-spec.k // tile.bf), splits)
    gemm = _tma.TmaLaunch(_fn(name), name, grid, (tile.threads, 1, 1), 3, (geometry,), maps, smem=tile.smem_bytes)
    sums = None if splits == 1 else _sum_kernel(dtype, dw_elements, splits, 1, 1, sm_count)
    return WgradLaunches(None, None, gemm, sums, 0, 0, 0 if splits == 1 else splits * dw_elements * 4)


def _wgrad_tma_prepare(spec: ConvSpec, dtype, env: "_plan.Env", tile: WgradTmaTile, splits: int = None,
                       krsc: bool = False) -> "_plan.Plan":
    """The TMA wgrad's plan on channels-last x and dy: the GEMM into dW (``krsc``: channels-last), or split into
    partial sums and their sum."""
    if not env.wgmma:
        raise ValueError(f"implicit_gemm: tile {tile} needs a device of compute capability 9.0 (wgmma, TMA)")
    if not env.aligned:
        raise ValueError(f"implicit_gemm: tile {tile} maps x and dy and stores dW in vectors: operands on "
                         f"{_plan.ALIGNMENT}-byte boundaries only")
    reason = wgrad_tma_reason(spec, dtype, tile)
    if reason is not None:
        raise ValueError(f"implicit_gemm: tile {tile} cannot run the wgrad of {spec}: {reason}")
    splits = splits or wgrad_tma_splits(spec, tile, env.sm_count, env.smem_per_sm, env.workspace_limit)
    ls = _wgrad_tma_launches(spec, dtype, tile, splits, env.device, env.sm_count, krsc)
    b = _plan.Builder("wgrad", env)
    if ls.sums is None:
        b.launch(ls.gemm, b.ref("x"), b.ref("dy"), b.ref("dw"))
    else:
        partials = b.take(ls.partial_bytes)
        b.launch(ls.gemm, b.ref("x"), b.ref("dy"), partials)
        b.launch(ls.sums, partials, _plan.NULL, b.ref("dw"))
    return b.plan(STEM)


def _wgrad_prepare(spec: ConvSpec, dtype, env: "_plan.Env", tile=None, splits: int = None,
                   nhwc: bool = False, krsc: bool = False) -> "_plan.Plan":
    """wgrad's plan: on channels-last operands at 256-byte boundaries the TMA wgrad where it serves
    (``wgrad_tma_tile``); else pack x and dy (two launches; ``nhwc``: from channels-last ones), the GEMM
    (``krsc``: into a channels-last dW), and where split the sum of its partial sums (in dW's layout)."""
    if tile is None and nhwc and env.wgmma and env.aligned:
        tile = wgrad_tma_tile(spec, dtype)
    if isinstance(tile, WgradTmaTile):
        if not nhwc:
            raise ValueError(f"implicit_gemm: tile {tile} reads channels-last x and dy")
        return _wgrad_tma_prepare(spec, dtype, env, tile, splits, krsc)
    b = _plan.Builder("wgrad", env)
    tile = tile or wgrad_tile(spec, dtype, env.wgmma)
    if tile.nchw:
        raise ValueError(f"implicit_gemm: wgrad reads packed operands; {tile} gathers NCHW ones")
    if tile.tma:
        raise ValueError(f"implicit_gemm: tile {tile} runs the forward GEMMs (fprop and dgrad), not wgrad's")
    if tile.wgmma and not env.wgmma:
        raise ValueError(f"implicit_gemm: tile {tile} needs a device of compute capability 9.0 (wgmma)")
    splits = splits or wgrad_splits(spec, dtype, tile, env.sm_count, env.smem_per_sm, env.workspace_limit)
    ls = _wgrad_launches(spec, dtype, tile, splits, env.device, env.sm_count, nhwc, krsc)
    packed_x, packed_dy = b.take(ls.x_bytes), b.take(ls.dy_bytes)
    weightless = () if nhwc else (_plan.NULL, _plan.NULL)  # (pack_nhwc's weight pointers; pack_swap has none)
    b.launch(ls.pack_x, b.ref("x"), packed_x, *weightless)
    b.launch(ls.pack_dy, b.ref("dy"), packed_dy, *weightless)
    if ls.sums is None:
        b.launch(ls.gemm, packed_x, packed_dy, _plan.NULL, b.ref("dw"))
    else:
        partials = b.take(ls.partial_bytes)
        b.launch(ls.gemm, packed_x, packed_dy, _plan.NULL, partials)
        b.launch(ls.sums, partials, _plan.NULL, b.ref("dw"))
    return b.plan(STEM)


# ----------------------------------------------------------------------------------------------------------
# dgrad where no single forward convolution of dy gives dx (a stride above 1, or padding wider than the dilated
# kernel), at dilation 1: dx's pixels of phase (ph, pw), rows h ≡ ph (mod stride_h) and columns w ≡ pw, take
# only the taps r ≡ ph + pad_h (mod stride_h) and s likewise; over those, the phase is the forward convolution
# of dy at stride 1 by them flipped (``phase_specs``). One pack of dy to NHWC, one launch packing every
# phase's weight (``pack_dgrad_phases``), then a GEMM per phase writing every stride-th pixel of dx (where a
# phase has no taps, a fill of dx with zeros first). No column matrix, no scatter.
# ----------------------------------------------------------------------------------------------------------
_MAX_PHASES = 16


def _phase_axis(size: int, kernel: int, stride: int, pad: int, phase: int, out: int) -> tuple:
    """(outputs, taps, first tap, top padding, bottom padding) of one axis of a phase: dx positions
    phase, phase + stride, ... below ``size``, the kernel taps r0, r0 + stride, ... below ``kernel``, and the
    padding of dy (``out`` long) that makes the stride-1 forward by the flipped taps produce exactly them."""
    outputs = -(-(size - phase) // stride)
    r0 = (phase + pad) % stride
    taps = -(-(kernel - r0) // stride) if r0 < kernel else 0
    top = max(taps, 1) - 1 - (phase + pad - r0) // stride
    return outputs, taps, r0, top, outputs - 1 + max(taps, 1) - out - top


def phase_specs(spec: ConvSpec) -> tuple:
    """((ph, pw), taps, forward spec) per phase of dx with pixels: the forward convolution of dy (N, K, P, Q)
    at stride 1 whose output (N, C, ·, ·) is that phase; ``taps`` th · tw (0: the phase gets zeros; its spec
    then has one tap)."""
    (sh, sw), out = spec.stride, []
    for ph in range(sh):
        ih, th, _, top, bottom = _phase_axis(spec.h, spec.r, sh, spec.pad[0], ph, spec.p)
        for pw in range(sw):
            iw, tw, _, left, right = _phase_axis(spec.w, spec.s, sw, spec.pad[2], pw, spec.q)
            if ih > 0 and iw > 0:
                out.append(((ph, pw), th * tw, ConvSpec(spec.n, spec.k, spec.p, spec.q, spec.c, max(th, 1),
                                                        max(tw, 1), (1, 1), (top, bottom, left, right), (1, 1),
                                                        spec.groups)))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class PhaseLaunches:
    """A phased dgrad's launches (pointers: dy, packed dy, null, null for ``pack_dy``; w, packed weights for
    ``pack_w``; dx for ``zeros``; packed dy, the phase's packed weight, null, dx at the phase's first pixel for
    each GEMM, with the byte offsets of that weight and pixel) and workspace bytes."""

    pack_dy: "_loader.PreparedLaunch"
    pack_w: "_loader.PreparedLaunch"
    zeros: "_loader.PreparedLaunch"  # None, or a fill of dx with zeros (phases without taps)
    gemms: tuple  # (launch, packed weight byte offset, dx byte offset) per phase with taps
    dy_bytes: int
    w_bytes: int


# A phase's GEMM has a stride² share of dgrad's rows and of its taps: with more than 64 filters, 128 x 128
# blocks (two per SM) where a phase has many rows, else 64 x 128 ones (more blocks: the fastest of the packed
# tiles on the strided layers of five torchvision models, docs/perf-notes.md)
_PHASE_WIDE_TILE_MIN_ROWS = 16384


def phase_tile(spec: ConvSpec, dtype, wgmma: bool):
    """The tile of every phase of a phased dgrad: ``choose_tile``'s for the phase of most taps where that is a TMA
    tile every phase's geometry takes (``tma_reason``); else, where it would take a wgmma tile of 128 filters, the
    64 x 128 one unless a phase has ``_PHASE_WIDE_TILE_MIN_ROWS`` rows."""
    phases = phase_specs(spec)
    widest = max(phases, key=lambda ph: ph[1])[2]
    tile = choose_tile(widest, dtype, wgmma, nchw=False)
    if tile.tma:
        cp, kp, w_row, _ = _phase_plan(spec, dtype, tile)
        if all(tma_reason(fs, dtype, Plan(tile, cp, 1, w_row, kp, spec.n)) is None for _, taps, fs in phases if taps):
            return tile
        tile = choose_tile(widest, dtype, wgmma, nchw=False, tma=False)
    if tile.wgmma and tile.bn > 64:
        rows = max(fs.n * fs.p * fs.q for _, _, fs in phases)
        return TILES["wg128x128r" if rows >= _PHASE_WIDE_TILE_MIN_ROWS else "wg64x128"]
    return tile


def _phase_plan(spec: ConvSpec, dtype, tile) -> tuple:
    """(padded channels of a group cp, rows per group kp, packed weight row w_row, phases) of a phased dgrad on
    ``tile``."""
    phases = phase_specs(spec)
    itemsize = numpy.dtype(dtype).itemsize
    widest = max(phases, key=lambda ph: ph[1])[2]
    cp = _padded_channels(widest, itemsize)
    tile_k = tile.kbytes // itemsize
    w_row = max(1, -(-widest.r * widest.s * cp // tile_k)) * tile_k
    return cp, -(-spec.c_per_group // tile.bn) * tile.bn, w_row, phases


@functools.lru_cache(maxsize=1024)
def _phase_launches(spec: ConvSpec, dtype, tile, device: int, nhwc: bool = False,
                    krsc: bool = False) -> PhaseLaunches:
    """Memoized per problem, tile and device (a layer called again plans nothing). ``nhwc``: dy and dx
    channels-last in memory; dy read in place where its pixels are the packed ones (``pack_dy`` None: a group's
    filters fill whole vectors, in the half types), else packed from channels-last pixels; ``krsc``: the weight
    channels-last."""
    cp, kp, w_row, phases = _phase_plan(spec, dtype, tile)
    itemsize, g, pq, hw = numpy.dtype(dtype).itemsize, spec.groups, spec.p * spec.q, spec.h * spec.w
    pix = g * cp
    if not nhwc:
        pack_dy = _pack_launch(dtype, spec.k, pix, pq, spec.n, spec.k * pq, pq, pq * pix)
    elif pix == spec.k and itemsize == 2:
        pack_dy = None
    else:
        pack_dy = _pack_launch(dtype, spec.k, pix, pq, spec.n, spec.k * pq, 1, pq * pix, src_pixel=spec.k)
    rows = spec.stride[0] * spec.stride[1] * g * kp  # every phase's rows, in the kernel's order (ph, pw)
    shape = numpy.array((g, spec.k_per_group, spec.c_per_group, kp, cp, spec.r, spec.s, *spec.stride, spec.pad[0],
                         spec.pad[2], krsc, w_row, rows), dtype=PHASE_WEIGHTS_DTYPE)[()]
    ctype = _dtypes.ctype_of(dtype)
    name = f"pack_dgrad_phases<{ctype},{_tf32(ctype)}>"
    pack_w = _loader.PreparedLaunch(_fn(name), name, (-(-spec.c_per_group // 64) * g, -(-cp // 64), spec.r * spec.s),
                                    (32, 8, 1), 2, (shape,))
    gemms, zeros = [], None
    for (ph, pw), taps, fs in phases:
        if taps == 0:
            # pixels no tap reaches: one dense fill of dx, before the GEMMs (a GEMM of no k tiles would write
            # these zeros a stride apart, partial sectors)
            zeros = elementwise.fill(dtype, spec.n * spec.c * hw)
            continue
        k_tiles = -(-taps * cp * itemsize // tile.kbytes)
        pl = Plan(tile, cp, k_tiles, w_row, kp, spec.n, g)
        if nhwc:  # (dx's pixel (h, w) at (h·W + w)·C; a filter of the phase's GEMM is a channel of dx)
            strides, pixel, first = (spec.c * hw, 1), (spec.stride[0] * spec.w * spec.c, spec.stride[1] * spec.c), \
                (ph * spec.w + pw) * spec.c
        else:
            strides, pixel, first = (spec.c * hw, hw), (spec.stride[0] * spec.w, spec.stride[1]), ph * spec.w + pw
        args = (fs, dtype, pl, spec.n * fs.p * fs.q, spec.c_per_group, g, cp, kp, strides, 1, k_tiles, pixel)
        phase = ph * spec.stride[1] + pw
        gemms.append((args, phase * g * kp * w_row * itemsize, first * itemsize))
    if (tile.tma or type(tile) is Tile) and 2 <= len(gemms) <= _FUSED_PHASES:
        gemms = [(_fused_phases_launch(gemms, dtype, tile), 0, 0)]
    else:
        gemms = [(_gemm_launch(*args), w_offset, dx_offset) for args, w_offset, dx_offset in gemms]
    dy_bytes = 0 if nhwc and pack_dy is None else spec.n * pq * pix * itemsize
    return PhaseLaunches(pack_dy, pack_w, zeros, tuple(gemms), dy_bytes, rows * w_row * itemsize)


_FUSED_PHASES = 4  # PhaseGemms' phases (implicit_gemm_wgmma_tma_phases's maps): a stride of 2 x 2 at most


def _fused_phases_launch(gemms: list, dtype, tile) -> "_loader.PreparedLaunch":
    """One ``implicit_gemm_fprop_phases`` or ``implicit_gemm_wgmma_tma_phases`` launch of a phased dgrad's GEMMs
    (``_gemm_launch`` arguments, packed weight and dx byte offsets each): grid z the phase, x the most pixel blocks
    of any phase; pointers packed dy, the phases' packed weights (the first's rows), null, dx."""
    itemsize = numpy.dtype(dtype).itemsize
    table = numpy.zeros((), dtype=PHASE_GEMMS_DTYPE)
    x_maps, w_maps = [], []
    for z, (args, w_offset, dx_offset) in enumerate(gemms):
        fs, _, pl, m, filters, groups, grp_a, w_rows, strides, splits, split_tiles, pixel = args
        table["g"][z] = _gemm_geometry(fs, pl, m, filters, groups, grp_a, w_rows, strides, splits, split_tiles, pixel)
        table["y_offset"][z], table["w_offset"][z] = dx_offset // itemsize, w_offset // itemsize
        if not tile.tma:
            continue
        reason = tma_reason(fs, dtype, pl)
        if reason is not None:
            raise ValueError(f"implicit_gemm: tile {tile} cannot run {fs}: {reason}")
        (_, x_map), (_, w_map) = _tma_gemm_maps(fs, pl, m // (fs.p * fs.q), groups * w_rows)
        x_maps.append(x_map)
        w_maps.append(functools.partial(_encode_at, w_map, w_offset))
    pad = _FUSED_PHASES - len(gemms)  # (the kernel's unused maps: copies, never read)
    maps = tuple((0, e) for e in x_maps + x_maps[:1] * pad) + tuple((1, e) for e in w_maps + w_maps[:1] * pad)
    blocks = max(-(-args[3] // tile.bm) for args, _, _ in gemms)
    pl, tile = gemms[0][0][2], _twin(tile)
    name = tile.kernel_name(_dtypes.ctype_of(dtype), phases=True)
    grid = (blocks, pl.groups * pl.kp // tile.bn, len(gemms))
    if not tile.tma:
        return _kernel(name, grid, (tile.threads, 1, 1), (table[()],), smem=tile.smem_bytes)
    return _tma.TmaLaunch(_fn(name), name, grid, (tile.threads, 1, 1), 4, (table[()],), maps, smem=tile.smem_bytes)


def _encode_at(encode, offset: int, dst: int, address: int) -> None:
    """A map's ``encode`` of the tensor ``offset`` bytes past ``address``."""
    encode(dst, address + offset)


def _phases_reason(spec: ConvSpec, dtype, precision: str, limits: "_plan.Limits"):
    dtype = numpy.dtype(dtype)
    reason = _arithmetic_reason(dtype, precision)
    if reason is not None:
        return reason
    if spec.dilation != (1, 1):
        return "its dgrad at a stride above 1 (or padding wider than the kernel) runs phases of dilation 1 only"
    if spec.stride[0] * spec.stride[1] > _MAX_PHASES:
        return f"its dgrad runs a GEMM per phase of the stride: at most {_MAX_PHASES} of them"
    if spec.groups != 1 and spec.k_per_group * dtype.itemsize % 16:
        return (f"a group's filters (K/groups = {spec.k_per_group}) must fill whole 16-byte vectors of the packed "
                f"grad_output (a multiple of {16 // dtype.itemsize} in {dtype})")
    if max(*spec.stride, *spec.pad, spec.h, spec.w) > _INT_MAX:
        return "its geometry struct holds strides, paddings and sizes in 32 bits"
    if max(spec.n, spec.r * spec.s) > _MAX_GRID_Z:
        return f"its packing runs one sample, and one kernel tap, per grid z (at most {_MAX_GRID_Z})"
    if spec.n * spec.c * spec.h * spec.w == 0:
        return None
    cp, kp, w_row, phases = _phase_plan(spec, dtype, phase_tile(spec, dtype, limits.wgmma))
    if max(max(abs(p) for p in fs.pad) + max(spec.p, spec.q) for _, _, fs in phases) > _MAX_SIDE:
        return "its padded grad_output exceeds the kernel's 16-bit pixel coordinates"
    dy_elements = spec.n * spec.p * spec.q * spec.groups * cp
    if max(dy_elements, spec.n * spec.c * spec.h * spec.w, spec.k * spec.crs_per_group) > _INT_MAX:
        return "grad_output packed, grad_input or the weight holds 2^31 elements or more (32-bit offsets)"
    need = (dy_elements + spec.stride[0] * spec.stride[1] * spec.groups * kp * w_row) * dtype.itemsize
    if need > limits.workspace_limit:
        return (f"grad_output packed to NHWC and the phases' weights need {need} bytes, more than "
                f"cuconv.config.workspace_limit ({limits.workspace_limit})")
    return None


def _phases_prepare(spec: ConvSpec, dtype, env: "_plan.Env", tile=None, nhwc: bool = False,
                    krsc: bool = False) -> "_plan.Plan":
    """A phased dgrad's plan: pack dy (``nhwc``: from channels-last pixels, or not at all where they are the
    packed ones), pack the phases' weights (``krsc``: from a channels-last one), a GEMM per phase."""
    b = _plan.Builder("dgrad", env)
    if spec.n * spec.c * spec.h * spec.w == 0:
        return b.plan(STEM)
    if tile is not None and tile.nchw:
        raise ValueError(f"implicit_gemm: a phased dgrad reads packed operands; {tile} gathers NCHW ones")
    tile = tile or phase_tile(spec, dtype, env.wgmma)
    if tile.wgmma and not env.wgmma:
        raise ValueError(f"implicit_gemm: tile {tile} needs a device of compute capability 9.0 (wgmma)")
    ls = _phase_launches(spec, numpy.dtype(dtype), tile, env.device, nhwc, krsc)
    packed_dy = b.take(ls.dy_bytes) if ls.pack_dy is not None else b.ref("dy")
    packed_w = b.take(ls.w_bytes)
    if spec.k:
        if ls.pack_dy is not None:
            b.launch(ls.pack_dy, b.ref("dy"), packed_dy, _plan.NULL, _plan.NULL)
        b.launch(ls.pack_w, b.ref("w"), packed_w)
    b.launch(ls.zeros, b.ref("dx"))
    for gemm, w_offset, dx_offset in ls.gemms:
        b.launch(gemm, packed_dy, (packed_w[0], packed_w[1] + w_offset), _plan.NULL, b.ref("dx", dx_offset))
    return b.plan(STEM)


def prepare(pass_: str, spec: ConvSpec, dtype, precision: str, env: "_plan.Env", bias: bool = False,
            tile: Tile = None, splits: int = None, layout: str = "nchw", weights: str = "kcrs") -> "_plan.Plan":
    """The plan of ``pass_`` (see ``cuconv._plan``): per chunk, the packing launch and the GEMM (an NchwTile:
    the GEMM alone, reading x and w as they are); dgrad as the forward convolution of dy
    (``dgrad_forward.forward_spec``), its packing launch reading the weight transposed and flipped (an
    NchwTile, which reads the weight in place, takes ``dgrad_forward``'s flipped copy), or at a stride above 1
    one per phase of the stride (``phase_specs``); wgrad as the forward convolution of x by dy, samples and
    channels swapped (``transposed_spec``), split over ``splits`` k ranges (default ``wgrad_splits``). The
    workspace holds the packed weight, then one chunk's packed input. ``tile`` forces one of ``TILES`` (tests).
    float32 computes TF32. ``layout="nhwc"``: the activations channels-last in memory (``reason_unsupported_nhwc``):
    the forward and the stride-1 dgrad in place where ``nhwc_in_place`` holds, else packed from channels-last
    pixels; the phases and wgrad's packs read channels-last pixels. ``weights="krsc"`` (with channels-last
    activations): the weight, and wgrad's dW, channels-last too ((K, R, S, C/groups) in memory)."""
    nhwc = layout == "nhwc"
    if weights not in ("kcrs", "krsc") or (weights == "krsc" and not nhwc):
        raise ValueError(f"implicit_gemm: weights {weights!r} with {layout!r} activations; channels-last weights "
                         "('krsc') go with channels-last activations ('nhwc')")
    krsc = weights == "krsc"
    if pass_ == "wgrad":
        return _wgrad_prepare(spec, numpy.dtype(dtype), env, tile, splits, nhwc, krsc)
    if nhwc:
        if pass_ == "dgrad" and dgrad_forward.forward_spec(spec) is None:
            return _phases_prepare(spec, dtype, env, tile, nhwc=True, krsc=krsc)
        return _nhwc_forward_plan(pass_, spec, numpy.dtype(dtype), env, tile, bias, krsc, splits)
    if tile is not None and tile.wgmma and not env.wgmma:
        raise ValueError(f"implicit_gemm: tile {tile} needs a device of compute capability 9.0 (wgmma)")
    if pass_ == "dgrad":
        fspec = dgrad_forward.forward_spec(spec)
        if fspec is None:
            return _phases_prepare(spec, dtype, env, tile)
        tile = tile or choose_tile(fspec, numpy.dtype(dtype), env.wgmma, rows=_unsplit(splits))
        if tile.nchw:
            return dgrad_forward.prepare(prepare, spec, dtype, precision, env, tile=tile, splits=splits)
        return _forward_plan(pass_, fspec, numpy.dtype(dtype), env, tile, splits, ("dy", "w", None, "dx"))
    return _forward_plan(pass_, spec, numpy.dtype(dtype), env,
                         tile or choose_tile(spec, dtype, env.wgmma, rows=_unsplit(splits)), splits,
                         ("x", "w", "bias", "out"))


def _forward_plan(pass_: str, spec: ConvSpec, dtype, env: "_plan.Env", tile, splits: int, operands: tuple,
                  nhwc: bool = False, krsc: bool = False) -> "_plan.Plan":
    """The forward ``spec``'s launches as ``pass_``'s plan, its input, weight, bias (None: none) and output the
    plan's ``operands`` (``nhwc``: the input and output channels-last in memory; ``krsc``: the weight); a dgrad's
    (the forward of dy) packs the layer's weight flipped."""
    b = _plan.Builder(pass_, env)
    if spec.n * spec.k * spec.p * spec.q == 0:
        return b.plan(STEM)
    x, w, bias, out = operands
    bias_ref = _plan.NULL if bias is None else b.ref(bias)
    pl, packed, partial_bytes, chunks = _launches(spec, dtype, tile, env.device, env.workspace_limit, env.sm_count,
                                                  env.smem_per_sm, splits, pass_ == "dgrad", nhwc, krsc)
    if not packed:  # an NchwTile: the GEMM reads x and w as they are
        for x_offset, out_offset, _, gemm, _ in chunks:
            b.launch(gemm, b.ref(x, x_offset), b.ref(w), bias_ref, b.ref(out, out_offset))
        return b.plan(STEM)
    packed_w = b.take(packed)  # the packed weight, then the input
    packed_x = (packed_w[0], packed_w[1] + pl.weight_bytes(dtype.itemsize))
    partials = b.take(partial_bytes) if partial_bytes else None
    for x_offset, out_offset, pack, gemm, sums in chunks:  # the first chunk's pack also packs the weight; the
        b.launch(pack, b.ref(x, x_offset), packed_x, b.ref(w), packed_w)  # others ignore its weight pointers
        if sums is None:
            b.launch(gemm, packed_x, packed_w, bias_ref, b.ref(out, out_offset))
        else:  # fp32 partial sums of the k ranges, then their sum with the bias
            b.launch(gemm, packed_x, packed_w, _plan.NULL, partials)
            b.launch(sums, partials, bias_ref, b.ref(out, out_offset))
    return b.plan(STEM)


def reason_unsupported_nhwc(spec: ConvSpec, dtype, pass_: str = "fprop", precision: str = "ieee", limits=None):
    """Why ``implicit_gemm`` cannot run ``pass_`` on channels-last activations, or None (the NCHW checks,
    ``reason_unsupported``, apply too): every pass, as on NCHW ones, its packs reading channels-last pixels. The
    forward, and the dgrad at stride 1 as the forward of dy (``dgrad_forward.forward_spec``), read their input
    in place where ``nhwc_in_place`` holds, in one GEMM whose input and output index in 32 bits; the phases of a
    strided dgrad read grad_output in place where its groups' channels fill whole vectors."""
    dtype = numpy.dtype(dtype)
    limits = limits or _plan.current_limits()
    fspec = _nhwc_forward_spec(spec, pass_)
    if fspec is not None and nhwc_in_place(fspec, dtype):
        if fspec.n * fspec.p * fspec.q * fspec.k >= _INT_MAX or fspec.n * fspec.h * fspec.w * fspec.c >= _INT_MAX:
            return "its channels-last GEMM reading its input in place indexes its input and output in 32 bits"
    elif fspec is not None and _arithmetic_reason(dtype, precision) is None:
        pl = plan(fspec, dtype, choose_tile(fspec, dtype, limits.wgmma, nchw=False), limits.workspace_limit)
        need = pl.sample_bytes(fspec, dtype.itemsize) + pl.weight_bytes(dtype.itemsize)
        if need > limits.workspace_limit:
            return (f"one sample packed from channels-last pixels and the packed weight need {need} bytes, more "
                    f"than cuconv.config.workspace_limit ({limits.workspace_limit})")
    if pass_ == "wgrad":
        tile = wgrad_tile(spec, dtype, limits.wgmma)
        pl = _wgrad_sizes(spec, dtype, tile, 1)[0]
        if -(-pl.cp // 32) > _MAX_GRID_Y:
            return f"its channels-last packs run 32 samples per grid y (at most {_MAX_GRID_Y})"
    return None


_MAX_GRID_Y = 65535


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


# The in-place channels-last forward's TMA tiles store their output through the TMA (implicit_gemm_wgmma_tma_st,
# implicit_gemm_wgmma_tma_rows_st) where it is a dense matrix of whole 16-byte pixels on 256-byte boundaries: the
# epilogue's instructions bound the layers of few channels and many pixels (square_3x3_1024; docs/perf-notes.md)
_TMA_STORE = True


# auto's persistent tiles (persistent_tile): where a block's filters' weight fits in its shared memory beside the
# ring and the pixels fill this many waves of the blocks the SMs hold (the weight copied once a block, not once a
# tile: square_3x3_1024 3.7 -> 2.0 ms, ResNet-50 64@56² 23.3 -> 20.3 µs; docs/perf-notes.md)
_PERSISTENT = True
_PERSISTENT_MIN_WAVES = 2
_PERSISTENT_MIN_PIXELS = 256  # an SM's blocks' pixels (VGG-11 64@112² -> 128: one 128 x 128 block an SM, 1.14x slower)


def persistent_tile(spec: ConvSpec, dtype, env: "_plan.Env"):
    """The persistent tile (``implicit_gemm_wgmma_tma_pst``) auto runs ``spec``'s channels-last GEMM on, its output
    stored through the TMA, or None: k tiles of 32 bytes where a tap's padded channels are an odd number of 16s,
    else of 64; 64 filters a block up to 64, else 128; of those tiles, one whose block's weight (every k tile) fits
    (``_persistent_per_sm``) and that holds the most pixels an SM (``_PERSISTENT_MIN_PIXELS`` at least), then the
    most blocks; where its tiles fill ``_PERSISTENT_MIN_WAVES`` waves of the blocks it runs."""
    itemsize = numpy.dtype(dtype).itemsize
    if not (_PERSISTENT and env.wgmma) or itemsize != 2 or spec.groups != 1:
        return None
    kbytes = 32 if _padded_channels(spec, itemsize) * itemsize % 64 else 64
    bn, m = 64 if spec.k <= 64 else 128, spec.n * spec.p * spec.q
    best, best_key = None, None
    for t in TMA_TILES.values():
        if not t.persistent or t.kbytes != kbytes or t.bn != bn:
            continue
        pl = plan(spec, dtype, t)
        per_sm = _persistent_per_sm(t, pl.k_tiles, env)
        if not per_sm or tma_reason(spec, dtype, pl) is not None:
            continue
        tiles = -(-m // t.bm) * (pl.kp // t.bn)
        key = (per_sm * t.bm, per_sm)
        if (key[0] >= _PERSISTENT_MIN_PIXELS and tiles >= _PERSISTENT_MIN_WAVES * env.sm_count * per_sm
                and (best_key is None or key > best_key)):
            best, best_key = t, key
    return best


def _nhwc_forward_plan(pass_: str, spec: ConvSpec, dtype, env: "_plan.Env", tile, bias: bool,
                       krsc: bool = False, splits: int = None) -> "_plan.Plan":
    """A forward or stride-1 dgrad on channels-last activations (the forward of dy into dx, the pack reading the
    layer's weight transposed and flipped). Where ``nhwc_in_place`` holds: one GEMM over every pixel of the batch,
    reading its input in place and storing NHWC rows (the epilogue's output strides: an image P·Q·K elements, a
    row Q·K, a pixel K, a filter 1), after the weight's packing launch alone (no samples; ``splits`` does not apply),
    or with none where a channels-last weight is its own pack (``_packed_as_krsc``).
    Elsewhere the NCHW plan's chunks, the pack reading channels-last pixels and the GEMM storing them, split over
    ``splits`` k ranges (default ``splits_for``). A grouped forward that ``block_diagonal_tile`` serves (on a
    wgmma device, or asked for with that tile) runs through a block-diagonal weight (``_block_diagonal_plan``)."""
    fspec = _nhwc_forward_spec(spec, pass_)
    b = _plan.Builder(pass_, env)
    if spec.n * spec.k * spec.p * spec.q == 0 or fspec.n * fspec.k * fspec.p * fspec.q == 0:
        return b.plan(STEM)
    if pass_ == "fprop" and spec.groups != 1:
        diagonal = block_diagonal_tile(spec, dtype)
        if diagonal is not None and (tile is diagonal or (tile is None and env.wgmma)):
            return _block_diagonal_plan(spec, dtype, env, bias, krsc)
    auto = tile is None
    tile = tile or choose_tile(fspec, dtype, env.wgmma, nchw=False, rows=_unsplit(splits))
    if tile.nchw:
        raise ValueError(f"implicit_gemm: tile {tile} gathers NCHW; channels-last inputs take a packed tile")
    if tile.wgmma and not env.wgmma:
        raise ValueError(f"implicit_gemm: tile {tile} needs a device of compute capability 9.0 (wgmma)")
    operands = ("x", "w", "bias" if bias and pass_ == "fprop" else None, "out") if pass_ == "fprop" else \
        ("dy", "w", None, "dx")
    if not nhwc_in_place(fspec, dtype):
        return _forward_plan(pass_, fspec, dtype, env, tile, splits, operands, nhwc=True, krsc=krsc)
    x, _, bias_operand, out = operands
    dense_out = _TMA_STORE and fspec.k % 8 == 0 and b.base_aligned(b.ref(out))  # (what a TMA store takes)
    if auto and dense_out:
        tile = persistent_tile(fspec, dtype, env) or tile
    pl = plan(fspec, dtype, tile, env.workspace_limit)
    m = fspec.n * fspec.p * fspec.q
    if m * fspec.k >= _INT_MAX or fspec.n * fspec.h * fspec.w * fspec.c >= _INT_MAX:
        raise NotImplementedError("cuconv: implicit_gemm's channels-last GEMM indexes its input and output in 32 bits")
    if pass_ == "fprop" and krsc and _packed_as_krsc(fspec, dtype, pl) and b.base_aligned(b.ref("w")):
        packed_w = b.ref("w")  # (the channels-last weight is its own pack: no launch)
    else:
        packed_w = b.take(pl.weight_bytes(dtype.itemsize))
        b.launch(_pack_kernel(fspec, dtype, pl.pix, 0, pl, flip=pass_ == "dgrad", krsc=krsc), _plan.NULL, _plan.NULL,
                 b.ref("w"), packed_w)
    store_tma = dense_out and tile.tma
    gemm = _gemm_launch(fspec, dtype, pl, m, fspec.k_per_group, pl.groups, pl.cp, pl.kp,
                        (fspec.p * fspec.q * fspec.k, 1), 1, pl.k_tiles, out_pixel=(fspec.q * fspec.k, fspec.k),
                        store_tma=store_tma, resident=_persistent_blocks(tile, pl, m, env) if store_tma else 0)
    b.launch(gemm, b.ref(x), packed_w, _plan.NULL if bias_operand is None else b.ref(bias_operand), b.ref(out))
    return b.plan(STEM)


# ----------------------------------------------------------------------------------------------------------
# Grouped forwards on channels-last tensors through a block-diagonal weight (the TMA tile, Geometry.block_diag):
# groups of 16, 32 or 64 channels and as many filters; a block's 64 filters against the 64 input channels of their
# groups, the weight packed dense with zeros between groups (pack_block_diagonal), so that one dense GEMM tile
# computes 64 / width groups at once (64 / width times their MACs: RegNet's 16-channel groups have few) from the
# input where it lies.
# ----------------------------------------------------------------------------------------------------------
_BLOCK_DIAGONAL_WIDTHS = (16, 32, 64)
_BLOCK_DIAGONAL_TILE = "tma64x128"  # 64 filters: a block of the weight's diagonal
BLOCK_DIAGONAL_DTYPE = numpy.dtype([("total", numpy.int64)] + [(f, numpy.int32) for f in (
    "k", "gw", "taps", "bw", "krsc", "unused")], align=True)


def block_diagonal_tile(spec: ConvSpec, dtype):
    """The TMA tile of ``spec``'s channels-last forward through a block-diagonal weight, or None: the 16-bit types,
    groups of 16, 32 or 64 channels and as many filters, channels in whole 16-byte vectors, the im2col map's limits
    (``tma_reason``) and 32-bit offsets."""
    if numpy.dtype(dtype).itemsize != 2 or spec.groups == 1 or spec.c % 8:
        return None
    if spec.c_per_group != spec.k_per_group or spec.c_per_group not in _BLOCK_DIAGONAL_WIDTHS:
        return None
    if spec.n * spec.p * spec.q * spec.k >= _INT_MAX or spec.n * spec.h * spec.w * spec.c >= _INT_MAX:
        return None
    t = TMA_TILES[_BLOCK_DIAGONAL_TILE]
    taps = spec.r * spec.s
    pl = Plan(t, t.bn, taps, taps * t.bn, -(-spec.k // t.bn) * t.bn, spec.n)
    return t if tma_reason(spec, dtype, pl) is None else None


@functools.lru_cache(maxsize=1024)
def _block_diagonal_launches(spec: ConvSpec, dtype, krsc: bool, device: int) -> tuple:
    """(packed weight bytes, the weight's pack (pointers: w, packed), the GEMM (x, packed weight, bias, out)) of a
    grouped channels-last forward through a block-diagonal weight; memoized per problem and device."""
    t = TMA_TILES[_BLOCK_DIAGONAL_TILE]
    ctype = _dtypes.ctype_of(dtype)
    bw, taps = t.bn, spec.r * spec.s
    kp, w_row = -(-spec.k // bw) * bw, taps * bw
    total = kp * w_row
    name = f"pack_block_diagonal<{ctype}>"
    pack = _loader.PreparedLaunch(_fn(name), name, (_loader.blocks(total), 1, 1), (_loader.THREADS, 1, 1), 2,
                                  (numpy.array((total, spec.k, spec.c_per_group, taps, bw, krsc, 0),
                                               dtype=BLOCK_DIAGONAL_DTYPE)[()],))
    m = spec.n * spec.p * spec.q
    pl = Plan(t, bw, taps, w_row, kp, spec.n)  # (a block's 64 channels a tap: one k tile)
    geometry = _gemm_geometry(spec, pl, m, spec.k, 1, bw, kp, (spec.p * spec.q * spec.k, 1), 1, taps,
                              (spec.q * spec.k, spec.k), pix=spec.c, block_diag=spec.c_per_group)
    maps = _tma_gemm_maps(spec, pl, spec.n, kp, pix=spec.c)
    name = t.kernel_name(ctype)
    gemm = _tma.TmaLaunch(_fn(name), name, (-(-m // t.bm), kp // t.bn, 1), (t.threads, 1, 1), 4, (geometry,), maps,
                          smem=t.smem_bytes)
    return total * numpy.dtype(dtype).itemsize, pack, gemm


def _block_diagonal_plan(spec: ConvSpec, dtype, env: "_plan.Env", bias: bool, krsc: bool) -> "_plan.Plan":
    """A grouped forward on channels-last tensors: the block-diagonal weight's pack, then one TMA GEMM over every
    pixel, the input read where it lies. Groups of a whole block's width (64) on a channels-last weight of whole
    blocks are their own pack (a filter's row its taps' 64 channels): no pack launch."""
    if not env.wgmma:
        raise ValueError("implicit_gemm: the block-diagonal grouped forward needs compute capability 9.0 (TMA)")
    b = _plan.Builder("fprop", env)
    weight_bytes, pack, gemm = _block_diagonal_launches(spec, numpy.dtype(dtype), krsc, env.device)
    bw = TMA_TILES[_BLOCK_DIAGONAL_TILE].bn
    if krsc and spec.c_per_group == bw and spec.k % bw == 0 and b.base_aligned(b.ref("w")):
        packed_w = b.ref("w")
    else:
        packed_w = b.take(weight_bytes)
        b.launch(pack, b.ref("w"), packed_w)
    b.launch(gemm, b.ref("x"), packed_w, b.ref("bias") if bias else _plan.NULL, b.ref("out"))
    return b.plan(STEM)


def _unsplit(splits) -> bool:
    """Whether a plan asked for ``splits`` may take a row-band tile (which reduces every tap in its block)."""
    return splits is None or splits == 1


def forward_gpu(x, w, bias, spec: ConvSpec, out, precision: str, tile: Tile = None, splits: int = None) -> None:
    """out = conv(x, w) + bias on C-contiguous CuPy arrays, current stream (float32 computes TF32)."""
    _plan.run_on_arrays(prepare, "fprop", spec, precision, x, w, bias, out, tile=tile, splits=splits)


def dgrad_gpu(dy, w, spec: ConvSpec, dx, precision: str, tile: Tile = None) -> None:
    """dx = conv2d_input(dy, w) as forward convolutions of dy: one (stride 1; ``dgrad_forward``), or one per
    phase of the stride (``phase_specs``)."""
    _plan.run_on_arrays(prepare, "dgrad", spec, precision, dy, w, dx, tile=tile)


def wgrad_gpu(x, dy, spec: ConvSpec, dw, precision: str, tile: Tile = None, splits: int = None) -> None:
    """dw = conv2d_weight(x, dy) into C-contiguous ``dw`` (``transposed_spec``); float32 computes TF32."""
    _plan.run_on_arrays(prepare, "wgrad", spec, precision, x, dy, dw, tile=tile, splits=splits)



class ImplicitGemm(Algorithm):
    """``implicit_gemm`` behind the algorithm contract (``cuconv.algos.base``)."""

    name = "implicit_gemm"
    passes = PASSES
    layouts = ("nchw", "nhwc")
    weight_layouts = ("kcrs", "krsc")
    nchw_limits = staticmethod(reason_unsupported)
    nhwc_limits = staticmethod(reason_unsupported_nhwc)

    def build(self, p: Problem, env: "_plan.Env", **knobs) -> "_plan.Plan":
        return prepare(p.pass_, p.spec, p.dtype, p.precision, env, p.bias, layout=p.layout, weights=p.weights, **knobs)


ALGORITHM = ImplicitGemm()
