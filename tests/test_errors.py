"""Misuses of ``cuconv.conv2d`` and ``cuconv.config`` on NumPy arrays: exception type and message.

Messages follow PyTorch's wording; where ``torch.nn.functional.conv2d`` raises RuntimeError, our ValueError and
TypeError are ``cuconv.ConvValueError``/``ConvTypeError``, RuntimeErrors too. Misuses that need a CuPy array (mixing NumPy and CuPy, arrays on different GPUs)
are pinned by the GPU tests.
"""

import types
import warnings

import numpy
import pytest
import torch

import cuconv
from cases import reference, rel_err, tolerance


def _arrays():
    rng = numpy.random.default_rng(42)
    return types.SimpleNamespace(
        x=rng.standard_normal((2, 4, 8, 8)),  # (N, C, H, W)
        w=rng.standard_normal((6, 4, 3, 3)),  # (K, C, R, S)
        b=rng.standard_normal(6),
        rng=rng,
    )


def _conv(**kwargs):
    """A call of conv2d on the valid arrays above with some arguments replaced."""
    def call(a):
        args = dict(x=a.x, weight=a.w, bias=a.b)
        args.update({k: (v(a) if callable(v) else v) for k, v in kwargs.items()})
        return cuconv.conv2d(args.pop("x"), args.pop("weight"), args.pop("bias"), **args)
    return call


def _config_set(name, value):
    return lambda a: setattr(cuconv.config, name, value)


def _config_block(**changes):
    def call(a):
        with cuconv.config(**changes):
            pass  # pragma: no cover - entering must fail
    return call


