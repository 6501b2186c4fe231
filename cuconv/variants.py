"""``conv_transpose2d`` and ``conv1d`` on arrays, on cuconv's 2-D passes, with torch's semantics and refusals.

A transposed convolution is the dgrad of the convolution it transposes: ``conv_transpose2d(x, w)`` is
``conv2d_input(output_size, w, x)`` with ``w`` of shape ``(C_in, C_out / groups, R, S)`` read as that
convolution's ``(K, C / groups, R, S)``, plus the bias after it; ``output_padding`` (below the stride or the
dilation) only lengthens the output by rows and columns the kernel windows do not reach. A 1-D convolution is a
2-D one over a plane of height one. A 3-D convolution is one 2-D convolution over its depth's columns: the T
input planes each output plane reads (``depth_columns``: a copy of the input T times over, the batch and output
depth folded together), their channels side by side, against the weight with its T taps folded into its channels
(``(K, C/groups, T, R, S)`` as ``(K, T·C/groups, R, S)``, group by group). The torch door (``cuconv.nn.functional``) checks its tensors with the same
functions, so both doors refuse alike, in torch's words.
"""

from __future__ import annotations

from typing import Optional

import numpy

from ._errors import ConvValueError
from ._types import Array, IntOrPair
from .spec import _is_int, check_geometry, pair, same_copy_sizes

__all__ = ["conv_transpose2d", "conv1d", "conv3d", "transposed_output_shape", "transposed_plan", "conv1d_args",
           "conv3d_args", "depth_columns"]


def _is_numpy(a) -> bool:
    return isinstance(a, numpy.ndarray)


def _int_pair(value, name: str, op: str) -> tuple:
    if isinstance(value, str):
        raise TypeError(f"{op}(): argument '{name}' must be tuple of ints, not str")
    return pair(value, name)


def _check_ranks(op: str, x_shape: tuple, w_shape: tuple, dims: int) -> None:
    """torch's refusal, in its words, of an input that is neither ``dims + 1`` (unbatched) nor ``dims + 2`` dimensional
    and of a weight that is not ``dims + 2`` dimensional, for the ``dims``-D convolution ``op``."""
    if len(x_shape) not in (dims + 1, dims + 2):
        raise ConvValueError(f"Expected {dims + 1}D (unbatched) or {dims + 2}D (batched) input to {op}, but got input "
                             f"of size: {list(x_shape)}")
    if len(w_shape) != dims + 2:
        raise ConvValueError("weight should have at least three dimensions" if len(w_shape) < 3 else
                             f"Expected {len(w_shape)}-dimensional input for {len(w_shape)}-dimensional weight "
                             f"{list(w_shape)}, but got {len(x_shape)}-dimensional input of size {list(x_shape)} "
                             f"instead")


