"""The types of the public API's arguments, for annotations (``py.typed``: users' type checkers read them)."""

from __future__ import annotations

from typing import Any, Sequence, Union

__all__ = ["Array", "Shape", "IntOrPair", "Padding"]

Array = Any                                  # a NumPy or CuPy array (or a torch tensor at cuconv.nn's door)
Shape = Sequence[int]
IntOrPair = Union[int, Sequence[int]]        # stride, dilation: one int for both axes, or (height, width)
Padding = Union[int, Sequence[int], str]     # an int, (h, w), (top, bottom, left, right), "same" or "valid"