MISUSES = [
    # ----- ranks ----------------------------------------------------------------------------------
    pytest.param(_conv(x=lambda a: a.x[0, 0]), ValueError,
                 r"Expected 3D \(unbatched\) or 4D \(batched\) input to conv2d, but got input of size: \[8, 8\]",
                 id="input_2d"),
    pytest.param(_conv(x=lambda a: a.x[None]), ValueError,
                 r"Expected 3D \(unbatched\) or 4D \(batched\) input to conv2d, but got input of size: "
                 r"\[1, 2, 4, 8, 8\]", id="input_5d"),
    pytest.param(_conv(weight=lambda a: a.w[0]), ValueError,
                 r"Expected 4D weight \(out_channels, in_channels/groups, kH, kW\) for conv2d, but got weight "
                 r"of size: \[4, 3, 3\]", id="weight_3d"),
    # ----- channels and groups ------------------------------------------------------------------------
    pytest.param(_conv(weight=lambda a: a.w[:, :3]), ValueError,
                 r"Given groups=1, weight of size \[6, 3, 3, 3\], expected input\[2, 4, 8, 8\] to have 3 "
                 r"channels, but got 4 channels instead", id="channel_mismatch"),
    pytest.param(_conv(x=lambda a: a.rng.standard_normal((2, 5, 8, 8)), weight=lambda a: a.w[:, :2],
                       groups=3), ValueError,
                 r"Given groups=3, weight of size \[6, 2, 3, 3\], expected input\[2, 5, 8, 8\] to have 6 "
                 r"channels, but got 5 channels instead", id="groups_not_dividing_C"),
    pytest.param(_conv(weight=lambda a: a.w[:5, :2], bias=lambda a: a.b[:5], groups=2), ValueError,
                 r"Given groups=2, expected weight to be divisible by 2 at dimension 0, but got weight of "
                 r"size \[\[5, 2, 3, 3\]\] instead", id="groups_not_dividing_K"),  # (torch's two brackets)
    pytest.param(_conv(groups=0), ValueError, r"non-positive groups is not supported", id="groups_0"),
    pytest.param(_conv(groups=-2), ValueError, r"non-positive groups is not supported", id="groups_negative"),
    pytest.param(_conv(groups=2.0), TypeError, r"conv2d\(\): argument 'groups' must be int, not float",
                 id="groups_float"),
    pytest.param(_conv(groups=True), TypeError, r"conv2d\(\): argument 'groups' must be int, not bool",
                 id="groups_bool"),
    # ----- stride, padding, dilation ------------------------------------------------------------------
    pytest.param(_conv(stride=0), ValueError, r"non-positive stride is not supported", id="stride_0"),
    pytest.param(_conv(stride=(1, -1)), ValueError, r"non-positive stride is not supported",
                 id="stride_negative"),
    pytest.param(_conv(stride=(1, 1, 1)), ValueError,
                 r"expected stride to be a single integer value or a list of 2 values to match the "
                 r"convolution dimensions, but got stride=\[1, 1, 1\]", id="stride_len3"),
    pytest.param(_conv(stride=1.5), TypeError,
                 r"conv2d\(\): argument 'stride' must be an int or a tuple of 2 ints, not float",
                 id="stride_float"),
    pytest.param(_conv(stride=(2, 1.0)), TypeError,
                 r"conv2d\(\): argument 'stride' must be an int or a tuple of 2 ints, not tuple",
                 id="stride_tuple_with_float"),
    pytest.param(_conv(dilation=0), ValueError, r"dilation should be greater than zero, but got \[0, 0\]",
                 id="dilation_0"),
    pytest.param(_conv(dilation=(1, -1)), ValueError, r"^dilation should be greater than zero$",
                 id="dilation_negative"),
    pytest.param(_conv(padding=-1), ValueError, r"negative padding is not supported", id="padding_negative"),
    pytest.param(_conv(padding=(1, -2)), ValueError, r"negative padding is not supported",
                 id="padding_negative_w"),
    pytest.param(_conv(padding="full"), ValueError, r"Invalid padding string: 'full'", id="padding_unknown_str"),
    pytest.param(_conv(padding="same", stride=2), ValueError,
                 r"padding='same' is not supported for strided convolutions", id="same_strided"),
    pytest.param(_conv(weight=lambda a: a.rng.standard_normal((6, 4, 9, 3))), ValueError,
                 r"Calculated padded input size per channel: \(8 x 8\)\. Kernel size: \(9 x 3\)\. Kernel size "
                 r"can't be greater than actual input size", id="kernel_larger_than_input"),
    pytest.param(_conv(weight=lambda a: a.rng.standard_normal((6, 4, 9, 9)), padding=(0, 1)), ValueError,
                 r"Calculated padded input size per channel: \(8 x 10\)\. Kernel size: \(9 x 9\)\.",
                 id="kernel_larger_than_padded_input"),
    pytest.param(_conv(dilation=(1, 4)), ValueError,
                 r"Calculated padded input size per channel: \(8 x 8\)\. Kernel size: \(3 x 9\)\.",
                 id="dilated_kernel_larger_than_input"),
    # ----- dtypes -------------------------------------------------------------------------------------
    pytest.param(_conv(weight=lambda a: a.w.astype(numpy.float32)), TypeError,
                 r"Input type \(float64\) and weight type \(float32\) should be the same",
                 id="dtype_mismatch_weight"),
    pytest.param(_conv(bias=lambda a: a.b.astype(numpy.float16)), TypeError,
                 r"Input type \(float64\) and bias type \(float16\) should be the same", id="dtype_mismatch_bias"),
    pytest.param(_conv(x=lambda a: a.x.astype(numpy.int64), weight=lambda a: a.w.astype(numpy.int64),
                       bias=None), TypeError,
                 r"cuconv: input dtype int64 is not supported; expected one of .*float16.*float32.*float64",
                 id="dtype_integer"),
    pytest.param(_conv(x=lambda a: a.x.astype(numpy.complex128), weight=lambda a: a.w.astype(numpy.complex128),
                       bias=None), TypeError, r"cuconv: input dtype complex128 is not supported",
                 id="dtype_complex"),
    # ----- bias and out -------------------------------------------------------------------------------
    pytest.param(_conv(bias=lambda a: a.b[:5]), ValueError,
                 r"Given weight of size \[6, 4, 3, 3\], expected bias to be 1-dimensional with 6 elements, but "
                 r"got bias of size \[5\] instead", id="bias_wrong_length"),
    pytest.param(_conv(bias=lambda a: a.b[None]), ValueError,
                 r"expected bias to be 1-dimensional with 6 elements, but got bias of size \[1, 6\] instead",
                 id="bias_2d"),
    pytest.param(_conv(out=lambda a: numpy.empty((2, 6, 6, 5))), ValueError,
                 r"conv2d\(\): expected out of size \[2, 6, 6, 6\], but got out of size \[2, 6, 6, 5\]",
                 id="out_wrong_shape"),
    pytest.param(_conv(out=lambda a: numpy.empty((2, 6, 6, 6), dtype=numpy.float32)), TypeError,
                 r"conv2d\(\): expected out to have dtype float64, but got float32", id="out_wrong_dtype"),
    # ----- non-arrays ---------------------------------------------------------------------------------
    pytest.param(_conv(x=lambda a: a.x.tolist()), TypeError,
                 r"conv2d\(\): argument 'input' must be a NumPy or CuPy array, not list$", id="input_list"),
    pytest.param(_conv(weight=lambda a: a.w.tolist()), TypeError,
                 r"conv2d\(\): argument 'weight' must be a NumPy or CuPy array, not list", id="weight_list"),
    pytest.param(_conv(weight=None), TypeError,
                 r"conv2d\(\): argument 'weight' must be a NumPy or CuPy array, not NoneType", id="weight_none"),
    pytest.param(_conv(bias=lambda a: a.b.tolist()), TypeError,
                 r"conv2d\(\): argument 'bias' must be a NumPy or CuPy array, not list", id="bias_list"),
    pytest.param(_conv(x=lambda a: torch.from_numpy(a.x), weight=lambda a: torch.from_numpy(a.w), bias=None),
                 TypeError, r"argument 'input' must be a NumPy or CuPy array, not Tensor; for torch tensors use "
                 r"cuconv\.nn\.functional\.conv2d", id="input_torch_tensor"),
    # ----- algo and precision -------------------------------------------------------------------------
    pytest.param(_conv(algo="fft"), ValueError,
                 r"cuconv: unknown algo 'fft'; expected 'auto' or one of \('im2col_gemm',", id="algo_unknown"),
    pytest.param(_conv(algo=None), TypeError, r"conv2d\(\): argument 'algo' must be str, not NoneType",
                 id="algo_not_str"),
    pytest.param(_conv(precision="fp8"), ValueError,
                 r"cuconv: precision must be None or one of \('ieee', 'tf32'\), got 'fp8'", id="precision_unknown"),
    pytest.param(_conv(precision="TF32"), ValueError, r"precision must be None or one of .*, got 'TF32'",
                 id="precision_wrong_case"),
    # ----- cuconv.config --------------------------------------------------------------------------------
    pytest.param(_config_set("precision", "half"), ValueError,
                 r"precision must be one of \('ieee', 'tf32'\), got 'half'", id="config_precision"),
    pytest.param(_config_set("workspace_limit", 0), ValueError,
                 r"workspace_limit must be a positive int \(bytes\), got 0", id="config_workspace_0"),
    pytest.param(_config_set("workspace_limit", -4096), ValueError,
                 r"workspace_limit must be a positive int \(bytes\), got -4096", id="config_workspace_negative"),
    pytest.param(_config_set("workspace_limit", 1.5e9), TypeError,
                 r"workspace_limit must be a positive int \(bytes\), got float 1500000000\.0",
                 id="config_workspace_float"),
    pytest.param(_config_set("workspace_limit", True), TypeError,
                 r"workspace_limit must be a positive int \(bytes\), got bool True", id="config_workspace_bool"),
    pytest.param(_config_block(precision="bf16"), ValueError, r"precision must be one of", id="config_block_precision"),
    pytest.param(_config_block(workspace_limit=0), ValueError, r"workspace_limit must be a positive int",
                 id="config_block_workspace"),
    pytest.param(_config_block(workspace=1 << 20), TypeError,
                 r"config\(\) got unexpected keyword argument\(s\) \['workspace'\]", id="config_block_unknown_key"),
]


