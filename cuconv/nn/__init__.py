"""cuconv for PyTorch: ``cuconv.nn.Conv2d`` (``ConvTranspose2d``, ``Conv1d``, ``Conv3d``), ``cuconv.nn.convert``,
``cuconv.nn.functional.conv2d`` and
``cuconv.nn.warmup`` (a model's kernels compiled side by side before its first call).

Importing this package needs torch; ``import cuconv`` alone does not.
"""

from . import functional
from ._warmup import warmup
from .modules import Conv1d, Conv2d, Conv3d, ConvTranspose2d, convert

__all__ = ["Conv2d", "ConvTranspose2d", "Conv1d", "Conv3d", "convert", "functional", "warmup"]
