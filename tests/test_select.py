"""Algorithm choice: the pure heuristic (a table of cases) and each family's reasons; the autotuner is in
test_autotune.py."""

from __future__ import annotations

import numpy
import pytest

import cuconv
from cases import select_auto, select_nhwc_auto, reason_under
from cuconv.problem import PASSES, Epilogue
from cuconv import _dtypes, select
from cuconv.problems import PROBLEMS
from cuconv.select import implicit_gemm as choice

_P = {p.name: p.spec() for p in PROBLEMS}
_F32, _F16, _F64 = numpy.dtype(numpy.float32), numpy.dtype(numpy.float16), numpy.dtype(numpy.float64)
_BF16 = numpy.dtype(_dtypes.bfloat16) if _dtypes.bfloat16 is not None else _F16  # (ml_dtypes absent)


@pytest.mark.parametrize("problem,dtype,precision,pass_,expected", [
    pytest.param("depthwise_3x3", _F32, "ieee", "fprop", "depthwise", id="depthwise_fprop"),
    pytest.param("depthwise_3x3", _F16, "ieee", "dgrad", "depthwise", id="depthwise_dgrad_fp16"),
    pytest.param("depthwise_3x3", _F32, "tf32", "wgrad", "depthwise", id="depthwise_wgrad"),
    pytest.param("square_5x9", _F32, "ieee", "fprop", "direct_smem", id="many_taps_fp32_ieee"),
    pytest.param("dilated_padded_5x9", _F64, "ieee", "fprop", "direct_smem", id="many_taps_fp64"),
    pytest.param("square_5x9", _F32, "tf32", "fprop", "implicit_gemm", id="tf32_tensor_cores"),
    pytest.param("square_5x9", _F16, "ieee", "fprop", "implicit_gemm", id="fp16_tensor_cores"),
    pytest.param("rect_5x7", _F16, "ieee", "dgrad", "implicit_gemm", id="fp16_dgrad_as_forward"),
    pytest.param("square_3x3_1024", _F32, "tf32", "wgrad", "im2col_gemm", id="implicit_gemm_has_no_wgrad"),
    pytest.param("square_3x3_1024", _F32, "tf32", "dgrad", "im2col_gemm", id="implicit_gemm_needs_32_filters"),
    pytest.param("square_3x3_1024", _F16, "ieee", "dgrad", "im2col_gemm", id="implicit_gemm_needs_32_filters_fp16"),
    pytest.param("square_5x9", _F32, "tf32", "dgrad", "implicit_gemm", id="implicit_gemm_dgrad_32_filters"),
    pytest.param("stem_7x7_s2", _F32, "tf32", "dgrad", "im2col_gemm", id="strided_dgrad_tf32"),
    pytest.param("stem_7x7_s2", _F16, "ieee", "fprop", "implicit_gemm", id="stem_fp16"),
    pytest.param("square_5x9", _F64, "tf32", "fprop", "direct_smem", id="fp64_ignores_tf32"),
    pytest.param("square_5x9", _F32, "ieee", "dgrad", "direct_smem", id="dgrad_as_forward_fp32_ieee"),
    pytest.param("rect_5x7", _F32, "ieee", "dgrad", "winograd", id="winograd_dgrad_5x7"),
    pytest.param("rect_5x7", _F64, "ieee", "dgrad", "winograd", id="winograd_dgrad_fp64"),
    pytest.param("square_3x3_1024", _F32, "ieee", "dgrad", "winograd", id="winograd_dgrad_16_filters"),
    pytest.param("rect_5x7", _F32, "tf32", "dgrad", "implicit_gemm", id="tf32_not_winograd"),
    pytest.param("square_5x9", _F32, "ieee", "wgrad", "im2col_gemm", id="direct_smem_has_no_wgrad"),
    pytest.param("rect_5x7", _F32, "ieee", "fprop", "winograd", id="winograd_5x7"),
    pytest.param("square_3x3_1024", _F32, "ieee", "fprop", "winograd_fused", id="winograd_fused_3x3"),
    pytest.param("resnet_3x3_64", _F32, "ieee", "fprop", "winograd", id="winograd_64_channels"),
    pytest.param("resnet_3x3_64", _F32, "ieee", "dgrad", "winograd", id="winograd_dgrad_64_channels"),
    pytest.param("resnet_3x3_64", _F64, "ieee", "fprop", "winograd", id="winograd_fused_is_float32_only"),
    pytest.param("square_3x3_1024", _F32, "tf32", "fprop", "implicit_gemm", id="tf32_3x3_tensor_cores"),
    pytest.param("resnet_3x3_64", _F32, "ieee", "wgrad", "im2col_gemm", id="winograd_has_no_wgrad"),
    pytest.param("resnet_1x1_256", _F32, "ieee", "fprop", "im2col_gemm", id="pointwise_fp32_ieee"),
    pytest.param("stem_7x7_s2", _F32, "ieee", "fprop", "im2col_gemm", id="stem_few_channels"),
])
def test_select_algorithm(problem, dtype, precision, pass_, expected):
    assert cuconv.select_algorithm(_P[problem], dtype, precision, True, pass_) == expected


@pytest.mark.parametrize("c,k,pass_,expected", [
    (32, 64, "fprop", "winograd_fused"), (48, 64, "fprop", "winograd"), (32, 48, "fprop", "winograd"),
    (64, 32, "dgrad", "winograd_fused"), (64, 48, "dgrad", "winograd"), (2048, 64, "fprop", "im2col_gemm"),
], ids=["fused_32_channels", "winograd_48_channels", "winograd_48_filters", "fused_dgrad_64_filters",
        "winograd_dgrad_48_channels", "float32_past_both_channel_limits"])
def test_winograd_fused_takes_3x3_layers_with_few_channels_and_many_filters(c, k, pass_, expected):
    """float32 'ieee' 3x3 stride 1: the fused F(2x2, 3x3) from 64 filters and up to 32 channels in the pass (dgrad:
    filters C, channels K), winograd's F(4x4, 3x3) above; past winograd's float32 cap (512 channels) a GEMM."""
    spec = cuconv.ConvSpec.from_args((2, c, 40, 40), (k, c, 3, 3), padding=1)
    assert cuconv.select_algorithm(spec, _F32, "ieee", True, pass_) == expected


@pytest.mark.parametrize("dtype,precision,hw,wgmma,expected", [
    (_F16, "ieee", 56, False, "im2col_gemm"), (_F16, "ieee", 56, True, "im2col_gemm"),
    (_F16, "ieee", 14, True, "im2col_gemm"), (_F16, "ieee", 13, True, "implicit_gemm"),
    (_F16, "ieee", 7, True, "implicit_gemm"), (_F16, "ieee", 7, False, "im2col_gemm"),
    (_F32, "tf32", 56, True, "im2col_gemm"), (_F32, "tf32", 14, True, "im2col_gemm"),
    (_F32, "tf32", 13, True, "implicit_gemm"), (_F32, "tf32", 7, True, "implicit_gemm"),
    (_F32, "tf32", 7, False, "im2col_gemm"), (_F32, "tf32", 1, True, "im2col_gemm"),
], ids=["fp16_56", "fp16_56_wgmma", "fp16_14_wgmma", "fp16_13_wgmma", "fp16_7_wgmma", "fp16_7",
        "tf32_56_wgmma", "tf32_14_wgmma", "tf32_13_wgmma", "tf32_7_wgmma", "tf32_7", "tf32_1_wgmma"])