@pytest.fixture(autouse=True)
def restore_config():
    """A failing test must not leave changed defaults behind for the next one."""
    saved = cuconv.config.precision, cuconv.config.workspace_limit
    yield
    cuconv.config.precision, cuconv.config.workspace_limit = saved


@pytest.mark.parametrize("misuse,exc,message", MISUSES)
def test_misuse_raises(misuse, exc, message):
    with pytest.raises(exc, match=message) as raised:
        misuse(_arrays())
    # torch's wording, and where torch's class is RuntimeError (geometry, shapes, dtypes), that class too
    if raised.type in (cuconv.ConvValueError, cuconv.ConvTypeError):
        assert isinstance(raised.value, RuntimeError)


@pytest.mark.parametrize("misuse,exc,message", MISUSES)
def test_valid_call_after_misuse(misuse, exc, message):
    a = _arrays()
    config_before = repr(cuconv.config)
    with pytest.raises(exc):
        misuse(a)
    assert repr(cuconv.config) == config_before
    y = cuconv.conv2d(a.x, a.w, a.b, padding=1)
    assert y.shape == (2, 6, 8, 8)
    assert rel_err(y, reference(a.x, a.w, a.b, padding=1)) <= tolerance(numpy.float64)


@pytest.mark.parametrize("changes", [
    pytest.param(dict(precision="tf32", workspace_limit=0), id="good_precision_then_bad_limit"),
    pytest.param(dict(workspace_limit=1 << 20, precision="fp16"), id="good_limit_then_bad_precision"),
])
def test_failed_config_block_changes_nothing(changes):
    # A valid change applied before a later invalid one must be undone.
    before = repr(cuconv.config)
    with pytest.raises(ValueError, match=r"must be"):
        with cuconv.config(**changes):
            pass  # pragma: no cover - entering must fail
    assert repr(cuconv.config) == before


