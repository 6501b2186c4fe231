"""The benchmark problems of docs/problems.md (shapes that define "fast" for cuconv), as data."""

from __future__ import annotations

import dataclasses
from typing import Tuple

from .spec import ConvSpec

__all__ = ["Problem", "PROBLEMS", "SUITES"]


@dataclasses.dataclass(frozen=True)
class Problem:
    name: str
    n: int
    c: int
    k: int
    h: int
    w: int
    kernel: Tuple[int, int]
    stride: Tuple[int, int] = (1, 1)
    padding: Tuple[int, int] = (0, 0)
    dilation: Tuple[int, int] = (1, 1)
    groups: int = 1

    @property
    def input_shape(self):
        return (self.n, self.c, self.h, self.w)

    @property
    def weight_shape(self):
        return (self.k, self.c // self.groups) + tuple(self.kernel)

    @property
    def conv_kwargs(self):
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups)

    def spec(self) -> ConvSpec:
        return ConvSpec.from_args(self.input_shape, self.weight_shape, **self.conv_kwargs)

    def scaled(self, n=None, hw=None) -> "Problem":
        """The same layer with a smaller batch and/or spatial size (reduced versions for CPU tests)."""
        return dataclasses.replace(self, n=n or self.n, h=hw or self.h, w=hw or self.w)


PROBLEMS = (
    Problem("square_5x9", 8, 32, 64, 512, 512, (5, 9)),
    Problem("square_3x3_1024", 16, 16, 128, 1024, 1024, (3, 3)),
    Problem("rect_5x7", 8, 64, 128, 512, 256, (5, 7)),
    Problem("dilated_padded_5x9", 8, 32, 64, 512, 512, (5, 9), padding=(2, 4), dilation=(2, 3)),
    Problem("resnet_3x3_64", 32, 64, 64, 56, 56, (3, 3), padding=(1, 1)),
    Problem("resnet_1x1_256", 32, 256, 64, 56, 56, (1, 1)),
    Problem("stem_7x7_s2", 32, 3, 64, 224, 224, (7, 7), stride=(2, 2), padding=(3, 3)),
    Problem("depthwise_3x3", 32, 256, 256, 56, 56, (3, 3), padding=(1, 1), groups=256),
)

SUITES = {
    "large": ("square_5x9", "square_3x3_1024", "rect_5x7", "dilated_padded_5x9"),
    "small": ("resnet_3x3_64", "resnet_1x1_256", "stem_7x7_s2", "depthwise_3x3"),
}
SUITES["all"] = SUITES["large"] + SUITES["small"]
