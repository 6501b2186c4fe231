"""The exceptions of misuse that torch's convolution raises as RuntimeError.

cuconv's array API has always raised ValueError (bad values, shapes and geometry) and TypeError (mismatched
dtypes) for them; code written against ``torch.nn.functional.conv2d`` catches RuntimeError. These classes are
both, so each contract holds: ``except ValueError`` and ``except RuntimeError`` both catch a ``ConvValueError``.
"""

from __future__ import annotations

__all__ = ["ConvValueError", "ConvTypeError"]


class ConvValueError(ValueError, RuntimeError):
    """A value, shape or geometry torch's convolution refuses (torch: RuntimeError)."""


class ConvTypeError(TypeError, RuntimeError):
    """Operands of different dtypes (torch: RuntimeError, "Input type (...) and weight type (...) should be the
    same")."""