# Shapes at the edges, torch.nn.functional.conv2d on the CPU as the oracle: refused with its message where it
# refuses, the same result where it accepts (C = 0 is the one documented difference: tests/test_conv_cpu.py).
TORCH_EDGE_CASES = [
    pytest.param((1, 1, 4, 4), (1, 1, 0, 1), {}, id="kernel_height_0"),
    pytest.param((1, 1, 4, 4), (1, 1, 1, 0), {}, id="kernel_width_0"),
    pytest.param((1, 1, 4, 4), (0, 1, 3, 3), {}, id="no_filters"),
    pytest.param((1, 1, 4, 4), (0, 1, 0, 1), {}, id="no_filters_and_no_taps"),
    pytest.param((1, 3, 4, 4), (2, 1, 3, 3), dict(groups=3), id="fewer_filters_than_groups"),
    pytest.param((1, 1, 2, 2), (1, 1, 0, 5), {}, id="kernel_0_and_too_wide"),
    pytest.param((1, 1, 4, 0), (1, 1, 1, 1), dict(padding=1), id="width_0_padded"),
    pytest.param((1, 1, 0, 4), (1, 1, 1, 1), dict(padding=1), id="height_0_padded"),
    pytest.param((1, 1, 0, 4), (1, 1, 0, 1), {}, id="height_0_and_no_taps"),
    pytest.param((0, 1, 0, 4), (2, 1, 1, 1), dict(padding=1), id="empty_batch_height_0"),
    pytest.param((2, 1, 4, 5), (3, 1, 3, 3), dict(stride=2**59), id="stride_2pow59"),
    pytest.param((2, 1, 4, 5), (3, 1, 3, 3), dict(stride=(1, 2**62)), id="stride_2pow62"),
    pytest.param((2, 1, 4, 5), (3, 1, 3, 3), dict(stride=2**63), id="stride_2pow63"),
    pytest.param((2, 1, 4, 5), (3, 1, 3, 3), dict(dilation=2**40), id="dilation_2pow40"),
]


def _outcome(call):
    try:
        return call()
    except (RuntimeError, ValueError, TypeError) as exc:
        return str(exc).splitlines()[0]


