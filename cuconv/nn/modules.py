"""``cuconv.nn.Conv2d``, a drop-in for ``torch.nn.Conv2d`` (``ConvTranspose2d``, ``Conv1d`` and ``Conv3d`` likewise
for torch's), and ``convert`` for existing models.

``Conv2d`` *is* a ``torch.nn.Conv2d`` (a subclass): same constructor, attributes, parameter shapes,
``reset_parameters`` (so one ``torch.manual_seed`` gives bit-identical weights), state_dict keys and
padding modes; only the convolution itself runs on cuconv. ``algo`` is its one extra, keyword-only,
argument, shown by ``extra_repr`` when it is not the default.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .._types import IntOrPair, Padding
from ..select import algorithms
from . import _bound
from . import functional as _F
from .functional import conv1d as _cuconv_conv1d
from .functional import conv3d as _cuconv_conv3d
from .functional import conv2d as _cuconv_conv2d
from .functional import conv_transpose2d as _cuconv_conv_transpose2d

# torch.fx records a call of cuconv's conv2d as one node (a Proxy never reaches its checks): models converted to
# cuconv trace with torch.fx.symbolic_trace as torch's do
torch.fx.wrap("_cuconv_conv2d")
torch.fx.wrap("_cuconv_conv_transpose2d")
torch.fx.wrap("_cuconv_conv1d")
torch.fx.wrap("_cuconv_conv3d")

__all__ = ["Conv2d", "ConvTranspose2d", "Conv1d", "Conv3d", "convert"]

_Tensor = torch.Tensor


def _check_algo(algo: str) -> None:
    if algo != "auto" and algo not in algorithms():
        raise ValueError(f"cuconv: unknown algo {algo!r}; expected 'auto' or one of {algorithms()}")


def _padded(module, input) -> tuple:
    """(input, padding) of a call of ``module``: for reflect / replicate / circular padding modes the input padded
    first (differentiable) and no padding for the convolution, else both as they are."""
    if module.padding_mode == "zeros":
        return input, module.padding
    return torch.nn.functional.pad(input, module._reversed_padding_repeated_twice, mode=module.padding_mode), 0


class _Algo:
    """What cuconv's modules add to torch's: ``algo`` (shown by ``extra_repr`` when it is not the default) and the
    refusal of ``torch.jit.script`` with what to use instead. Listed before torch's class among the bases."""

    def extra_repr(self) -> str:
        text = super().extra_repr()
        return text if self.algo == "auto" else f"{text}, algo={self.algo!r}"

    def __prepare_scriptable__(self):
        raise RuntimeError(NOT_SCRIPTABLE)


