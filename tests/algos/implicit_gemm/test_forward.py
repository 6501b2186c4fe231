"""implicit_gemm's forward plans (``cuconv.algos.implicit_gemm.forward``) on a fake device: which launches a
channels-last forward makes (nothing runs; the kernels' results are checked in the GPU tests)."""

from __future__ import annotations

import pytest

from cuconv import _dtypes, algos
from cuconv.problem import BIAS, Epilogue, Problem
from cuconv.spec import ConvSpec
from fake_device import ENVS, fake_device

pytestmark = pytest.mark.skipif(_dtypes.bfloat16 is None, reason="no bfloat16 type (ml_dtypes) here")


def _packs(monkeypatch, spec: ConvSpec, weights: str, epilogue=BIAS) -> list:
    recorder = fake_device(monkeypatch)
    problem = Problem.of(spec, _dtypes.bfloat16, "ieee", "fprop", "nhwc", weights, epilogue)
    algorithm = algos.get("implicit_gemm")
    assert algorithm.can_implement(problem, ENVS["sm90"]) is None
    algorithm.plan(problem, ENVS["sm90"])
    return [name for _, name, *_ in recorder.launches if name.startswith("pack")]


@pytest.mark.parametrize("weights", ["kcrs", "krsc"])
@pytest.mark.parametrize("stride", [1, 2])
def test_a_1x1_weight_is_its_own_pack_in_either_layout(monkeypatch, weights, stride):
    """A 1x1 weight's KCRS and KRSC orders are one and the same memory: a channels-last forward reads it in place,
    with no packing launch a call, whichever layout the layer was told (a fused layer's folded 1x1 weight is
    contiguous, so it is told KCRS)."""
    spec = ConvSpec.from_args((64, 256, 28, 28), (128, 256, 1, 1), stride, 0, 1, 1)
    assert _packs(monkeypatch, spec, weights) == []
    assert _packs(monkeypatch, spec, weights, Epilogue(True, "relu", residual="before")) == []


@pytest.mark.parametrize("weights", ["kcrs", "krsc"])
def test_a_grouped_1x1_weight_is_its_own_block_diagonal_pack_in_either_layout(monkeypatch, weights):
    """Groups of the block-diagonal tile's width (64 channels) on a 1x1 weight: its rows are the block-diagonal
    weight's, read in place whichever layout the layer was told: one launch, no workspace."""
    fake_device(monkeypatch)
    spec = ConvSpec.from_args((3, 128, 5, 6), (128, 64, 1, 1), 1, 0, 1, 2)
    problem = Problem.of(spec, _dtypes.bfloat16, "ieee", "fprop", "nhwc", weights, BIAS)
    plan = algos.get("implicit_gemm").plan(problem, ENVS["sm90"])
    assert len(plan.steps) == 1 and plan.workspace == 0


def test_a_3x3_kcrs_weight_is_packed_and_a_krsc_one_read_in_place(monkeypatch):
    spec = ConvSpec.from_args((64, 128, 28, 28), (128, 128, 3, 3), 1, 1, 1, 1)
    assert len(_packs(monkeypatch, spec, "kcrs")) == 1
    assert _packs(monkeypatch, spec, "krsc") == []
