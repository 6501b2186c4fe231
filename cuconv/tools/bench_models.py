"""``python -m cuconv bench --models ...``: whole torchvision models, converted, against cuDNN.

The measure users feel (``MODELS.md``). For each model (built with ``weights=None``: nothing is downloaded) and
each mode (``tf32``: float32 with TF32 on both sides; ``bf16`` / ``fp16``: ``torch.autocast``), both sides in
one process, same weights and inputs, torch with ``cudnn.benchmark = True``, the same memory format:

- per layer: every distinct ``Conv2d`` (its input shape at ``--batch`` and its geometry) with the number of
  times it occurs, forward and forward+backward, timed three ways: *eager* (CUDA events around one call,
  median), *GPU alone* (a run of calls captured in a CUDA graph and replayed, per call) and *host* (wall time
  of calls back to back without synchronising, per call, the two sides' rounds alternating); the algorithms
  ``auto`` chose; sums weighted by occurrence;
- end to end: eager inference (``eval``, ``no_grad``, ``--infer-batch``) and an eager training step (forward,
  a cross-entropy loss, backward; ``--batch``), timed in samples of calls back to back (``E2E_CALLS``), the
  converted model against the same model on cuDNN, and with ``--compile`` the same under ``torch.compile``
  (default and ``mode="reduce-overhead"``);
- correctness alongside: outputs and gradients against torch in float32 without TF32, beside torch's own
  error at the same precision, and (``tf32`` mode) every gradient of a float64 copy of the model against
  torch's in float64.

Before a mode is measured, ``cuconv.nn.warmup`` compiles the converted model's kernels side by side (its
seconds are reported: the cold start on an empty kernel cache). Ratios are torch time / cuconv time: above 1,
cuconv is faster.
"""

from __future__ import annotations

import copy
import gc
import json
import statistics
import sys
import time

__all__ = ["main", "add_arguments", "layer_operands", "MODES"]

MODES = ("tf32", "bf16", "fp16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_SIDES = ("torch", "cuconv")
_AUTOCAST = {"bf16": "bfloat16", "fp16": "float16"}


def _commit():
    """The commit measured: ``CUCONV_COMMIT`` where set (a copy of the tree without its git directory), else the
    checkout's ``git rev-parse --short HEAD``, else None."""
    import os
    import subprocess

    if os.environ.get("CUCONV_COMMIT"):
        return os.environ["CUCONV_COMMIT"]
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=os.path.dirname(os.path.abspath(__file__)))
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def add_arguments(ap) -> None:
    """The options of ``--models`` (on ``python -m cuconv bench``'s parser)."""
    g = ap.add_argument_group("models (python -m cuconv bench --models NAME[,NAME...])")
    g.add_argument("--models", metavar="NAMES",
                   help="comma-separated names of torchvision models (weights=None; classification and "
                        "segmentation), fpn_resnet50, unet, unet_transposed or a sequence model; 'models' stands for "
                        "MODELS.md's five (resnet50, mobilenet_v3_large, efficientnet_b0, regnet_y_800mf, "
                        "convnext_tiny), 'zoo' for the wider set of cuconv.tools.zoo, 'video', 'decoders' and "
                        "'sequence' for its video, transposed-convolution and 1-D sets")
    g.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)} (default all)")
    g.add_argument("--batch", type=int, default=32, help="batch of the layers and the training step (default 32)")
    g.add_argument("--infer-batch", type=int, default=64, help="batch of end-to-end inference (default 64)")
    g.add_argument("--image", type=int, default=224, help="input height and width (default 224)")
    g.add_argument("--channels-last", action="store_true",
                   help="both sides in torch.channels_last, for the models and for the problems (where cuconv gets "
                        "channels-last CuPy arrays): cuconv runs NHWC passes in place where a plan serves them, "
                        "the others on NCHW copies")
    g.add_argument("--compile", action="store_true",
                   help="also time torch.compile of the models (--compile-modes, --compile-sides)")
    g.add_argument("--compile-modes", default="default,reduce-overhead", metavar="MODES",
                   help=f"with --compile: comma-separated, of {', '.join(COMPILE_MODES)} (default: default,"
                        f"reduce-overhead)")
    g.add_argument("--compile-sides", default="torch,cuconv", metavar="SIDES",
                   help="with --compile: comma-separated, of torch, cuconv (default both; --fuse compares cuconv "
                        "fused eager with torch's model compiled in default mode, which 'torch' alone gives)")
    g.add_argument("--fuse", action="store_true",
                   help="inference also of torch with its BatchNorms folded (torch.fx.experimental.optimization.fuse) "
                        "and of cuconv fused (cuconv.nn.convert(fuse=True)), eager and as one CUDA-graph replay")
    g.add_argument("--no-layers", action="store_true", help="skip the per-layer measurements")
    g.add_argument("--no-e2e", action="store_true", help="skip the end-to-end measurements")
    g.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    g.add_argument("--no-train", action="store_true", help="end to end, time inference alone (no training step)")
    g.add_argument("--layer-reps", type=int, default=6, help="timed runs per layer measurement (median)")


# --------------------------------------------------------------------------------------------------------
# timers (torch's current stream)
# --------------------------------------------------------------------------------------------------------
def _events_ms(fn, reps: int, warmup: int = 2, calls: int = 1) -> float:
    """Median milliseconds of one call of ``fn``: CUDA events around ``calls`` calls back to back (per call), the
    GPU idle before each sample. Python's garbage collector runs as it does in a user's loop: a side that makes more
    garbage pays for its collections."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / calls)
    return statistics.median(times)


# End to end, a sample is this many calls back to back: a model's forward after an idle GPU measures its host
# time plus the first kernels' latency once; back to back, a host-bound model's launches queue behind each other
# as a serving loop's do (one call a sample varied 30-60% between runs of a host-bound model's fused side).
E2E_CALLS = 4


def _alternating_ms(fns: dict, rounds: int = 5, reps: int = 5, calls: int = E2E_CALLS) -> dict:
    """{name: median milliseconds of one call} of each of ``fns`` (name: function), timed as ``_events_ms`` (samples
    of ``calls`` calls) in ``rounds`` rounds of ``reps`` samples, every side in each, the order flipped each round:
    a drift of the clocks, or of the host's other load, falls on every side alike."""
    times = {k: [] for k in fns}
    for rnd in range(rounds):
        for k in (list(fns) if rnd % 2 == 0 else reversed(list(fns))):
            times[k].append(_events_ms(fns[k], reps=reps, warmup=2 if rnd == 0 else 1, calls=calls))
    return {k: statistics.median(v) for k, v in times.items()}


