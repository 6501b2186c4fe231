"""The array doors' argument checks (``cuconv.conv2d``, ``conv2d_input``, ``conv2d_weight``), in PyTorch's wording.

Each runs once, at the public boundary, before any kernel: types and ranks first, in the user's terms, then the
value expected and the value received. The torch door (``cuconv.nn.functional``) checks tensors in the same words.
"""

from __future__ import annotations

import numbers

from . import _backend, _dtypes
from ._config import PRECISIONS
from ._errors import ConvTypeError, ConvValueError
from .problem import ACTIVATIONS, RESIDUALS, Epilogue
from .spec import ConvSpec

__all__ = ["array_kind", "resolve_precision", "check_arrays", "check_dtypes", "check_same_device", "check_out",
           "size", "check_grad_output", "check_grad_output_rank"]


def _shape(a) -> list:
    return list(a.shape)


def array_kind(a, name: str) -> str:
    """"cupy" or "numpy": the library of array argument ``name``; anything else raises ``TypeError``."""
    if _backend.is_cupy_array(a):
        return "cupy"
    if _backend.is_numpy_array(a):
        return "numpy"
    raise TypeError(f"conv2d(): argument '{name}' must be a NumPy or CuPy array, not {type(a).__name__}"
                    + ("; for torch tensors use cuconv.nn.functional.conv2d" if type(a).__module__
                       .startswith("torch") else ""))


def resolve_precision(precision, default: str) -> str:
    """A call's ``precision=``: ``default`` (the settings' precision) for None, else one of ``PRECISIONS``."""
    if precision is None:
        return default
    if precision not in PRECISIONS:
        raise ValueError(f"cuconv: precision must be None or one of {PRECISIONS}, got {precision!r}")
    return precision


def check_arrays(x, weight, bias, out):
    """Types, ranks, dtypes and devices of a forward's arrays, in the order torch checks them. Returns the
    backend name."""
    kind = array_kind(x, "input")
    for name, a in (("weight", weight), ("bias", bias), ("out", out)):
        if a is None and name != "weight":
            continue
        other = array_kind(a, name)
        if other != kind:
            raise TypeError(f"conv2d(): input is a {kind} array but {name} is a {other} array; "
                            f"all arrays must come from the same library")
    if x.ndim not in (3, 4):
        raise ConvValueError(f"Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of "
                             f"size: {_shape(x)}")
    if weight.ndim != 4:
        raise ConvValueError(f"Expected 4D weight (out_channels, in_channels/groups, kH, kW) for conv2d, but "
                             f"got weight of size: {_shape(weight)}")
    check_dtypes(x, weight, bias)
    if bias is not None and (bias.ndim != 1 or bias.shape[0] != weight.shape[0]):
        raise ConvValueError(f"Given weight of size {_shape(weight)}, expected bias to be 1-dimensional "
                             f"with {weight.shape[0]} elements, but got bias of size {_shape(bias)} instead")
    if kind == "cupy":
        check_same_device(x, weight=weight, bias=bias, out=out)
    return kind


def check_dtypes(first_array, second_array, bias, first="Input", second="weight"):
    """A supported float dtype, the same for every array (torch's "Input type ... and weight type ...")."""
    _dtypes.check_float_dtype(first_array.dtype, first.lower() if first == "Input" else first)
    if second_array.dtype != first_array.dtype:
        raise ConvTypeError(f"{first} type ({first_array.dtype}) and {second} type ({second_array.dtype}) "
                            f"should be the same")
    if bias is not None and bias.dtype != first_array.dtype:
        raise ConvTypeError(f"{first} type ({first_array.dtype}) and bias type ({bias.dtype}) should be the same")


def check_same_device(reference, reference_name="input", **others):
    """CuPy arrays all on ``reference``'s device."""
    dev = reference.data.device_id  # an int attribute: ``.device`` builds a Device object (host time)
    for name, a in others.items():
        if a is not None and a.data.device_id != dev:
            raise ConvValueError(f"Expected all arrays to be on the same device, but found {reference_name} on "
                                 f"cuda:{dev} and {name} on cuda:{a.data.device_id}")


