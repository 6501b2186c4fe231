"""``python -m cuconv profile --models NAME[,NAME...]``: where each side's GPU time goes, kernel by kernel.

For every distinct ``Conv2d`` of the models (as ``bench --models`` finds them), both sides run the layer's forward
and backward (``--forward-only``: the forward) a few times under the torch profiler, in one process, same inputs,
torch with ``cudnn.benchmark = True``, the same precision (``--mode``) and memory format (``--channels-last``).
Each side's kernels are summed per name and per call. Printed: each model's kernel time summed over its layers
weighted by occurrence (torch / cuconv: above 1, cuconv is faster), then the layers that lose the most time
(deficit × occurrences) with each side's costliest kernels. Kernel sums leave out the gaps between launches that
``bench --models``' graph replays include; they say which kernels to work on, the benchmark says how fast a model is.

``--host``: where the host time of eager inference goes instead. Each model converted with ``fuse=True`` (and, with
``--unfused``, without) runs its forward (no_grad, the mode's autocast, ``--infer-batch``) under cProfile after a
warm-up; printed: wall time per forward (the GPU synchronised once after many) beside its GPU time as a CUDA-graph
replay (their difference is how host-bound the model is), host time per run of each cuconv module's forward, and the
functions that take it.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

from . import bench_models

__all__ = ["main", "profile_layer"]


def _kernel_times(fn, iters: int, counts: dict = None) -> dict:
    """{kernel name: µs per call} of ``fn`` run ``iters`` times under the torch profiler (after three warm-up
    calls); ``counts``, where given, gets {kernel name: launches per call}."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    times = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name] += event.time_range.elapsed_us() / iters
            if counts is not None:
                counts[event.name] = counts.get(event.name, 0) + 1 / iters
    return dict(times)


def profile_layer(geometry: dict, shape: tuple, first: bool, mode: "bench_models._Mode", channels_last: bool,
                  forward_only: bool = False, iters: int = 5) -> dict:
    """{"torch": {kernel: µs}, "cuconv": {kernel: µs}} of one layer's forward (+ backward) per call."""
    import torch

    theirs, ours, x, dy = bench_models.layer_operands(geometry, shape, first, mode, channels_last)
    sides = {}
    for side, module in (("torch", theirs), ("cuconv", ours)):
        inputs = [t for t in (x, module.weight, module.bias) if t is not None and t.requires_grad]

        def step(module=module, inputs=inputs):
            if forward_only:
                with torch.no_grad(), mode.autocast(cache=False):
                    return module(x)
            with mode.autocast(cache=False):
                y = module(x)
            return torch.autograd.grad(y, inputs, dy)

        sides[side] = _kernel_times(step, iters)
    return sides


def host_profile(model, x, mode: "bench_models._Mode", calls: int = 20, top: int = 25) -> dict:
    """Eager inference of ``model`` on ``x``: {"forward_ms": wall ms per forward (one synchronisation after all
    ``calls``), "graph_ms": GPU ms per forward (CUDA-graph replay), "forwards": {cuconv module forward: (runs per
    forward, host µs per run under cProfile)}, "stats": pstats text of the ``top`` functions by own time and of
    cuconv's by cumulative time}."""
    import cProfile
    import io
    import pstats
    import time

    import torch

    run = bench_models._infer_fn(model, x, mode)
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        run()
    torch.cuda.synchronize()
    forward_ms = (time.perf_counter() - t0) / calls * 1e3
    graph_ms = bench_models._graph_ms([run], reps=5, calls=2)[0]
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        run()
    profiler.disable()
    torch.cuda.synchronize()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    # the modules' forwards: per forward, how often each runs and its host µs per run (nested ones count in both)
    forwards = {f"{k[0].rsplit('/', 1)[-1]}:{k[1]}": (v[1] / calls, v[3] / v[1] * 1e6)
                for k, v in stats.stats.items() if k[2] == "forward" and "cuconv" in k[0] and v[1]}
    if top:
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats("cuconv", top)
    return dict(forward_ms=forward_ms, graph_ms=graph_ms, forwards=forwards, stats=stream.getvalue())


def epilogue_summary() -> dict:
    """{(algorithm, "in its kernels" | "as a pass after"): layers} over the layers with an epilogue that cuconv's
    torch door has planned in this process (``cuconv.nn.functional``'s kept layers, their aligned forwards)."""
    from cuconv import _plan
    from cuconv.nn import functional

    counts = collections.Counter()
    for layer in list(functional._layers.values()):
        plan = layer._aligned.get("fprop") if layer.epilogue is not None else None
        if plan is not None:
            after = any(isinstance(step, _plan.Nested) for step in plan.steps)
            counts[(plan.algo, "as a pass after" if after else "in its kernels")] += 1
    return dict(counts)