@pytest.mark.parametrize("x_shape,w_shape,kwargs", TORCH_EDGE_CASES)
def test_edge_shapes_as_torch(x_shape, w_shape, kwargs):
    import cuconv.nn.functional as F

    rng = numpy.random.default_rng(43)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    expected = _outcome(lambda: torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), **kwargs))
    for got in (_outcome(lambda: cuconv.conv2d(x, w, **kwargs)),
                _outcome(lambda: F.conv2d(torch.from_numpy(x), torch.from_numpy(w), **kwargs))):
        if isinstance(expected, str):
            assert got == expected
        else:
            got = numpy.asarray(got)
            assert got.shape == tuple(expected.shape)
            assert rel_err(got, expected.numpy()) <= tolerance(numpy.float64)


# ----- cuconv.config: process-wide by assignment, per thread and task for a block ---------------------------------
def test_config_blocks_in_threads_see_only_their_own_values():
    import threading

    barrier = threading.Barrier(8)
    seen = {}

    def worker(i):
        limit = (i + 1) << 20
        with cuconv.config(workspace_limit=limit, precision="tf32" if i % 2 else "ieee"):
            barrier.wait()  # every thread inside its block at once
            seen[i] = [(cuconv.config.workspace_limit, cuconv.config.precision) for _ in range(1500)]
            barrier.wait()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, reads in seen.items():
        assert set(reads) == {((i + 1) << 20, "tf32" if i % 2 else "ieee")}, i
    assert (cuconv.config.workspace_limit, cuconv.config.precision) == (1 << 30, "ieee")


def test_config_blocks_left_out_of_order_across_threads_restore_the_default():
    import threading

    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def block(limit, entered, wait_for, left=None):
        with cuconv.config(workspace_limit=limit):
            entered.set()
            wait_for.wait(5)
        if left is not None:
            left.set()

    ta = threading.Thread(target=block, args=(1 << 20, a_in, b_in, a_out))
    tb = threading.Thread(target=block, args=(2 << 20, b_in, a_out))
    ta.start()
    a_in.wait(5)
    tb.start()  # A entered, B enters, A leaves, then B leaves
    ta.join()
    tb.join()
    assert cuconv.config.workspace_limit == 1 << 30


def test_config_assignment_is_process_wide_and_new_threads_start_from_it():
    import threading

    seen = []
    with cuconv.config(precision="tf32"):
        cuconv.config.workspace_limit = 5 << 20
        t = threading.Thread(target=lambda: seen.append((cuconv.config.precision, cuconv.config.workspace_limit)))
        t.start()
        t.join()
    assert seen == [("ieee", 5 << 20)]  # the assignment reaches it, the block's precision does not


def test_config_blocks_in_asyncio_tasks_are_their_own():
    import asyncio

    async def task(limit):
        with cuconv.config(workspace_limit=limit):
            await asyncio.sleep(0.01)
            return cuconv.config.workspace_limit

    async def main():
        return await asyncio.gather(*(task((i + 1) << 20) for i in range(4)))

    assert asyncio.run(main()) == [(i + 1) << 20 for i in range(4)]


@pytest.mark.parametrize("name", ["precison", "workspace", "Precision"])
def test_config_unknown_setting_raises(name):
    with pytest.raises(AttributeError, match=rf"cuconv\.config has no setting '{name}'"):
        setattr(cuconv.config, name, "tf32")
    with pytest.raises(AttributeError):
        getattr(cuconv.config, name)


