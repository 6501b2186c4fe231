"""Bound calls: a module's call like its last one runs the layer that call found, without the checked path.

A convolution module in a model is called with the same shapes, dtypes and weights again and again. The checked
path (``functional.conv2d``) validates the arguments, builds the call's signature and looks the layer up: tens of
microseconds of host time a call, as long as a small layer's kernels. A module that binds its last call keeps the
call's key (what the module reads besides its weights: the input's shape, strides, dtype and device, autocast,
the float32 precision, the configuration, its own geometry) with a record of its weights, and the layer: with
``FusedConv2d``'s fold (kept as its ``_weights`` keeps it), or with ``Conv2d``'s own weight where the layer takes it
as it is (autocast's cast, or a weight laid out anew, is made again each call, as the checked path makes it). A call
whose key is equal and whose weights are unchanged (the same tensor objects at the same versions, data pointers,
dtypes and shapes) runs the layer directly. Nothing is bound while a CUDA graph is captured. Only for inference on
CUDA: gradients not recorded, nothing compiling or tracing, no ``torch.func`` transform or forward-mode AD active
(``may_bind``).
"""

from __future__ import annotations

import torch

from .._config import config
from . import functional as F

_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling
_is_tracing = torch._C._is_tracing
_forward_ad = torch.autograd.forward_ad  # (its ``_current_level``: the innermost open dual level, -1 if none)
_autocast_enabled, _autocast_dtype = torch.is_autocast_enabled, torch.get_autocast_dtype
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
_settings = config.settings
_torch_precision = F.torch_precision


def may_bind() -> bool:
    """Whether a call now may be served by a bound call (and bind one): no gradients recorded, not compiling or
    tracing, no transform or forward-mode AD active."""
    # (compiling first: dynamo reads it as a constant and traces none of the rest)
    return not (_is_compiling() or _grad_enabled() or _is_tracing() or _forward_ad._current_level >= 0
                or _transforms_active())


def context() -> tuple:
    """What a call depends on besides its tensors and module: autocast's dtype (False: off), the float32
    precision, the configuration."""
    return (_autocast_enabled("cuda") and _autocast_dtype("cuda"), _torch_precision(), _settings())


def tensor_key(t: torch.Tensor) -> tuple:
    return (t.shape, t.stride(), t.dtype, t.device)


def record(tensors: tuple):
    """What ``unchanged`` compares: the tensors themselves, and each one's version, data pointer, dtype and shape,
    with the first one's device (an ``.to()`` or an assignment to ``.data`` moves a tensor without a new version);
    None where a tensor has no version counter (an inference tensor: nothing can be kept), or while a CUDA graph is
    being captured (what the call computes then is only recorded, not yet computed)."""
    if tensors[0].is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    try:
        state = tuple(None if t is None else (t._version, t.data_ptr(), t.dtype, t.shape) for t in tensors)
    except RuntimeError:
        return None
    return (tensors, state, tensors[0].device)


def unchanged(kept, tensors: tuple) -> bool:
    """Whether ``tensors`` are those ``kept`` (a ``record``) was made of, each at the same version, data pointer,
    dtype and shape."""
    made_of, state, device = kept
    for t, k, s in zip(tensors, made_of, state):  # (identities: ``==`` of tensors compares their elements)
        if t is not k or (t is not None and (t._version != s[0] or t.data_ptr() != s[1] or t.dtype is not s[2]
                                             or t.shape != s[3])):
            return False
    return tensors[0].device == device


def parameters(module) -> tuple:
    """A convolution's weight and bias, read from its dictionary (``Module.__getattr__`` costs ~0.9 µs a read),
    through the attribute where they are not there (a parametrized weight)."""
    p = module._parameters
    return (p["weight"] if "weight" in p else module.weight, p["bias"] if "bias" in p else module.bias)


class Slot:
    """A module's bound call (``value``: None, or what the module keeps), never copied or pickled with the module:
    its layer holds kernels and locks, and a copy binds its own."""

    __slots__ = ("value",)

    def __init__(self):
        self.value = None

    def __deepcopy__(self, memo):
        return Slot()

    def __reduce__(self):
        return (Slot, ())


def slot(module) -> Slot:
    """``module``'s slot (``_bound_call`` in its dictionary, made at the first call: modules made by ``convert`` or
    loaded from a checkpoint have none)."""
    d = module.__dict__
    s = d.get("_bound_call")
    if s is None:
        s = d["_bound_call"] = Slot()
    return s