def transposed_output_shape(x_shape: tuple, w_shape: tuple, b_shape: Optional[tuple], stride, padding,
                            output_padding, groups, dilation) -> tuple:
    """The output shape of ``conv_transpose2d`` (4-D, the batch 1 for an unbatched input) and its arguments as
    pairs ``(stride, padding, output_padding, dilation)``, after torch's checks in its words."""
    op = "conv_transpose2d"
    _check_ranks(op, x_shape, w_shape, 2)
    stride, padding = _int_pair(stride, "stride", op), _int_pair(padding, "padding", op)
    output_padding, dilation = _int_pair(output_padding, "output_padding", op), _int_pair(dilation, "dilation", op)
    if not _is_int(groups):
        raise TypeError(f"{op}(): argument 'groups' must be int, not {type(groups).__name__}")
    groups = int(groups)
    # (torch's order: check_geometry's, then the transposed convolution's own checks)
    check_geometry(w_shape, stride, padding, dilation, groups, output_padding)
    x4 = (1, *x_shape) if len(x_shape) == 3 else tuple(x_shape)
    n, c, h, w = x4
    c_in, c_out_g, r, s = w_shape
    if c != c_in:
        raise ConvValueError(f"Given transposed=1, weight of size {list(w_shape)}, expected input{list(x_shape)} to "
                             f"have {c_in} channels, but got {c} channels instead")
    c_out = c_out_g * groups
    if b_shape is not None and tuple(b_shape) != (c_out,):
        raise ConvValueError(f"Given transposed=1, weight of size {list(w_shape)}, expected bias to be 1-dimensional "
                             f"with {c_out} elements, but got bias of size {list(b_shape)} instead")
    if min(dilation) == 0:
        raise ConvValueError(f"dilation should be greater than zero, but got dilation_height: {dilation[0]}, "
                             f"dilation_width: {dilation[1]}")
    if not all(op_ < st or op_ < d for op_, st, d in zip(output_padding, stride, dilation)):
        raise ConvValueError(
            f"output padding must be smaller than either stride or dilation, but got output_padding_height: "
            f"{output_padding[0]} output_padding_width: {output_padding[1]} stride_height: {stride[0]} stride_width: "
            f"{stride[1]} dilation_height: {dilation[0]} dilation_width: {dilation[1]}")
    size = [(length - 1) * st - 2 * p + d * (k - 1) + op_ + 1
            for length, st, p, d, k, op_ in zip((h, w), stride, padding, dilation, (r, s), output_padding)]
    if any(v <= 0 for v in size):
        raise ConvValueError(f"Given input size per channel: ({h} x {w}). Calculated output size per channel: "
                             f"({size[0]} x {size[1]}). Output size is too small")
    return (n, c_out, size[0], size[1]), (stride, padding, output_padding, dilation)


def transposed_plan(x_hw: tuple, out_hw: tuple, w_hw: tuple, stride, padding, output_padding, dilation) -> tuple:
    """How a transposed convolution runs as the dgrad of a convolution, per axis: ``(sizes, pads, fill)``, the
    dgrad's input size (the output computed), its four-sided padding (top, bottom, left, right) and the rows and
    columns of zeros after it. The dgrad's convolution must map ``sizes`` back onto ``x_hw`` exactly: with the
    padding ``p`` before and ``max(0, p - output_padding)`` after, it does where ``output_padding < p + stride``;
    beyond that (an output padding as large as the dilation allows) the last output positions no kernel window
    reaches are zeros, and the dgrad computes up to the last one a window reaches."""
    sizes, pads, fill = [], [], []
    for length, out, k, st, p, op, d in zip(x_hw, out_hw, w_hw, stride, padding, output_padding, dilation):
        if op < p + st:
            sizes.append(out)
            pads += [p, max(0, p - op)]
            fill.append(0)
        else:
            reached = (length - 1) * st + d * (k - 1) + 1 - p  # (rows up to the last a window reaches)
            sizes.append(reached)
            pads += [p, 0]
            fill.append(out - reached)
    return tuple(sizes), tuple(pads), tuple(fill)


def conv1d_args(x_shape: tuple, w_shape: tuple, stride, padding, dilation, groups) -> tuple:
    """``conv1d``'s arguments as ``conv2d``'s over a plane of height one, ``(stride, padding, dilation)``, after
    the checks whose words name 1-D sizes (the rest are ``conv2d``'s)."""
    _check_ranks("conv1d", x_shape, w_shape, 1)

    def single(value, name):
        if isinstance(value, (tuple, list)):
            if len(value) != 1:
                raise ConvValueError(f"expected {name} to be a single integer value or a list of 1 values to match "
                                     f"the convolution dimensions, but got {name}={list(value)}")
            value = value[0]
        return value

    stride, dilation = single(stride, "stride"), single(dilation, "dilation")
    padding = padding if isinstance(padding, str) else single(padding, "padding")
    for name, value in (("stride", stride), ("dilation", dilation), ("padding", padding)):
        if not isinstance(value, str) and not _is_int(value):
            raise TypeError(f"conv1d(): argument '{name}' must be tuple of ints, but found element of type "
                            f"{type(value).__name__} at pos 0")
    if _is_int(groups):  # (torch's refusals before the channels', in its order; other groups are conv2d's to refuse)
        check_geometry(w_shape, (int(stride),), padding if isinstance(padding, str) else (int(padding),),
                       (int(dilation),), int(groups))
    c = x_shape[-2]
    if _is_int(groups) and int(groups) > 0 and c != w_shape[1] * int(groups):
        shown = list(x_shape)
        if padding == "same":
            shown[-1:] = same_copy_sizes(shown[-1:], (int(dilation) * (w_shape[2] - 1) + 1,))
        raise ConvValueError(f"Given groups={int(groups)}, weight of size {list(w_shape)}, expected input"
                             f"{shown} to have {w_shape[1] * int(groups)} channels, but got {c} channels instead")
    pad = 0 if padding == "valid" else padding
    if (padding != "same" and int(dilation) > 0 and int(pad) >= 0
            and x_shape[-1] + 2 * int(pad) < int(dilation) * (w_shape[2] - 1) + 1):
        raise ConvValueError(f"Calculated padded input size per channel: ({x_shape[-1] + 2 * int(pad)}). Kernel "
                             f"size: ({int(dilation) * (w_shape[2] - 1) + 1}). Kernel size can't be greater than "
                             f"actual input size")
    return ((1, stride), padding if isinstance(padding, str) else (0, padding), (1, dilation))


