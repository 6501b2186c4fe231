"""Bound calls, measured: torch eager against cuconv fused with its bound calls and with the checked path on every
call, in one process.

    PYTHONPATH=. python benchmarks/bound_calls.py resnet50,mobilenet_v3_large 64,1 cl|nchw [bf16|tf32]

Each model (torchvision, ``weights=None``, eval mode) against ``cuconv.nn.convert(model, fuse=True)``; the checked
side has ``FusedConv2d._call_key`` return None (no call binds). Eager inference, four forwards back to back a
sample, the three sides in alternating rounds (``bench_models._alternating_ms``); then host milliseconds a forward
(``perf_counter`` over ten forwards without a synchronisation, median of five). torch with ``cudnn.benchmark``.
docs/perf-notes.md ("Host time in eager") has the figures.
"""

from __future__ import annotations

import copy
import statistics
import sys
import time


def _host_ms(fn, n: int = 10) -> float:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e3


def main(argv) -> int:
    import torch
    import torchvision

    import cuconv.nn
    from cuconv.nn.fuse import FusedConv2d
    from cuconv.tools.bench_models import _alternating_ms

    names, batches, layout = argv[0].split(","), [int(b) for b in argv[1].split(",")], argv[2]
    mode = argv[3] if len(argv) > 3 else "bf16"
    dtype = {"bf16": torch.bfloat16, "tf32": None}[mode]
    torch.backends.cudnn.benchmark = True
    if dtype is None:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    cl = layout == "cl"
    key = FusedConv2d._call_key

    def unbound(self, x, residual):
        return None

    def ctx():
        return torch.autocast("cuda", dtype=dtype) if dtype else torch.autocast("cuda", enabled=False)

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {layout}, {mode}")
    try:
        for name in names:
            base = getattr(torchvision.models, name)(weights=None).cuda().eval()
            fused = cuconv.nn.convert(copy.deepcopy(base), fuse=True).eval()
            if cl:
                base, fused = base.to(memory_format=torch.channels_last), fused.to(memory_format=torch.channels_last)
            for b in batches:
                x = torch.randn(b, 3, 224, 224, device="cuda")
                if cl:
                    x = x.contiguous(memory_format=torch.channels_last)
                with ctx():
                    cuconv.nn.warmup(fused, x, backward=False)

                def side(model, bound):
                    def run():
                        FusedConv2d._call_key = key if bound else unbound
                        with torch.no_grad(), ctx():
                            return model(x)
                    return run
                fns = {"torch": side(base, True), "bound": side(fused, True), "checked": side(fused, False)}
                same = bool(torch.equal(fns["bound"](), fns["checked"]()))
                t = _alternating_ms(fns)
                h = {k: statistics.median(_host_ms(f) for _ in range(5)) for k, f in fns.items()}
                print(f"{name:20s} b{b:<3d} eager ms torch {t['torch']:.3f} bound {t['bound']:.3f} checked "
                      f"{t['checked']:.3f} | vs torch bound {t['torch'] / t['bound']:.2f} checked "
                      f"{t['torch'] / t['checked']:.2f} | host ms/fwd torch {h['torch']:.3f} bound {h['bound']:.3f} "
                      f"checked {h['checked']:.3f} | bound==checked {same}", flush=True)
    finally:
        FusedConv2d._call_key = key
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