class Conv2d(_Algo, torch.nn.Conv2d):
    """``torch.nn.Conv2d`` computed by cuconv (forward, dgrad and wgrad).

    Parameters are torch's: ``in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
    groups=1, bias=True, padding_mode="zeros", device=None, dtype=None``; plus ``algo`` (``"auto"`` or one
    of :func:`cuconv.algos`).

    Examples
    --------
    >>> import torch, cuconv.nn
    >>> _ = torch.manual_seed(0); a = torch.nn.Conv2d(3, 8, (3, 5), padding="same")
    >>> _ = torch.manual_seed(0); b = cuconv.nn.Conv2d(3, 8, (3, 5), padding="same")
    >>> bool(torch.equal(a.weight, b.weight)), b
    (True, Conv2d(3, 8, kernel_size=(3, 5), stride=(1, 1), padding=same))
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrPair, stride: IntOrPair = 1,
                 padding: Padding = 0, dilation: IntOrPair = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", device: Any = None, dtype: Optional[torch.dtype] = None, *,
                 algo: str = "auto") -> None:
        _check_algo(algo)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device, dtype)
        self.algo = algo

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if (type(input) is _Tensor and input.is_cuda and self.padding_mode == "zeros" and _bound.may_bind()
                and type(self)._conv_forward is Conv2d._conv_forward):  # (a subclass's own: its path)
            # inference on CUDA: a call like the last one runs its layer without the checked path (``_bound``)
            key = (input.shape, input.stride(), input.dtype, input.device, _bound.context(), self.stride,
                   self.padding, self.dilation, self.groups, self.algo)
            tensors = _bound.parameters(self)
            slot = _bound.slot(self)
            kept = slot.value
            if kept is not None and kept[0] == key and _bound.unchanged(kept[1], tensors):
                layer, low, as_is = kept[2]
                # (a weight cast by autocast or laid out anew is made again each call, as the checked path makes
                # it: a kept copy would miss edits through .data, and a CUDA graph would not capture the cast)
                w, b = tensors if as_is else _F.layer_operands(layer, *tensors)
                return _F.run_layer(layer, input if low is None else low(input), w, b)
            found = _F.plain_layer(input, tensors[0], tensors[1], self.stride, self.padding, self.dilation,
                                   self.groups, self.algo)
            if found is not None:
                layer, x, w, b = found
                record = _bound.record(tensors)
                low = None if x.dtype is input.dtype else _F.lower_of(x.dtype)
                as_is = w is tensors[0] and b is tensors[1]
                slot.value = None if record is None else (key, record, (layer, low, as_is))
                return _F.run_layer(layer, x, w, b)
        return self._conv_forward(input, self.weight, self.bias)

    def _conv_forward(self, input, weight, bias):
        if type(input) is not torch.Tensor and type(getattr(input, "tracer", None)).__name__ == "QuantizationTracer":
            # (FX-mode quantization traces through the layer to a call it has no pattern for: left float silently)
            raise NotImplementedError(NOT_QUANTIZABLE)
        input, padding = _padded(self, input)
        return _cuconv_conv2d(input, weight, bias, self.stride, padding, self.dilation, self.groups, algo=self.algo)


class ConvTranspose2d(_Algo, torch.nn.ConvTranspose2d):
    """``torch.nn.ConvTranspose2d`` computed by cuconv (``cuconv.nn.functional.conv_transpose2d``): torch's
    constructor, attributes, initialisation and state_dict, ``forward(input, output_size=None)``; plus ``algo``
    (keyword-only: the algorithm of the dgrad that computes it)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrPair, stride: IntOrPair = 1,
                 padding: IntOrPair = 0, output_padding: IntOrPair = 0, groups: int = 1, bias: bool = True,
                 dilation: IntOrPair = 1, padding_mode: str = "zeros", device: Any = None,
                 dtype: Optional[torch.dtype] = None, *, algo: str = "auto") -> None:
        _check_algo(algo)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, output_padding, groups, bias,
                         dilation, padding_mode, device, dtype)
        self.algo = algo

    def forward(self, input: torch.Tensor, output_size: Optional[list] = None) -> torch.Tensor:
        if self.padding_mode != "zeros":
            raise ValueError("Only `zeros` padding mode is supported for ConvTranspose2d")
        output_padding = self._output_padding(input, output_size, self.stride, self.padding, self.kernel_size, 2,
                                              self.dilation)
        return _cuconv_conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding, output_padding,
                                        self.groups, self.dilation, algo=self.algo)


class Conv1d(_Algo, torch.nn.Conv1d):
    """``torch.nn.Conv1d`` computed by cuconv (``cuconv.nn.functional.conv1d``: a 2-D convolution over a plane of
    height one): torch's constructor, attributes, initialisation, state_dict and padding modes; plus ``algo``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device: Any = None,
                 dtype: Optional[torch.dtype] = None, *, algo: str = "auto") -> None:
        _check_algo(algo)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device, dtype)
        self.algo = algo

    def _conv_forward(self, input, weight, bias):
        input, padding = _padded(self, input)
        return _cuconv_conv1d(input, weight, bias, self.stride, padding, self.dilation, self.groups, algo=self.algo)


class Conv3d(_Algo, torch.nn.Conv3d):
    """``torch.nn.Conv3d`` computed by cuconv (``cuconv.nn.functional.conv3d``: one 2-D convolution over the
    depth's columns): torch's constructor, attributes, initialisation, state_dict and padding modes; plus
    ``algo`` (the 2-D convolution's)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device: Any = None,
                 dtype: Optional[torch.dtype] = None, *, algo: str = "auto") -> None:
        _check_algo(algo)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device, dtype)
        self.algo = algo

    def _conv_forward(self, input, weight, bias):
        input, padding = _padded(self, input)
        return _cuconv_conv3d(input, weight, bias, self.stride, padding, self.dilation, self.groups, algo=self.algo)


NOT_QUANTIZABLE = ("cuconv: cuconv's Conv2d computes in floating point (float32, TF32, float16, bfloat16, float64) "
                   "and has no quantized form; quantize the torch model (before cuconv.nn.convert)")


# torch.jit.script compiles a module's forward from its Python source; cuconv's runs its own Python path (the
# checks, the plan, the launches), which TorchScript cannot compile. Said before TorchScript fails inside it.
NOT_SCRIPTABLE = ("cuconv: torch.jit.script cannot compile cuconv's convolution layers (their forward runs "
                  "cuconv's Python code). Use torch.jit.trace (it records the custom op cuconv::conv2d; import "
                  "cuconv before torch.jit.load), torch.export or torch.compile instead")


# torch's convolution modules convert swaps, each for cuconv's twin
_TWINS = {torch.nn.Conv2d: Conv2d, torch.nn.ConvTranspose2d: ConvTranspose2d, torch.nn.Conv1d: Conv1d,
          torch.nn.Conv3d: Conv3d}