def conv_transpose2d(x: Array, weight: Array, bias: Optional[Array] = None, stride: IntOrPair = 1,
                     padding: IntOrPair = 0, output_padding: IntOrPair = 0, groups: int = 1,
                     dilation: IntOrPair = 1, *, algo: str = "auto", precision: Optional[str] = None) -> Array:
    """2-D transposed convolution with the semantics of ``torch.nn.functional.conv_transpose2d``.

    Parameters
    ----------
    x : numpy.ndarray or cupy.ndarray
        ``(N, C_in, H, W)`` or unbatched ``(C_in, H, W)``.
    weight : array of the same library and dtype, ``(C_in, C_out / groups, R, S)``
    bias : array ``(C_out,)``, optional
    stride, padding, output_padding, dilation : int or (int, int)
        ``output_padding`` must be smaller than the stride or the dilation on each axis.
    groups : int
    algo, precision
        As :func:`cuconv.conv2d_input`'s (the pass that computes it).

    Returns
    -------
    array ``(N, C_out, (H - 1)·stride - 2·padding + dilation·(R - 1) + output_padding + 1, ...)``.
    """
    from .backward import dgrad_of
    from .spec import ConvSpec

    shape, (stride, padding, output_padding, dilation) = transposed_output_shape(
        tuple(x.shape), tuple(weight.shape), None if bias is None else tuple(bias.shape), stride, padding,
        output_padding, groups, dilation)
    unbatched = x.ndim == 3
    sizes, pads, fill = transposed_plan(tuple(x.shape[-2:]), shape[2:], tuple(weight.shape[2:]), stride, padding,
                                        output_padding, dilation)
    k, _, r, s = weight.shape
    y = dgrad_of((*shape[:2], *sizes)[1 if unbatched else 0:], weight, x,
                 lambda size: ConvSpec(*size, k, r, s, stride, pads, dilation, int(groups)), algo, precision,
                 grad_output_name="Input")
    if any(fill):  # (output positions no kernel window reaches: an output padding up to the dilation)
        xp = numpy if _is_numpy(x) else __import__("cupy")
        out = xp.zeros(shape[1:] if unbatched else shape, dtype=y.dtype)
        out[..., :sizes[0], :sizes[1]] = y
        y = out
    if bias is not None:  # (a pass after the dgrad: its plans take no bias)
        y += bias.reshape((-1, 1, 1))
    return y


