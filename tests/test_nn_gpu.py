"""cuconv.nn on CUDA tensors: values and grads, zero-copy, streams, no syncs, compile, graphs, training."""

from __future__ import annotations

import numpy
import pytest

from cases import CASES, PROBLEM_CASES, TORCH_ERROR_FACTOR, bound, make_inputs, rel_err, tolerance

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
import cuconv  # noqa: E402
import cuconv.nn  # noqa: E402
import cuconv.nn.functional as F  # noqa: E402


@pytest.fixture(autouse=True)
def _ieee_fp32():
    """torch's own float32 convolutions as a baseline run without TF32, stated explicitly."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = saved


def _grads(fn, x, w, b, dy):
    out = fn(x, w, b)
    return (out,) + torch.autograd.grad(out, (x, w) + ((b,) if b is not None else ()), dy)


@pytest.mark.parametrize("dtype_name", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", CASES + PROBLEM_CASES)
def test_forward_and_grads_match_oracle(case, dtype_name):
    x, w, b = make_inputs(case, seed=21)
    dtype = getattr(torch, dtype_name)
    leaf = lambda a, dev, dt: None if a is None else torch.from_numpy(a).to(dev, dt).requires_grad_()
    kw = case.kwargs
    ref_in = [leaf(a, "cpu", torch.float64) for a in (x, w, b)]
    ref_out = torch.nn.functional.conv2d(*ref_in, **kw)
    dy = torch.randn(ref_out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(22))
    # quantise every input to the dtype so the oracle sees what the kernels see
    q = lambda t: None if t is None else t.detach().to(dtype).double().requires_grad_()
    ref = _grads(lambda *a: torch.nn.functional.conv2d(*a, **kw), q(ref_in[0]), q(ref_in[1]), q(ref_in[2]),
                 dy.to(dtype).double())
    ours_in = [None if a is None else a.detach().to("cuda", dtype).requires_grad_() for a in ref_in]
    ours = _grads(lambda *a: F.conv2d(*a, **kw), *ours_in, dy.to("cuda", dtype))
    theirs = _grads(lambda *a: torch.nn.functional.conv2d(*a, **kw), *[
        None if a is None else a.detach().clone().requires_grad_() for a in ours_in], dy.to("cuda", dtype))
    np_dtype = cuconv._dtypes.bfloat16 if dtype_name == "bfloat16" else numpy.dtype(dtype_name)
    for name, o, t, r in zip(("out", "dx", "dw", "db"), ours, theirs, ref):
        assert o.dtype == dtype and o.device.type == "cuda"
        r = r.detach().numpy()
        err = rel_err(o.detach().double().cpu().numpy(), r)
        assert err <= bound(r, np_dtype), f"{name} {err:.2e}"
        if dtype_name in ("float16", "bfloat16"):
            torch_err = rel_err(t.detach().double().cpu().numpy(), r)
            assert err <= max(TORCH_ERROR_FACTOR * torch_err, 1e-7), f"{name} {err:.2e} vs torch {torch_err:.2e}"


def test_gradcheck_float64_on_gpu():
    x = torch.randn(2, 4, 7, 6, dtype=torch.float64, device="cuda", requires_grad=True)
    w = torch.randn(6, 2, 3, 2, dtype=torch.float64, device="cuda", requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, device="cuda", requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2), (x, w, b))


def test_tensors_cross_zero_copy():
    from cuconv.nn import _bridge

    t = torch.randn(2, 3, 8, 8, device="cuda")
    assert _bridge.as_array(t).data.ptr == t.data_ptr()
    h = torch.randn(2, 3, 8, 8, device="cuda", dtype=torch.bfloat16)
    assert _bridge.as_array(h).data.ptr == h.data_ptr()


def test_memory_growth_is_output_plus_workspace():
    """A large call holds at most its output plus the documented workspace bound, in torch's pool."""
    x = torch.randn(16, 32, 256, 256, device="cuda")
    w = torch.randn(64, 32, 5, 9, device="cuda")
    F.conv2d(x, w)  # warm: kernels compiled, handles created
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    y = F.conv2d(x, w)
    torch.cuda.synchronize()
    growth = torch.cuda.max_memory_allocated() - base
    assert growth <= y.numel() * y.element_size() + cuconv.config.workspace_limit + (2 << 20)
    assert growth > y.numel() * y.element_size(), "the column buffer did not come from torch's allocator"


