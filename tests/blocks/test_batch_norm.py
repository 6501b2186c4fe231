"""The train-mode BatchNorm kernels (``batch_norm``): their NumPy twin against torch's autograd in float64 (the
formulas the kernels compute: statistics, epilogue, the activation's derivative at torch's side of each kink, the
backward's two sums and dy), and on the GPU the kernels against the twin, NCHW and channels-last, every type, into
NaN-poisoned outputs."""

import numpy
import pytest

from cuconv.blocks import batch_norm
from cuconv.problem import ACTIVATIONS

torch = pytest.importorskip("torch")

_ACTS = [None, *ACTIVATIONS]


def _torch_block(y, gamma, beta, residual, position, activation, alpha, eps):
    import cuconv.nn.fuse as fuse

    u = torch.nn.functional.batch_norm(y, None, None, gamma, beta, True, 0.0, eps)
    return fuse.apply_epilogue(u, activation, alpha, residual, position)


def _case(seed, shape=(3, 5, 4, 6)):
    rng = numpy.random.default_rng(seed)
    y = rng.standard_normal(shape) * 2 + 3
    gamma, beta = rng.standard_normal(shape[1]), rng.standard_normal(shape[1])
    residual = rng.standard_normal(shape)
    dz = rng.standard_normal(shape)
    return y, gamma, beta, residual, dz


@pytest.mark.parametrize("position", [None, "before", "after"])
@pytest.mark.parametrize("activation", _ACTS, ids=str)
def test_the_twin_is_torchs_block_and_its_gradients(activation, position):
    y, gamma, beta, residual, dz = _case(1)
    res = residual if position else None
    out, mean, invstd = batch_norm.forward_numpy(y, gamma, beta, res, position, activation, 0.2, 1e-5)
    t = [torch.tensor(a, requires_grad=True) for a in (y, gamma, beta, residual)]
    want = _torch_block(t[0], t[1], t[2], t[3] if position else None, position, activation, 0.2, 1e-5)
    numpy.testing.assert_allclose(out, want.detach().numpy(), rtol=1e-12, atol=1e-12)
    want.backward(torch.tensor(dz))
    dy, d_gamma, d_beta, d_res = batch_norm.backward_numpy(dz, y, gamma, beta, res, position, activation, 0.2, 1e-5)
    for got, ref in ((dy, t[0].grad), (d_gamma, t[1].grad), (d_beta, t[2].grad)):
        numpy.testing.assert_allclose(got, ref.numpy(), rtol=1e-10, atol=1e-10)
    if position:
        numpy.testing.assert_allclose(d_res, t[3].grad.numpy(), rtol=1e-10, atol=1e-10)


def test_the_activation_derivatives_take_torchs_side_at_each_kink():
    points = numpy.array([-3.0, 0.0, 3.0, 6.0, -1.5, 2.5])
    for activation in ACTIVATIONS:
        x = torch.tensor(points, requires_grad=True)
        import cuconv.nn.fuse as fuse

        fuse._apply_activation(x, activation, 0.2).sum().backward()
        numpy.testing.assert_allclose(batch_norm._activation_grad(points, activation, 0.2), x.grad.numpy(),
                                      rtol=1e-12, err_msg=activation)


def test_types_without_kernels_are_refused_before_any_lookup():
    assert batch_norm.supports(numpy.float32) and batch_norm.supports(numpy.float16)
    assert not batch_norm.supports(numpy.float64)
    assert batch_norm.activation_code(None) == 0 and batch_norm.activation_code("sigmoid") == 9


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("activation,position", [(None, None), ("relu", "before"), ("silu", "after"),
                                                 ("hardswish", None), ("gelu", "before")])
