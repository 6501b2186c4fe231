"""cuconv for PyTorch: ``cuconv.nn.Conv2d``, ``cuconv.nn.convert`` and ``cuconv.nn.functional.conv2d``.

Importing this package needs torch; ``import cuconv`` alone does not.
"""

from . import functional
from .modules import Conv2d, convert

__all__ = ["Conv2d", "convert", "functional"]