# ----- refusals of the geometry, in torch's order -----------------------------------------------------------------
_TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def _first_refusal(call):
    try:
        call()
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as exc:
        return type(exc), str(exc).splitlines()[0]
    return None


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_geometry_refusals_follow_torchs_order_and_words(rank):
    """Every combination of a bad or good padding (negative, 'same', 'valid'), stride (negative, zero, 2), dilation
    (negative, zero), groups (zero, negative, more than the filters, not dividing them) and channels (matching or
    not), through conv1d, conv2d and conv3d on tensors and on NumPy arrays: the error torch raises first, of its
    class (or a subclass) and in its words, or none where torch raises none. (torch checks these in its order,
    at::_convolution then check_shape_forward; a refusal out of that order names the wrong argument.)"""
    import itertools

    import cuconv.nn.functional as F

    ops = {1: (torch.nn.functional.conv1d, F.conv1d, cuconv.conv1d),
           2: (torch.nn.functional.conv2d, F.conv2d, cuconv.conv2d),
           3: (torch.nn.functional.conv3d, F.conv3d, cuconv.conv3d)}
    theirs, ours, arrays = ops[rank]
    rng = numpy.random.default_rng(rank)
    mismatches = []
    for pad, stride, dilation, groups, channels_match, filters in itertools.product(
            (0, -1, "same", "valid"), (1, -1, 0, 2), (1, -1, 0), (1, 0, -1, 3), (True, False), (2, 4)):
        x = torch.from_numpy(rng.standard_normal((1, 2 if channels_match else 3) + (5,) * rank))
        w = torch.from_numpy(rng.standard_normal((filters, 2 if channels_match else 1) + (2,) * rank))
        kwargs = dict(padding=pad, stride=stride, dilation=dilation, groups=groups)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (torch's warning for 'same' with even kernels)
            expected = _first_refusal(lambda: theirs(x, w, **kwargs))
        for got in (_first_refusal(lambda: ours(x, w, **kwargs)),
                    _first_refusal(lambda: arrays(x.numpy(), w.numpy(), **kwargs))):
            if (expected is None) != (got is None) or (expected is not None and (
                    not issubclass(got[0], expected[0]) or got[1] != expected[1])):
                mismatches.append((kwargs, channels_match, filters, expected, got))
    if _TORCH_VERSION < (2, 13):
        # (torch before 2.13, 2.11 as measured, works out 'same' padding from a negative dilation before it checks
        # the dilation and refuses the negative padding; cuconv follows the torch this project pins, 2.13)
        mismatches = [m for m in mismatches if not (m[0]["padding"] == "same" and m[0]["dilation"] < 0 and m[3] == (
            RuntimeError, "negative padding is not supported") and m[4][1] == "dilation should be greater than zero")]
    assert mismatches == []


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_a_dtype_mismatch_is_refused_before_an_unsupported_dtype(rank):
    """torch's error input for conv: an integer input and weight with a floating bias is a mismatch ("should be the
    same", a RuntimeError), not an unsupported integer input."""
    import cuconv.nn.functional as F

    op = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[rank]
    x = torch.ones((1, 1) + (4,) * rank, dtype=torch.int64)
    w = torch.ones((1, 1) + (2,) * rank, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="should be the same"):
        op(x, w, torch.ones(1, dtype=torch.float64))


@pytest.mark.parametrize("door", ["conv2d_input", "conv2d_weight"])
def test_backward_door_refusals_follow_torch_nn_grads_order_and_words(door):
    """The same table through ``conv2d_input`` and ``conv2d_weight`` against ``torch.nn.grad``'s, whose
    ``convolution_backward`` checks in another order (the groups after the dilation, in other words). grad_output
    has the convolution's output size where the geometry has one: torch's refusal of a wrong size is its CPU
    backend's (its words differ for a dilated or a grouped convolution), cuconv's one message names both sizes.
    (Padding strings are left out: torch.nn.grad refuses them as a schema mismatch, cuconv takes them as conv2d
    does.)"""
    import itertools

    rng = numpy.random.default_rng(5)
    mismatches = []
    for pad, stride, dilation, groups, channels_match, filters in itertools.product(
            (0, -1, 1), (1, -1, 0, 2), (1, -1, 0), (1, 0, -1, 3), (True, False), (2, 4)):
        x = torch.from_numpy(rng.standard_normal((1, 2 if channels_match else 3, 5, 5)))
        w = torch.from_numpy(rng.standard_normal((filters, 2 if channels_match else 1, 2, 2)))
        kwargs = dict(padding=pad, stride=stride, dilation=dilation, groups=groups)
        try:
            dy = torch.from_numpy(rng.standard_normal(torch.nn.functional.conv2d(x, w, **kwargs).shape))
        except RuntimeError:
            dy = torch.from_numpy(rng.standard_normal((1, filters, 4, 4)))
        if door == "conv2d_input":
            expected = _first_refusal(lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, **kwargs))
            got = _first_refusal(lambda: cuconv.conv2d_input(x.shape, w.numpy(), dy.numpy(), **kwargs))
        else:
            expected = _first_refusal(lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, **kwargs))
            got = _first_refusal(lambda: cuconv.conv2d_weight(x.numpy(), w.shape, dy.numpy(), **kwargs))
        if (expected is None) != (got is None) or (expected is not None and (
                not issubclass(got[0], expected[0]) or got[1] != expected[1])):
            mismatches.append((kwargs, channels_match, filters, expected, got))
    assert mismatches == []


