"""Memory formats as torch has them: which 4-D tensors and arrays are "channels-last" (NHWC in memory, NCHW in
shape), so that a convolution's result comes back in the format torch's would (``suggest_memory_format``).

torch decides from the strides alone (``is_channels_last_strides_2d_s4`` in c10): walking the dimensions C, W, H,
N, each stride must be at least the extent of the ones inside it, with NCHW winning the ambiguous cases (a zero
channel stride; a size-1 batch whose stride ties the channel's). A convolution's result is channels-last where its
input or its weight is (``cudnn_conv_suggest_memory_format``, and the CPU backends alike).
"""

from __future__ import annotations

__all__ = ["strides_like_channels_last", "is_channels_last", "result_channels_last", "dense_nhwc", "nhwc_strides",
           "element_strides", "VECTOR_ALIGNMENT"]

# The passes that read and write channels-last activations in place move 16-byte vectors of channels (cp.async,
# 16-byte loads and stores): their activations must lie on 16-byte boundaries. A dense channels-last operand
# elsewhere (a view with a hand-made storage offset) is copied first.
VECTOR_ALIGNMENT = 16


def strides_like_channels_last(shape, strides) -> bool:
    """torch's test of 4-D ``shape`` and ``strides`` (in elements) for channels-last order."""
    if len(shape) != 4 or len(strides) != 4 or strides[1] == 0:
        return False  # (a zero channel stride: NCHW, torch's default for the trivial case)
    low = 0
    for d in (1, 3, 2, 0):
        if shape[d] == 0 or strides[d] < low:
            return False
        if d == 0 and low == strides[1]:
            return False  # N111 and sliced N11W tensors: NCHW, as torch falls back
        low = strides[d] * shape[d] if shape[d] > 1 else strides[d]
    return True


def is_channels_last(a) -> bool:
    """Whether torch would call ``a`` (a torch tensor, or a NumPy or CuPy array) channels-last: 4-D with
    channels-last strides."""
    shape = tuple(a.shape)
    if len(shape) != 4:
        return False
    strides = element_strides(a)
    return strides is not None and strides_like_channels_last(shape, strides)


def result_channels_last(x, weight, on_gpu: bool = False) -> bool:
    """Whether a convolution of ``x`` by ``weight`` returns a channels-last result: torch's rule, either is,
    except for float64 on a GPU (``cudnn_conv_suggest_memory_format``: doubles stay NCHW there)."""
    if on_gpu and x.dtype.itemsize == 8:  # (float64: the only 8-byte dtype a convolution takes)
        return False
    return is_channels_last(x) or is_channels_last(weight)


def nhwc_strides(shape) -> tuple:
    """The element strides of a dense channels-last tensor of 4-D ``shape`` (N, C, H, W)."""
    _, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def dense_nhwc(shape, strides) -> bool:
    """Whether 4-D ``shape`` with element ``strides`` lies in memory as a dense (N, H, W, C) array (torch's
    ``is_contiguous(memory_format=torch.channels_last)``: the stride of a dimension of extent 1 is free)."""
    return len(shape) == 4 and all(n == 1 or s == e for n, s, e in zip(shape, strides, nhwc_strides(shape)))


def only_channels_last(a) -> bool:
    """Whether 4-D ``a`` (a torch tensor, or a NumPy or CuPy array) lies as a dense channels-last tensor and not
    also as a contiguous one (1x1 and depthwise weights can be both): a weight the channels-last plans that take
    one read where it lies."""
    if hasattr(a, "is_contiguous"):  # (a torch tensor, torch imported: its own tests, in C)
        import torch

        return a.dim() == 4 and a.is_contiguous(memory_format=torch.channels_last) and not a.is_contiguous()
    strides = element_strides(a)
    return a.ndim == 4 and not a.flags.c_contiguous and strides is not None and dense_nhwc(a.shape, strides)


def element_strides(a) -> tuple:
    """A torch tensor's or NumPy/CuPy array's strides in elements (None where a byte stride is not a whole
    number of elements)."""
    stride = getattr(a, "stride", None)
    if callable(stride):
        return tuple(stride())
    itemsize = a.dtype.itemsize
    if any(s % itemsize for s in a.strides):
        return None
    return tuple(s // itemsize for s in a.strides)
