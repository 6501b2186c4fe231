"""cuconv: 2-D convolution for CuPy (GPU) and NumPy (CPU) arrays, on CUDA kernels of its own."""

from ._config import config
from ._errors import ConvTypeError, ConvValueError
from .select import algorithms, select_algorithm
from .backward import conv2d_input, conv2d_weight
from .conv import conv2d
from .spec import ConvSpec, output_size

__version__ = "0.1.0"

__all__ = ["conv2d", "conv2d_input", "conv2d_weight", "algorithms", "select_algorithm", "config", "ConvSpec",
           "output_size", "ConvValueError", "ConvTypeError", "__version__"]