def _graph_ms(fns, reps: int, calls: int = 5) -> list:
    """Median milliseconds per call of each of ``fns`` (the two sides) with host time taken out: ``calls`` calls
    of each captured in a CUDA graph (after a warm-up on a side stream, as torch's notes on graphs show), the
    graphs' replays timed in alternation, their order flipped each round, so that a drift of the GPU's clocks
    or of its other load falls on both sides alike."""
    import torch

    graphs = []
    for fn in fns:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        graph.replay()
        graphs.append(graph)
    times = [[] for _ in graphs]
    for r in range(reps):
        for i in (range(len(graphs)) if r % 2 == 0 else reversed(range(len(graphs)))):
            torch.cuda.synchronize()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[i].replay()
            stop.record()
            stop.synchronize()
            times[i].append(start.elapsed_time(stop) / calls)
    del graphs
    return [statistics.median(t) for t in times]


def _host_us(fns, contexts=(), rounds: int = 9, calls: int = 10) -> list:
    """Median microseconds of host time per call of each of ``fns`` (the two sides): wall time of ``calls`` calls
    back to back, not synchronised inside (few enough that the launch queue never fills), per call. The sides'
    rounds alternate (ABBAAB...), so drift of the machine (clocks, other processes, the garbage collector) falls
    on both alike; ``contexts`` (no_grad, autocast) are entered once around the calls, as a model's forward
    enters them once around its layers."""
    import contextlib

    import torch

    samples = [[] for _ in fns]
    with contextlib.ExitStack() as stack:
        for c in contexts:
            stack.enter_context(c)
        for r in range(rounds):
            for i in (range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))):
                fn = fns[i]
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                samples[i].append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return [statistics.median(s) for s in samples]


def _rel_err(a, b) -> float:
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


# --------------------------------------------------------------------------------------------------------
# modes
# --------------------------------------------------------------------------------------------------------
class _Mode:
    """A precision both sides run at: TF32 float32 (``tf32``), or autocast to a half type; ``ieee`` is the
    float32 reference (TF32 off) of the correctness checks."""

    def __init__(self, name: str):
        self.name = name

    def autocast(self, cache: bool = True):
        import contextlib

        import torch

        if self.name not in _AUTOCAST:
            return contextlib.nullcontext()
        return torch.autocast("cuda", dtype=getattr(torch, _AUTOCAST[self.name]), cache_enabled=cache)

    def __enter__(self):
        import torch

        self._saved = torch.backends.cudnn.allow_tf32, _fp32_precision()
        _set_tf32(self.name != "ieee")
        return self

    def __exit__(self, *exc):
        import torch

        torch.backends.cudnn.allow_tf32 = self._saved[0]
        if self._saved[1] is not None:
            torch.backends.cudnn.conv.fp32_precision = self._saved[1]

    @property
    def input_dtype(self):
        import torch

        return getattr(torch, _AUTOCAST[self.name]) if self.name in _AUTOCAST else torch.float32


def _fp32_precision():
    import torch

    conv = getattr(torch.backends.cudnn, "conv", None)
    return getattr(conv, "fp32_precision", None) if conv is not None else None


def _set_tf32(on: bool) -> None:
    import torch

    torch.backends.cudnn.allow_tf32 = on
    if _fp32_precision() is not None:
        torch.backends.cudnn.conv.fp32_precision = "tf32" if on else "ieee"


# --------------------------------------------------------------------------------------------------------
# the layers of a model
# --------------------------------------------------------------------------------------------------------
def _build(name: str):
    from . import zoo

    return zoo.build(name)


def model_names(spec: str) -> list:
    """``--models``' names: comma-separated, ``models`` standing for MODELS.md's five, ``zoo`` for the wider set
    ``video`` for the video models, ``decoders`` and ``sequence`` for the transposed-convolution and 1-D models
    (``cuconv.tools.zoo``), each name once in the order given."""
    from . import zoo

    names = []
    for name in (n.strip() for n in spec.split(",")):
        for n in {"models": zoo.MODELS, "zoo": zoo.ZOO, "video": zoo.VIDEO, "decoders": zoo.DECODERS,
                  "sequence": zoo.SEQUENCE}.get(name, (name,) if name else ()):
            if n not in names:
                names.append(n)
    return names


def _sample(args) -> tuple:
    """One input sample of the model being measured (``args.sample``, set per model; else an image)."""
    return getattr(args, "sample", None) or (3, args.image, args.image)


def _format(sample: tuple):
    """The channels-last memory format of inputs of this sample's rank (a sequence's: its only one)."""
    import torch

    return {4: torch.channels_last_3d, 3: torch.channels_last}.get(len(sample), torch.contiguous_format)


def distinct_layers(model, batch: int, image: int, channels_last: bool = False, sample: tuple = None):
    """[(geometry dict, input shape, count, first)] of every ``torch.nn.Conv2d`` the model runs on a
    ``(batch, 3, image, image)`` input, in the order first met; ``first`` marks the model's first convolution
    (its input needs no gradient)."""
    import torch

    seen = {}
    order = []

    def hook(module, args):
        x = args[0]
        geometry = dict(in_channels=module.in_channels, out_channels=module.out_channels,
                        kernel_size=tuple(module.kernel_size), stride=tuple(module.stride),
                        padding=module.padding if isinstance(module.padding, str) else tuple(module.padding),
                        dilation=tuple(module.dilation), groups=module.groups, bias=module.bias is not None,
                        padding_mode=module.padding_mode)
        key = (tuple(x.shape), tuple(sorted(geometry.items())))
        if key not in seen:
            seen[key] = [geometry, tuple(x.shape), 0, not order]
            order.append(key)
        seen[key][2] += 1

    handles = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    try:
        sample = sample or (3, image, image)
        x = torch.randn(batch, *sample, device="cuda")
        if channels_last:
            x = x.contiguous(memory_format=_format(sample))
        with torch.no_grad():
            model.eval()(x)
    finally:
        for h in handles:
            h.remove()
    return [tuple(seen[k]) for k in order]