def conv1d(x: Array, weight: Array, bias: Optional[Array] = None, stride=1, padding=0, dilation=1, groups: int = 1,
           *, algo: str = "auto", precision: Optional[str] = None) -> Array:
    """1-D convolution with the semantics of ``torch.nn.functional.conv1d``: ``x`` ``(N, C, L)`` or ``(C, L)``,
    ``weight`` ``(K, C / groups, S)``, ``padding`` an int, ``"same"`` or ``"valid"``; computed as
    :func:`cuconv.conv2d` over a plane of height one (its ``algo``, ``precision``)."""
    from .conv import conv2d

    stride2, padding2, dilation2 = conv1d_args(tuple(x.shape), tuple(weight.shape), stride, padding, dilation, groups)
    y = conv2d(x[..., None, :], weight[:, :, None, :], bias, stride2, padding2, dilation2, groups, algo=algo,
               precision=precision)
    return y[..., 0, :]


def _triple(value, name: str) -> tuple:
    if isinstance(value, (tuple, list)):
        if len(value) == 1:
            value = tuple(value) * 3
        if len(value) != 3:
            raise ConvValueError(f"expected {name} to be a single integer value or a list of 3 values to match the "
                                 f"convolution dimensions, but got {name}={list(value)}")
        return tuple(value)
    return (value,) * 3


