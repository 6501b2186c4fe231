"""``python -m cuconv bench --layer-zoo``: every distinct Conv2d of the zoo's models, layer by layer against cuDNN.

The layers (``collect``) are the distinct ``torch.nn.Conv2d`` calls (input shape and geometry) that the models
of ``--models`` (default: MODELS.md's five and ``cuconv.tools.zoo.ZOO``) make at each batch of ``--layer-batches``,
found by running each model on the meta device (nothing is computed or allocated). Each is timed with
``bench_models.measure_layer`` (GPU time alone as CUDA-graph replays, forward and forward+backward, both sides in
one process, torch with ``cudnn.benchmark``) in each mode of ``--modes`` and in NCHW and channels-last
(``--layouts``). The table lists the layers below ``--floor`` of cuDNN's GPU time, worst first, and the geometric
means; ``--json`` keeps every row, so a loss shows the day it appears. ``--layer-slice a:b`` times the layers
``a`` to ``b`` of the collected list only (a run of the whole zoo takes longer than one device call).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

__all__ = ["collect", "main", "add_arguments"]


def add_arguments(ap) -> None:
    g = ap.add_argument_group("layer zoo (python -m cuconv bench --layer-zoo)")
    g.add_argument("--layer-zoo", action="store_true",
                   help="time every distinct Conv2d of the zoo's models (--models; default: the five and the zoo)")
    g.add_argument("--layer-batches", default="1,8,32,128", help="batches the layers are collected at")
    g.add_argument("--layouts", default="nchw,channels_last", help="comma-separated, of nchw and channels_last")
    g.add_argument("--layer-slice", default=":", metavar="A:B", help="time only layers A to B of the collected list")
    g.add_argument("--floor", type=float, default=0.85, help="list the layers below this ratio to cuDNN")


def collect(names, batches, image: int = 224) -> list:
    """[{geometry, shape, models: {name: count}}] of every distinct Conv2d call the models ``names`` make at
    each of ``batches``, in the order first met; on the meta device."""
    import torch

    from . import zoo

    seen, order = {}, []
    for name in names:
        model = zoo.build(name).eval().to("meta")
        counts = {}

        def hook(module, args):
            geometry = dict(in_channels=module.in_channels, out_channels=module.out_channels,
                            kernel_size=tuple(module.kernel_size), stride=tuple(module.stride),
                            padding=module.padding if isinstance(module.padding, str) else tuple(module.padding),
                            dilation=tuple(module.dilation), groups=module.groups, bias=module.bias is not None,
                            padding_mode=module.padding_mode)
            key = (tuple(args[0].shape), tuple(sorted(geometry.items())))
            if key not in seen:
                seen[key] = dict(geometry=geometry, shape=tuple(args[0].shape), models={})
                order.append(key)
            counts[key] = counts.get(key, 0) + 1

        handles = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
        try:
            for batch in batches:
                with torch.no_grad():
                    model(torch.empty(batch, *zoo.sample_shape(name, image), device="meta"))
        finally:
            for h in handles:
                h.remove()
        for key, count in counts.items():
            seen[key]["models"][name] = seen[key]["models"].get(name, 0) + count
    return [seen[k] for k in order]


def _slice(spec: str, n: int) -> range:
    a, _, b = spec.partition(":")
    return range(*slice(int(a) if a else None, int(b) if b else None).indices(n))


def main(args) -> int:
    import torch

    from . import bench_models, zoo

    names = bench_models.model_names(args.models or "models,zoo")
    batches = [int(b) for b in args.layer_batches.split(",") if b]
    layouts = [x for x in args.layouts.split(",") if x]
    if any(x not in ("nchw", "channels_last") for x in layouts):
        print(f"--layouts: expected nchw and/or channels_last, got {args.layouts!r}", file=sys.stderr)
        return 2
    missing = bench_models._missing("bench --layer-zoo", "nothing to time")
    if missing is not None:
        return missing
    started = time.perf_counter()
    layers = collect([n for n in names if n not in zoo.VIDEO], batches, args.image)
    chosen = _slice(args.layer_slice, len(layers))
    print(f"layer zoo: {len(layers)} distinct Conv2d calls of {len(names)} models at batches {batches} "
          f"({time.perf_counter() - started:.0f} s to collect); timing {len(chosen)} of them", flush=True)
    torch.backends.cudnn.benchmark = True
    rows = []
    for mode in (bench_models._Mode(m) for m in args.modes.split(",") if m):
        with mode:
            for layout in layouts:
                for i in chosen:
                    layer = layers[i]
                    try:
                        row = bench_models.measure_layer(layer["geometry"], layer["shape"], False, mode,
                                                         args.layer_reps, layout == "channels_last")
                    except Exception as exc:  # (one layer that fails must not lose the others' figures)
                        row = dict(error=f"{type(exc).__name__}: {exc}")
                    row.update(index=i, mode=mode.name, layout=layout, models=layer["models"])
                    rows.append(row)
    _print(rows, args.floor)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(meta=dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                                     cudnn=torch.backends.cudnn.version(), batches=batches, image=args.image,
                                     commit=bench_models._commit(), date=time.strftime("%Y-%m-%d"),
                                     layers=len(layers), models=names), rows=rows), fh, indent=1)
    return 0


def _ratio(row, key: str):
    ours, theirs = row.get(f"cuconv_{key}"), row.get(f"torch_{key}")
    return theirs / ours if isinstance(ours, (int, float)) and isinstance(theirs, (int, float)) and ours > 0 else None


def _print(rows, floor: float) -> None:
    groups = {}
    for row in rows:
        groups.setdefault((row["mode"], row["layout"]), []).append(row)
    for (mode, layout), group in groups.items():
        print(f"\n{mode}, {layout}: {len(group)} layers; ratio = cuDNN GPU time / cuconv's (above 1: cuconv faster)")
        for key, label in (("fwd_gpu_ms", "forward"), ("fb_gpu_ms", "forward+backward")):
            ratios = [(r, _ratio(r, key)) for r in group]
            ratios = [(r, v) for r, v in ratios if v is not None]
            if not ratios:
                continue
            below = sorted((v, r) for r, v in ratios if v < floor)
            print(f"  {label}: geometric mean {statistics.geometric_mean([v for _, v in ratios]):.2f}x, "
                  f"{len(below)} below {floor}x, lowest {min(v for _, v in ratios):.2f}x")
            for v, r in below[:20]:
                g = r.get("kernel_size"), r.get("stride"), r.get("groups")
                print(f"    {v:.2f}x  {r['shape']} -> {r.get('out_channels')} k{g[0]} s{g[1]} g{g[2]}  "
                      f"{r.get('algos', {})}  ({', '.join(r['models'])})")
        errors = [r for r in group if "error" in r]
        if errors:
            print(f"  {len(errors)} layers failed, first: {errors[0]['error']}")
