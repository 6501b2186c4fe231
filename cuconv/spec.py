"""The one description of a convolution's geometry that every path takes.

``ConvSpec`` is built once per call from the user's arguments (``ConvSpec.from_args``), validated there
in PyTorch's wording, and then handed to the algorithm, the launchers and the chunk planner. It is frozen
and hashable, so it is also the cache key for compiled kernels and algorithm choices.

Layouts: input NCHW ``(N, C, H, W)``, weight KCRS ``(K, C/groups, R, S)``, output NKPQ ``(N, K, P, Q)``.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from typing import Sequence, Tuple

from ._types import IntOrPair, Padding

from ._errors import ConvValueError

__all__ = ["ConvSpec", "check_geometry", "output_size", "pair", "same_copy_sizes"]


def output_size(in_size: int, kernel: int, stride: int, pad_lo: int, pad_hi: int, dilation: int) -> int:
    """Output length along one axis: the only place this formula exists.

    The dilated kernel covers ``dilation * (kernel - 1) + 1`` input positions (not ``dilation * kernel``).
    """
    extent = dilation * (kernel - 1) + 1
    return (in_size + pad_lo + pad_hi - extent) // stride + 1


def _plain(v) -> bool:
    """An argument whose value alone (not its type, which these exclude) determines the spec: an int, a str
    or a tuple of ints. Booleans, floats, lists and NumPy scalars take the validating path every time."""
    t = type(v)
    if t is int or t is str:
        return True
    if t is not tuple:
        return False
    for e in v:
        if type(e) is not int:
            return False
    return True


_SPECS: dict = {}  # ConvSpec.from_args memo, keyed by plain arguments
_SPECS_MAX = 4096


def _is_int(v) -> bool:
    """An int as torch's argument parser reads one: an integral number but a bool, or a 0-d integer (or bool)
    tensor."""
    if isinstance(v, numbers.Integral):
        return not isinstance(v, bool)
    # (duck-typed: the array API imports no torch)
    return (getattr(v, "ndim", None) == 0 and type(v).__module__.partition(".")[0] == "torch"
            and str(v.dtype) in ("torch.int8", "torch.uint8", "torch.int16", "torch.int32", "torch.int64",
                                 "torch.bool"))


_INT64 = 2**63


def _int64(v) -> int:
    """An argument as torch reads it: a 64-bit int (torch's argument parser refuses wider ones in these words)."""
    v = int(v)
    if not -_INT64 <= v < _INT64:
        raise ValueError("Overflow when unpacking long long")
    return v


def pair(value, name: str) -> Tuple[int, int]:
    """Normalise an int or a length-2 sequence of ints to ``(h, w)``, as torch's ``_pair`` does."""
    if _is_int(value):
        return (_int64(value), _int64(value))
    if isinstance(value, (tuple, list)) and all(_is_int(v) for v in value):
        if len(value) == 1:
            return (_int64(value[0]), _int64(value[0]))
        if len(value) == 2:
            return (_int64(value[0]), _int64(value[1]))
        raise ConvValueError(f"expected {name} to be a single integer value or a list of 2 values to match the "
                             f"convolution dimensions, but got {name}={list(value)}")
    raise TypeError(f"conv2d(): argument '{name}' must be an int or a tuple of 2 ints, "
                    f"not {type(value).__name__}")


def check_geometry(w_shape, stride: tuple, padding, dilation: tuple, groups: int, output_padding=(),
                   backward: bool = False) -> None:
    """torch's first refusals of a convolution's geometry, in its order (``at::_convolution``, then
    ``check_shape_forward``) and words: the padding string, the groups, 'same' on a stride, negative padding (and
    output padding, a transposed convolution's), the stride, a negative dilation, the filters against the groups.
    ``stride``, ``dilation`` (and ``padding`` where it is not a string) tuples of ints of the convolution's rank;
    what follows them (the bias, the channels, the kernel's extent, a dilation of zero) is each op's.

    ``backward``: the order of ``torch.nn.grad``'s doors (``convolution_backward`` goes to ``check_shape_forward``
    without ``at::_convolution``'s first check), where the groups come after the dilation, in other words."""
    if isinstance(padding, str) and padding not in ("same", "valid"):
        raise ConvValueError(f"Invalid padding string: {padding!r}")
    if groups <= 0 and not backward:
        raise ConvValueError("non-positive groups is not supported")
    if padding == "same" and any(v != 1 for v in stride):
        raise ConvValueError("padding='same' is not supported for strided convolutions")
    if not isinstance(padding, str) and any(v < 0 for v in padding):
        raise ConvValueError("negative padding is not supported")
    if any(v < 0 for v in output_padding):
        raise ConvValueError("negative output_padding is not supported")
    if any(v <= 0 for v in stride):
        raise ConvValueError("non-positive stride is not supported")
    if any(v < 0 for v in dilation):
        raise ConvValueError("dilation should be greater than zero")
    if groups <= 0:
        raise ConvValueError(f"expected groups to be greater than 0, but got groups={groups}")
    k = w_shape[0]
    if k < groups:  # K = 0 included
        raise ConvValueError(f"Given groups={groups}, expected weight to be at least {groups} at dimension 0, but got "
                             f"weight of size {list(w_shape)} instead")
    if k % groups:  # (torch's words: the size in two brackets)
        raise ConvValueError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, but "
                             f"got weight of size [{list(w_shape)}] instead")


