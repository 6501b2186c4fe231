"""``cuconv.nn.Conv2d``, a drop-in for ``torch.nn.Conv2d``, and ``convert`` for existing models.

``Conv2d`` *is* a ``torch.nn.Conv2d`` (a subclass): same constructor, attributes, parameter shapes,
``reset_parameters`` (so one ``torch.manual_seed`` gives bit-identical weights), state_dict keys and
padding modes; only the convolution itself runs on cuconv. ``algo`` is its one extra, keyword-only,
argument, shown by ``extra_repr`` when it is not the default.
"""

from __future__ import annotations

import torch

from ..registry import algorithms
from . import functional as F

__all__ = ["Conv2d", "convert"]


class Conv2d(torch.nn.Conv2d):
    """``torch.nn.Conv2d`` computed by cuconv (forward, dgrad and wgrad).

    Parameters are torch's: ``in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
    groups=1, bias=True, padding_mode="zeros", device=None, dtype=None``; plus ``algo`` (``"auto"`` or one
    of :func:`cuconv.algorithms`).

    Examples
    --------
    >>> import torch, cuconv.nn
    >>> _ = torch.manual_seed(0); a = torch.nn.Conv2d(3, 8, (3, 5), padding="same")
    >>> _ = torch.manual_seed(0); b = cuconv.nn.Conv2d(3, 8, (3, 5), padding="same")
    >>> bool(torch.equal(a.weight, b.weight)), b
    (True, Conv2d(3, 8, kernel_size=(3, 5), stride=(1, 1), padding=same))
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", device=None, dtype=None, *, algo: str = "auto"):
        if algo != "auto" and algo not in algorithms():
            raise ValueError(f"cuconv: unknown algo {algo!r}; expected 'auto' or one of {algorithms()}")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device, dtype)
        self.algo = algo

    def _conv_forward(self, input, weight, bias):
        if self.padding_mode != "zeros":
            # reflect / replicate / circular: pad first (differentiable), then a valid convolution
            padded = torch.nn.functional.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return F.conv2d(padded, weight, bias, self.stride, 0, self.dilation, self.groups, algo=self.algo)
        return F.conv2d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups,
                        algo=self.algo)

    def extra_repr(self) -> str:
        text = super().extra_repr()
        return text if self.algo == "auto" else f"{text}, algo={self.algo!r}"


def _converted(conv: torch.nn.Conv2d, algo: str) -> Conv2d:
    new = Conv2d.__new__(Conv2d)
    new.__dict__.update(conv.__dict__)  # the same Parameter objects, buffers, hooks and training flag
    new.algo = algo
    return new


def convert(model: torch.nn.Module, *, algo: str = "auto") -> torch.nn.Module:
    """Replace every ``torch.nn.Conv2d`` in ``model`` by :class:`Conv2d`, in place; returns the model.

    The new modules share the old ones' parameters (so optimizers keep working), buffers, hooks, device,
    dtype and training mode. Subclasses of ``torch.nn.Conv2d`` other than plain ones are left alone.

    Examples
    --------
    >>> import torch, cuconv.nn
    >>> m = cuconv.nn.convert(torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU()))
    >>> type(m[0]).__name__
    'Conv2d'
    >>> type(m[0]).__module__
    'cuconv.nn.modules'
    """
    if type(model) is torch.nn.Conv2d:
        return _converted(model, algo)
    for name, child in model.named_children():
        if type(child) is torch.nn.Conv2d:
            setattr(model, name, _converted(child, algo))
        else:
            convert(child, algo=algo)
    return model
