"""depthwise's column-strip plan (``strips_plan``): which cases take ``depthwise_fwd_strips`` and how a plane
is cut. No GPU needed: the kernels run in test_conv_gpu.py and test_backward_gpu.py (case table, TILING_CASES)."""

import pytest

from cuconv import depthwise
from cuconv.problems import PROBLEMS
from cuconv.spec import ConvSpec

_THREADS = 256


@pytest.mark.parametrize("p,q", [(1, 1), (3, 5), (56, 56), (57, 300), (112, 112), (1022, 1022), (17, 1)])
@pytest.mark.parametrize("k", [3, 5, 7])
def test_strips_cover_every_output_once(p, q, k):
    spec = ConvSpec(2, 4, p + k - 1, q + k - 1, 4, k, k, groups=4)
    rows, strips, blocks = depthwise.strips_plan(spec)
    assert 4 <= rows <= 16
    assert (strips - 1) * rows < spec.p <= strips * rows
    assert (blocks - 1) * _THREADS < strips * spec.q <= blocks * _THREADS


def test_strips_only_for_unit_stride_and_dilation_and_compiled_kernels():
    shapes = ((1, 4, 20, 20), (4, 1, 3, 3))
    assert depthwise.strips_plan(ConvSpec.from_args(*shapes, groups=4, padding=1)) is not None
    for kwargs in (dict(stride=2), dict(dilation=2), dict(stride=(1, 2))):
        assert depthwise.strips_plan(ConvSpec.from_args(*shapes, groups=4, **kwargs)) is None
    assert depthwise.strips_plan(ConvSpec.from_args((1, 4, 20, 20), (4, 1, 3, 1), groups=4)) is None


def test_depthwise_problem_fills_its_blocks():
    spec = next(p for p in PROBLEMS if p.name == "depthwise_3x3").spec()
    rows, strips, blocks = depthwise.strips_plan(spec)
    assert (rows, strips, blocks) == (14, 4, 1)  # 4 strips x 56 columns = 224 of 256 threads busy