def test_pointwise_layers_take_a_gemm_except_small_planes_on_wgmma(dtype, precision, hw, wgmma, expected):
    """1x1 stride-1 forwards at tensor-core precisions: cuBLASLt's GEMM per sample (im2col_gemm), except on
    planes below 14x14 on a device that runs wgmma, where implicit_gemm's NchwTile reads the input as it is, but
    squeeze-excitation's 1x1 planes (the batch one short GEMM); the choice is memoized with the device's answer.
    A widening layer (64 -> 256): im2col_gemm's GEMM over the batch would have a short reduction."""
    spec = cuconv.ConvSpec.from_args((32, 64, hw, hw), (256, 64, 1, 1))
    limits = {"smem_limit": 227 << 10, "workspace_limit": cuconv.config.workspace_limit}
    assert select_auto(spec, dtype, precision, True, "fprop", wgmma=wgmma, **limits) == expected
    dgrad = (spec, dtype, precision, True, "dgrad")  # a GEMM (few channels x filters: implicit_gemm's slower)
    assert select_auto(*dgrad, wgmma=wgmma, **limits) == "im2col_gemm"


@pytest.mark.parametrize("epilogue,hw,c,k,nchw,nhwc", [
    (Epilogue(bias=True), 56, 24, 144, "im2col_gemm", "im2col_gemm"),
    (Epilogue(bias=True, activation="hardswish"), 56, 24, 144, "implicit_gemm", "im2col_gemm"),
    (Epilogue(bias=True, activation="hardswish"), 28, 40, 240, "implicit_gemm", "implicit_gemm"),
    (Epilogue(bias=True, activation="relu"), 28, 512, 144, "im2col_gemm", "implicit_gemm"),
    (Epilogue(bias=True, activation="relu"), 56, 256, 64, "implicit_gemm", "implicit_gemm"),
    (Epilogue(bias=True, activation="silu"), 56, 24, 144, "implicit_gemm", "im2col_gemm"),
    (Epilogue(bias=True, activation="silu"), 28, 40, 240, "implicit_gemm", "implicit_gemm"),
    (Epilogue(bias=True, activation="relu6"), 112, 16, 96, "implicit_gemm", "implicit_gemm"),
    (Epilogue(bias=True, activation="relu"), 7, 2048, 512, None, "im2col_gemm"),
    (Epilogue(bias=True, activation="silu"), 7, 192, 1152, None, "implicit_gemm"),
    (Epilogue(bias=True, residual="after"), 28, 24, 144, "im2col_gemm", "im2col_gemm"),
    (Epilogue(bias=True, activation="relu", residual="before"), 28, 24, 144, "im2col_gemm", "im2col_gemm"),
    (Epilogue(bias=True, activation="relu"), 1, 24, 144, "im2col_gemm", "im2col_gemm"),
    (Epilogue(bias=True, residual="before"), 56, 16, 16, "im2col_gemm", "implicit_gemm"),
    (Epilogue(bias=True, activation="relu", residual="before"), 14, 256, 1024, "im2col_gemm", "implicit_gemm"),
    (Epilogue(bias=True, residual="after"), 7, 960, 160, None, "im2col_gemm"),
], ids=["bias", "hardswish_56", "hardswish_28", "relu_wide", "relu_narrowing", "silu_56", "silu_28", "relu6_112", "relu_7x7_wide",
        "silu_7x7_expansion", "residual_24_channels", "residual_relu_24_channels", "se_relu", "residual_16_channels",
        "residual_relu_wide", "residual_7x7_wide"])
def test_pointwise_forwards_with_an_epilogue(epilogue, hw, c, k, nchw, nhwc):
    """A 1x1 forward with an activation and no residual, where implicit_gemm applies it in its store: NCHW on few
    channels (not im2col_gemm's GEMM per sample and a pass over the output), channels-last in the half types on a
    wgmma device but 7x7 planes of 672 channels or more and, for activations other than the ReLUs, planes over
    28x28 (one GEMM over every pixel and the pass); with a residual, channels-last in the half types on a wgmma
    device where the channels are whole 16-channel k tiles, but 7x7 planes of 672 channels or more (NCHW: the GEMM
    and its pass); on squeeze-excitation's 1x1 planes (one short GEMM over the batch) the GEMM and its pass; the
    bias alone stays in cuBLASLt's GEMM. (NCHW 7x7 planes: None, other rules choose there with or without an
    epilogue.)"""
    from cuconv import _plan
    from cuconv.problem import Problem

    spec = cuconv.ConvSpec.from_args((32, c, hw, hw), (k, c, 1, 1))
    for layout in ("nchw", "nhwc") if nchw is not None else ("nhwc",):
        for wgmma in (True, False):
            limits = _plan.Limits(227 << 10, wgmma, cuconv.config.workspace_limit)
            for dtype, precision in ((_F16, "ieee"), (_F32, "tf32")):
                problem = Problem.of(spec, dtype, precision, "fprop", layout, epilogue=epilogue)
                expected = nchw if layout == "nchw" else nhwc if (wgmma and dtype == _F16) else "im2col_gemm"
                if wgmma or layout == "nhwc":
                    assert select.algorithm(problem, limits) == expected, (layout, wgmma, dtype)
                plain = Problem.of(spec, dtype, precision, "fprop", layout, epilogue=Epilogue(bias=epilogue.bias))
                if wgmma:
                    assert select.algorithm(plain, limits) == "im2col_gemm", (layout, dtype)
            ffma = Problem.of(spec, _F32, "ieee", "fprop", layout, epilogue=epilogue)  # (FFMA: no tensor-core tiles)
            assert select.algorithm(ffma, limits) != "implicit_gemm"


def test_strided_pointwise_forward_with_a_residual_takes_the_tma_store():
    """RegNet's strided 1x1 projections with a residual and a ReLU, channels-last in the half types on a wgmma
    device: implicit_gemm (its TMA store adds the residual), not the column matrix's GEMM and the pass."""
    from cuconv import _plan
    from cuconv.problem import Problem

    spec = cuconv.ConvSpec.from_args((32, 64, 56, 56), (144, 64, 1, 1), stride=2)
    epilogue = Epilogue(bias=True, activation="relu", residual="before")
    for wgmma, expected in ((True, "implicit_gemm"), (False, "im2col_gemm")):
        limits = _plan.Limits(227 << 10, wgmma, cuconv.config.workspace_limit)
        problem = Problem.of(spec, _F16, "ieee", "fprop", "nhwc", epilogue=epilogue)
        assert select.algorithm(problem, limits) == expected


@pytest.mark.parametrize("hw,c,k,expected", [(7, 512, 2048, "im2col_gemm"), (7, 2048, 512, "implicit_gemm"),
                                             (7, 1152, 192, "implicit_gemm"), (7, 672, 160, "im2col_gemm"),
                                             (14, 1024, 256, "im2col_gemm"), (1, 960, 240, "im2col_gemm")])