def test_backward_doors_refuse_ranks_before_dtypes_and_dtypes_before_sizes():
    """torch.nn.grad's order after the geometry: grad_output of the input's rank (its words), then the dtypes,
    then grad_output's size; a bad geometry is named before a dtype mismatch."""
    x, w, dy = numpy.ones((1, 2, 5, 5)), numpy.ones((4, 2, 2, 2)), numpy.ones((1, 4, 4, 4))
    rank = "Expected input and grad_output to have the same number of dimensions, but got: 4 and 5"
    with pytest.raises(RuntimeError, match=rank):
        cuconv.conv2d_input(x.shape, w.astype(numpy.float32), dy[None])
    with pytest.raises(RuntimeError, match=rank):
        cuconv.conv2d_weight(x, w.shape, dy[None].astype(numpy.float32))
    with pytest.raises(RuntimeError, match="should be the same"):
        cuconv.conv2d_input(x.shape, w.astype(numpy.float32), dy[:, :3])
    with pytest.raises(RuntimeError, match="negative padding is not supported"):
        cuconv.conv2d_input(x.shape, w.astype(numpy.float32), dy, padding=-1)
    with pytest.raises(RuntimeError, match="expected groups to be greater than 0, but got groups=0"):
        cuconv.conv2d_weight(x, w.shape, dy.astype(numpy.float32), groups=0)
    with pytest.raises(RuntimeError, match=r"Expected grad_output of size \[1, 4, 4, 4\]"):
        cuconv.conv2d_weight(x, w.shape, dy[:, :3])


def test_transposed_convolution_names_its_input_in_a_dtype_refusal():
    with pytest.raises(RuntimeError, match=r"Input type \(float64\) and weight type \(float32\) should be the same"):
        cuconv.conv_transpose2d(numpy.ones((1, 4, 5, 5)), numpy.ones((4, 2, 2, 2), numpy.float32))


def test_transposed_geometry_refusals_follow_torchs_order_and_words():
    """The same for conv_transpose2d, with its output padding (negative, at or above the stride and the
    dilation): torch's first error or none, on tensors and on NumPy arrays."""
    import itertools

    import cuconv.nn.functional as F

    rng = numpy.random.default_rng(4)
    mismatches = []
    for pad, stride, dilation, groups, output_padding, channels_match, filters in itertools.product(
            (0, -1, 1), (1, -1, 0, 2), (1, -1, 0), (1, 0, -1, 3), (0, 1, -1, 3), (True, False), (2, 4)):
        x = torch.from_numpy(rng.standard_normal((1, filters if channels_match else 3, 5, 5)))
        w = torch.from_numpy(rng.standard_normal((filters, 2, 2, 2)))
        kwargs = dict(padding=pad, stride=stride, dilation=dilation, groups=groups, output_padding=output_padding)
        expected = _first_refusal(lambda: torch.nn.functional.conv_transpose2d(x, w, **kwargs))
        for got in (_first_refusal(lambda: F.conv_transpose2d(x, w, **kwargs)),
                    _first_refusal(lambda: cuconv.conv_transpose2d(x.numpy(), w.numpy(), **kwargs))):
            if (expected is None) != (got is None) or (expected is not None and (
                    not issubclass(got[0], expected[0]) or got[1] != expected[1])):
                mismatches.append((kwargs, channels_match, filters, expected, got))
    assert mismatches == []