@pytest.mark.parametrize("shape", [(2, 40, 7, 9), (3, 64, 1, 1), (5, 3, 33, 31)], ids=str)
def test_the_kernels_match_the_twin(shape, activation, position, dtype_name, channels_last):
    import cuconv.nn.fuse_train as fuse_train

    dtype = getattr(torch, dtype_name)
    y64, gamma, beta, residual, dz = _case(7, shape)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    dev = lambda a, t=dtype: torch.tensor(a, dtype=t, device="cuda").contiguous(memory_format=fmt)  # noqa: E731
    y, r, g = dev(y64), dev(residual), dev(dz)
    yq, rq, gq = (t.double().cpu().numpy() for t in (y, r, g))  # (the inputs as the kernels read them)
    res = rq if position else None
    launches = batch_norm.launches(fuse_train.batch_norm_dtype(dtype), channels_last, shape[0], shape[1],
                                   shape[2] * shape[3], activation, {None: 0, "before": 1, "after": 2}[position],
                                   0.0, 1e-5, 0.1)
    c = shape[1]
    f32 = dict(dtype=torch.float32, device="cuda")
    parts = torch.full((2, launches.chunks, c), float("nan"), **f32)
    stats = torch.full((4, c), float("nan"), **f32)
    gm, bt = torch.tensor(gamma, **f32), torch.tensor(beta, **f32)
    rm, rv = torch.zeros(c, **f32), torch.ones(c, **f32)
    out = torch.full_like(y, float("nan"))
    s = torch.cuda.current_stream().cuda_stream
    launches.stats(s, y.data_ptr(), parts[0].data_ptr(), parts[1].data_ptr())
    launches.finalize(s, parts[0].data_ptr(), parts[1].data_ptr(), y.data_ptr(), gm.data_ptr(), bt.data_ptr(),
                      rm.data_ptr(), rv.data_ptr(), 0, *(stats[i].data_ptr() for i in range(4)))
    launches.apply(s, y.data_ptr(), r.data_ptr() if position else 0, stats[2].data_ptr(), stats[3].data_ptr(),
                   out.data_ptr())
    want, mean, invstd = batch_norm.forward_numpy(yq, gm.double().cpu().numpy(), bt.double().cpu().numpy(), res,
                                                  position, activation, 0.0, 1e-5)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    err = numpy.linalg.norm(out.double().cpu().numpy() - want) / numpy.linalg.norm(want)
    assert err <= tol
    numpy.testing.assert_allclose(stats[0].cpu().numpy(), mean, rtol=1e-5, atol=1e-5)
    numpy.testing.assert_allclose(stats[1].cpu().numpy(), invstd, rtol=1e-4)
    m = shape[0] * shape[2] * shape[3]
    numpy.testing.assert_allclose(rm.cpu().numpy(), 0.1 * mean, rtol=1e-5, atol=1e-6)
    numpy.testing.assert_allclose(rv.cpu().numpy(), 0.9 + 0.1 * yq.var(axis=(0, 2, 3)) * m / (m - 1), rtol=1e-5)
    sums = torch.full((4, c), float("nan"), **f32)
    d_res = torch.full_like(y, float("nan")) if position == "before" else None
    dy = torch.full_like(y, float("nan"))
    launches.backward_sums(s, g.data_ptr(), y.data_ptr(), r.data_ptr() if position else 0, stats[2].data_ptr(),
                           stats[3].data_ptr(), stats[0].data_ptr(), stats[1].data_ptr(), parts[0].data_ptr(),
                           parts[1].data_ptr(), 0 if d_res is None else d_res.data_ptr())
    launches.backward_finalize(s, parts[0].data_ptr(), parts[1].data_ptr(), *(sums[i].data_ptr() for i in range(4)))
    launches.backward_dy(s, g.data_ptr(), y.data_ptr(), r.data_ptr() if position else 0, stats[2].data_ptr(),
                         stats[3].data_ptr(), stats[0].data_ptr(), stats[1].data_ptr(), sums[2].data_ptr(),
                         sums[3].data_ptr(), dy.data_ptr())
    w_dy, w_dg, w_db, w_dres = batch_norm.backward_numpy(gq, yq, gm.double().cpu().numpy(),
                                                         bt.double().cpu().numpy(), res, position, activation, 0.0,
                                                         1e-5)
    for got, ref in ((dy, w_dy), (sums[1], w_dg), (sums[0], w_db)) + (((d_res, w_dres),) if d_res is not None else ()):
        got = got.double().cpu().numpy()
        assert numpy.linalg.norm(got - ref) <= tol * (numpy.linalg.norm(ref) + 1e-3 * numpy.sqrt(ref.size))