def _layer_pair(geometry: dict, channels_last: bool):
    """A torch.nn.Conv2d with this geometry and its cuconv twin with the same weights, on the GPU."""
    import torch

    import cuconv.nn

    theirs = torch.nn.Conv2d(**geometry).cuda()
    ours = cuconv.nn.Conv2d(**geometry).cuda()
    ours.load_state_dict(theirs.state_dict())
    if channels_last:
        theirs = theirs.to(memory_format=torch.channels_last)
        ours = ours.to(memory_format=torch.channels_last)
    return theirs, ours


def _chosen(geometry: dict, shape: tuple, mode: _Mode, channels_last: bool = False) -> dict:
    """The algorithm ``auto`` runs for each pass of this layer in this mode (config.benchmark off); with
    channels-last activations the one that serves them in place (``select.select_nhwc``), or, where none
    does, the NCHW choice marked " (copies)"."""
    import cuconv
    from cuconv import _dtypes, select
    from cuconv.spec import ConvSpec

    k = geometry["kernel_size"]
    spec = ConvSpec.from_args(shape, (geometry["out_channels"], geometry["in_channels"] // geometry["groups"], *k),
                              geometry["stride"], geometry["padding"], geometry["dilation"], geometry["groups"])
    dtype = _dtypes.by_name({"tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}[mode.name])
    precision = "tf32" if mode.name == "tf32" else "ieee"
    chosen = {}
    for p in ("fprop", "dgrad", "wgrad"):
        nhwc = select.select_nhwc("auto", spec, dtype, precision, p) if channels_last else None
        copies = " (copies)" if channels_last else ""
        chosen[p] = nhwc or cuconv.select_algorithm(spec, dtype, precision, True, p) + copies
    return chosen


def layer_operands(geometry: dict, shape: tuple, first: bool, mode: _Mode, channels_last: bool) -> tuple:
    """(torch's layer, cuconv's twin, x, dy) of one layer in one mode: random x of ``shape`` in the mode's input
    dtype (needing a gradient unless the layer is the model's first) and a random gradient of the output."""
    import torch

    theirs, ours = _layer_pair(geometry, channels_last)
    gen = torch.Generator(device="cuda").manual_seed(hash(shape) & 0xFFFF)
    x = torch.randn(shape, device="cuda", generator=gen).to(mode.input_dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_(not first)
    with torch.no_grad(), mode.autocast():
        dy = torch.randn_like(theirs(x), dtype=mode.input_dtype if mode.name in _AUTOCAST else torch.float32)
    return theirs, ours, x, dy


def measure_layer(geometry: dict, shape: tuple, first: bool, mode: _Mode, reps: int, channels_last: bool) -> dict:
    """One layer in one mode, both sides: eager, GPU-alone and host times of the forward and of forward +
    backward; the forward's relative difference between the sides."""
    import torch

    theirs, ours, x, dy = layer_operands(geometry, shape, first, mode, channels_last)
    row = dict(count=None, shape=list(shape), **{k: (list(v) if isinstance(v, tuple) else v)
                                                   for k, v in geometry.items()})
    row["algos"] = _chosen(geometry, shape, mode, channels_last)
    calls, fwds, fwd_bwds = [], [], []
    for side, module in (("torch", theirs), ("cuconv", ours)):
        inputs = [t for t in (x, module.weight, module.bias) if t is not None and t.requires_grad]

        def fwd(module=module):
            with torch.no_grad(), mode.autocast(cache=False):
                return module(x)

        def fwd_bwd(module=module, inputs=inputs):
            with mode.autocast(cache=False):
                y = module(x)
            return torch.autograd.grad(y, inputs, dy)

        def call(module=module):
            return module(x)

        row[f"{side}_fwd_ms"] = _events_ms(fwd, reps)
        row[f"{side}_fb_ms"] = _events_ms(fwd_bwd, reps)
        calls.append(call)
        fwds.append(fwd)
        fwd_bwds.append(fwd_bwd)
    row["torch_fwd_gpu_ms"], row["cuconv_fwd_gpu_ms"] = _graph_ms(fwds, reps)
    row["torch_fb_gpu_ms"], row["cuconv_fb_gpu_ms"] = _graph_ms(fwd_bwds, reps)
    # (autocast's cast cache off: in a model each layer's weight is cast once per forward, on both sides)
    row["torch_fwd_host_us"], row["cuconv_fwd_host_us"] = _host_us(calls, (torch.no_grad(),
                                                                            mode.autocast(cache=False)))
    # (autocast around the forward only, as in training)
    row["torch_fb_host_us"], row["cuconv_fb_host_us"] = _host_us(fwd_bwds)
    with torch.no_grad(), mode.autocast():
        row["fwd_rel_diff"] = _rel_err(ours(x), theirs(x))
    return row


# --------------------------------------------------------------------------------------------------------
# end to end
# --------------------------------------------------------------------------------------------------------
def _inputs(batch: int, image: int, channels_last: bool, seed: int, sample: tuple = None):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    sample = sample or (3, image, image)
    x = torch.randn(batch, *sample, device="cuda", generator=gen)
    if channels_last:
        x = x.contiguous(memory_format=_format(sample))
    labels = torch.randint(0, 1000, (batch,), device="cuda", generator=gen)
    return x, labels


def _infer_fn(model, x, mode: _Mode):
    import torch

    def run():
        with torch.no_grad(), mode.autocast():
            return model(x)
    return run


def _train_fn(model, x, labels, mode: _Mode):
    from . import zoo

    def run():
        model.zero_grad(set_to_none=True)
        with mode.autocast():
            out = model(x)
        loss = zoo.loss(out, labels)
        loss.backward()
        return loss
    return run


def measure_e2e(pair, args, mode: _Mode) -> dict:
    """Eager inference and training steps of both models in one mode, the two sides in alternating rounds (and
    compiled, with --compile)."""
    import torch

    theirs, ours = pair
    row = {}
    x_inf, _ = _inputs(args.infer_batch, args.image, args.channels_last, 1, _sample(args))
    x_tr, labels = _inputs(args.batch, args.image, args.channels_last, 2, _sample(args))
    sides = (("torch", theirs), ("cuconv", ours))
    kinds = (("infer", lambda m: _infer_fn(m, x_inf, mode), False),
             ("train", lambda m: _train_fn(m, x_tr, labels, mode), True))
    for kind, fn_of, train in kinds[:1] if getattr(args, "no_train", False) else kinds:
        for _, model in sides:
            model.train(train)
        row.update(_alternating_ms({f"{side}_{kind}_ms": fn_of(model) for side, model in sides}))
    if args.compile:
        chosen = compile_choices(args.compile_sides, COMPILE_SIDES, "--compile-sides")
        for how in compile_choices(args.compile_modes, COMPILE_MODES, "--compile-modes"):
            for side, model in (("torch", theirs), ("cuconv", ours)):
                if side not in chosen:
                    continue
                torch._dynamo.reset()
                compiled = torch.compile(model, mode=None if how == "default" else how)
                model.eval()
                infer = _infer_fn(compiled, x_inf, mode)
                row[f"{side}_compile_{how}_infer_ms"] = _events_ms(lambda: infer().clone(), reps=10, warmup=3,
                                                                   calls=E2E_CALLS)
                if not getattr(args, "no_train", False):
                    model.train()
                    train = _train_fn(compiled, x_tr, labels, mode)
                    row[f"{side}_compile_{how}_train_ms"] = _events_ms(train, reps=10, warmup=3, calls=E2E_CALLS)
        torch._dynamo.reset()
    if getattr(args, "fuse", False):
        row.update(measure_fused(pair, args, mode, x_inf, row.get("torch_compile_default_infer_ms")))
    return row


def compile_choices(text: str, allowed: tuple, option: str) -> list:
    """The comma-separated names of ``text``, each one of ``allowed`` (a ValueError naming ``option`` else)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    wrong = [n for n in names if n not in allowed]
    if wrong or not names:
        raise ValueError(f"{option}: {', '.join(wrong) or 'nothing'} is not one of {', '.join(allowed)}")
    return names


def fused_pair(theirs, channels_last: bool, memory_format=None):
    """(torch's model with its convolutions and BatchNorms folded by ``torch.fx.experimental.optimization.fuse``,
    cuconv's fused by ``cuconv.nn.convert(fuse=True)``), both of copies of ``theirs`` in eval mode; the first None
    where torch's ``fuse`` cannot trace the model."""
    import torch
    import torch.fx.experimental.optimization as fx_opt

    import cuconv.nn

    try:
        folded = fx_opt.fuse(copy.deepcopy(theirs).eval())
    except Exception as exc:  # (symbolic tracing's refusals are of many types)
        print(f"torch.fx.experimental.optimization.fuse: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        folded = None
    fused = cuconv.nn.convert(copy.deepcopy(theirs).eval(), fuse=True)
    if channels_last:
        fmt = memory_format or torch.channels_last
        folded, fused = (None if m is None else m.to(memory_format=fmt) for m in (folded, fused))
    return None if folded is None else folded.eval(), fused.eval()


def measure_fused(pair, args, mode: _Mode, x, compiled_ms: float = None) -> dict:
    """Inference of torch, torch folded, cuconv unfused and cuconv fused in one process: eager (events, rounds of
    the four in turn) and as one CUDA-graph replay each (GPU time alone); with --compile also torch.compile
    (default mode) of torch's model (``compiled_ms`` where the end-to-end measurement timed it already). The fused
    model's output against torch's float32 (TF32 off) beside torch's own error at this precision, and a float64
    copy's against torch's float64 copy (on the CPU)."""
    import torch

    theirs, ours = pair
    folded, fused = fused_pair(theirs, args.channels_last, _format(_sample(args)))
    with mode.autocast():
        import cuconv.nn

        cuconv.nn.warmup(fused, torch.empty(x.shape, device="meta"), backward=False)
    sides = {"torch": theirs, "torch_folded": folded, "cuconv": ours, "cuconv_fused": fused}
    sides = {k: m for k, m in sides.items() if m is not None}
    for model in sides.values():
        model.eval()
    fns = {k: _infer_fn(m, x, mode) for k, m in sides.items()}
    out = {f"{k}_eager_infer_ms": ms for k, ms in zip(fns, _alternating_ms(fns).values())}
    graph = _graph_ms(list(fns.values()), reps=10, calls=2)
    out.update({f"{k}_graph_infer_ms": ms for k, ms in zip(fns, graph)})
    if args.compile and compiled_ms is not None:
        out["torch_compile_default_infer_ms"] = compiled_ms
    elif args.compile:
        torch._dynamo.reset()
        compiled = torch.compile(theirs)
        infer = _infer_fn(compiled, x, mode)
        out["torch_compile_default_infer_ms"] = _events_ms(lambda: infer().clone(), reps=10, warmup=3,
                                                           calls=E2E_CALLS)
        torch._dynamo.reset()
    if not args.no_check:
        with torch.no_grad():
            with _Mode("ieee"):
                ref = theirs(x[:4]).double()
            with mode.autocast():  # (the caller holds ``mode``: entering it again would lose its saved state)
                out["fused_out_err"] = _rel_err(fused(x[:4]).double(), ref)
                out["torch_out_err"] = _rel_err(theirs(x[:4]).double(), ref)
            # (float64 copies of both: the fused model to rounding, 1e-12; torch's on the CPU, whose hardswish and
            # hardsigmoid divide by 6 where its CUDA kernels multiply by 1/6 rounded to float32, 3e-8 off in float64)
            with _Mode("ieee"):
                try:
                    x64 = x[:2].double()
                    fused64, theirs64 = copy.deepcopy(fused).double(), copy.deepcopy(theirs).double().cpu()
                    out["fused_float64_err"] = _rel_err(fused64(x64).cpu(), theirs64(x64.cpu()))
                    del fused64, theirs64
                except Exception as exc:  # (reported with the figures: the timings above stand)
                    out["fused_float64_failure"] = f"{type(exc).__name__}: {exc}"
    del folded, fused
    if not getattr(args, "no_train", False):
        out.update(measure_fused_train(pair, args, mode))
    return out


def measure_fused_train(pair, args, mode: _Mode) -> dict:
    """Training steps (forward, loss, backward) of torch, cuconv unfused and cuconv fused
    (``cuconv.nn.convert(fuse=True)`` in train mode: each block one autograd node with its BatchNorm on the batch's
    statistics) in alternating rounds, at ``--batch``; and the fused step's gradients against the unfused model's
    from the same state."""
    import torch

    import cuconv.nn

    theirs, ours = pair
    x, labels = _inputs(args.batch, args.image, args.channels_last, 2, _sample(args))
    fused = cuconv.nn.convert(copy.deepcopy(theirs).train(), fuse=True)
    if args.channels_last:
        fused = fused.to(memory_format=_format(_sample(args)) or torch.channels_last)
    sides = {"torch": theirs, "cuconv": ours, "cuconv_fused": fused}
    state = {k: copy.deepcopy(m.state_dict()) for k, m in sides.items()}  # (running statistics: put back after)
    for model in sides.values():
        model.train()
    fns = {k: _train_fn(m, x, labels, mode) for k, m in sides.items()}
    out = {f"{k}_fused_train_ms": ms for k, ms in zip(fns, _alternating_ms(fns).values())}
    if not args.no_check:
        grads = {}
        for k in ("cuconv", "cuconv_fused"):  # (both from the state before the timing: its running statistics)
            sides[k].load_state_dict(state["torch"])
            fns[k]()
            grads[k] = {n: p.grad for n, p in sides[k].named_parameters() if p.grad is not None}
        names = sorted(grads["cuconv"])
        if names == sorted(grads["cuconv_fused"]):
            out["fused_train_grad_err"] = _rel_err(*(torch.cat([grads[k][n].double().flatten() for n in names])
                                                     for k in ("cuconv_fused", "cuconv")))
    for k, model in sides.items():
        model.load_state_dict(state[k])
    del fused
    return out


def warm_up(model, args, mode: _Mode) -> dict:
    """``cuconv.nn.warmup`` of the converted model for every batch this run calls it at (the check's, the
    training step's and the layers', inference's): its kernels compiled side by side before anything is timed."""
    import torch

    import cuconv.nn

    started = time.perf_counter()
    example = lambda batch: torch.empty(batch, *_sample(args), device="meta")
    with mode.autocast():
        layers = sum(cuconv.nn.warmup(model, example(b), backward=True) for b in {min(args.batch, 8), args.batch})
        layers += cuconv.nn.warmup(model, example(args.infer_batch), backward=False)
    return dict(layers=layers, seconds=time.perf_counter() - started)


def check_model(pair, args, mode: _Mode) -> dict:
    """One inference and one training step of both models on the same data: the converted model's output and
    gradients against torch's float32 (TF32 off), beside torch's own error in this mode; for ``tf32`` also a
    float64 copy of both models, whose every gradient must equal torch's to rounding. cuDNN takes its own
    algorithms here: benchmark mode would time every algorithm of each layer at the check's batch (most of the
    check's time), and nothing the check measures depends on it."""
    import torch

    benchmark, torch.backends.cudnn.benchmark = torch.backends.cudnn.benchmark, False
    try:
        return _check_model(pair, args, mode)
    finally:
        torch.backends.cudnn.benchmark = benchmark


def _check_model(pair, args, mode: _Mode) -> dict:
    import torch

    import cuconv.nn

    from . import zoo

    theirs, ours = pair
    x, labels = _inputs(min(args.batch, 8), args.image, args.channels_last, 3, _sample(args))

    def step(model, m: _Mode):
        with m:
            model.train()
            model.zero_grad(set_to_none=True)
            torch.manual_seed(4)  # dropout and stochastic depth draw the same masks on both sides
            with m.autocast():
                out = model(x)
            zoo.loss(out, labels).backward()
            grads = torch.cat([p.grad.flatten().double() for p in model.parameters() if p.grad is not None])
            model.eval()
            with torch.no_grad(), m.autocast():
                y = model(x).double()
            model.zero_grad(set_to_none=True)
            return y, grads

    # training mode updates BatchNorm's running statistics: every step starts from the same state
    state = copy.deepcopy(theirs.state_dict())

    def fresh(model):
        model.load_state_dict(state)
        return model

    ref_y, ref_g = step(fresh(theirs), _Mode("ieee"))
    torch_y, torch_g = step(fresh(theirs), mode)
    ours_y, ours_g = step(fresh(ours), mode)
    fresh(theirs)
    fresh(ours)
    row = dict(out_err=_rel_err(ours_y, ref_y), torch_out_err=_rel_err(torch_y, ref_y),
               grad_err=_rel_err(ours_g, ref_g), torch_grad_err=_rel_err(torch_g, ref_g))
    if mode.name == "tf32":
        t64, o64 = copy.deepcopy(theirs).double(), copy.deepcopy(ours).double()
        x64 = x[:2].double()
        cuconv.nn.warmup(o64, x64)
        for model in (t64, o64):
            model.train()
            torch.manual_seed(5)
            zoo.loss(model(x64), labels[:2]).backward()
        grads = [(po.grad, pt.grad) for po, pt in zip(o64.parameters(), t64.parameters()) if pt.grad is not None]
        # normwise over every gradient; and the worst parameter among those whose gradient is not analytically zero
        # (a bias ahead of a training-mode BatchNorm gets only rounding noise, ~1e-17, on both sides)
        row["float64_grad_err"] = _rel_err(torch.cat([a.flatten() for a, _ in grads]),
                                           torch.cat([b.flatten() for _, b in grads]))
        scale = max(float(b.norm()) for _, b in grads)
        row["float64_worst_param_err"] = max(_rel_err(a, b) for a, b in grads if float(b.norm()) > 1e-6 * scale)
        del t64, o64
    return row


# --------------------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------------------
def _progress(total: int, desc: str):
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, file=sys.stderr, mininterval=10, leave=False)
    except ImportError:  # a plain counter
        class _Counter:
            def __init__(self):
                self.n = 0

            def update(self, k=1):
                self.n += k
                if self.n % 20 == 0 or self.n == total:
                    print(f"{desc}: {self.n}/{total}", file=sys.stderr, flush=True)

            def close(self):
                pass

        return _Counter()


def run(args) -> dict:
    """All measurements of ``args.models`` in ``args.modes``; returns the JSON-ready report."""
    import torch

    import cuconv
    import cuconv.nn

    from . import zoo

    torch.backends.cudnn.benchmark = True
    names = model_names(args.models)
    modes = [_Mode(m) for m in args.modes.split(",") if m]
    report = dict(meta=dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                            cudnn=torch.backends.cudnn.version(), cuconv=cuconv.__version__,
                            date=time.strftime("%Y-%m-%d"), batch=args.batch, infer_batch=args.infer_batch,
                            image=args.image, memory_format="channels_last" if args.channels_last else "nchw",
                            modes=[m.name for m in modes], commit=_commit()), models={})
    for name in names:
        started = time.perf_counter()
        torch.manual_seed(0)
        entry = report["models"][name] = dict(layers=[], modes={})
        try:
            theirs = _build(name).cuda()
            ours = cuconv.nn.convert(copy.deepcopy(theirs))
            args.sample = zoo.sample_shape(name, args.image)
            if args.channels_last:
                theirs, ours = (m.to(memory_format=_format(args.sample)) for m in (theirs, ours))
            layers = distinct_layers(theirs, args.batch, args.image, args.channels_last, args.sample)
        except Exception as exc:  # (a model this torchvision lacks, or one that fails to run: the others go on)
            entry["error"] = f"{type(exc).__name__}: {exc}"
            print(f"{name}: {entry['error']}", file=sys.stderr, flush=True)
            continue
        entry["distinct_layers"] = len(layers)
        entry["convolutions"] = sum(c for _, _, c, _ in layers)
        # the objects alive now (models, torch's and CuPy's modules) out of the collector's full passes while the
        # model is measured: those pauses otherwise land in one side's host-time rounds at random
        gc.collect()
        gc.freeze()
        for mode in modes:
            result = entry["modes"][mode.name] = {}
            seconds = result["seconds"] = {}  # where the run's time goes (it must fit a 10-minute device call)
            with mode:
                try:
                    result["warmup"] = warm_up(ours, args, mode)  # (it reports its own seconds)
                    t1 = time.perf_counter()
                    if not args.no_check:
                        result["check"] = check_model((theirs, ours), args, mode)
                    t2 = time.perf_counter()
                    if not args.no_e2e:
                        result["e2e"] = measure_e2e((theirs, ours), args, mode)
                    t3 = time.perf_counter()
                    seconds.update(check=t2 - t1, e2e=t3 - t2)
                    if not args.no_layers:
                        bar = _progress(len(layers), f"{name} {mode.name} layers")
                        rows = []
                        for geometry, shape, count, first in layers:
                            row = measure_layer(geometry, shape, first, mode, args.layer_reps, args.channels_last)
                            row["count"] = count
                            rows.append(row)
                            bar.update(1)
                        bar.close()
                        result["layers"] = rows
                        if rows:  # (a model of 3-D convolutions alone has no Conv2d layers to sum)
                            result["sums"] = _sums(rows)
                        seconds["layers"] = time.perf_counter() - t3
                except Exception as exc:  # one failing model or mode must not lose the others' figures
                    result["error"] = f"{type(exc).__name__}: {exc}"
                    print(f"{name} {mode.name}: {result['error']}", file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
        entry["seconds"] = time.perf_counter() - started
        print(_model_summary(name, entry), file=sys.stderr, flush=True)
        if args.json:  # after each model: a run stopped early keeps the models it finished
            with open(args.json, "w") as fh:
                json.dump(report, fh, indent=1)
        del theirs, ours
        gc.unfreeze()
        torch.cuda.empty_cache()
    return report


_TIMES = ("fwd_ms", "fwd_gpu_ms", "fb_ms", "fb_gpu_ms")


def _sums(rows) -> dict:
    """Occurrence-weighted sums of each time for both sides, their ratios, and the medians of host time."""
    sums = {}
    for t in _TIMES:
        for side in ("torch", "cuconv"):
            sums[f"{side}_{t}"] = sum(r["count"] * r[f"{side}_{t}"] for r in rows)
        sums[f"ratio_{t}"] = sums[f"torch_{t}"] / max(sums[f"cuconv_{t}"], 1e-12)
    for t in ("fwd_host_us", "fb_host_us"):
        for side in ("torch", "cuconv"):
            sums[f"{side}_median_{t}"] = statistics.median(r[f"{side}_{t}"] for r in rows)
        sums[f"host_ratio_{t}"] = sums[f"cuconv_median_{t}"] / max(sums[f"torch_median_{t}"], 1e-12)
    return sums


def _model_summary(name: str, entry: dict) -> str:
    parts = [f"{name}: {entry['distinct_layers']} distinct convolutions ({entry['convolutions']} in all), "
             f"{entry['seconds']:.0f} s"]
    for mode, result in entry["modes"].items():
        if "error" in result:
            parts.append(f"  {mode}: ERROR {result['error']}")
            continue
        e2e, sums = result.get("e2e"), result.get("sums")
        text = f"  {mode} ({', '.join(f'{k} {v:.0f} s' for k, v in result.get('seconds', {}).items())}):"
        if result.get("warmup"):
            text += f" warm-up {result['warmup']['layers']} layers {result['warmup']['seconds']:.1f} s;"
        if e2e:
            text += f" inference {e2e['torch_infer_ms'] / e2e['cuconv_infer_ms']:.2f}x"
            if "cuconv_train_ms" in e2e:
                text += f", training step {e2e['torch_train_ms'] / e2e['cuconv_train_ms']:.2f}x"
            text += ";"
        if sums:
            text += (f" layers GPU alone fwd {sums['ratio_fwd_gpu_ms']:.2f}x, fwd+bwd {sums['ratio_fb_gpu_ms']:.2f}x;"
                     f" eager fwd {sums['ratio_fwd_ms']:.2f}x, fwd+bwd {sums['ratio_fb_ms']:.2f}x; host per call "
                     f"(median) fwd {sums['cuconv_median_fwd_host_us']:.0f} / {sums['torch_median_fwd_host_us']:.0f} "
                     f"us, fwd+bwd {sums['cuconv_median_fb_host_us']:.0f} / {sums['torch_median_fb_host_us']:.0f} us")
        parts.append(text)
    return "\n".join(parts)


def _ratio(e2e: dict, kind: str) -> str:
    key = f"torch_{kind}_ms"
    return f"{e2e[key] / e2e[f'cuconv_{kind}_ms']:.2f}x" if key in e2e else "-"


def print_tables(report: dict) -> None:
    """The tables: models end to end and per-layer sums, then host time, then the correctness checks."""
    meta = report["meta"]
    print(f"\n{meta['device']}, {meta['date']}, torch {meta['torch']}, cuDNN {meta['cudnn']} "
          f"(cudnn.benchmark=True), cuconv {meta['cuconv']}; memory format {meta['memory_format']} on both sides; "
          f"batch {meta['batch']} (layers, training), {meta['infer_batch']} (inference), "
          f"{meta['image']}x{meta['image']}")
    print("ratio = torch time / cuconv time (above 1: cuconv faster); both sides at the same precision")
    head = (f"{'model':<20} {'mode':<5} {'infer':>6} {'train':>6} {'fwd eager':>8} {'fwd GPU':>8} {'f+b eager':>9} "
            f"{'f+b GPU':>9} {'host fwd us':>12} {'host f+b us':>12}")
    print(head)
    print("-" * len(head))
    for name, entry in report["models"].items():
        for mode, result in entry["modes"].items():
            if "error" in result:
                print(f"{name:<20} {mode:<5} ERROR {result['error']}")
                continue
            e2e, s = result.get("e2e", {}), result.get("sums", {})
            cells = [_ratio(e2e, "infer"), _ratio(e2e, "train")]
            cells += [f"{s[f'ratio_{t}']:.2f}x" if s else "-" for t in _TIMES]
            cells += [f"{s[f'cuconv_median_{t}']:.0f}/{s[f'torch_median_{t}']:.0f}" if s else "-"
                      for t in ("fwd_host_us", "fb_host_us")]
            widths = (6, 6, 8, 8, 9, 9, 12, 12)
            print(f"{name:<20} {mode:<5} " + " ".join(f"{c:>{w}}" for c, w in zip(cells, widths)))
    print("infer/train: end-to-end eager; fwd/f+b GPU: per-layer GPU time alone (CUDA graph replay) summed by "
          "occurrence; eager: one timed call per layer; host: median over the layers of µs per call, cuconv/torch")
    compiled = [(n, m, r["e2e"]) for n, e in report["models"].items() for m, r in e["modes"].items()
                if any(k.startswith("cuconv_compile") for k in r.get("e2e", {}))]
    if compiled:
        hows = [h for h in COMPILE_MODES if any(f"cuconv_compile_{h}_infer_ms" in e for _, _, e in compiled)]
        print("\ntorch.compile (ratio torch / cuconv): " + "; ".join(f"{h} infer, train" for h in hows))
        for name, mode, e in compiled:
            keys = [(f"torch_compile_{h}_{k}_ms", f"cuconv_compile_{h}_{k}_ms")
                    for h in hows for k in ("infer", "train")]
            print(f"  {name:<20} {mode:<5} " + " ".join(f"{e[a] / e[b]:.2f}x" if a in e and b in e else "  –  "
                                                        for a, b in keys))
    fused = [(n, m, r["e2e"]) for n, e in report["models"].items() for m, r in e["modes"].items()
             if "cuconv_fused_eager_infer_ms" in r.get("e2e", {})]
    if fused:
        print("\ninference, cuconv fused: torch time / cuconv fused time against torch eager, torch with its "
              "BatchNorms folded, cuconv unfused; eager, then CUDA-graph replay (GPU time alone); torch.compile")
        columns = [(f"{k}_eager_infer_ms", "cuconv_fused_eager_infer_ms") for k in ("torch", "torch_folded", "cuconv")]
        columns += [(f"{k}_graph_infer_ms", "cuconv_fused_graph_infer_ms") for k in ("torch", "torch_folded")]
        if any("torch_compile_default_infer_ms" in e for _, _, e in fused):
            columns.append(("torch_compile_default_infer_ms", "cuconv_fused_eager_infer_ms"))
        per_mode = {}
        for name, mode, e in fused:
            cells = [e[a] / e[b] if a in e and b in e else None for a, b in columns]
            for i, v in enumerate(cells):
                if v is not None:
                    per_mode.setdefault(mode, {}).setdefault(i, []).append(v)
            err = (f"; output {e['fused_out_err']:.1e} / {e['torch_out_err']:.1e}" if "fused_out_err" in e else "")
            err += f"; float64 {e['fused_float64_err']:.1e}" if "fused_float64_err" in e else ""
            err += f"; float64 failed: {e['fused_float64_failure']}" if "fused_float64_failure" in e else ""
            print(f"  {name:<20} {mode:<5} " + " ".join("  –  " if v is None else f"{v:.2f}x" for v in cells) + err)
        for mode, by_column in per_mode.items():  # (each column over the models that have it)
            means = [statistics.geometric_mean(by_column[i]) if i in by_column else None for i in range(len(columns))]
            print(f"  {'geometric mean':<20} {mode:<5} " + " ".join("  –  " if v is None else f"{v:.2f}x"
                                                                    for v in means)
                  + f"; every model vs torch eager >= {min(by_column.get(0, [float('nan')])):.2f}x")
    trained = [(n, m, r["e2e"]) for n, e in report["models"].items() for m, r in e["modes"].items()
               if "cuconv_fused_fused_train_ms" in r.get("e2e", {})]
    if trained:
        print("\ntraining step, cuconv fused (each block one autograd node with its BatchNorm): torch time / cuconv "
              "fused time, cuconv unfused time / cuconv fused time")
        ratios = {}
        for name, mode, e in trained:
            a = e["torch_fused_train_ms"] / e["cuconv_fused_fused_train_ms"]
            b = e["cuconv_fused_train_ms"] / e["cuconv_fused_fused_train_ms"]
            ratios.setdefault(mode, []).append((a, b))
            err = f"; gradients against unfused {e['fused_train_grad_err']:.1e}" if "fused_train_grad_err" in e else ""
            print(f"  {name:<20} {mode:<5} {a:.2f}x {b:.2f}x{err}")
        for mode, rs in ratios.items():
            print(f"  {'geometric mean':<20} {mode:<5} {statistics.geometric_mean(r[0] for r in rs):.2f}x "
                  f"{statistics.geometric_mean(r[1] for r in rs):.2f}x")
    checks = [(n, m, r["check"]) for n, e in report["models"].items() for m, r in e["modes"].items() if "check" in r]
    if checks:
        print("\ncorrectness against torch float32 without TF32 (cuconv's error / torch's own at the same precision)")
        for name, mode, c in checks:
            f64 = (f"; float64 gradients {c['float64_grad_err']:.1e} (worst parameter "
                   f"{c['float64_worst_param_err']:.1e})" if "float64_grad_err" in c else "")
            print(f"  {name:<20} {mode:<5} output {c['out_err']:.1e} / {c['torch_out_err']:.1e}, gradients "
                  f"{c['grad_err']:.1e} / {c['torch_grad_err']:.1e}{f64}")


def _missing(command: str, without_gpu: str):
    """The exit status where ``command`` cannot run here (no GPU: 1, after saying ``without_gpu`` on stderr: the
    work asked for was not done; no torchvision: 2), else None."""
    from .. import _backend

    if not _backend.gpu_available():
        print(f"No CUDA GPU visible (CuPy missing or no device): {without_gpu}.", file=sys.stderr)
        return 1
    try:
        import torchvision  # noqa: F401
    except ImportError:
        print(f"python -m cuconv {command} needs torchvision: pip install 'cuconv[bench]'", file=sys.stderr)
        return 2
    return None


def main(args) -> int:
    unknown = [m for m in args.modes.split(",") if m and m not in MODES]
    if unknown:
        print(f"python -m cuconv bench: unknown mode(s) {unknown}; choose from {MODES}", file=sys.stderr)
        return 2
    try:  # (the options first: a machine without a GPU says what was wrong with them too)
        compile_choices(args.compile_modes, COMPILE_MODES, "--compile-modes")
        compile_choices(args.compile_sides, COMPILE_SIDES, "--compile-sides")
    except ValueError as exc:
        print(f"python -m cuconv bench: {exc}", file=sys.stderr)
        return 2
    status = _missing("bench --models", "the model benchmark needs one")
    if status is not None:
        return status
    report = run(args)
    print_tables(report)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


# --------------------------------------------------------------------------------------------------------
# python -m cuconv warmup
# --------------------------------------------------------------------------------------------------------
def warmup_main(argv) -> int:
    """``python -m cuconv warmup MODEL[,MODEL...]``: compile ahead of time what converted torchvision models
    need (``cuconv.nn.warmup``, into CuPy's kernel cache), per mode; prints the seconds of the warm-up and of the
    first forward that follows it (the cold start of a process whose kernel cache starts empty)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m cuconv warmup",
                                 description="Compile the kernels converted torchvision models need, ahead of time "
                                             "(into CuPy's kernel cache), and time the first forward after it.")
    ap.add_argument("models", help="models as bench --models names them (torchvision's, fpn_resnet50, unet; 'models', "
                                   "'zoo'), comma-separated")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)} (default all)")
    ap.add_argument("--batch", type=int, default=32, help="input batch (default 32)")
    ap.add_argument("--image", type=int, default=224, help="input height and width (default 224)")
    ap.add_argument("--forward-only", action="store_true", help="inference: no dgrad and wgrad plans")
    ap.add_argument("--threads", type=int, default=None, help="threads compiling at once (default: CPUs, at most 16)")
    args = ap.parse_args(argv)
    unknown = [m for m in args.modes.split(",") if m and m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {unknown}; choose from {MODES}")
    if args.batch < 1 or args.image < 1 or (args.threads is not None and args.threads < 1):
        ap.error("--batch, --image and --threads must be positive")
    status = _missing("warmup", "nothing to compile for")
    if status is not None:
        return status
    import torch

    import cuconv.nn

    from . import zoo

    for name in model_names(args.models):
        sample = zoo.sample_shape(name, args.image)
        model = cuconv.nn.convert(_build(name)).cuda()
        if args.forward_only:
            model.eval().requires_grad_(False)
        for mode in (_Mode(m) for m in args.modes.split(",") if m):
            with mode, mode.autocast():
                started = time.perf_counter()
                layers = cuconv.nn.warmup(model, torch.empty(args.batch, *sample, device="meta"),
                                          backward=not args.forward_only, threads=args.threads)
                warm = time.perf_counter() - started
                x = torch.randn(args.batch, *sample, device="cuda")
                torch.cuda.synchronize()
                started = time.perf_counter()
                with torch.no_grad():
                    model(x)
                torch.cuda.synchronize()
                first = time.perf_counter() - started
            print(f"{name} {mode.name}: {layers} layers warmed up in {warm:.1f} s; the first forward after it "
                  f"{first:.2f} s", flush=True)
        del model
        torch.cuda.empty_cache()
    return 0
