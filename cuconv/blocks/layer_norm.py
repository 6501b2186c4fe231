"""Python twin of ``kernels_cu/blocks/layer_norm.cu``: LayerNorm over the last axis without its affine transform,
rounded to a half type (``cuconv.nn.fuse_linear``: the norm between ConvNeXt's depthwise convolution and the Linear
that takes its weight and bias), and the same on NumPy arrays for its tests."""

from __future__ import annotations

import numpy

from .. import _dtypes, _loader

__all__ = ["supports", "launch", "apply_numpy", "MAX_CHANNELS", "NAME_EXPRESSIONS", "STEM"]

STEM = "blocks/layer_norm"
_LANES_VALUES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # a lane's share of a row: instances for rows up to 32·VPL
MAX_CHANNELS = 32 * _LANES_VALUES[-1]
_TYPES = (("float", "__half"), ("float", "__nv_bfloat16"), ("__half", "__half"),
          ("__nv_bfloat16", "__nv_bfloat16"))
NAME_EXPRESSIONS = tuple(f"layer_norm_rows<{ti},{to},{v}>" for ti, to in _TYPES for v in _LANES_VALUES)
_ROWS_A_BLOCK = 8  # (256 threads, a warp a row)
_MAX_BLOCKS = 2**31 - 1


def supports(in_dtype, out_dtype, c: int) -> bool:
    """Whether an instance normalizes rows of ``c`` elements of ``in_dtype`` into ``out_dtype``."""
    try:
        names = (_dtypes.ctype_of(in_dtype), _dtypes.ctype_of(out_dtype))
    except KeyError:
        return False
    return names in _TYPES and 0 < c <= MAX_CHANNELS


def launch(in_dtype, out_dtype, rows: int, c: int, eps: float) -> "_loader.PreparedLaunch":
    """A launch normalizing ``rows`` rows of ``c`` elements (``supports``); pointers: x, y (both row-major)."""
    if not supports(in_dtype, out_dtype, c):
        raise ValueError(f"cuconv: no layer_norm_rows instance for {numpy.dtype(in_dtype)} -> "
                         f"{numpy.dtype(out_dtype)} rows of {c}")
    blocks = -(-rows // _ROWS_A_BLOCK)
    if blocks > _MAX_BLOCKS:
        raise NotImplementedError(f"cuconv: layer_norm_rows runs a warp a row, at most {_MAX_BLOCKS * 8} rows")
    vpl = next(v for v in _LANES_VALUES if 32 * v >= c)
    name = f"layer_norm_rows<{_dtypes.ctype_of(in_dtype)},{_dtypes.ctype_of(out_dtype)},{vpl}>"
    return _loader.prepare(STEM, NAME_EXPRESSIONS, name, (max(1, blocks), 1, 1), (32 * _ROWS_A_BLOCK, 1, 1), 2,
                           (numpy.int64(rows), numpy.int32(c), numpy.float32(eps)))


def apply_numpy(x: numpy.ndarray, eps: float, out_dtype) -> numpy.ndarray:
    """The kernel's result on the CPU: the last axis normalized in float32, rounded once to ``out_dtype``."""
    v = x.astype(numpy.float32)
    mean = v.mean(axis=-1, keepdims=True, dtype=numpy.float32)
    d = v - mean
    var = (d * d).mean(axis=-1, keepdims=True, dtype=numpy.float32)
    return (d / numpy.sqrt(var + numpy.float32(eps))).astype(out_dtype)
