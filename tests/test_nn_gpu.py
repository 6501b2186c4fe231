"""cuconv.nn on CUDA tensors: values and grads, zero-copy, streams, no syncs, compile, graphs, training."""

from __future__ import annotations

import copy

import numpy
import pytest

from cases import CASES, PROBLEM_CASES, TORCH_ERROR_FACTOR, bound, captured, make_inputs, rel_err, tolerance

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


@pytest.mark.parametrize("check", [torch.autograd.gradcheck, torch.autograd.gradgradcheck],
                         ids=["gradcheck", "gradgradcheck"])
def test_gradchecks_float64_on_gpu(check):
    x = torch.randn(2, 4, 7, 6, dtype=torch.float64, device="cuda", requires_grad=True)
    w = torch.randn(6, 2, 3, 2, dtype=torch.float64, device="cuda", requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, device="cuda", requires_grad=True)
    assert check(lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
                 (x, w, b))


def test_forward_mode_ad_on_gpu_matches_torch():
    gen = torch.Generator(device="cuda").manual_seed(46)
    primals = tuple(torch.randn(s, dtype=torch.float64, device="cuda", generator=gen)
                    for s in ((2, 4, 9, 8), (6, 4, 3, 3), (6,)))
    tangents = tuple(torch.randn_like(p) for p in primals)
    got = torch.func.jvp(lambda *t: F.conv2d(*t, padding=1), primals, tangents)[1]
    expected = torch.func.jvp(lambda *t: torch.nn.functional.conv2d(*t, padding=1), primals, tangents)[1]
    assert rel_err(got.cpu().numpy(), expected.cpu().numpy()) <= tolerance(numpy.float64)


def test_tensors_cross_zero_copy(monkeypatch):
    """The plans get the tensors' own data pointers (no copy) and torch's current stream."""
    from cuconv import _plan

    seen = []
    real_run = _plan.Plan.run
    monkeypatch.setattr(_plan.Plan, "run", lambda self, ptrs, stream, ws=0: (seen.append((ptrs, stream)),
                                                                           real_run(self, ptrs, stream, ws))[1])
    for dtype in (torch.float32, torch.bfloat16):
        t = torch.randn(2, 3, 8, 8, device="cuda", dtype=dtype)
        w = torch.randn(4, 3, 3, 3, device="cuda", dtype=dtype)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = F.conv2d(t, w)
        ptrs, stream = seen[-1]
        assert ptrs[:2] == (t.data_ptr(), w.data_ptr()) and ptrs[3] == y.data_ptr()
        assert stream == side.cuda_stream
        torch.cuda.current_stream().wait_stream(side)


@pytest.mark.parametrize("tf32", [False, True], ids=["ieee", "tf32"])
def test_memory_growth_is_output_plus_workspace(tf32):
    """A large call holds at most its output plus the documented workspace bound, in torch's pool."""
    from cuconv.nn import _bridge

    torch.backends.cudnn.allow_tf32 = tf32
    x = torch.randn(16, 32, 256, 256, device="cuda")
    w = torch.randn(64, 32, 5, 9, device="cuda")
    F.conv2d(x, w)  # warm: kernels compiled, handles created
    torch.cuda.synchronize()
    _bridge._kept.buffers = {}  # (a workspace this call keeps for the next ones is allocated in it)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    y = F.conv2d(x, w)
    torch.cuda.synchronize()
    growth = torch.cuda.max_memory_allocated() - base
    assert growth <= y.numel() * y.element_size() + cuconv.config.workspace_limit + (2 << 20)
    assert growth > y.numel() * y.element_size(), "the workspace did not come from torch's allocator"


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


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_torch_compile_fullgraph_channels_last(dtype):
    """A channels-last model (weights too) under torch.compile(fullgraph=True): the custom ops give channels-last
    results with the strides their fake implementations promise; outputs, input and weight gradients equal
    eager's (the same layers' plans)."""
    model = torch.nn.Sequential(cuconv.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
                                cuconv.nn.Conv2d(32, 32, 3, stride=2, padding=1, groups=2),
                                cuconv.nn.Conv2d(32, 32, 3, padding=1, groups=32),
                                cuconv.nn.Conv2d(32, 16, 1)).to("cuda", dtype).to(memory_format=torch.channels_last)
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(2, 16, 12, 12, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    x2 = x.detach().clone(memory_format=torch.channels_last).requires_grad_()
    eager, comp = model(x), compiled(x2)
    assert eager.is_contiguous(memory_format=torch.channels_last)
    assert comp.is_contiguous(memory_format=torch.channels_last)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(comp, eager, rtol=tol, atol=tol)
    eager.float().square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    comp.float().square().sum().backward()
    torch.testing.assert_close(x2.grad, x.grad, rtol=tol, atol=tol)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g, rtol=tol, atol=tol)


