"""The fused layers of whole models, algorithm by algorithm: what ``auto`` chooses for each against the others.

    PYTHONPATH=. python benchmarks/fused_layers.py --models resnet50,mobilenet_v3_large [--channels-last]
        [--mode bf16] [--batch 64] [--algos implicit_gemm,im2col_gemm] [--json out.json]

Each model (``cuconv.tools.zoo``'s names, ``models`` and ``zoo`` included) is converted with ``fuse=True`` and run
once in eval mode; every distinct fused call (input shape and memory format, the convolution's geometry, its
epilogue: bias, activation, residual) is then timed on its own as CUDA-graph replays (GPU time alone, rounds
alternating between the variants) with ``algo="auto"`` and with each of ``--algos`` that serves it, with its
epilogue and with the bias alone (the cost of the epilogue in each algorithm). The summary weighs each layer by
how often the model runs it: ``auto``'s total against the total of the fastest algorithm per layer, and the layers
where ``auto`` is slower than the fastest by more than 5%. Torch is not timed here: the model benchmark
(``python -m cuconv bench --models ... --fuse``) compares against it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def fused_calls(model, x):
    """[(key, description dict, count)] of every distinct ``FusedConv2d`` call a forward of ``model`` on ``x``
    makes."""
    import torch

    from cuconv.nn.fuse import FusedConv2d

    seen, order = {}, []

    def hook(module, args):
        x, conv = args[0], module.conv
        cl = x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
        d = dict(shape=tuple(x.shape), channels_last=cl, out_channels=conv.out_channels,
                 kernel_size=tuple(conv.kernel_size), stride=tuple(conv.stride),
                 padding=conv.padding if isinstance(conv.padding, str) else tuple(conv.padding),
                 dilation=tuple(conv.dilation), groups=conv.groups, activation=module.activation,
                 slope=module.slope, residual=module.residual)
        key = tuple(sorted(d.items()))
        if key not in seen:
            seen[key] = [d, 0]
            order.append(key)
        seen[key][1] += 1

    handles = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, FusedConv2d)]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return [(k, *seen[k]) for k in order]


def _label(d: dict) -> str:
    n, c, h, w = d["shape"]
    k = "x".join(map(str, d["kernel_size"]))
    s = "" if d["stride"] == (1, 1) else f" s{d['stride'][0]}"
    g = "" if d["groups"] == 1 else f" g{d['groups']}"
    ep = "+".join(filter(None, [f"res({d['residual']})" if d["residual"] else None, d["activation"]])) or "bias"
    return f"{c}->{d['out_channels']} {k}{s}{g} @{h}x{w} {ep}"


def time_layer(d: dict, dtype, algos, reps: int):
    """{variant: ms per call} of one fused call: ``auto`` and each of ``algos``, with its epilogue (``name``) and
    with the bias alone (``name/plain``); a variant that refuses the problem is left out."""
    import torch

    import cuconv.nn.functional as F
    from cuconv.tools import bench_models

    fmt = torch.channels_last if d["channels_last"] else torch.contiguous_format
    gen = torch.Generator(device="cuda").manual_seed(0)
    n, c, h, w = d["shape"]
    x = torch.randn(d["shape"], device="cuda", generator=gen).to(dtype).contiguous(memory_format=fmt)
    wt = (torch.randn(d["out_channels"], c // d["groups"], *d["kernel_size"], device="cuda", generator=gen)
          * (c // d["groups"] * d["kernel_size"][0] * d["kernel_size"][1]) ** -0.5).to(dtype)
    wt = wt.contiguous(memory_format=fmt)
    b = torch.randn(d["out_channels"], device="cuda", generator=gen).to(dtype)
    args = (d["stride"], d["padding"], d["dilation"], d["groups"])
    with torch.no_grad():
        y = F.conv2d(x, wt, b, *args)
    residual = torch.randn_like(y) if d["residual"] else None
    fns = {}
    for algo in ("auto", *algos):
        for plain in (False, True):
            kw = {} if plain else dict(activation=d["activation"], negative_slope=d["slope"], residual=residual,
                                       residual_position=d["residual"] or "before")

            def fn(algo=algo, kw=kw):
                with torch.no_grad():
                    return F.conv2d(x, wt, b, *args, algo=algo, **kw)
            try:
                fn()
                torch.cuda.synchronize()
            except Exception:  # (the algorithm does not serve this problem)
                continue
            fns[algo + ("/plain" if plain else "")] = fn
    times = bench_models._graph_ms(list(fns.values()), reps=reps, calls=5)
    return dict(zip(fns, times))


def chosen(d: dict, dtype) -> str:
    """The algorithm ``auto`` runs this fused forward with (the channels-last choice where it serves in place)."""
    from cuconv import _dtypes, select
    from cuconv.problem import Epilogue
    from cuconv.spec import ConvSpec

    import torch

    npdtype = _dtypes.by_name({torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}[dtype])
    precision = "tf32" if dtype == torch.float32 else "ieee"
    spec = ConvSpec.from_args(d["shape"], (d["out_channels"], d["shape"][1] // d["groups"], *d["kernel_size"]),
                              d["stride"], d["padding"], d["dilation"], d["groups"])
    ep = Epilogue(bias=True, activation=d["activation"], alpha=d["slope"] if d["activation"] == "leaky_relu" else 0.0,
                  residual=d["residual"])
    if d["channels_last"]:
        nhwc = select.select_nhwc("auto", spec, npdtype, precision, "fprop", epilogue=ep)
        if nhwc is not None:
            return nhwc
    return select.resolve("auto", spec, npdtype, precision, True, "fprop", epilogue=ep)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True)
    ap.add_argument("--mode", default="bf16", choices=("bf16", "fp16", "tf32"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--algos", default="implicit_gemm,im2col_gemm")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import torch

    import cuconv.nn
    from cuconv.tools import bench_models, zoo

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.mode == "tf32"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}[args.mode]
    algos = [a for a in args.algos.split(",") if a]
    report = dict(mode=args.mode, batch=args.batch, channels_last=args.channels_last, models={})
    for name in bench_models.model_names(args.models):
        torch.manual_seed(0)
        sample = zoo.sample_shape(name, args.image)
        try:
            model = cuconv.nn.convert(zoo.build(name).eval(), fuse=True).cuda().eval()
            fmt = bench_models._format(sample) if args.channels_last else torch.contiguous_format
            model = model.to(dtype=dtype, memory_format=fmt)
            x = torch.randn(args.batch, *sample, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
            calls = fused_calls(model, x)
        except Exception as exc:  # (one model that fails must not lose the others)
            print(f"\n{name}: {type(exc).__name__}: {exc}", flush=True)
            continue
        rows = []
        for _, d, count in calls:
            t = time_layer(d, dtype, algos, args.reps)
            if "auto" not in t:  # (a layer auto itself refused: reported, not summed)
                print(f"  {name}: {_label(d)}: auto failed", flush=True)
                continue
            best = min((v, k) for k, v in t.items() if not k.endswith("/plain"))
            rows.append(dict(layer=_label(d), count=count, auto_algo=chosen(d, dtype), times=t, best=best[1]))
        if not rows:
            print(f"\n{name}: no fused calls", flush=True)
            continue
        total = lambda key: sum(r["count"] * r["times"].get(key, float("nan")) for r in rows)
        oracle = sum(r["count"] * r["times"][r["best"]] for r in rows)
        report["models"][name] = dict(rows=rows, auto_ms=total("auto"), best_ms=oracle,
                                      auto_plain_ms=total("auto/plain"))
        print(f"\n{name} ({args.mode}, batch {args.batch}, {'channels-last' if args.channels_last else 'NCHW'}): "
              f"{len(rows)} distinct fused calls; auto {total('auto'):.3f} ms, fastest per layer {oracle:.3f} ms "
              f"({total('auto') / oracle:.3f}x), auto with the bias alone {total('auto/plain'):.3f} ms", flush=True)
        for r in rows:
            t = r["times"]
            mark = " <-- auto slower" if t["auto"] > 1.05 * t[r["best"]] else ""
            cells = " ".join(f"{k}={v * 1e3:.1f}" for k, v in t.items())
            print(f"  {r['count']:>3}x {r['layer']:<44} auto={r['auto_algo']:<14} µs: {cells}{mark}", flush=True)
        del model
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    ratios = [m["auto_ms"] / m["best_ms"] for m in report["models"].values()]
    if ratios:
        print(f"\nauto / fastest per layer, geometric mean over the models: {statistics.geometric_mean(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