def conv3d_args(x_shape: tuple, w_shape: tuple, stride, padding, dilation, groups) -> dict:
    """``conv3d``'s geometry after torch's checks in its words: ``stride``, ``dilation`` (triples), ``pad_d`` (the
    depth's padding before and after), ``padding_hw`` (the plane's, as conv2d takes it: a pair or a string),
    ``depth`` (the output's), ``groups``."""
    _check_ranks("conv3d", x_shape, w_shape, 3)
    stride, dilation = _triple(stride, "stride"), _triple(dilation, "dilation")
    for name, values in (("stride", stride), ("dilation", dilation)):
        if not all(_is_int(v) for v in values):
            raise TypeError(f"conv3d(): argument '{name}' must be tuple of ints, but found element of type "
                            f"{type(next(v for v in values if not _is_int(v))).__name__}")
    stride, dilation = tuple(int(v) for v in stride), tuple(int(v) for v in dilation)
    if not _is_int(groups):
        raise TypeError(f"conv3d(): argument 'groups' must be int, not {type(groups).__name__}")
    groups = int(groups)
    if isinstance(padding, str):
        triple = padding
    else:
        triple = _triple(padding, "padding")
        if not all(_is_int(v) for v in triple):
            raise TypeError("conv3d(): argument 'padding' must be tuple of ints")
        triple = tuple(int(v) for v in triple)
    check_geometry(w_shape, stride, triple, dilation, groups)  # (torch's refusals before the channels', its order)
    x5 = (1, *x_shape) if len(x_shape) == 4 else tuple(x_shape)
    _, c, d, h, w = x5
    k, c_g, t, r, s = w_shape
    extents = [dl * (kk - 1) + 1 for dl, kk in zip(dilation, (t, r, s))]
    if isinstance(padding, str):
        total = extents[0] - 1 if padding == "same" else 0
        pads = [(total // 2, total - total // 2)] + [(0, 0)] * 2
        padding_hw = padding
    else:
        pads = [(v, v) for v in triple]
        padding_hw = (triple[1], triple[2])
    if c != c_g * groups:
        shown = list(x_shape)
        if padding == "same":
            shown[-3:] = same_copy_sizes(shown[-3:], extents)
        raise ConvValueError(f"Given groups={groups}, weight of size {list(w_shape)}, expected input{shown} to "
                             f"have {c_g * groups} channels, but got {c} channels instead")
    if padding == "same":
        pads = [pads[0]] + [((e - 1) // 2, e - 1 - (e - 1) // 2) for e in extents[1:]]
    padded = [size + lo + hi for size, (lo, hi) in zip((d, h, w), pads)]
    if any(p < e for p, e in zip(padded, extents)):
        raise ConvValueError(f"Calculated padded input size per channel: ({padded[0]} x {padded[1]} x {padded[2]}). "
                             f"Kernel size: ({extents[0]} x {extents[1]} x {extents[2]}). Kernel size can't be greater "
                             f"than actual input size")
    if min(dilation) == 0:
        raise ConvValueError(f"dilation should be greater than zero, but got {list(dilation)}")
    depth = (padded[0] - extents[0]) // stride[0] + 1
    return dict(stride=stride, dilation=dilation, pad_d=pads[0], padding_hw=padding_hw, depth=depth, groups=groups)


def depth_columns(xp, x, geometry: dict, taps: int, channels_per_group: int):
    """The columns of a 3-D convolution's depth for its one 2-D convolution: from ``x`` ``(N, C, D, H, W)`` of the
    array or tensor module ``xp`` (numpy, cupy or torch, whose ``pad``/``stack`` it takes), the array
    ``(N·D_out, groups·T·C/groups, H, W)`` whose sample ``n·D_out + d`` holds, group by group, the T input planes
    output plane ``d`` reads (zeros in the depth's padding)."""
    n, c, d, h, w = x.shape
    lo, hi = geometry["pad_d"]
    if lo or hi:
        if xp.__name__ == "torch":
            x = xp.nn.functional.pad(x, (0, 0, 0, 0, lo, hi))
        else:
            x = xp.pad(x, ((0, 0), (0, 0), (lo, hi), (0, 0), (0, 0)))
    depth, st, dl = geometry["depth"], geometry["stride"][0], geometry["dilation"][0]
    g = geometry["groups"]
    # each tap's planes as a view (N, D_out, g, C/g, H, W), stacked after the group: (N, D_out, g, T, C/g, H, W) in
    # one copy, the channels of one group together with its taps outermost, and the batch and depth one axis
    order = (0, 3, 1, 2, 4, 5)
    planes = []
    for t in range(taps):
        plane = x[:, :, t * dl: t * dl + st * (depth - 1) + 1: st].reshape(n, g, channels_per_group, depth, h, w)
        planes.append(plane.permute(*order) if xp.__name__ == "torch" else plane.transpose(order))
    return xp.stack(planes, 3).reshape(n * depth, g * taps * channels_per_group, h, w)


def folded_weight(w):
    """A 3-D weight ``(K, C/groups, T, R, S)`` as the 2-D one of ``depth_columns``' convolution, ``(K, T·C/groups,
    R, S)`` (NumPy and CuPy arrays: ``transpose``; tensors: ``permute``)."""
    k, c_g, t, r, s = w.shape
    moved = w.permute(0, 2, 1, 3, 4) if hasattr(w, "permute") else w.transpose(0, 2, 1, 3, 4)
    return moved.reshape(k, t * c_g, r, s)


def conv3d(x: Array, weight: Array, bias: Optional[Array] = None, stride=1, padding=0, dilation=1, groups: int = 1,
           *, algo: str = "auto", precision: Optional[str] = None) -> Array:
    """3-D convolution with the semantics of ``torch.nn.functional.conv3d``: ``x`` ``(N, C, D, H, W)`` or
    ``(C, D, H, W)``, ``weight`` ``(K, C / groups, T, R, S)``, ``padding`` an int, a triple, ``"same"`` or
    ``"valid"``; computed as one :func:`cuconv.conv2d` over the depth's columns (``depth_columns``; its ``algo``,
    ``precision``): a copy of the input T times over."""
    from . import _backend
    from .conv import conv2d

    geometry = conv3d_args(tuple(x.shape), tuple(weight.shape), stride, padding, dilation, groups)
    xp = numpy if _backend.is_numpy_array(x) else _backend.cupy_or_none()
    unbatched = x.ndim == 4
    x5 = x[None] if unbatched else x
    n, k, taps = x5.shape[0], weight.shape[0], weight.shape[2]
    cols = xp.ascontiguousarray(depth_columns(xp, x5, geometry, taps, weight.shape[1]))
    w2 = xp.ascontiguousarray(folded_weight(weight))
    y = conv2d(cols, w2, bias, geometry["stride"][1:], geometry["padding_hw"], geometry["dilation"][1:],
               geometry["groups"], algo=algo, precision=precision)  # (N·D_out, K, P, Q)
    y = y.reshape(n, geometry["depth"], k, *y.shape[2:]).transpose(0, 2, 1, 3, 4)
    y = xp.ascontiguousarray(y)
    return y[0] if unbatched else y
