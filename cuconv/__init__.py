"""cuconv: 2-D convolution (and the transposed and 1-D ones on its passes) for CuPy (GPU) and NumPy (CPU) arrays,
on CUDA kernels of its own."""

from ._config import config
from ._errors import ConvTypeError, ConvValueError
from .select import algorithms, select_algorithm
from .backward import conv2d_input, conv2d_weight
from .conv import conv2d
from .spec import ConvSpec, output_size
from .variants import conv1d, conv3d, conv_transpose2d

__version__ = "0.1.0"

__all__ = ["conv2d", "conv2d_input", "conv2d_weight", "conv_transpose2d", "conv1d", "conv3d", "algorithms",
           "select_algorithm", "config", "ConvSpec", "output_size", "ConvValueError", "ConvTypeError", "__version__"]