# what a subclass of a torch convolution may define and still be converted as the plain one: its constructor and
# static or class methods (torchvision's video models build with Conv3d subclasses that add a static method)
_PLAIN_NAMES = {"__module__", "__qualname__", "__doc__", "__init__", "__annotations__", "__firstlineno__",
                "__static_attributes__", "__dict__", "__weakref__", "__orig_bases__", "__parameters__"}


def _base_of(module: torch.nn.Module):
    """The torch convolution class ``module`` is an instance of, or None."""
    return next((b for b in _TWINS if isinstance(module, b)), None)


def _plain_subclass(cls: type, base: type) -> bool:
    """Whether ``cls``, a subclass of ``base``, adds no behaviour to a constructed module: nothing between them
    but constructors and static or class methods (a forward, another method or a property would be lost)."""
    for c in cls.__mro__[:cls.__mro__.index(base)]:
        for name, value in vars(c).items():
            if name not in _PLAIN_NAMES and not isinstance(value, (staticmethod, classmethod)):
                return False
    return True


def _converted(conv: torch.nn.Module, algo: str) -> torch.nn.Module:
    """cuconv's twin of ``conv`` holding its state: the same Parameter and buffer objects, hooks and training flag,
    in dicts of its own (a hook registered on one module later does not fire on the other)."""
    twin = _TWINS[_base_of(conv)]
    new = twin.__new__(twin)
    for name, value in conv.__dict__.items():
        object.__setattr__(new, name, value.copy() if isinstance(value, (dict, set)) else value)
    new.algo = algo
    return new


def convert(model: torch.nn.Module, *, algo: str = "auto", fuse: bool = False) -> torch.nn.Module:
    """Replace every ``torch.nn.Conv2d`` in ``model`` by :class:`Conv2d` (``ConvTranspose2d``, ``Conv1d`` and
    ``Conv3d`` by cuconv's), in place; returns the model.

    Every use of a convolution is replaced, and a module used in several places (or under several names) by one
    converted module, shared as the original was. The new modules hold the old ones' Parameter and buffer
    objects (so optimizers keep working), hooks, device, dtype and training mode, in dicts of their own.
    A subclass that adds nothing but a constructor and static or class methods (torchvision's ``Conv3DSimple``) is
    converted as the plain one; other subclasses are left alone, with a ``UserWarning`` naming them and why (a
    ``LazyConv2d`` before its first forward: run one first; a parametrized weight such as ``weight_norm``'s: its
    parametrization would have to run inside cuconv's call; a subclass's own methods).

    ``fuse=True`` then runs each convolution with the BatchNorm2d, activation and residual add after it as one
    call (``cuconv.nn.fuse``): where the model traces with ``torch.fx`` the result is a ``torch.fx.GraphModule``
    (the converted model is its root; use the returned module), else the model with its Sequential patterns fused
    in place. The state_dict keys and values stay the original's; in eval mode each BatchNorm is folded into its
    convolution, in train mode the fused calls run unfused.

    Raises
    ------
    TypeError
        ``model`` is not a ``torch.nn.Module``.
    ValueError
        ``algo`` is not ``"auto"`` or one of :func:`cuconv.algos`.

    Examples
    --------
    >>> import torch, cuconv.nn
    >>> m = cuconv.nn.convert(torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU()))
    >>> type(m[0]).__name__
    'Conv2d'
    >>> type(m[0]).__module__
    'cuconv.nn.modules'
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"convert(): argument 'model' must be a torch.nn.Module, not {type(model).__name__}")
    if not isinstance(algo, str):
        raise TypeError(f"convert(): argument 'algo' must be str, not {type(algo).__name__}")
    _check_algo(algo)
    if not isinstance(fuse, bool):
        raise TypeError(f"convert(): argument 'fuse' must be bool, not {type(fuse).__name__}")
    left = []
    model = _convert(model, algo, {}, set(), left)
    if left:
        import warnings

        warnings.warn("cuconv.nn.convert left these convolutions on torch: " + "; ".join(left), UserWarning,
                      stacklevel=2)
    if fuse:
        from .fuse import fuse as _fuse  # (imports this module)

        model = _fuse(model)
    return model


def _left_alone(module: torch.nn.Module):
    """Why a subclass of one of torch's convolutions stays on torch; None where it converts as the plain one."""
    base = _base_of(module)
    if isinstance(module, torch.nn.modules.lazy.LazyModuleMixin):
        return f"a Lazy{base.__name__} before its first forward (run one forward, then convert)"
    if torch.nn.utils.parametrize.is_parametrized(module):
        return ("a parametrized weight (weight_norm, spectral_norm, ...), computed by torch on each call "
                "(torch.nn.utils.parametrize.remove_parametrizations first to convert it)")
    if _plain_subclass(type(module), base):
        return None
    return (f"a subclass of torch.nn.{base.__name__} with methods of its own "
            f"({type(module).__module__}.{type(module).__qualname__})")