def test_cuda_graph_capture_and_replay():
    model = torch.nn.Sequential(cuconv.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                cuconv.nn.Conv2d(8, 4, 3)).cuda()
    static_x = torch.randn(4, 3, 32, 32, device="cuda")
    graph, static_y = captured(model, static_x, warmups=3)
    for seed in (0, 1):
        static_x.copy_(torch.randn(4, 3, 32, 32, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.allclose(static_y, model(static_x), rtol=1e-5, atol=1e-5)


def _workspace_layer():
    """A converted layer whose eager passes use a workspace under ``_bridge._KEPT_MAX`` (im2col_gemm's column
    matrix), and an input."""
    from cuconv.nn import _bridge

    torch.manual_seed(29)
    conv = cuconv.nn.Conv2d(16, 24, 3, padding=1, bias=False, algo="im2col_gemm").cuda()
    x = torch.randn(4, 16, 20, 20, device="cuda")
    with torch.no_grad():
        conv(x)
    layer = next(l for l in F._layers.values() if l.spec.input_shape == (4, 16, 20, 20) and l.algo == "im2col_gemm")
    assert 0 < layer.fprop.workspace <= _bridge._KEPT_MAX
    return conv, x


def _reference(conv, x):
    return torch.nn.functional.conv2d(x.double(), conv.weight.detach().double(), None, 1, 1)


def test_eager_workspaces_kept_per_thread_and_stream():
    """Eager calls on one stream from two threads at once, and on two streams, each reuse a buffer of their own
    (thread, device, stream): every result equals the float64 reference."""
    import threading

    from cuconv.nn import _bridge

    conv, _ = _workspace_layer()
    inputs = [torch.randn(4, 16, 20, 20, device="cuda", generator=torch.Generator("cuda").manual_seed(s))
              for s in range(4)]
    refs = [_reference(conv, x) for x in inputs]
    errors, results = [], {}

    def work(name, stream):
        try:
            with torch.cuda.stream(stream), torch.no_grad():
                results[name] = [conv(inputs[i % 4]) for i in range(40)]
            stream.synchronize()
            results[name + " buffers"] = dict(getattr(_bridge._kept, "buffers", {}))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    shared, side = torch.cuda.current_stream(), torch.cuda.Stream()
    threads = [threading.Thread(target=work, args=(name, stream))
               for name, stream in (("a", shared), ("b", shared), ("c", side))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert not errors, errors
    for name in "abc":
        for i, y in enumerate(results[name]):
            assert rel_err(y.double().cpu().numpy(), refs[i % 4].cpu().numpy()) <= tolerance(numpy.float32), (name, i)
        stream = shared if name != "c" else side
        assert list(results[name + " buffers"]) == [(torch.cuda.current_device(), stream.cuda_stream)]


def test_captured_graph_keeps_its_own_workspace():
    """A CUDA graph captured from eager calls allocates its workspaces in its own pool, not in the thread's kept
    buffers (which eager calls between replays, or on other streams beside them, write): replays compute the
    reference."""
    from cuconv.nn import _bridge

    conv, x = _workspace_layer()
    static_x = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            conv(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    kept = dict(getattr(_bridge._kept, "buffers", {}))
    with torch.cuda.graph(graph), torch.no_grad():
        static_y = conv(static_x)
    after = getattr(_bridge._kept, "buffers", {})
    assert after.keys() == kept.keys() and all(after[key] is kept[key] for key in kept)
    for seed in range(3):
        static_x.copy_(torch.randn(4, 16, 20, 20, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)))
        graph.replay()
        with torch.no_grad():
            other = conv(torch.randn_like(static_x))  # (writes the kept buffer after the replay was enqueued)
            graph.replay()
        torch.cuda.synchronize()
        expected = _reference(conv, static_x).cpu().numpy()
        assert rel_err(static_y.double().cpu().numpy(), expected) <= tolerance(numpy.float32), seed
        assert other.isfinite().all()


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


# ----- the planned path: a layer seen before ------------------------------------------------------------------
def _valid_call():
    gen = torch.Generator(device="cuda").manual_seed(40)
    x = torch.randn(2, 4, 10, 9, device="cuda", generator=gen)
    w = torch.randn(6, 4, 3, 3, device="cuda", generator=gen)
    b = torch.randn(6, device="cuda", generator=gen)
    return x, w, b


PLANNED_MISUSES = [
    pytest.param(lambda x, w, b: F.conv2d(x, w.half(), b, padding=1), TypeError,
                 r"Input type \(torch\.float32\) and weight type \(torch\.float16\) should be the same", id="w_dtype"),
    pytest.param(lambda x, w, b: F.conv2d(x, w, b.double(), padding=1), TypeError,
                 r"Input type \(torch\.float32\) and bias type \(torch\.float64\) should be the same", id="b_dtype"),
    pytest.param(lambda x, w, b: F.conv2d(x, w.cpu(), b, padding=1), ValueError,
                 r"Expected all tensors to be on the same device", id="w_device"),
    pytest.param(lambda x, w, b: F.conv2d(x, w, b[:5], padding=1), ValueError,
                 r"expected bias to be 1-dimensional with 6 elements, but got bias of size \[5\]", id="b_shape"),
    pytest.param(lambda x, w, b: F.conv2d(x[:, :3], w, b, padding=1), ValueError,
                 r"expected input\[2, 3, 10, 9\] to have 4 channels", id="x_channels"),
    pytest.param(lambda x, w, b: F.conv2d(x[None], w, b, padding=1), ValueError,
                 r"Expected 3D \(unbatched\) or 4D \(batched\) input", id="x_rank"),
    pytest.param(lambda x, w, b: F.conv2d(x, w, b, padding=1, stride=0), ValueError,
                 r"non-positive stride is not supported", id="stride_0"),
    pytest.param(lambda x, w, b: F.conv2d(x, w, b, padding=-1), ValueError, r"negative padding is not supported",
                 id="padding_negative"),
    pytest.param(lambda x, w, b: F.conv2d(x, w, b, padding="full"), ValueError, r"Invalid padding string",
                 id="padding_string"),
    pytest.param(lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=4), ValueError,
                 r"Given groups=4, expected weight to be divisible by 4", id="groups"),
    pytest.param(lambda x, w, b: F.conv2d(x, w, b, padding=[1, 1, 1]), ValueError,
                 r"expected padding to be a single integer value or a list of 2 values", id="padding_list3"),
    pytest.param(lambda x, w, b: F.conv2d(x, w, b, padding=1, algo="fft"), ValueError, r"unknown algo 'fft'",
                 id="algo"),
    pytest.param(lambda x, w, b: F.conv2d(x[..., :2, :2], w, b), ValueError,
                 r"Kernel size can't be greater than actual input size", id="too_small"),
]


@pytest.mark.parametrize("misuse,exc,message", PLANNED_MISUSES)
def test_planned_call_still_refuses_misuse(misuse, exc, message, monkeypatch):
    """A layer called before runs from its kept plans; any change a check reads must reach the checks again,
    and they refuse in torch's wording before any kernel runs."""
    from cuconv import _plan

    x, w, b = _valid_call()
    F.conv2d(x, w, b, padding=1)
    F.conv2d(x, w, b, padding=1)  # planned now
    runs = []
    real_run = _plan.Plan.run
    monkeypatch.setattr(_plan.Plan, "run", lambda self, *a: (runs.append(self), real_run(self, *a))[1])
    with pytest.raises(exc, match=message):
        misuse(x, w, b)
    assert runs == []


def test_planned_call_repeats_no_checks(monkeypatch):
    """A layer seen before: no geometry validation and no new plan (the host time of the torch path)."""
    from cuconv import dispatch, spec as spec_module

    x, w, b = _valid_call()
    conv = cuconv.nn.Conv2d(4, 6, 3, padding=1).cuda()
    y0 = conv(x)
    calls = []
    monkeypatch.setattr(spec_module.ConvSpec, "_validated",
                        classmethod(lambda cls, *a: calls.append("validate") or pytest.fail("validated again")))
    real_prepare = dispatch.prepare
    monkeypatch.setattr(dispatch, "prepare", lambda *a, **k: calls.append("prepare") or real_prepare(*a, **k))
    y1 = conv(x)
    assert calls == [] and torch.equal(y0, y1)


def test_a_call_like_the_last_one_is_bound_and_follows_every_change(monkeypatch):
    """Without gradients a Conv2d's call like the one before it runs the layer it bound (no checks, no lookup);
    an in-place edit of the weight, a new Parameter, ``.to()``, another input, autocast or the TF32 switch binds
    again; every result matches torch's; a copy and a pickle of a module that bound a call carry none of it."""
    import io

    binds = []
    real = F.plain_layer
    monkeypatch.setattr(F, "plain_layer", lambda *a: binds.append(1) or real(*a))
    torch.manual_seed(0)
    ref = torch.nn.Conv2d(8, 16, 3, padding=1).cuda()
    conv = cuconv.nn.convert(copy.deepcopy(ref))
    x = torch.randn(2, 8, 13, 11, device="cuda")

    def check(x, tol=1e-5):
        want, got = ref(x).double(), conv(x).double()
        assert float((got - want).norm() / want.norm()) <= tol, float((got - want).norm() / want.norm())

    with torch.no_grad():
        check(x)
        check(x.clone())
        assert len(binds) == 1
        for m in (ref, conv):
            m.weight.mul_(-0.5)
        check(x)
        assert len(binds) == 2
        check(x)
        assert len(binds) == 2
        for m in (ref, conv):
            m.bias = torch.nn.Parameter(m.bias.detach() + 1.0)
        check(x)
        check(x[:1])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            want, got = ref(x).double(), conv(x).double()
            assert conv(x).dtype == torch.bfloat16
            assert float((got - want).norm() / want.norm()) <= 2e-2
        for m in (ref, conv):  # (through .data: no new version; autocast's cast is made each call)
            m.weight.data.mul_(-1.0)
        # (in a new autocast region: torch's own autocast keeps a parameter's cast for the rest of a region, edits
        # through .data or not, so within the old one its reference would be the stale cast)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            want, got = ref(x).double(), conv(x).double()
            assert float((got - want).norm() / want.norm()) <= 2e-2
        ref.to(memory_format=torch.channels_last), conv.to(memory_format=torch.channels_last)
        check(x.contiguous(memory_format=torch.channels_last))
        ref.double(), conv.double()
        check(x.double(), 1e-12)
        assert len(binds) == 7
        twin = copy.deepcopy(conv)
        buf = io.BytesIO()
        torch.save(conv, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        for m in (twin, loaded):
            assert m._bound_call.value is None
            assert torch.equal(m(x.double()), conv(x.double()))
    xg = x.double().requires_grad_(True)  # (gradients recorded: the checked path)
    conv(xg).sum().backward()
    assert xg.grad is not None and conv.weight.grad is not None

    class Doubled(cuconv.nn.Conv2d):  # (a subclass's own _conv_forward: never bound past it)
        def _conv_forward(self, input, weight, bias):
            return super()._conv_forward(input, 2 * weight, bias)

    doubled = Doubled(8, 16, 3, padding=1).cuda()
    with torch.no_grad():
        for _ in range(2):
            want = torch.nn.functional.conv2d(x, 2 * doubled.weight, doubled.bias, padding=1)
            assert float((doubled(x) - want).norm() / want.norm()) <= 1e-5


def test_noncontiguous_channels_last_and_unaligned_inputs():
    """Strided views are made contiguous, channels_last tensors give channels-last results; a view that starts off
    a 256-byte boundary
    runs the layer's plan for unaligned pointers: every result equals torch's in float64."""
    gen = torch.Generator(device="cuda").manual_seed(41)
    base = torch.randn(3, 8, 21, 19, device="cuda", generator=gen)
    w = torch.randn(8, 8, 3, 3, device="cuda", generator=gen)
    b = torch.randn(8, device="cuda", generator=gen)
    inputs = {"transposed": base.transpose(2, 3), "channels_last": base.contiguous(memory_format=torch.channels_last),
              "strided": base[:, :, ::2], "offset": base.flatten()[5:5 + 2 * 8 * 21 * 19].view(2, 8, 21, 19)}
    for name, x in inputs.items():
        for dtype in (torch.float32, torch.float16):
            xd, wd, bd = x.to(dtype), w.to(dtype), b.to(dtype)
            if name == "offset":
                xd = xd.flatten()
                xd = torch.cat([xd.new_zeros(3), xd])[3:].view(x.shape)  # a data pointer 6 or 12 bytes past a block
            ref = torch.nn.functional.conv2d(xd.double(), wd.double(), bd.double(), padding=1)
            xg = xd.detach().requires_grad_()  # (detach keeps strides and storage offset)
            y = F.conv2d(xg, wd, bd, padding=1)
            (gx,) = torch.autograd.grad(y, xg, torch.ones_like(y))
            # (torch's memory format: channels-last in, channels-last out; any other view gives NCHW)
            assert y.is_contiguous(memory_format=torch.channels_last if name == "channels_last"
                                   else torch.contiguous_format) and gx.shape == xg.shape
            tol = 5e-3 if dtype == torch.float16 else tolerance(numpy.float32)
            assert rel_err(y.detach().double().cpu().numpy(), ref.cpu().numpy()) <= tol, (name, dtype)


def test_inference_paths_record_no_graph():
    x, w, b = _valid_call()
    conv = cuconv.nn.Conv2d(4, 6, 3, padding=1).cuda()
    with torch.no_grad():
        y = conv(x)
    assert y.grad_fn is None and not y.requires_grad
    with torch.inference_mode():
        z = conv(x)
    assert z.is_inference() and torch.equal(y, z)


# ----- autocast ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_autocast_matches_torch_with_mixed_dtypes(low, mode):
    """A half activation and float32 parameters under autocast (every layer of a model but the first): cast as
    torch casts, result in the low dtype, gradients in each tensor's dtype, errors no worse than 2x torch's."""
    torch.manual_seed(42)
    ref = torch.nn.Conv2d(8, 16, 3, padding=1, padding_mode=mode).cuda()
    ours = cuconv.nn.Conv2d(8, 16, 3, padding=1, padding_mode=mode).cuda()
    ours.load_state_dict(ref.state_dict())
    # the float64 oracle computes on what autocast gives both sides: parameters rounded to the low dtype
    exact = copy.deepcopy(ref).double()
    with torch.no_grad():
        exact.weight.copy_(ref.weight.to(low).double())
        exact.bias.copy_(ref.bias.to(low).double())
    x = torch.randn(4, 8, 17, 15, device="cuda").to(low)
    dy = torch.randn(4, 16, 17, 15, device="cuda").to(low)
    results = {}
    for name, module in (("torch", ref), ("cuconv", ours)):
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=low):
            y = module(xi)
        assert y.dtype == low
        y.backward(dy)
        assert xi.grad.dtype == low and module.weight.grad.dtype == torch.float32 == module.bias.grad.dtype
        results[name] = [y, xi.grad, module.weight.grad, module.bias.grad]
    xe = x.double().requires_grad_()
    ye = exact(xe)
    ye.backward(dy.double())
    oracle = [ye, xe.grad, exact.weight.grad, exact.bias.grad]
    for i, name in enumerate(("out", "dx", "dw", "db")):
        r = oracle[i].detach().cpu().numpy()
        ours_err = rel_err(results["cuconv"][i].detach().double().cpu().numpy(), r)
        torch_err = rel_err(results["torch"][i].detach().double().cpu().numpy(), r)
        assert ours_err <= max(TORCH_ERROR_FACTOR * torch_err, 1e-3), (name, ours_err, torch_err)


def _bn_cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1, groups=4), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1, groups=32), torch.nn.Conv2d(32, 64, 1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10))


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_autocast_training_with_grad_scaler_follows_torch(low):
    """Ten training steps under autocast with torch.amp.GradScaler: the converted model's losses stay within
    the spread between torch's own runs in the low precision and in float32."""
    gen = torch.Generator().manual_seed(43)
    labels = torch.randint(0, 10, (32,), generator=gen)
    patterns = torch.randn(10, 3, 16, 16, generator=gen)
    data = (patterns[labels] + 0.5 * torch.randn(32, 3, 16, 16, generator=gen)).cuda()
    labels = labels.cuda()
    losses = {}
    for kind, dtype in (("torch32", None), ("torch", low), ("cuconv", low)):
        torch.manual_seed(44)
        model = _bn_cnn().cuda()
        if kind == "cuconv":
            cuconv.nn.convert(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        scaler = torch.amp.GradScaler("cuda", enabled=dtype is not None)
        trace = []
        for _ in range(10):
            opt.zero_grad()
            with torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
                loss = torch.nn.functional.cross_entropy(model(data), labels)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            trace.append(loss.item())
        losses[kind] = numpy.array(trace)
    spread = numpy.abs(losses["torch"] - losses["torch32"]).max()
    assert losses["cuconv"][-1] < losses["cuconv"][0], "the converted model did not train"
    assert numpy.abs(losses["cuconv"] - losses["torch"]).max() <= 2 * spread + 1e-3, losses


# ----- torch.compile with CUDA graphs -------------------------------------------------------------------------
def test_compile_reduce_overhead_equals_eager_on_repeated_calls():
    """torch.compile(mode="reduce-overhead") (CUDA graphs): every call's output equals eager's, inputs changing
    between calls, outputs kept across calls (cloned, as torch's notes ask)."""
    torch._dynamo.reset()
    torch.manual_seed(45)
    model = cuconv.nn.convert(_bn_cnn()).cuda().eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    outs = []
    for seed in range(4):
        x = torch.randn(8, 3, 16, 16, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        with torch.no_grad():
            got = compiled(x).clone()
            expected = model(x)
        outs.append(got)
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4), seed
    assert not torch.equal(outs[0], outs[1])
    torch._dynamo.reset()


@pytest.mark.parametrize("low", [None, torch.bfloat16])
def test_warmup_makes_the_layers_real_calls_use(low, monkeypatch):
    """After ``warmup`` (threads compiling side by side) a training step and an inference make no layer and no
    plan of their own, and give what an unwarmed twin gives."""
    from cuconv import dispatch
    from cuconv.nn import _bridge

    def build():
        torch.manual_seed(31)
        return cuconv.nn.convert(torch.nn.Sequential(
            torch.nn.Conv2d(3, 24, 3, stride=2, padding=1, bias=False), torch.nn.ReLU(),
            torch.nn.Conv2d(24, 24, 5, padding=2, groups=24), torch.nn.Conv2d(24, 40, 1),
            torch.nn.Conv2d(40, 40, 3, padding=1, padding_mode="circular"), torch.nn.Conv2d(40, 8, 3, dilation=2),
            torch.nn.Flatten(), torch.nn.LazyLinear(5))).cuda()

    x = torch.randn(5, 3, 29, 27, device="cuda")
    twin, model = build(), build()
    twin(x), model(x)  # (the lazy layer takes its shape)
    model.load_state_dict(twin.state_dict())
    F._layers.clear()
    autocast = torch.autocast("cuda", dtype=low, enabled=low is not None)

    def step(m):
        m.zero_grad(set_to_none=True)
        with autocast:
            out = m(x)
        out.float().square().mean().backward()
        with torch.no_grad(), autocast:
            return out, m(x), [p.grad for p in m.parameters()]

    with autocast:
        assert cuconv.nn.warmup(model, x, threads=4) == 5
        assert cuconv.nn.warmup(model, x) == 0  # made already
    made = []
    monkeypatch.setattr(_bridge, "Layer", lambda *a, **k: made.append(a) or pytest.fail("a layer made anew"))
    real_prepare = dispatch.prepare
    monkeypatch.setattr(dispatch, "prepare", lambda *a, **k: made.append(a) or real_prepare(*a, **k))
    ours = step(model)
    assert made == []
    monkeypatch.undo()
    F._layers.clear()
    theirs = step(twin)
    for a, b in zip((ours[0], ours[1], *ours[2]), (theirs[0], theirs[1], *theirs[2])):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_graph_tools_on_converted_models_on_cuda(dtype):
    """torch.jit.trace, torch.jit.script's refusal and fuse_modules on CUDA (test_nn_cpu.graph_tools_agree): a
    trace records the custom op, not the launches, so its outputs are cuconv's (TF32 off for float32)."""
    from test_nn_cpu import graph_tools_agree

    allow = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        graph_tools_agree("cuda", dtype)
    finally:
        torch.backends.cudnn.allow_tf32 = allow
