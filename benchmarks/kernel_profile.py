"""Where a model's inference GPU time goes, kernel by kernel, on torch's side and on cuconv's fused side.

    PYTHONPATH=. python benchmarks/kernel_profile.py convnext_tiny [--mode bf16|fp32] [--channels-last]
        [--batch 64] [--top 14]

The torchvision model (``weights=None``, eval mode) and a deep copy converted with ``cuconv.nn.convert(...,
fuse=True)`` each run five warm-up forwards, then five forwards under ``torch.profiler`` (CUDA activity); every
CUDA kernel's time is summed by name and listed, largest first, as ms a forward and calls a forward, under each
side's total. bf16 is ``torch.autocast`` on both sides; fp32 follows torch's TF32 flags (``cudnn.benchmark`` on).
The model benchmark (``python -m cuconv bench --models ... --fuse``) times the sides against each other; this
says what fills their time.
"""

from __future__ import annotations

import argparse
import collections
import copy


def _profile(model, x, autocast, forwards: int = 5) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), autocast():
        for _ in range(forwards):
            model(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(forwards):
                model(x)
            torch.cuda.synchronize()
    kernels = collections.defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type.name == "CUDA":
            kernels[event.name][0] += getattr(event, "device_time_total", None) or event.cuda_time_total
            kernels[event.name][1] += 1
    return {name: (us / forwards / 1000.0, calls // forwards) for name, (us, calls) in kernels.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a torchvision model's name")
    ap.add_argument("--mode", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--top", type=int, default=14, help="kernels listed a side")
    args = ap.parse_args(argv)

    import torch
    import torchvision

    import cuconv.nn

    if not torch.cuda.is_available():
        print("kernel_profile: no GPU here")
        return 1
    torch.backends.cudnn.benchmark = True
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    ref = torchvision.models.get_model(args.model, weights=None).cuda().eval().to(memory_format=fmt)
    fused = cuconv.nn.convert(copy.deepcopy(ref), fuse=True).eval()
    x = torch.randn(args.batch, 3, 224, 224, device="cuda").to(memory_format=fmt)
    autocast = (lambda: torch.autocast("cuda", torch.bfloat16)) if args.mode == "bf16" else (
        lambda: torch.autocast("cuda", enabled=False))
    layout = "cl" if args.channels_last else "nchw"
    for side, model in (("torch", ref), ("fused", fused)):
        kernels = _profile(model, x, autocast)
        total = sum(ms for ms, _ in kernels.values())
        print(f"== {args.model} {args.mode} {layout} b{args.batch} {side}: GPU {total:.3f} ms/forward")
        for name, (ms, calls) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:args.top]:
            print(f"  {ms:7.3f} ms {calls:4d}x  {name[:150]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