def _convert(module: torch.nn.Module, algo: str, done: dict, walked: set, left: list,
             path: str = "") -> torch.nn.Module:
    """``module`` with its convolutions replaced; ``done`` maps each original (by id) to (original, replacement),
    so a module met again gets the same one, ``walked`` holds the containers already walked, and ``left`` gets
    the path and reason of each subclass of Conv2d left alone."""
    subclass = (isinstance(module, tuple(_TWINS)) and type(module) not in _TWINS
                and not isinstance(module, tuple(_TWINS.values())))
    reason = _left_alone(module) if subclass else None
    if reason is not None:
        if id(module) not in walked:
            walked.add(id(module))
            left.append(f"{path or '(the model)'}: {reason}")
        return module
    if type(module) in _TWINS or subclass:
        entry = done.get(id(module))
        if entry is None:  # (the original is kept in ``done`` while the walk lasts: its id cannot be reused)
            entry = done[id(module)] = (module, _converted(module, algo))
        return entry[1]
    if id(module) in walked:
        return module
    walked.add(id(module))
    for name, child in list(module._modules.items()):  # every name, a module held twice included
        if child is not None:
            replacement = _convert(child, algo, done, walked, left, f"{path}.{name}" if path else name)
            if replacement is not child:
                module._modules[name] = replacement
    return module


def _refuse_qat(is_qat: bool) -> None:
    if is_qat:  # (its fused modules are torch.ao.nn.intrinsic's, which compute with torch's convolution)
        raise NotImplementedError("cuconv: quantization-aware training fuses into torch.ao.nn.intrinsic modules, "
                                  "which compute with torch's convolution; fuse the torch model before "
                                  "cuconv.nn.convert, or train without quantization")


def _fuse_conv_bn(is_qat: bool, conv, bn, relu=None):
    """``torch.ao.quantization.fuse_modules``' fuser for cuconv's Conv2d with BatchNorm2d (and ReLU): in eval mode
    the BatchNorm folded into a copy of the convolution (``torch.nn.utils.fuse_conv_bn_eval``), still cuconv's,
    followed by the ReLU; quantization-aware training (``is_qat``) is refused."""
    _refuse_qat(is_qat)
    if conv.training or bn.training:
        raise AssertionError("Conv and BN both must be in eval mode for fusion outside quantization-aware training")
    fused = torch.nn.utils.fuse_conv_bn_eval(conv, bn)
    return fused if relu is None else torch.nn.Sequential(fused, relu)


def _fuse_conv_relu(is_qat: bool, conv, relu):
    _refuse_qat(is_qat)
    return torch.nn.Sequential(conv, relu)


def _register_fusers() -> None:
    """Entries for cuconv's Conv2d in torch's table of module fusions (it matches types exactly, a subclass
    finds none: "did not find fuser method"), so that ``torch.ao.quantization.fuse_modules`` fuses cuconv's
    layers as it fuses torch's."""
    try:
        from torch.ao.quantization import fuser_method_mappings
    except ImportError:  # (a torch without torch.ao.quantization: nothing to register with)
        return
    table = getattr(fuser_method_mappings, "_DEFAULT_OP_LIST_TO_FUSER_METHOD", None)
    if isinstance(table, dict):
        table.setdefault((Conv2d, torch.nn.BatchNorm2d), _fuse_conv_bn)
        table.setdefault((Conv2d, torch.nn.BatchNorm2d, torch.nn.ReLU), _fuse_conv_bn)
        table.setdefault((Conv2d, torch.nn.ReLU), _fuse_conv_relu)


class _NotQuantized:
    """What torch's eager quantization swaps cuconv's Conv2d for: nothing, said clearly (torch's quantized modules
    would compute the convolution with torch's kernels, and a layer left out of the mapping stayed float
    without a word)."""

    @classmethod
    def from_float(cls, mod, *args, **kwargs):
        raise NotImplementedError(NOT_QUANTIZABLE + ", or set these layers' qconfig to None")

    from_observed = from_float


def _register_quantization() -> None:
    """cuconv's Conv2d in torch's eager-mode quantization mappings, as ``_NotQuantized``: ``prepare`` observes it and
    ``convert`` (or ``prepare_qat``) refuses it, where a subclass of Conv2d would otherwise be passed over."""
    try:
        from torch.ao.quantization import quantization_mappings
    except ImportError:
        return
    for name in ("DEFAULT_STATIC_QUANT_MODULE_MAPPINGS", "DEFAULT_QAT_MODULE_MAPPINGS",
                 "DEFAULT_REFERENCE_STATIC_QUANT_MODULE_MAPPINGS"):
        table = getattr(quantization_mappings, name, None)
        if isinstance(table, dict):
            table.setdefault(Conv2d, _NotQuantized)


_register_fusers()
_register_quantization()