def test_pointwise_dgrad_takes_implicit_gemm_on_small_planes_with_many_weights(hw, c, k, expected):
    """1x1 stride-1 dgrad on a wgmma device: implicit_gemm's forward of dy where N·H·W is 1024 to 4095, C·K
    at least 150000 and the layer narrows (K < C; otherwise im2col_gemm's one GEMM over the batch), cuBLASLt's
    GEMMs elsewhere."""
    spec = cuconv.ConvSpec.from_args((32, c, hw, hw), (k, c, 1, 1))
    limits = {"smem_limit": 227 << 10, "workspace_limit": cuconv.config.workspace_limit}
    for dtype, precision in ((_F16, "ieee"), (_F32, "tf32")):
        assert select_auto(spec, dtype, precision, True, "dgrad", wgmma=True, **limits) == expected


@pytest.mark.parametrize("hw,c,k,groups,dtype,expected", [
    (1, 960, 240, 1, _F32, "im2col_gemm"), (1, 32, 8, 1, _F16, "im2col_gemm"), (1, 64, 64, 4, _F16, "implicit_gemm"),
    (7, 960, 240, 1, _F32, "im2col_gemm"), (7, 2048, 512, 1, _F32, "implicit_gemm"),
    (14, 960, 240, 1, _F32, "im2col_gemm"),
    (14, 960, 240, 1, _F16, "implicit_gemm"), (28, 960, 240, 1, _F16, "im2col_gemm"),
    (14, 480, 112, 1, _F16, "im2col_gemm"), (7, 480, 112, 1, _F16, "im2col_gemm"),
    (13, 960, 240, 4, _F16, "implicit_gemm"),
    (14, 1024, 512, 1, _F32, "implicit_gemm"), (14, 256, 1024, 1, _F32, "im2col_gemm"),
    (28, 1024, 512, 1, _F32, "im2col_gemm"),
], ids=["se_tf32", "se_fp16", "se_grouped", "7_tf32", "7_tf32_large_weight", "14_tf32", "14_fp16", "28_fp16",
        "14_fp16_small_weight", "7_fp16", "13_fp16_grouped", "14_tf32_large_weight", "14_tf32_2^18",
        "28_tf32_large_weight"])