def same_copy_sizes(sizes, extents) -> list:
    """The spatial ``sizes`` as torch's 'same' padding shows them in its messages: an odd total padding of a
    kernel's ``extents`` puts its extra row (column, plane) into a padded copy of the input first."""
    return [size + (extent - 1) % 2 for size, extent in zip(sizes, extents)]


@dataclasses.dataclass(frozen=True)
class ConvSpec:
    """Geometry of one 2-D convolution (forward view), normalised and validated.

    ``pad`` is four-sided ``(top, bottom, left, right)`` so that ``padding="same"`` with an even
    dilated kernel, which pads one more element after than before, fits without special cases.
    """

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: Tuple[int, int] = (1, 1)
    pad: Tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: Tuple[int, int] = (1, 1)
    groups: int = 1

    def __hash__(self) -> int:
        """The fields' hash, computed once: a call hashes its spec in several memo tables (host time)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    # ----- derived sizes (the ones every call asks for are computed once per spec: specs are memoized and
    # frozen; functools.cached_property writes the instance dict, which the fields, __eq__ and __hash__ ignore)
    @functools.cached_property
    def p(self) -> int:
        """Output height."""
        return output_size(self.h, self.r, self.stride[0], self.pad[0], self.pad[1], self.dilation[0])

    @functools.cached_property
    def q(self) -> int:
        """Output width."""
        return output_size(self.w, self.s, self.stride[1], self.pad[2], self.pad[3], self.dilation[1])

    @functools.cached_property
    def c_per_group(self) -> int:
        return self.c // self.groups

    @functools.cached_property
    def k_per_group(self) -> int:
        return self.k // self.groups

    @property
    def crs(self) -> int:
        """Rows of the full column matrix: C·R·S (all groups)."""
        return self.c * self.r * self.s

    @functools.cached_property
    def crs_per_group(self) -> int:
        """Reduction length of one group's GEMM: (C/groups)·R·S."""
        return self.c_per_group * self.r * self.s

    @property
    def input_shape(self) -> Tuple[int, int, int, int]:
        return (self.n, self.c, self.h, self.w)

    @property
    def weight_shape(self) -> Tuple[int, int, int, int]:
        return (self.k, self.c_per_group, self.r, self.s)

    @functools.cached_property
    def output_shape(self) -> Tuple[int, int, int, int]:
        return (self.n, self.k, self.p, self.q)

    @property
    def flops(self) -> int:
        """Multiply-adds counted as 2 FLOPs: 2·N·K·P·Q·(C/groups)·R·S."""
        return 2 * self.n * self.k * self.p * self.q * self.crs_per_group

    @property
    def is_pointwise_identity(self) -> bool:
        """True when the column matrix of a sample *is* its input plane stack (1x1, stride 1, no pad)."""
        return (self.r == 1 and self.s == 1 and self.stride == (1, 1) and self.pad == (0, 0, 0, 0))

    def implicit_gemm_size(self, kind: str = "fprop") -> Tuple[int, int, int]:
        """(M, N, K) of the GEMM one group performs over the whole batch, as in CUTLASS.

        fprop: out (N·P·Q, K/g) = col (N·P·Q, CRS/g) @ Wᵀ;  dgrad: (N·H·W, C/g) over K/g·R·S;
        wgrad: (K/g, CRS/g) over N·P·Q.
        """
        npq = self.n * self.p * self.q
        if kind == "fprop":
            return (npq, self.k_per_group, self.crs_per_group)
        if kind == "dgrad":
            return (self.n * self.h * self.w, self.c_per_group, self.k_per_group * self.r * self.s)
        if kind == "wgrad":
            return (self.k_per_group, self.crs_per_group, npq)
        raise ValueError(f"unknown GEMM kind {kind!r}; expected 'fprop', 'dgrad' or 'wgrad'")

    # ----- construction --------------------------------------------------------------------------
    @classmethod
    def from_args(cls, input_shape: Sequence[int], weight_shape: Sequence[int], stride: IntOrPair = 1,
                  padding: Padding = 0, dilation: IntOrPair = 1, groups: int = 1, memo: bool = True,
                  backward: bool = False) -> "ConvSpec":
        """Validate torch-style arguments against 4-D shapes and return the spec.

        Raises ``TypeError``/``ValueError`` with PyTorch's wording for every misuse of geometry. Arguments of
        plain types (tuples of ints, ints, a padding string) are memoized: a layer called again with its
        shapes costs a dictionary lookup, not a validation (host time per call matters for small layers).
        ``memo=False``: validated every time (under torch.compile, where the memo's state would be guarded).
        ``backward``: refusals in the order of ``torch.nn.grad``'s doors (see :func:`check_geometry`); a valid
        geometry is the same spec either way, so the memo holds it once.
        """
        key = (input_shape, weight_shape, stride, padding, dilation, groups)
        if (memo and _plain(input_shape) and _plain(weight_shape) and _plain(stride) and _plain(padding)
                and _plain(dilation) and _plain(groups)):
            spec = _SPECS.get(key)
            if spec is None:
                spec = cls._validated(*key, backward)
                if len(_SPECS) >= _SPECS_MAX:
                    _SPECS.clear()
                _SPECS[key] = spec
            return spec
        return cls._validated(*key, backward)

    @classmethod
    def _validated(cls, input_shape, weight_shape, stride, padding, dilation, groups,
                   backward: bool = False) -> "ConvSpec":
        n, c, h, w = (int(v) for v in input_shape)
        k, c_g, r, s = (int(v) for v in weight_shape)
        stride = pair(stride, "stride")
        dilation = pair(dilation, "dilation")
        if not _is_int(groups):
            raise TypeError(f"conv2d(): argument 'groups' must be int, not {type(groups).__name__}")
        groups = int(groups)
        # torch's order: check_geometry's refusals, the channels, the kernel's extent, a dilation of zero
        padding = padding if isinstance(padding, str) else pair(padding, "padding")
        check_geometry(weight_shape, stride, padding, dilation, groups, backward=backward)
        extent_h, extent_w = dilation[0] * (r - 1) + 1, dilation[1] * (s - 1) + 1
        if padding == "valid":
            pad = (0, 0, 0, 0)
        elif padding == "same":  # torch pads total // 2 before and the rest after, per axis.
            th, tw = extent_h - 1, extent_w - 1
            pad = (th // 2, th - th // 2, tw // 2, tw - tw // 2)
        else:
            pad = (padding[0], padding[0], padding[1], padding[1])
        wshape = list(weight_shape)
        if c != c_g * groups:
            shown = list(input_shape)
            if padding == "same":
                shown[2:] = same_copy_sizes((h, w), (extent_h, extent_w))
            raise ConvValueError(f"Given groups={groups}, weight of size {wshape}, expected input"
                                 f"{shown} to have {c_g * groups} channels, but got {c} channels instead")
        padded_h, padded_w = h + pad[0] + pad[1], w + pad[2] + pad[3]
        if padded_h < extent_h or padded_w < extent_w:
            raise ConvValueError(f"Calculated padded input size per channel: ({padded_h} x {padded_w}). "
                                 f"Kernel size: ({extent_h} x {extent_w}). Kernel size can't be greater "
                                 f"than actual input size")
        if min(dilation) == 0:
            raise ConvValueError(f"dilation should be greater than zero, but got {list(dilation)}")
        # torch's next checks, in its order: an empty image only in an empty batch or with no channels (C = 0
        # stays cuconv's: its output is K planes of bias, the sum over no channels), then a kernel of no taps
        if n and c and not (h and w):
            raise ConvValueError(f"Only zero batch or zero channel inputs are supported, but got input shape: "
                                 f"{list(input_shape)}")
        if r <= 0 or s <= 0:
            raise ConvValueError(f"kernel size should be greater than zero, but got kernel_height: {r} "
                                 f"kernel_width: {s}")
        return cls(n, c, h, w, k, r, s, stride, pad, dilation, groups)