def test_no_host_synchronisation():
    x = torch.randn(4, 8, 32, 32, device="cuda", requires_grad=True)
    conv = cuconv.nn.Conv2d(8, 16, 3, padding=1).cuda()
    conv(x).sum().backward()  # warm-up (compilation may sync)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        conv(x).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_runs_on_torchs_current_stream():
    """A producer still running on a side stream must be waited for: our kernels are ordered after it."""
    torch.manual_seed(23)
    x0 = torch.randn(8, 16, 128, 128, device="cuda")
    w = torch.randn(32, 16, 3, 3, device="cuda")
    ref = torch.nn.functional.conv2d((x0 * 2).double(), w.double())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(20):  # a long queue on `side` before the input is ready
            torch.cuda._sleep(1000000)
        x = x0 * 2
        y = F.conv2d(x, w)
    torch.cuda.current_stream().wait_stream(side)
    assert rel_err(y.double().cpu().numpy(), ref.cpu().numpy()) <= tolerance(numpy.float32)


def test_torch_compile_fullgraph():
    model = torch.nn.Sequential(cuconv.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                cuconv.nn.Conv2d(8, 4, (3, 5), stride=2)).cuda()
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(2, 3, 16, 16, device="cuda", requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    eager, comp = model(x), compiled(x2)
    assert torch.allclose(eager, comp, rtol=1e-5, atol=1e-5)
    eager.sum().backward()
    comp.sum().backward()
    assert torch.allclose(x.grad, x2.grad, rtol=1e-5, atol=1e-5)


def test_cuda_graph_capture_and_replay():
    model = torch.nn.Sequential(cuconv.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                cuconv.nn.Conv2d(8, 4, 3)).cuda()
    static_x = torch.randn(4, 3, 32, 32, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = model(static_x)
    for seed in (0, 1):
        static_x.copy_(torch.randn(4, 3, 32, 32, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.allclose(static_y, model(static_x), rtol=1e-5, atol=1e-5)


def _small_cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 16, 3, stride=2, padding=1),
        torch.nn.ReLU(), torch.nn.Conv2d(16, 16, (3, 5), padding="same", groups=2), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10))


def test_training_50_steps_matches_torch():
    """A small CNN trained 50 steps on fixed data: the converted model's losses follow torch's (fp32 IEEE)."""
    gen = torch.Generator().manual_seed(24)
    labels = torch.randint(0, 10, (64,), generator=gen)
    patterns = torch.randn(10, 1, 16, 16, generator=gen)  # one image per class, plus noise: learnable
    data = (patterns[labels] + 0.5 * torch.randn(64, 1, 16, 16, generator=gen)).cuda()
    labels = labels.cuda()
    losses = {}
    for kind in ("torch", "cuconv"):
        torch.manual_seed(25)
        model = _small_cnn().cuda()
        if kind == "cuconv":
            cuconv.nn.convert(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        trace = []
        for _ in range(50):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(data), labels)
            loss.backward()
            opt.step()
            trace.append(loss.item())
        losses[kind] = numpy.array(trace)
    assert losses["cuconv"][-1] < losses["cuconv"][0] * 0.95, "the converted model did not train"
    numpy.testing.assert_allclose(losses["cuconv"], losses["torch"], rtol=1e-3)


def test_converted_resnet_block_same_outputs_and_grads():
    class BasicBlock(torch.nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn1 = torch.nn.BatchNorm2d(c)
            self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = torch.nn.BatchNorm2d(c)

        def forward(self, x):
            return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))

    torch.manual_seed(26)
    block = BasicBlock(16).cuda().double().eval()
    x = torch.randn(4, 16, 20, 20, device="cuda", dtype=torch.float64, requires_grad=True)
    before = block(x)
    (gx_before,) = torch.autograd.grad(before.sum(), x)
    gw_before = torch.autograd.grad(block(x).sum(), block.conv1.weight)[0]
    cuconv.nn.convert(block)
    assert type(block.conv1) is cuconv.nn.Conv2d
    after = block(x)
    (gx_after,) = torch.autograd.grad(after.sum(), x)
    gw_after = torch.autograd.grad(block(x).sum(), block.conv1.weight)[0]
    for a, b in ((after, before), (gx_after, gx_before), (gw_after, gw_before)):
        assert rel_err(a.detach().cpu().numpy(), b.detach().cpu().numpy()) <= 1e-12


def test_tensors_on_the_second_gpu_run_there():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: this machine has one")
    x = torch.randn(2, 3, 8, 8, device="cuda:1")
    w = torch.randn(4, 3, 3, 3, device="cuda:1")
    y = F.conv2d(x, w)
    assert y.device == x.device
    assert torch.allclose(y, torch.nn.functional.conv2d(x, w), rtol=1e-5, atol=1e-5)
