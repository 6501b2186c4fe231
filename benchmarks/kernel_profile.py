"""Where a model's inference GPU time goes, kernel by kernel, on torch's side and on cuconv's fused side.

    PYTHONPATH=. python benchmarks/kernel_profile.py convnext_tiny [--mode bf16|tf32|fp16] [--channels-last]
        [--batch 64] [--top 14]

The model (``cuconv.tools.zoo``'s names, torchvision's with ``weights=None``; eval mode) and a copy converted with
``cuconv.nn.convert(..., fuse=True)`` each run their forward under the torch profiler (``cuconv profile``'s kernel
sums: three warm-up calls, five profiled); every CUDA kernel's time is summed by name and listed, largest first, as
ms and launches a forward, under each side's total. The mode is ``bench --models``' (autocast for the half types,
torch's TF32 flags for tf32; ``cudnn.benchmark`` on). The model benchmark (``python -m cuconv bench --models ...
--fuse``) times the sides against each other; this says what fills their time. ``cuconv profile`` does the same for
each convolution layer alone.
"""

from __future__ import annotations

import argparse
import copy


def main(argv=None) -> int:
    from cuconv.tools import bench_models, profile, zoo

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a model's name (cuconv.tools.zoo)")
    ap.add_argument("--mode", choices=bench_models.MODES, default="bf16", help="bench --models' mode")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--top", type=int, default=14, help="kernels listed a side")
    args = ap.parse_args(argv)

    import torch

    import cuconv.nn

    if not torch.cuda.is_available():
        print("kernel_profile: no GPU here")
        return 1
    torch.backends.cudnn.benchmark = True
    mode = bench_models._Mode(args.mode)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    ref = zoo.build(args.model).cuda().eval().to(memory_format=fmt)
    fused = cuconv.nn.convert(copy.deepcopy(ref), fuse=True).eval()
    x = torch.randn(args.batch, 3, 224, 224, device="cuda").to(memory_format=fmt)
    with mode:  # (its TF32 flags, as bench --models sets them)
        for side, model in (("torch", ref), ("fused", fused)):
            def forward(model=model):
                with torch.no_grad(), mode.autocast(cache=False):
                    return model(x)

            counts = {}
            times = profile._kernel_times(forward, 5, counts)
            print(f"== {args.model} {args.mode} {'cl' if args.channels_last else 'nchw'} b{args.batch} {side}: GPU "
                  f"{sum(times.values()) / 1000:.3f} ms/forward")
            for name, us in sorted(times.items(), key=lambda kv: -kv[1])[:args.top]:
                print(f"  {us / 1000:7.3f} ms {round(counts[name]):4d}x  {name[:150]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