def test_pointwise_wgrad_takes_a_gemm_on_large_planes_and_on_1x1_planes(hw, c, k, groups, dtype, expected):
    """1x1 stride-1 wgrad at tensor-core precisions: cuBLASLt's GEMMs from 14x14 planes (TF32, but below 28x28 only
    where C·K < 2^19) or 28x28 (half types; 14x14 where C·K < 90000), on squeeze-excitation's 1x1 planes of one
    group, and on smaller planes of one group below C·K = 2^20 (one GEMM over the batch), implicit_gemm between."""
    spec = cuconv.ConvSpec.from_args((32, c, hw, hw), (k, c // groups, 1, 1), groups=groups)
    precision = "tf32" if dtype == _F32 else "ieee"
    assert cuconv.select_algorithm(spec, dtype, precision, True, "wgrad") == expected


@pytest.mark.parametrize("x_shape,k,groups,dtype,expected", [
    ((32, 256, 56, 56), 512, 1, _F32, "im2col_gemm"), ((32, 64, 56, 56), 144, 1, _F32, "im2col_gemm"),
    ((32, 32, 112, 112), 64, 1, _F32, "im2col_gemm"), ((32, 32, 112, 112), 64, 1, _BF16, "im2col_gemm"),
    ((32, 256, 56, 56), 512, 1, _BF16, "implicit_gemm"), ((32, 512, 28, 28), 1024, 1, _F32, "implicit_gemm"),
    ((32, 144, 28, 28), 320, 1, _F32, "implicit_gemm"), ((32, 256, 56, 56), 512, 4, _F32, "implicit_gemm"),
], ids=["56_tf32", "56_tf32_narrow", "112_tf32", "112_bf16", "56_bf16", "28_tf32", "28_tf32_narrow", "56_tf32_g4"])
def test_strided_pointwise_wgrad_gathers_only_the_pixels_it_reads_on_large_planes(x_shape, k, groups, dtype, expected):
    """1x1 wgrads at stride 2 of one group: im2col_gemm (a gather of the pixels the stride reads, one GEMM) on input
    planes from 56x56 in TF32 and from 112x112 in the half types; implicit_gemm, which packs all of x, below, and
    for grouped layers."""
    spec = cuconv.ConvSpec.from_args(x_shape, (k, x_shape[1] // groups, 1, 1), stride=2, groups=groups)
    precision = "tf32" if dtype == _F32 else "ieee"
    assert cuconv.select_algorithm(spec, dtype, precision, True, "wgrad") == expected


@pytest.mark.parametrize("x_shape,k,kernel,expected", [
    ((32, 256, 14, 14), 256, 3, "wg128x256"), ((32, 256, 28, 28), 256, 3, "wg128x256"),
    ((4, 256, 25, 38), 256, 3, "wg128x256"), ((16, 256, 14, 14), 256, 3, "wg128x256"),
    ((32, 512, 7, 7), 512, 3, "wg64x128"), ((32, 1024, 14, 14), 512, 1, "wg64x128"),
    ((32, 128, 28, 28), 128, 3, "wg64x128"), ((32, 320, 14, 14), 320, 3, "wg64x128"),
], ids=["256_14", "256_28", "fpn_25x38", "256_14_b16", "512_7", "1x1_1024", "128_28", "grouped_20"])
def test_wgrad_tile_is_wide_for_long_columns_and_reductions(x_shape, k, kernel, expected):
    """wgrad's wgmma tile: 128 filters x 256 of dW's columns where a group has more than 64 filters and both
    C/groups·R·S and N·P·Q reach 2048; 64 x 128 otherwise (the last case: 20 groups of 16)."""
    from cuconv.algos import implicit_gemm

    groups = 20 if x_shape[1] == 320 else 1
    spec = cuconv.ConvSpec.from_args(x_shape, (k, x_shape[1] // groups, kernel, kernel), padding=kernel // 2,
                                     groups=groups)
    assert choice.wgrad_tile(spec, _F16, True) is implicit_gemm.TILES[expected]


@pytest.mark.parametrize("x_shape,k,expected", [
    ((32, 512, 14, 14), 512, "wg128x256"), ((32, 1024, 7, 7), 1024, "wg128x256"), ((64, 256, 14, 14), 256, "wg128x256"),
    ((4, 256, 50, 76), 256, "wg128x256"), ((32, 256, 14, 14), 256, "wg64x128"), ((32, 512, 7, 7), 512, "wg64x128"),
], ids=["512_14", "1024_7", "256_14_b64", "fpn_50x76", "256_14", "512_7"])
def test_long_gemms_on_few_pixels_take_128x256_blocks(x_shape, k, expected):
    """Of the cp.async tiles (float32, or no TMA tile): below 16384 output pixels a 3x3 forward of more than 64
    filters takes 64 x 128 blocks, but 128 x 256 ones where the GEMM has 5·10^9 multiply-adds or more (dgrad at
    stride 1 follows: the forward of dy)."""
    from cuconv.algos import implicit_gemm

    spec = cuconv.ConvSpec.from_args(x_shape, (k, x_shape[1], 3, 3), padding=1)
    assert choice.choose_tile(spec, _BF16, wgmma=True, nchw=False, tma=False) is implicit_gemm.TILES[expected]


def test_splits_never_spill_past_one_wave_of_resident_blocks():
    """72 blocks of a tile that fits once an SM: split in two they would take two waves on 132 SMs; they stay
    whole. Tiles of two blocks an SM keep the rounded count (144 of them are resident at once)."""
    from cuconv.algos import implicit_gemm

    tiles, smem = implicit_gemm.TILES, 228 << 10
    assert implicit_gemm.resident_blocks(tiles["wg128x256"], smem) == 1
    assert implicit_gemm.resident_blocks(tiles["wg64x128"], smem) == 2
    assert choice.splits_for(18 * 256, 4 * 128, tiles["wg128x256"], 98, 132, smem, 1 << 30) == 1
    assert choice.splits_for(9 * 256, 2 * 128, tiles["wg128x256"], 98, 132, smem, 1 << 30) == 7
    assert choice.splits_for(36 * 128, 2 * 64, tiles["wg64x128"], 98, 132, smem, 1 << 30) == 2


@pytest.mark.parametrize("c,k,expected", [(1152, 192, "implicit_gemm"), (960, 160, "implicit_gemm"),
                                         (2048, 512, "im2col_gemm"), (672, 160, "im2col_gemm"),
                                         (1152, 320, "im2col_gemm")])
def test_tf32_narrowing_pointwise_forward_on_7x7_reads_the_input_once(c, k, expected):
    """TF32 1x1 forwards on 7x7 planes (where im2col_gemm folds the batch between two swaps of the input) that
    narrow the channels 5 times or more: implicit_gemm's NchwTile, which reads the input once; bf16 stays folded."""
    spec = cuconv.ConvSpec.from_args((32, c, 7, 7), (k, c, 1, 1))
    limits = {"smem_limit": 227 << 10, "workspace_limit": cuconv.config.workspace_limit}
    assert select_auto(spec, _F32, "tf32", True, "fprop", wgmma=True, **limits) == expected
    assert select_auto(spec, _BF16, "ieee", True, "fprop", wgmma=True, **limits) == "im2col_gemm"


@pytest.mark.parametrize("xs,kwargs,pass_,half,tf32", [
    ((32, 784, 7, 7), dict(groups=49, padding=1), "fprop", "grouped_mma", "grouped_mma"),
    ((32, 784, 7, 7), dict(groups=49, padding=1), "dgrad", "grouped_mma", "grouped_mma"),
    ((32, 320, 14, 14), dict(groups=20, padding=1), "fprop", "grouped_mma", "grouped_mma"),
    ((32, 320, 28, 28), dict(groups=20, stride=2, padding=1), "fprop", "grouped_mma", "implicit_gemm"),
    ((32, 320, 28, 28), dict(groups=20, stride=2, padding=1), "dgrad", "implicit_gemm", "implicit_gemm"),
    ((32, 144, 28, 28), dict(groups=9, padding=1), "fprop", "grouped_mma", "implicit_gemm"),
    ((32, 144, 28, 28), dict(groups=9, padding=1), "wgrad", "implicit_gemm", "implicit_gemm"),
    ((1, 320, 14, 14), dict(groups=20, padding=1), "fprop", "implicit_gemm", "implicit_gemm"),
    ((32, 256, 28, 28), dict(groups=8, padding=1), "fprop", "implicit_gemm", "implicit_gemm"),
], ids=["7x7", "7x7_dgrad", "14x14", "stride2", "stride2_dgrad", "28x28", "wgrad", "batch1", "32_a_group"])
def test_groups_of_16_take_grouped_mma(xs, kwargs, pass_, half, tf32):
    """Groups of 16 channels and 16 filters: grouped_mma in the half types for the forward and the stride-1 dgrad,
    in TF32 at stride 1 onto planes up to 14x14; implicit_gemm where the launch has too few blocks (a batch of
    one), for wgrad and for wider groups."""
    c = xs[1]
    spec = cuconv.ConvSpec.from_args(xs, (c, c // kwargs["groups"], 3, 3), **kwargs)
    assert cuconv.select_algorithm(spec, _BF16, "ieee", True, pass_) == half
    assert cuconv.select_algorithm(spec, _F16, "ieee", True, pass_) == half
    assert cuconv.select_algorithm(spec, _F32, "tf32", True, pass_) == tf32
    assert cuconv.select_algorithm(spec, _F32, "ieee", True, pass_) != "grouped_mma"


def test_resnet_1x1_256_forward_is_a_gemm_at_every_precision():
    for dtype, precision in ((_F16, "ieee"), (_F32, "tf32"), (_F32, "ieee"), (_F64, "ieee")):
        assert cuconv.select_algorithm(_P["resnet_1x1_256"], dtype, precision, True) == "im2col_gemm"


@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("problem", sorted(_P))
def test_selection_always_serves_the_case(problem, pass_):
    for dtype in (_F16, _F32, _F64):
        for precision in ("ieee", "tf32"):
            name = cuconv.select_algorithm(_P[problem], dtype, precision, True, pass_)
            assert select.reason_unsupported(name, _P[problem], dtype, pass_, precision) is None


def test_unknown_pass_is_refused():
    with pytest.raises(ValueError, match="unknown pass 'bwd'"):
        cuconv.select_algorithm(_P["square_5x9"], _F32, "ieee", True, "bwd")


_WIDE_1X1 = cuconv.ConvSpec.from_args((2, 64, 9, 9), (256, 64, 1, 1))


@pytest.mark.parametrize("problem,dtype,wgmma,nchw,expected", [
    # mma.sync: 128 filters above 64; 64-byte k tiles for short reductions
    ("rect_5x7", _F16, False, None, "128x128"),
    ("square_5x9", _F32, False, None, "128x64"),
    ("stem_7x7_s2", _F32, False, None, "128x64_k64"),
    ("resnet_1x1_256", _F32, False, None, "128x64_k64"),
    # wgmma: float32 with long reductions keeps more slots (and 256 pixels above 64 filters); short
    # reductions take smaller blocks, more of them per SM; the 16-bit types take TMA tiles (tma_tile)
    ("square_5x9", _F32, True, None, "wg64x128"),
    ("square_5x9", _F16, True, None, "rows64x256_k32"),
    ("stem_7x7_s2", _F32, True, None, "wg64x128s3"),
    ("rect_5x7", _F32, True, None, "wg128x256"),
    ("rect_5x7", _F16, True, None, "rows128x128_k64"),
    ("square_3x3_1024", _F32, True, None, "wg128x128r"),
    ("resnet_3x3_64", _F16, True, None, "tma64x128"),
    ("resnet_3x3_64", _F32, True, False, "wg64x128"),
    # NchwTiles (no packing launch) where the pack weighs most: 1x1 layers, and float32 up to K·R·S = 576
    ("resnet_1x1_256", _F16, True, None, "nchw64"),
    ("resnet_1x1_256", _F32, True, None, "nchw64"),
    ("resnet_3x3_64", _F32, True, None, "nchw64"),
    ("wide_1x1", _F16, True, None, "nchw128"),
    # past the NchwTile's limits (31 taps) the packed tiles serve even when asked for it
    ("stem_7x7_s2", _F32, True, True, "wg64x128s3"),
])
def test_implicit_gemm_tile_choice(problem, dtype, wgmma, nchw, expected):
    from cuconv.algos import implicit_gemm

    spec = _WIDE_1X1 if problem == "wide_1x1" else _P[problem]
    tiles = {**implicit_gemm.TILES, **implicit_gemm.TMA_TILES, **implicit_gemm.TMA_ROWS_TILES}
    assert choice.choose_tile(spec, dtype, wgmma=wgmma, nchw=nchw) is tiles[expected]


def test_implicit_gemm_tiles_fit_and_fall_back():
    from cuconv.algos import implicit_gemm

    tiles = implicit_gemm.TILES
    # past the NchwTile's limits (31 taps, reductions of 2048) a plan for it takes the packed wgmma tile
    stem, rect = _P["stem_7x7_s2"], _P["rect_5x7"]
    assert not implicit_gemm.nchw_fits(stem, _F32) and not implicit_gemm.nchw_fits(rect, _F32)
    assert implicit_gemm.plan(rect, _F32, tiles["nchw128"], 1 << 30).tile is tiles["wg128x256"]
    assert choice.choose_tile(_P["square_5x9"], _F32) is choice.choose_tile(  # the device's
        _P["square_5x9"], _F32, wgmma=implicit_gemm.wgmma_available())
    for tile in tiles.values():  # every tile fits the device; an mma.sync epilogue fits the pipeline
        assert tile.smem_bytes <= 227 << 10
        if tile.nchw:  # two slots of 128 pixels; the k table (8 bytes a k, up to 2048) fits beside them
            assert tile.bm == 128 and tile.stages == 2 and tile.smem_bytes + 2048 * 8 <= 227 << 10
        if tile.wgmma:  # 128-byte k rows in 1024-byte swizzle atoms; whole warpgroups of 64 x 128
            assert tile.bn % 64 == 0 and tile.bm % (128 * tile.wg_p) == 0 and tile.kbytes == 128
            assert tile.threads == 128 * tile.bn // 64 * tile.wg_p <= 1024
        else:
            assert tile.bn * (tile.bm + 4) * 4 <= tile.stages * (tile.bm + tile.bn) * tile.pitch


def test_implicit_gemm_reasons():
    from cuconv.algos import implicit_gemm
    from cuconv.spec import ConvSpec

    spec = _P["square_5x9"]
    assert implicit_gemm.reason_unsupported(spec, _F32, "fprop", "tf32") is None
    assert "precision='tf32'" in implicit_gemm.reason_unsupported(spec, _F32, "fprop", "ieee")
    assert "float64" in implicit_gemm.reason_unsupported(spec, _F64, "fprop", "ieee")
    assert implicit_gemm.reason_unsupported(spec, _F16, "wgrad") is None
    assert "precision='tf32'" in implicit_gemm.reason_unsupported(spec, _F32, "wgrad", "ieee")
    # wgrad's packed channels are the samples: any C/groups, depthwise included
    assert implicit_gemm.reason_unsupported(ConvSpec.from_args((1, 4, 8, 8), (4, 2, 3, 3), groups=2), _F16,
                                            "wgrad") is None
    assert implicit_gemm.reason_unsupported(ConvSpec.from_args((3, 6, 8, 8), (12, 1, 3, 3), groups=6), _F16,
                                            "wgrad") is None
    assert "grid z" in implicit_gemm.reason_unsupported(ConvSpec.from_args((1, 70000, 3, 3), (8, 70000, 1, 1)),
                                                        _F16, "wgrad")
    assert "C/groups = 2" in implicit_gemm.reason_unsupported(
        ConvSpec.from_args((1, 4, 8, 8), (4, 2, 3, 3), groups=2), _F16)
    assert implicit_gemm.reason_unsupported(ConvSpec.from_args((1, 32, 8, 8), (64, 8, 3, 3), groups=4), _F16) is None
    # dgrad at a stride above 1: a GEMM per phase of the stride, at dilation 1
    assert implicit_gemm.reason_unsupported(_P["stem_7x7_s2"], _F16, "dgrad") is None
    assert "dilation 1" in implicit_gemm.reason_unsupported(
        ConvSpec.from_args((1, 8, 9, 9), (8, 8, 3, 3), stride=2, dilation=2), _F16, "dgrad")
    assert "16-byte vectors" in implicit_gemm.reason_unsupported(
        ConvSpec.from_args((1, 8, 9, 9), (12, 2, 3, 3), stride=2, groups=4), _F16, "dgrad")
    assert "16-bit pixel" in implicit_gemm.reason_unsupported(ConvSpec.from_args((1, 1, 1, 40000), (1, 1, 1, 3)),
                                                              _F16)
    with cuconv.config(workspace_limit=1 << 20):
        assert "workspace_limit" in implicit_gemm.reason_unsupported(spec, _F16)
        assert "workspace_limit" in implicit_gemm.reason_unsupported(spec, _F16, "wgrad")


def test_selection_reads_no_device_state_beyond_its_arguments(monkeypatch):
    """The limits a choice depends on (shared memory, wgmma, workspace limit) are its arguments: with the
    device's own answers made to fail, the memoized selector still decides, and decides by what it is given."""
    from cuconv import _loader
    from cuconv.algos import implicit_gemm

    def asked(*_):
        raise AssertionError("the device was asked")

    monkeypatch.setattr(_loader, "smem_limit", asked)
    monkeypatch.setattr(implicit_gemm, "wgmma_available", asked)
    monkeypatch.setattr(choice, "wgmma_available", asked)  # (where choose_tile asks)
    monkeypatch.setattr(cuconv._plan, "current_limits", asked)
    select._clear()
    try:
        for problem in sorted(_P):
            for pass_ in PASSES:
                for smem_limit, wgmma in ((227 << 10, True), (99 << 10, False), (48 << 10, False)):
                    name = select_auto(_P[problem], numpy.dtype(numpy.float32), "ieee", True, pass_,
                                                      smem_limit, wgmma, 1 << 30)
                    assert name in select.algorithms(pass_)
        # a workspace limit below what one packed sample needs refuses implicit_gemm, given, not read
        tight = reason_under("implicit_gemm", _P["square_3x3_1024"], numpy.dtype(numpy.float16),
                                             "fprop", "ieee", 227 << 10, True, 1 << 20)
        assert "workspace_limit (1048576)" in tight
    finally:
        select._clear()


def test_resolve_takes_the_workspace_limit_it_is_given():
    """A layer's backward passes resolve in autograd's thread, outside the caller's ``cuconv.config`` block: the
    limit passed in decides as the block would have."""
    spec, f16 = _P["square_3x3_1024"], numpy.dtype(numpy.float16)
    with cuconv.config(workspace_limit=1 << 20):
        in_block = select.resolve("auto", spec, f16, "ieee", True, "fprop")
        with pytest.raises(NotImplementedError, match="workspace_limit"):
            select.resolve("implicit_gemm", spec, f16, "ieee", True, "fprop")
    assert select.resolve("auto", spec, f16, "ieee", True, "fprop", 1 << 20) == in_block != "implicit_gemm"
    assert select.resolve("auto", spec, f16, "ieee", True, "fprop") == "implicit_gemm"
    with pytest.raises(NotImplementedError, match="workspace_limit"):
        select.resolve("implicit_gemm", spec, f16, "ieee", True, "fprop", 1 << 20)


@pytest.mark.parametrize("c,k,hw,expected", [(1024, 512, 14, "implicit_gemm"), (2048, 1024, 14, "implicit_gemm"),
                                             (512, 2048, 14, "im2col_gemm"), (768, 768, 14, "im2col_gemm"),
                                             (1024, 512, 28, "im2col_gemm")])
def test_pointwise_tf32_forward_takes_implicit_gemm_on_14x14_planes_with_large_weights(c, k, hw, expected):
    """TF32 1x1 forwards on 14x14 to 27x27 planes from 1024 channels and C·K = 2^19 (cuBLAS's 196-row per-sample
    GEMMs were 1.2-1.5x slower there); the half types keep the GEMM."""
    spec = cuconv.ConvSpec.from_args((32, c, hw, hw), (k, c, 1, 1))
    limits = dict(smem_limit=227 << 10, workspace_limit=1 << 30)
    assert select_auto(spec, _F32, "tf32", True, "fprop", wgmma=True, **limits) == expected
    assert select_auto(spec, _F16, "ieee", True, "fprop", wgmma=True, **limits) == "im2col_gemm"


def test_channels_last_passes_read_in_place_or_pack_channels_last_pixels():
    """implicit_gemm serves every pass on channels-last activations: the forward and the stride-1 dgrad (the
    forward of dy) read their input in place where a group's channels fill 16-byte vectors in the half types, and
    pack channels-last pixels elsewhere (float32's TF32 rounding, channels off whole vectors) within the
    workspace limit; strided dgrads (phases) and wgrad pack from channels-last pixels too."""
    from cuconv import _plan
    from cuconv.blocks import dgrad_forward
    from cuconv.algos import implicit_gemm

    f16, f32 = numpy.dtype(numpy.float16), numpy.dtype(numpy.float32)
    limits = _plan.Limits(227 << 10, True, 1 << 30)
    spec = cuconv.ConvSpec.from_args((2, 20, 9, 9), (16, 20, 3, 3), padding=1)  # 16 filters: dy's pixels 32 bytes
    assert not implicit_gemm.nhwc_in_place(spec, f16)  # x's 20 channels are 40 bytes
    assert implicit_gemm.nhwc_in_place(dgrad_forward.forward_spec(spec), f16)
    assert not implicit_gemm.nhwc_in_place(dgrad_forward.forward_spec(spec), f32)
    grouped = cuconv.ConvSpec.from_args((2, 32, 9, 9), (32, 16, 3, 3), padding=1, groups=2)
    assert implicit_gemm.nhwc_in_place(grouped, f16)
    assert not implicit_gemm.nhwc_in_place(cuconv.ConvSpec.from_args((2, 8, 9, 9), (8, 4, 3, 3), groups=2), f16)
    strided = cuconv.ConvSpec.from_args((2, 16, 9, 9), (16, 16, 3, 3), padding=1, stride=2)
    for case in (spec, grouped, strided):
        for dtype in (f16, f32):
            for pass_ in ("fprop", "dgrad", "wgrad"):
                assert implicit_gemm.reason_unsupported_nhwc(case, dtype, pass_, "tf32", limits) is None
    tiny = _plan.Limits(227 << 10, True, 1024)
    assert "workspace_limit" in implicit_gemm.reason_unsupported_nhwc(spec, f16, "fprop", "tf32", tiny)
    # read in place, the input takes no workspace; the packed weight still does (18 KB here)
    in_place = dgrad_forward.forward_spec(spec)
    assert "packed weight" in implicit_gemm.reason_unsupported_nhwc(in_place, f16, "fprop", "tf32", tiny)
    weight_only = _plan.Limits(227 << 10, True, 18432)
    assert implicit_gemm.reason_unsupported_nhwc(in_place, f16, "fprop", "tf32", weight_only) is None


def test_pack_swap_divides_by_its_magic_number():
    """pack_swap finds a run element's pixel as (j · m) >> p (``division_magic``): j // C for every j below 2^31,
    at the edges of each quotient, for channel counts from 1 to large ones and powers of two."""
    from cuconv.algos import implicit_gemm

    rng = numpy.random.default_rng(0)
    for d in list(range(1, 600)) + [2**k for k in range(31)] + [2**k + 1 for k in range(30)] + \
            list(rng.integers(1, 2**24, 300)):
        m, p = implicit_gemm.division_magic(int(d))
        assert m < 2**33
        js = numpy.concatenate([[0, 1, d - 1, d, d + 1, 2**31 - 1, 2**31 - 2], rng.integers(0, 2**31, 64)])
        for j in js:
            if 0 <= j < 2**31:
                assert (int(j) * m) >> p == int(j) // int(d), (d, j)


@pytest.mark.parametrize("x_shape,w_shape,kwargs,dtype,expected", [
    ((32, 256, 14, 14), (256, 256, 3, 3), dict(padding=1), _BF16, "im2col_gemm"),
    ((32, 128, 56, 56), (128, 128, 3, 3), dict(stride=2, padding=1), _BF16, "im2col_gemm"),
    ((32, 128, 28, 28), (128, 128, 3, 3), dict(padding=1), _BF16, "implicit_gemm"),
    ((32, 64, 56, 56), (64, 64, 3, 3), dict(padding=1), _BF16, "implicit_gemm"),
    ((32, 256, 56, 56), (256, 256, 3, 3), dict(padding=1), _BF16, "implicit_gemm"),
    ((32, 256, 14, 14), (256, 256, 3, 3), dict(padding=1), _F32, "implicit_gemm"),
    ((32, 96, 56, 56), (192, 96, 2, 2), dict(stride=2), _F32, "im2col_gemm"),
    ((32, 256, 14, 14), (256, 64, 3, 3), dict(padding=1, groups=4), _BF16, "implicit_gemm"),
], ids=["256_14_bf16", "128_56_s2_bf16", "128_28_bf16", "64_filters", "column_matrix_too_large", "tf32",
        "patches_tf32", "grouped"])
def test_channels_last_wgrad_through_the_column_matrix(x_shape, w_shape, kwargs, dtype, expected):
    """k x k wgrads on channels-last tensors on a device without wgmma (no GPU needed): im2col_gemm's column matrix
    and one GEMM for layers of one group with 128 filters or more at a stride (256 at stride 1) in the half types,
    up to a column matrix of 256 MiB, and for non-overlapping patches in any precision; implicit_gemm elsewhere."""
    spec = cuconv.ConvSpec.from_args(x_shape, w_shape, **kwargs)
    precision = "tf32" if dtype == _F32 else "ieee"
    assert select_nhwc_auto("auto", spec, dtype, precision, "wgrad", 163 << 10, False,
                                 cuconv.config.workspace_limit) == expected


@pytest.mark.parametrize("x_shape,w_shape,kwargs,dtype,expected,tile", [
    ((32, 64, 56, 56), (64, 64, 3, 3), dict(padding=1), _BF16, "implicit_gemm", "wt64x64"),
    ((32, 128, 28, 28), (128, 128, 3, 3), dict(padding=1), _F16, "implicit_gemm", "wt64x128"),
    ((32, 64, 56, 56), (128, 64, 3, 3), dict(stride=2, padding=1), _BF16, "implicit_gemm", "wt64x64"),
    ((32, 256, 14, 14), (256, 256, 3, 3), dict(padding=1), _BF16, "implicit_gemm", "wt128x256"),
    ((32, 128, 56, 56), (128, 128, 3, 3), dict(stride=2, padding=1), _BF16, "implicit_gemm", "wt64x128"),
    ((32, 96, 28, 28), (64, 96, 3, 3), dict(padding=1), _BF16, "implicit_gemm", "wt64x128"),
    ((64, 384, 7, 7), (384, 384, 3, 3), dict(padding=2, dilation=2), _BF16, "implicit_gemm", "wt128x256"),
    ((8, 256, 14, 14), (256, 256, 3, 3), dict(padding=1), _BF16, "im2col_gemm", "wt128x256"),
    ((8, 64, 14, 14), (64, 64, 3, 3), dict(padding=1), _BF16, "implicit_gemm", "wt64x64"),
    ((32, 96, 56, 56), (192, 96, 2, 2), dict(stride=2), _BF16, "im2col_gemm", "wt64x128"),
    ((32, 256, 14, 14), (256, 256, 1, 1), {}, _BF16, "im2col_gemm", "wt128x256"),
    ((32, 256, 14, 14), (256, 256, 3, 3), dict(padding=1), _F32, "implicit_gemm", None),
    ((32, 256, 14, 14), (256, 64, 3, 3), dict(padding=1, groups=4), _BF16, "implicit_gemm", "wt64x64"),
    ((32, 320, 14, 14), (320, 16, 3, 3), dict(padding=1, groups=20), _BF16, "implicit_gemm", "wt64x64"),
    ((32, 64, 112, 112), (64, 16, 3, 3), dict(padding=1, stride=2, groups=4), _BF16, "implicit_gemm", "wt64x64"),
    ((32, 256, 28, 28), (256, 8, 3, 3), dict(padding=1, groups=32), _BF16, "implicit_gemm", None),
    ((32, 24, 56, 56), (64, 24, 3, 3), dict(padding=1), _BF16, "implicit_gemm", None),
    ((32, 64, 56, 56), (20, 64, 3, 3), dict(padding=1), _BF16, "implicit_gemm", None),
], ids=["64_56", "128_28_fp16", "64_to_128_s2", "256_14", "128_56_s2", "96_to_64", "dilated", "few_pixels",
        "few_pixels_no_columns", "patches", "pointwise", "tf32",
        "grouped", "regnet_g16", "regnet_g16_s2", "groups_of_8", "c24", "k20"])
def test_channels_last_wgrad_takes_the_tma_wgrad_on_wgmma_devices(x_shape, w_shape, kwargs, dtype, expected, tile):
    """On a wgmma device (no GPU needed) the channels-last wgrad of overlapping k x k windows of one group in the
    half types, channels and filters whole 16-byte vectors of at least 32, is implicit_gemm's TMA wgrad, before
    im2col_gemm's column matrix: 64 filters x 64 channels up to 64 channels, 64 x 128 up to 128 channels or 64
    filters, else 128 x 256;
    1x1 layers, patches and layers of fewer than 2048 output pixels its column matrix serves stay with im2col_gemm;
    groups of 16, 32 or 64 channels and as many filters take 64 x 64; float32, narrower groups and narrow layers
    stay with the packed wgrad."""
    from cuconv.algos import implicit_gemm

    spec = cuconv.ConvSpec.from_args(x_shape, w_shape, **kwargs)
    precision = "tf32" if dtype == _F32 else "ieee"
    assert select_nhwc_auto("auto", spec, dtype, precision, "wgrad", 227 << 10, True,
                                 cuconv.config.workspace_limit) == expected
    assert choice.wgrad_tma_tile(spec, dtype) is (None if tile is None else implicit_gemm.WGRAD_TMA_TILES[tile])


@pytest.mark.parametrize("x_shape,w_shape,kwargs,dtype,expected", [
    ((32, 320, 14, 14), (320, 16, 3, 3), dict(padding=1, groups=20), _BF16, "tma64x128"),
    ((32, 64, 112, 112), (64, 16, 3, 3), dict(padding=1, stride=2, groups=4), _F16, "tma64x128"),
    ((32, 96, 28, 28), (96, 32, 3, 3), dict(padding=1, groups=3), _BF16, "tma64x128"),
    ((32, 256, 28, 28), (256, 8, 3, 3), dict(padding=1, groups=32), _BF16, None),
    ((32, 320, 14, 14), (320, 16, 3, 3), dict(padding=1, groups=20), _F32, None),
    ((32, 320, 14, 14), (320, 320, 3, 3), dict(padding=1), _BF16, None),
], ids=["regnet_g16", "regnet_g16_s2", "g32", "groups_of_8", "fp32", "dense"])
def test_grouped_forward_through_a_block_diagonal_weight(x_shape, w_shape, kwargs, dtype, expected):
    """A grouped forward of 16, 32 or 64 channels and as many filters a group in the half types runs, on a wgmma
    device's channels-last tensors, as one TMA GEMM through a block-diagonal weight (no GPU needed)."""
    from cuconv.algos import implicit_gemm

    spec = cuconv.ConvSpec.from_args(x_shape, w_shape, **kwargs)
    tile = implicit_gemm.block_diagonal_tile(spec, dtype)
    assert tile is (None if expected is None else implicit_gemm.TMA_TILES[expected])
    if expected is not None:
        assert select_nhwc_auto("auto", spec, dtype, "ieee", "fprop", 227 << 10, True,
                                     cuconv.config.workspace_limit) == "implicit_gemm"


def test_split_forwards_take_no_row_band_tile():
    """A forward asked for a split over k takes the TMA tile the row-band tile stands in for (it reduces every tap
    in its block; no GPU needed)."""
    from cuconv.algos import implicit_gemm

    spec = _P["square_5x9"]
    assert choice.choose_tile(spec, _F16, wgmma=True, nchw=False) is implicit_gemm.TMA_ROWS_TILES[
        "rows64x256_k32"]
    assert choice.choose_tile(spec, _F16, wgmma=True, nchw=False, rows=False) is implicit_gemm.TMA_TILES[
        "tma64x256_k64"]


def test_tma_wgrad_splits_fill_the_sms():
    """The TMA wgrad's pixel ranges: as many as fill the SMs' resident blocks over the dW tiles, each of at least
    four 64-pixel k tiles, the partial sums within the workspace; one where the tiles fill the SMs already."""
    from cuconv.algos import implicit_gemm

    t = implicit_gemm.WGRAD_TMA_TILES
    small = cuconv.ConvSpec.from_args((32, 64, 56, 56), (64, 64, 3, 3), padding=1)  # 9 blocks, 1568 k tiles
    assert choice.wgrad_tma_splits(small, t["wt64x64"], 132, 228 << 10, 1 << 30) == 264 // 9
    assert choice.wgrad_tma_splits(small, t["wt64x64"], 132, 228 << 10, 4 * 64 * 576 * 5) == 5
    short = cuconv.ConvSpec.from_args((2, 64, 7, 7), (64, 64, 3, 3), padding=1)  # 2 k tiles
    assert choice.wgrad_tma_splits(short, t["wt64x64"], 132, 228 << 10, 1 << 30) == 1
    wide = cuconv.ConvSpec.from_args((32, 512, 28, 28), (512, 512, 3, 3), padding=1)  # 144 blocks of one an SM
    assert choice.wgrad_tma_splits(wide, t["wt128x256"], 132, 228 << 10, 1 << 30) == 1


@pytest.mark.parametrize("x_shape,w_shape,kwargs,dtype_name,reason", [
    ((2, 64, 9, 9), (64, 64, 3, 3), dict(padding=1), "float32", "16-bit"),
    ((2, 128, 9, 9), (64, 64, 3, 3), dict(padding=1, groups=2), "float16", "one group"),
    ((2, 32, 9, 9), (64, 32, 3, 3), dict(padding=1), "bfloat16", "64 channels"),
    ((1, 64, 300, 9), (64, 64, 3, 3), dict(padding=(130, 1)), "float16", "corners"),
])
def test_tma_reason_names_what_the_tma_tiles_do_not_serve(x_shape, w_shape, kwargs, dtype_name, reason):
    """``tma_reason`` refuses what the TMA tiles cannot run, with the reason (no GPU needed)."""
    from cuconv.algos import implicit_gemm

    dtype = _dtypes.by_name(dtype_name)
    spec = cuconv.ConvSpec.from_args(x_shape, w_shape, **kwargs)
    pl = implicit_gemm.plan(spec, dtype, implicit_gemm.TMA_TILES["tma64x128"], 1 << 30)
    assert reason in implicit_gemm.tma_reason(spec, dtype, pl)
    ok = cuconv.ConvSpec.from_args((2, 64, 9, 9), (64, 64, 3, 3), padding=1)
    assert implicit_gemm.tma_reason(ok, _dtypes.by_name("float16"),
                                    implicit_gemm.plan(ok, _dtypes.by_name("float16"),
                                                       implicit_gemm.TMA_TILES["tma64x128"], 1 << 30)) is None


@pytest.mark.parametrize("x_shape,w_shape,kwargs,dtype_name,expected", [
    ((32, 64, 56, 56), (64, 64, 3, 3), dict(padding=1), "bfloat16", "tma64x128"),
    ((32, 128, 28, 28), (128, 128, 3, 3), dict(padding=1), "bfloat16", "tma128x128"),  # short reduction
    ((32, 256, 14, 14), (256, 256, 3, 3), dict(padding=1), "float16", "tma128x128"),   # 98 blocks
    ((32, 512, 7, 7), (512, 512, 3, 3), dict(padding=1), "float16", "tma64x128"),      # 52 would idle SMs
    ((32, 512, 14, 14), (512, 512, 3, 3), dict(padding=1), "bfloat16", "tma128x256"),  # long reduction
    ((128, 256, 14, 14), (256, 256, 3, 3), dict(padding=1), "bfloat16", "tma128x128"),  # 1.5 waves of 128x256
    ((32, 96, 56, 56), (192, 96, 2, 2), dict(stride=2), "bfloat16", "tma64x128_k64"),  # 192 filters
    ((32, 96, 56, 56), (96, 96, 3, 3), dict(padding=1), "bfloat16", "tma128x128_k64"),
    ((8, 32, 512, 512), (64, 32, 5, 9), {}, "float16", "rows64x256_k32"),              # square_5x9: long rows
    ((16, 16, 1024, 1024), (128, 16, 3, 3), {}, "float16", "rows128x128_k16"),         # square_3x3_1024
    ((8, 64, 512, 256), (128, 64, 5, 7), {}, "float16", "rows128x128_k64"),            # rect_5x7
    ((8, 32, 512, 512), (64, 32, 5, 9), dict(padding=(2, 4), dilation=(2, 3)), "bfloat16",
     "rows64x256_k32"),                                                                  # dilated_padded_5x9
    ((8, 32, 512, 300), (64, 32, 5, 9), {}, "float16", "tma64x256_k64"),                # rows of 292: 57% filled
    ((8, 96, 512, 512), (64, 96, 3, 3), {}, "float16", "tma64x256_k64"),                # 96 channels a tap
    ((32, 64, 56, 56), (64, 64, 3, 3), dict(padding=1), "float32", None),
    ((32, 64, 56, 56), (64, 32, 3, 3), dict(padding=1, groups=2), "float16", None),
    ((32, 24, 56, 56), (64, 24, 3, 3), dict(padding=1), "float16", None),              # 48-byte pixels
], ids=["64", "128_short", "256_14", "512_7_few", "512_long", "256_14_b128", "192f_k64", "96_k64", "square_5x9",
        "square_3x3_1024", "rect_5x7", "dilated_5x9", "rows_part_filled", "c96_rows", "fp32", "groups", "c24"])
def test_tma_tile_choice(x_shape, w_shape, kwargs, dtype_name, expected):
    """auto's TMA tile on a wgmma device (no GPU needed): at stride 1 with 16, 32 or 64 channels and output rows of
    256 pixels and more, 90% filled by whole segments, a row-band tile; else the widest that fills the SMs
    (``tma_tile``), k tiles as wide as the channels allow; none for float32, groups, or channels that are not whole
    16s; ``choose_tile`` takes it where the packed path runs."""
    from cuconv.algos import implicit_gemm

    spec = cuconv.ConvSpec.from_args(x_shape, w_shape, **kwargs)
    dtype = _dtypes.by_name(dtype_name)
    tile = choice.tma_tile(spec, dtype)
    tiles = {**implicit_gemm.TMA_TILES, **implicit_gemm.TMA_ROWS_TILES}
    assert tile is (None if expected is None else tiles[expected])
    if tile is not None:
        assert choice.choose_tile(spec, dtype, wgmma=True, nchw=False) is tile
        assert choice.choose_tile(spec, dtype, wgmma=False) is not tile


def test_phased_dgrad_takes_a_tma_tile_every_phase_serves():
    """A strided dgrad's phases share the TMA tile of the phase of most taps; where a phase's geometry refuses it
    (its im2col corners out of range) they share a cp.async tile (no GPU needed)."""
    from cuconv.algos import implicit_gemm

    spec = cuconv.ConvSpec.from_args((32, 96, 56, 56), (192, 96, 3, 3), stride=2, padding=1)
    assert choice.phase_tile(spec, _BF16, True) is implicit_gemm.TMA_TILES["tma128x128"]
    wide = cuconv.ConvSpec.from_args((2, 64, 20, 20), (64, 64, 3, 3), stride=2, padding=260)
    assert not choice.phase_tile(wide, _BF16, True).tma


def test_tma_wgrad_refuses_unaligned_operands():
    """The TMA wgrad maps x and dy (16-byte aligned addresses) and stores dW in vectors: asked for on operands off
    256-byte boundaries, its plan says so before any kernel runs (``auto`` takes the packed wgrad there; no GPU
    needed)."""
    from cuconv import _plan
    from cuconv.algos import implicit_gemm

    spec = cuconv.ConvSpec.from_args((2, 64, 9, 9), (64, 64, 3, 3), padding=1)
    env = _plan.Env(device=0, workspace_limit=1 << 30, smem_limit=227 << 10, wgmma=True, sm_count=132,
                    smem_per_sm=228 << 10, aligned=False)
    with pytest.raises(ValueError, match="boundaries"):
        implicit_gemm.prepare("wgrad", spec, _dtypes.by_name("float16"), "ieee", env, layout="nhwc",
                              tile=implicit_gemm.WGRAD_TMA_TILES["wt64x64"])


def test_tma_tiles_refuse_wgrad():
    """The TMA tiles run forward GEMMs only: a wgrad plan asked for one says so (no GPU needed)."""
    from cuconv import _plan
    from cuconv.algos import implicit_gemm

    spec = cuconv.ConvSpec.from_args((2, 64, 9, 9), (64, 64, 3, 3), padding=1)
    env = _plan.Env(device=0, workspace_limit=1 << 30, smem_limit=227 << 10, wgmma=True, sm_count=132,
                    smem_per_sm=228 << 10)
    with pytest.raises(ValueError, match="not wgrad's"):
        implicit_gemm.prepare("wgrad", spec, _dtypes.by_name("float16"), "ieee", env,
                              tile=implicit_gemm.TMA_TILES["tma64x128"])