def check_out(out, shape, dtype):
    """A preallocated ``out`` of the result's ``shape`` and ``dtype``."""
    if out.dtype != dtype:
        raise TypeError(f"conv2d(): expected out to have dtype {dtype}, but got {out.dtype}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"conv2d(): expected out of size {list(shape)}, but got out of size "
                         f"{_shape(out)}")


def epilogue_of(bias: bool, activation, slope, residual: bool, position):
    """The ``Epilogue`` a call's ``activation``, ``negative_slope`` and ``residual_position`` ask for (``bias``,
    ``residual``: whether it has them), its arguments checked in torch's manner; ``alpha`` kept for leaky_relu only,
    so that calls differing in a slope they do not use share one plan."""
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"conv2d(): argument 'activation' must be None or one of {ACTIVATIONS}, got {activation!r}")
    if not isinstance(slope, numbers.Real) or isinstance(slope, bool):
        raise TypeError(f"conv2d(): argument 'negative_slope' must be a number, not {type(slope).__name__}")
    if position not in RESIDUALS:
        raise ValueError(f"conv2d(): argument 'residual_position' must be one of {RESIDUALS}, got {position!r}")
    return Epilogue(bias, activation, float(slope) if activation == "leaky_relu" else 0.0,
                    position if residual else None)


def check_residual(residual, shape, x):
    """A residual of the result's ``shape`` and the input ``x``'s dtype, library and device."""
    same_kind = _backend.is_cupy_array(x) and _backend.is_cupy_array(residual) or (
        _backend.is_numpy_array(x) and _backend.is_numpy_array(residual))
    if not same_kind:
        raise TypeError(f"conv2d(): expected residual to be an array of the input's library, but got "
                        f"{type(residual).__name__}")
    if residual.dtype != x.dtype:
        raise TypeError(f"conv2d(): expected residual to have dtype {x.dtype}, but got {residual.dtype}")
    if tuple(residual.shape) != tuple(shape):
        raise ValueError(f"conv2d(): expected residual of size {list(shape)}, but got residual of size "
                         f"{_shape(residual)}")
    if _backend.is_cupy_array(x) and residual.data.device_id != x.data.device_id:
        raise ValueError(f"conv2d(): expected residual on device {x.data.device_id}, but got device "
                         f"{residual.data.device_id}")


def size(value, name: str, ranks=(3, 4)) -> tuple:
    """A backward door's ``input_size`` / ``weight_size``: non-negative ints, ``ranks`` of them."""
    if not (isinstance(value, (tuple, list)) or type(value).__name__ == "Size") or not all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value):
        raise TypeError(f"{name} must be a tuple of non-negative ints, got {value!r}")
    if any(v < 0 for v in value):
        raise ValueError(f"{name} must be a tuple of non-negative ints, got {value!r}")
    if len(value) not in ranks:
        raise ValueError(f"{name} must have {' or '.join(map(str, ranks))} entries, got {list(value)}")
    return tuple(int(v) for v in value)


def check_grad_output_rank(grad_output):
    """A batched backward door's grad_output of four dimensions, as its input (torch's words)."""
    if grad_output.ndim != 4:
        raise ConvValueError(f"Expected input and grad_output to have the same number of dimensions, but got: 4 and "
                             f"{grad_output.ndim}")


def check_grad_output(grad_output, spec: ConvSpec, unbatched: bool):
    """grad_output of the shape the convolution ``spec`` produces."""
    expected = spec.output_shape[1:] if unbatched else spec.output_shape
    if tuple(grad_output.shape) != tuple(expected):
        raise ConvValueError(f"Expected grad_output of size {list(expected)} for this convolution, but got "
                             f"grad_output of size {list(grad_output.shape)}")