def _main_host(args, mode) -> int:
    import copy

    import torch

    import cuconv.nn

    from . import zoo

    for name in bench_models.model_names(args.models):
        theirs = bench_models._build(name).cuda().eval()
        sample = zoo.sample_shape(name, args.image)
        x, _ = bench_models._inputs(args.infer_batch, args.image, args.channels_last, 1, sample)
        if args.channels_last:
            theirs = theirs.to(memory_format=bench_models._format(sample))
        variants = [("fused", True)] + ([("unfused", False)] if args.unfused else [])
        for label, fuse in variants:
            ours = cuconv.nn.convert(copy.deepcopy(theirs), fuse=fuse).eval()
            with mode.autocast():
                cuconv.nn.warmup(ours, torch.empty(x.shape, device="meta"), backward=False)
            row = host_profile(ours, x, mode, top=args.top)
            print(f"\n### {name} cuconv {label} ({args.mode}{', channels_last' if args.channels_last else ''}, "
                  f"batch {args.infer_batch}): {row['forward_ms']:.2f} ms per forward, GPU {row['graph_ms']:.2f} ms; "
                  f"module forwards (runs per forward, host µs per run under cProfile): " + ", ".join(
                      f"{k} {n:.0f}x {us:.1f}" for k, (n, us) in row["forwards"].items()))
            if fuse:
                print("epilogues so far (algorithm, where: layers): " + ", ".join(
                    f"{a} {where}: {n}" for (a, where), n in sorted(epilogue_summary().items())))
            print(row["stats"])
        torch_row = host_profile(theirs, x, mode, top=0)
        print(f"### {name} torch: {torch_row['forward_ms']:.2f} ms per forward, GPU {torch_row['graph_ms']:.2f} ms")
        del theirs
        torch.cuda.empty_cache()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cuconv profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True, metavar="NAMES",
                    help="torchvision classification models (weights=None), comma-separated")
    ap.add_argument("--mode", choices=bench_models.MODES, default="bf16",
                    help="precision of both sides (default bf16 autocast)")
    ap.add_argument("--channels-last", action="store_true", help="both sides in torch.channels_last")
    ap.add_argument("--forward-only", action="store_true", help="the forward alone (default: forward + backward)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--iters", type=int, default=5, help="profiled calls per layer and side")
    ap.add_argument("--top", type=int, default=30, help="layers listed (the most time lost first)")
    ap.add_argument("--json", metavar="PATH", help="also write every layer's kernel times to this JSON file")
    ap.add_argument("--host", action="store_true",
                    help="where eager inference's host time goes (cProfile of the fused converted model)")
    ap.add_argument("--unfused", action="store_true", help="with --host: the unfused converted model too")
    ap.add_argument("--infer-batch", type=int, default=64, help="with --host: the inference batch (default 64)")
    args = ap.parse_args(argv)
    for option in ("batch", "image", "iters", "top", "infer_batch"):
        if getattr(args, option) < 1:
            ap.error(f"--{option.replace('_', '-')} must be positive")
    try:
        import torch
    except ImportError:
        print("python -m cuconv profile needs torch (and torchvision)", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():  # (the work asked for is not done: a failure, with its reason)
        print("No CUDA GPU visible: nothing to profile", file=sys.stderr)
        return 1
    torch.backends.cudnn.benchmark = True
    mode = bench_models._Mode(args.mode)
    if args.host:
        with mode:
            return _main_host(args, mode)
    rows = []
    with mode:
        for name in bench_models.model_names(args.models):
            model = bench_models._build(name).cuda()
            if args.channels_last:
                model = model.to(memory_format=torch.channels_last)
            layers = bench_models.distinct_layers(model, args.batch, args.image, args.channels_last)
            del model
            for geometry, shape, count, first in layers:
                sides = profile_layer(geometry, shape, first, mode, args.channels_last, args.forward_only, args.iters)
                rows.append(dict(model=name, geometry=geometry, shape=list(shape), count=count, kernels=sides,
                                 torch_us=sum(sides["torch"].values()), cuconv_us=sum(sides["cuconv"].values())))
            torch.cuda.empty_cache()
    totals = collections.defaultdict(lambda: [0.0, 0.0])
    for row in rows:
        totals[row["model"]][0] += row["torch_us"] * row["count"]
        totals[row["model"]][1] += row["cuconv_us"] * row["count"]
    what = "forward" if args.forward_only else "forward+backward"
    print(f"kernel time of the layers' {what}, µs summed over the layers by occurrence ({args.mode}"
          f"{', channels_last' if args.channels_last else ''}): torch, cuconv, torch / cuconv")
    for name, (t, c) in totals.items():
        print(f"  {name:22s} {t:9.0f} {c:9.0f} {t / c:6.2f}")
    t, c = (sum(v[i] for v in totals.values()) for i in (0, 1))
    print(f"  {'all':22s} {t:9.0f} {c:9.0f} {t / c:6.2f}")
    print("\nlayers by time lost (cuconv - torch) x occurrences, each side's costliest kernels (µs per call)")
    for row in sorted(rows, key=lambda r: -(r["cuconv_us"] - r["torch_us"]) * r["count"])[:args.top]:
        g = row["geometry"]
        print(f"\n{row['model']} x{row['count']} {tuple(row['shape'])} {g['in_channels']}->{g['out_channels']} "
              f"k{tuple(g['kernel_size'])} s{tuple(g['stride'])} g{g['groups']}{' bias' if g['bias'] else ''}: "
              f"torch {row['torch_us']:.1f}, cuconv {row['cuconv_us']:.1f} µs")
        for side in ("torch", "cuconv"):
            top = sorted(row["kernels"][side].items(), key=lambda kv: -kv[1])[:5]
            print(f"  {side:6s} " + " | ".join(f"{us:6.1f} {name[:60]}" for name, us in top))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(mode=args.mode, channels_last=args.channels_last, forward_only=args.forward_only,
                           layers=rows), f, indent=1)
    return 0
