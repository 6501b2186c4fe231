"""``python -m cuconv bench``: cuconv against cuDNN (through torch) on the problems of docs/problems.md; with
``--models``, on whole torchvision models and their layers (``bench_models``).

Method (see README "Benchmark"): one process, same inputs for both sides, CUDA events around each call,
warm-up first, median of many runs; torch with ``cudnn.benchmark = True`` and its TF32 switch set to the
precision asked for. Each side is also timed per call in a loop of calls back to back (``loop ms``), where
host time overlaps the previous call's GPU time as it does in a model. Device ceilings (cuBLAS GEMM rate
per precision, device-to-device copy bandwidth) are measured in the same run; "floor" = max(FLOPs / GEMM
rate, fewest bytes / copy bandwidth).
Correctness: normwise relative error of samples 0 and N-1 (of all of dW for wgrad) against torch in
float64. ``--backward`` adds dgrad and wgrad, each against cuDNN's own (``aten.convolution_backward`` with
the other outputs masked off) at the same precision.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy

from .. import _dtypes, select as _select
from ..problem import PASSES
from ..select import autotune
from . import bench_models, layer_zoo
from ..problems import PROBLEMS, SUITES

__all__ = ["main"]

_BY_NAME = {p.name: p for p in PROBLEMS}
_DOORS = {"cupy": "cuconv.conv2d on CuPy arrays", "torch": "cuconv.nn.functional.conv2d on torch tensors"}


def _parse(argv):
    ap = argparse.ArgumentParser(prog="python -m cuconv bench",
                                 description=" ".join(__doc__.split("\n\n")[0].replace("``", "").split()))
    ap.add_argument("--suite", choices=sorted(SUITES), default="all", help="problem set (default all)")
    ap.add_argument("--problem", action="append", default=[], metavar="NAME",
                    help="run only these problems (repeatable, or comma-separated)")
    ap.add_argument("--dtype", choices=("float32", "float16", "bfloat16", "float64"), default="float32")
    ap.add_argument("--precision", choices=("ieee", "tf32"), default="ieee",
                    help="float32 arithmetic on both sides (default ieee)")
    ap.add_argument("--algo", default="auto", help="'auto', 'all', or one of cuconv.algorithms()")
    ap.add_argument("--reps", type=int, default=20, help="timed runs per measurement (median)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--backward", action="store_true",
                    help="also time dgrad and wgrad against cuDNN's backward (aten.convolution_backward)")
    ap.add_argument("--cudnn-layout", choices=("nchw", "nhwc"), default="nchw",
                    help="memory format of torch's tensors alone (nhwc: torch.channels_last, cuDNN's fastest for "
                         "half types), cuconv's arrays staying NCHW; --channels-last puts both sides in NHWC")
    ap.add_argument("--api", choices=("cupy", "torch"), default="cupy",
                    help="cuconv's door: cuconv.conv2d on CuPy arrays into a preallocated out= (default), or "
                         "cuconv.nn.functional.conv2d on torch tensors sharing their memory, its result allocated "
                         "as torch's is (forward only); timed the same way against the same cuDNN calls")
    ap.add_argument("--json", metavar="PATH", help="also write all figures to this JSON file")
    bench_models.add_arguments(ap)
    layer_zoo.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.api == "torch" and args.backward:
        ap.error("--api torch times the forward alone (its dgrad and wgrad run inside autograd); drop --backward")
    names = [n for item in args.problem for n in item.split(",") if n] or list(SUITES[args.suite])
    unknown = [n for n in names if n not in _BY_NAME]
    if unknown:
        ap.error(f"unknown problem(s) {unknown}; choose from {sorted(_BY_NAME)}")
    algos = (tuple(dict.fromkeys(n for p in PASSES for n in _select.algorithms(p)))
             if args.algo == "all" else (args.algo,))
    for a in algos:
        if a != "auto" and a not in _select.algorithms():
            ap.error(f"unknown algo {a!r}; choose 'auto', 'all' or one of {_select.algorithms()}")
    return args, names, algos


# ----------------------------------------------------------------------------------------------------
# GPU measurement helpers
# ----------------------------------------------------------------------------------------------------
def _time_gpu(fn, reps, warmup):
    """Median milliseconds of ``fn()`` over ``reps`` runs, timed with CUDA events on CuPy's stream."""
    from ..select.autotune import time_cuda

    return time_cuda(fn, reps, warmup)


def _time_loop(fn, call_ms, reps=5):
    """Median milliseconds per call of ``fn`` called back to back between two CUDA events: the throughput of
    a layer called in a loop, where the host enqueues the next call while the GPU runs this one. Equal to
    the single-call time for large problems; for small ones it drops the idle GPU time before the launch
    that a single timed call includes (whichever of host and GPU is slower sets it)."""
    from ..select.autotune import time_cuda

    return time_cuda(fn, reps, 1, calls=max(3, min(50, int(20.0 / max(call_ms, 1e-3)))))


def _host_overhead_us(fn, reps=20):
    """Median host time of one call in microseconds (enqueue only, no synchronisation inside)."""
    import cupy

    samples = []
    for _ in range(reps):
        cupy.cuda.get_current_stream().synchronize()
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    cupy.cuda.get_current_stream().synchronize()
    return statistics.median(samples)


def measure_ceilings(reps=10):
    """Measured cuBLAS GEMM rates (TFLOP/s) per (dtype, precision) and copy bandwidth (TB/s, read+write)."""
    import cupy

    from .. import _cublas

    rates = {}
    n = 8192
    for key, dtype, precision in (("float32/ieee", numpy.float32, "ieee"), ("float32/tf32", numpy.float32, "tf32"),
                                  ("float16", numpy.float16, "ieee"), ("float64", numpy.float64, "ieee")):
        size = n if dtype != numpy.float64 else 4096
        a = cupy.random.standard_normal((size, size), dtype=numpy.float32).astype(dtype)
        b = cupy.random.standard_normal((size, size), dtype=numpy.float32).astype(dtype)
        c = cupy.empty((size, size), dtype=dtype)

        def run():
            _cublas.gemm(dtype, precision, size, size, size, a.data.ptr, size, 0, b.data.ptr, size, 0,
                         c.data.ptr, size, 0, 1)

        ms = _time_gpu(run, reps, 2)
        rates[key] = 2 * size ** 3 / (ms * 1e-3) / 1e12
        del a, b, c
    src = cupy.random.standard_normal(1 << 28, dtype=numpy.float32)  # 1 GiB
    dst = cupy.empty_like(src)
    ms = _time_gpu(lambda: dst.__setitem__(Ellipsis, src), reps, 2)
    bandwidth = 2 * src.nbytes / (ms * 1e-3) / 1e12
    del src, dst
    cupy.get_default_memory_pool().free_all_blocks()
    return rates, bandwidth


class _PeakWorkspace:
    """Peak bytes CuPy allocations hold inside the block (the column buffers of one cuconv call)."""

    def __init__(self):
        from cupy.cuda import memory_hook

        outer = self

        class Hook(memory_hook.MemoryHook):
            name = "cuconv_bench_peak"

            def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
                outer.sizes[mem_ptr] = size
                outer.current += size
                outer.peak = max(outer.peak, outer.current)

            def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
                outer.current -= outer.sizes.pop(mem_ptr, 0)

        self.hook, self.sizes, self.current, self.peak = Hook(), {}, 0, 0

    def __enter__(self):
        self.hook.__enter__()
        return self

    def __exit__(self, *exc):
        return self.hook.__exit__(*exc)


def _host_array(a):
    """A CuPy array's or a torch tensor's values as a NumPy array (float64 for a torch tensor: NumPy has no
    bfloat16 of torch's)."""
    if hasattr(a, "detach"):
        return a.detach().double().cpu().numpy()
    import cupy

    return cupy.asnumpy(a)


def _rel_err(y, ref):
    y = y.astype(numpy.float64)
    den = float(numpy.linalg.norm(ref))
    return float(numpy.linalg.norm(y - ref) / (den if den else 1.0))


# ----------------------------------------------------------------------------------------------------
class _Pass:
    """One direction of one problem: how torch and cuconv run it, its float64 reference, its bytes."""

    def __init__(self, name, torch_call, ours, reference, compare, min_bytes):
        self.name, self.torch_call, self.ours = name, torch_call, ours
        self.reference, self.compare, self.min_bytes = reference, compare, min_bytes


def _channels_last(a):
    """``a`` (N, C, H, W) with channels-last strides (torch.channels_last's layout), same values."""
    import cupy

    return cupy.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def _passes(args, prob, spec, x, w, dy):
    """fprop, and with --backward dgrad and wgrad, each with its torch call, our call and its oracle."""
    import cupy
    import torch

    import cuconv

    kw = prob.conv_kwargs
    xt, wt = torch.from_dlpack(x), torch.from_dlpack(w)  # with --channels-last, x and w are NHWC already
    if args.cudnn_layout == "nhwc":  # torch's copies only: cuconv keeps reading its NCHW arrays
        xt, wt = (t.contiguous(memory_format=torch.channels_last) for t in (xt, wt))
    idx = [0, spec.n - 1] if spec.n > 1 else [0]  # samples checked (both batch ends: chunking errors)
    item = x.dtype.itemsize
    out_bytes = spec.n * spec.k * spec.p * spec.q * item
    aten_args = (list(prob.stride), list(prob.padding), list(prob.dilation), False, [0, 0], prob.groups)
    out = _channels_last(cupy.empty(spec.output_shape, dtype=x.dtype)) if args.channels_last else \
        cupy.empty(spec.output_shape, dtype=x.dtype)

    if args.api == "torch":  # (the torch door on the same memory: its precision follows torch's TF32 switch)
        import cuconv.nn.functional

        xo, wo = torch.from_dlpack(x), torch.from_dlpack(w)

        def fprop(algo):
            with torch.no_grad():
                return cuconv.nn.functional.conv2d(xo, wo, None, algo=algo, **kw)
    else:
        def fprop(algo):
            return cuconv.conv2d(x, w, None, algo=algo, precision=args.precision, out=out, **kw)

    yield _Pass("fprop", lambda: torch.nn.functional.conv2d(xt, wt, None, **kw), fprop,
                lambda: torch.nn.functional.conv2d(xt[idx].double(), wt.double(), None, **kw),
                lambda y: y[idx], x.nbytes + w.nbytes + out_bytes)
    if dy is None:
        return
    dyt = torch.from_dlpack(dy)
    if args.cudnn_layout == "nhwc":
        dyt = dyt.contiguous(memory_format=torch.channels_last)
    backward = torch.ops.aten.convolution_backward

    def dgrad(algo):
        return cuconv.conv2d_input(x.shape, w, dy, algo=algo, precision=args.precision, **kw)

    def wgrad(algo):
        return cuconv.conv2d_weight(x, w.shape, dy, algo=algo, precision=args.precision, **kw)

    yield _Pass("dgrad", lambda: backward(dyt, xt, wt, None, *aten_args, [True, False, False])[0], dgrad,
                lambda: backward(dyt[idx].double(), xt[idx].double(), wt.double(), None, *aten_args,
                                 [True, False, False])[0],
                lambda dx: dx[idx], dy.nbytes + w.nbytes + x.nbytes)
    yield _Pass("wgrad", lambda: backward(dyt, xt, wt, None, *aten_args, [False, True, False])[1], wgrad,
                lambda: backward(dyt.double(), xt.double(), wt.double(), None, *aten_args,
                                 [False, True, False])[1],
                lambda dw: dw, dy.nbytes + x.nbytes + w.nbytes)


def _measure(args, prob, spec, pass_, algos, rate, bandwidth, progress):
    """Time torch and every algorithm on one pass; yield one row per algorithm."""
    import cupy
    import torch

    floor_ms = max(spec.flops / (rate * 1e12), pass_.min_bytes / (bandwidth * 1e12)) * 1e3
    t_ms = _time_gpu(pass_.torch_call, args.reps, args.warmup)
    t_loop_ms = _time_loop(pass_.torch_call, t_ms)
    theirs = pass_.torch_call()
    ref = pass_.reference().cpu().numpy()
    torch_err = _rel_err(pass_.compare(theirs).float().cpu().numpy(), ref)
    del theirs
    torch.cuda.empty_cache()
    rows = []
    for algo in algos:
        try:
            with _PeakWorkspace() as peak:
                result = pass_.ours(algo)
                cupy.cuda.get_current_stream().synchronize()
        except NotImplementedError as exc:
            print(f"{progress} {prob.name} {pass_.name} {algo}: skipped ({exc})", file=sys.stderr, flush=True)
            continue
        # fprop writes into a preallocated out=; dgrad/wgrad return their result: not workspace
        workspace = peak.peak - (0 if pass_.name == "fprop" else result.nbytes)
        err = _rel_err(_host_array(pass_.compare(result)), ref)
        del result
        ms = _time_gpu(lambda: pass_.ours(algo), args.reps, args.warmup)
        loop_ms = _time_loop(lambda: pass_.ours(algo), ms)
        host_us = _host_overhead_us(lambda: pass_.ours(algo))
        dtype = _dtypes.by_name(args.dtype)
        auto_algo = _select.select_algorithm(spec, dtype, args.precision, True, pass_.name)
        chosen = auto_algo if algo == "auto" else algo
        row = dict(problem=prob.name, pass_=pass_.name, algo=chosen, auto_algo=auto_algo, dtype=args.dtype,
                   precision=args.precision,
                   ms=ms, tflops=spec.flops / (ms * 1e-3) / 1e12, floor_ms=floor_ms,
                   pct_floor=100 * floor_ms / ms, cudnn_ms=t_ms, ratio=t_ms / ms, rel_err=err,
                   torch_rel_err=torch_err, host_us=host_us, workspace_mib=workspace / 2**20,
                   loop_ms=loop_ms, cudnn_loop_ms=t_loop_ms, loop_ratio=t_loop_ms / loop_ms)
        if pass_.name == "fprop" and chosen == "im2col_gemm" and not spec.is_pointwise_identity:
            col_bytes = 2 * spec.n * spec.crs * spec.p * spec.q * dtype.itemsize  # written once, read once
            row["im2col_floor_ms"] = ((pass_.min_bytes + col_bytes) / (bandwidth * 1e12)
                                      + spec.flops / (rate * 1e12)) * 1e3
        print(f"{progress} {prob.name} {pass_.name} {chosen}: {ms:.3f} ms, cuDNN {t_ms:.3f} ms, ratio "
              f"{t_ms / ms:.2f}x (in a loop {loop_ms:.3f} against {t_loop_ms:.3f} ms: {t_loop_ms / loop_ms:.2f}x), "
              f"err {err:.1e}", file=sys.stderr, flush=True)
        rows.append(row)
    if len(algos) > 1 and rows:
        # auto with config.benchmark on: its first call times the candidates (the autotuner), then the
        # winner is timed like every row above
        import cuconv

        with cuconv.config(benchmark=True):
            pass_.ours("auto")
            tuned_ms = _time_gpu(lambda: pass_.ours("auto"), args.reps, args.warmup)
        tuned = autotune.winner(spec, dtype, args.precision, pass_.name)
        tuned_algo = None if tuned is None else autotune.text(tuned)
        for row in rows:
            row["tuned_ms"], row["tuned_algo"] = tuned_ms, tuned_algo
    yield from rows


def _bench_gpu(args, names, algos):
    import cupy
    import torch

    import cuconv

    torch.backends.cudnn.benchmark = True
    tf32 = args.precision == "tf32" and args.dtype == "float32"
    torch.backends.cudnn.allow_tf32 = tf32
    conv_backend = getattr(torch.backends.cudnn, "conv", None)
    if conv_backend is not None and hasattr(conv_backend, "fp32_precision"):
        conv_backend.fp32_precision = "tf32" if tf32 else "ieee"
    dtype = _dtypes.by_name(args.dtype)
    if dtype is None:
        raise SystemExit("bench: bfloat16 needs ml_dtypes installed (CuPy's bfloat16 arrays)")
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
    device_name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]

    print(f"cuconv {cuconv.__version__} | {device_name} | torch {torch.__version__} "
          f"cuDNN {torch.backends.cudnn.version()} | dtype {args.dtype} | precision both sides: "
          f"{'TF32' if tf32 else ('fp32-IEEE' if args.dtype == 'float32' else args.dtype)}",
          file=sys.stderr)
    print("measuring device ceilings ...", file=sys.stderr, flush=True)
    rates, bandwidth = measure_ceilings()
    # bfloat16 runs on the same tensor cores at the same rate as float16
    rate_key = {"float32": "float32/tf32" if tf32 else "float32/ieee", "bfloat16": "float16"}.get(args.dtype,
                                                                                                   args.dtype)
    rate = rates[rate_key]
    print(f"ceilings: GEMM {', '.join(f'{k} {v:.0f}' for k, v in rates.items())} TFLOP/s; "
          f"copy {bandwidth:.2f} TB/s (read+write)", file=sys.stderr, flush=True)

    rows = []
    for i, name in enumerate(names, 1):
        prob = _BY_NAME[name]
        spec = prob.spec()
        rng = cupy.random.default_rng(1234 + i)
        x = rng.standard_normal(prob.input_shape, dtype=numpy.float32).astype(dtype)
        w = (rng.standard_normal(prob.weight_shape, dtype=numpy.float32)
             / numpy.sqrt(spec.crs_per_group)).astype(dtype)
        dy = rng.standard_normal(spec.output_shape, dtype=numpy.float32).astype(dtype) if args.backward else None
        if args.channels_last:  # both sides read the same channels-last arrays
            x, w = _channels_last(x), _channels_last(w)
            dy = None if dy is None else _channels_last(dy)
        for pass_ in _passes(args, prob, spec, x, w, dy):
            for row in _measure(args, prob, spec, pass_, algos, rate, bandwidth, f"[{i}/{len(names)}]"):
                rows.append(row)
        del x, w, dy
        cupy.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    meta = dict(device=device_name, torch=torch.__version__, cudnn=torch.backends.cudnn.version(),
                cuconv=cuconv.__version__, dtype=args.dtype, precision=args.precision,
                cudnn_layout="nhwc" if args.channels_last else args.cudnn_layout,
                cuconv_layout="nhwc" if args.channels_last else "nchw", gemm_tflops=rates, copy_tbs=bandwidth,
                date=time.strftime("%Y-%m-%d"), api=args.api)
    return meta, rows


def _print_auto_vs_best(rows):
    """With several algorithms timed per problem (``--algo all``): what ``auto`` picks against the fastest."""
    groups = {}
    for r in rows:
        groups.setdefault((r["problem"], r["pass_"]), []).append(r)
    if all(len(g) < 2 for g in groups.values()):
        return
    print("\nauto (heuristic, config.benchmark off; and with it on) against the fastest algorithm:")
    for (problem, pass_), group in groups.items():
        best = min(group, key=lambda r: r["ms"])
        chosen = next((r for r in group if r["algo"] == group[0].get("auto_algo")), None)
        if chosen is None:
            continue
        tuned = (f"  with config.benchmark {chosen.get('tuned_algo') or '?'} {chosen['tuned_ms']:.3f} ms: "
                 f"{chosen['tuned_ms'] / best['ms']:.2f}x" if "tuned_ms" in chosen else "")
        print(f"  {problem:<20} {pass_:<6} auto={chosen['algo']:<12} {chosen['ms']:>9.3f} ms  "
              f"best={best['algo']:<12} {best['ms']:>9.3f} ms  auto/best {chosen['ms'] / best['ms']:.2f}x{tuned}")


def _print_table(meta, rows):
    print(f"\n{meta['device']}, {meta['date']}, dtype {meta['dtype']}, precision {meta['precision']} "
          f"(both sides), memory format cuconv {meta['cuconv_layout']} / cuDNN {meta['cudnn_layout']}; "
          f"torch {meta['torch']}, cuDNN {meta['cudnn']}, cudnn.benchmark=True; cuconv through "
          f"{_DOORS[meta.get('api', 'cupy')]}")
    head = (f"{'problem':<20} {'pass':<6} {'algo':<12} {'ms':>9} {'TFLOP/s':>8} {'%floor':>7} {'cuDNN ms':>9} "
            f"{'ratio':>6} {'loop ms':>9} {'loop':>6} {'rel err':>8} {'torch err':>9} {'host us':>8} {'ws MiB':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['problem']:<20} {r['pass_']:<6} {r['algo']:<12} {r['ms']:>9.3f} {r['tflops']:>8.1f} "
              f"{r['pct_floor']:>6.0f}% {r['cudnn_ms']:>9.3f} {r['ratio']:>5.2f}x {r['loop_ms']:>9.3f} "
              f"{r['loop_ratio']:>5.2f}x {r['rel_err']:>8.1e} {r['torch_rel_err']:>9.1e} "
              f"{r['host_us']:>8.0f} {r['workspace_mib']:>7.0f}")
    _print_auto_vs_best(rows)
    print("ratio: cuDNN time / cuconv time of one timed call; loop: the same for calls back to back "
          "(loop ms: per call)")
    for pass_ in ("fprop", "dgrad", "wgrad"):
        ratios = [r["ratio"] for r in rows if r["pass_"] == pass_]
        if ratios:
            geo = float(numpy.exp(numpy.mean(numpy.log(ratios))))
            print(f"{pass_}: geometric mean ratio (cuDNN time / cuconv time): {geo:.2f}x")


def _bench_cpu(args):
    import cuconv

    print("No CUDA GPU visible (CuPy missing or no device): timing nothing. Running a reduced "
          "problem on the NumPy CPU path against torch instead.")
    prob = _BY_NAME["dilated_padded_5x9"].scaled(n=2, hw=48)
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal(prob.input_shape)
    w = rng.standard_normal(prob.weight_shape)
    t0 = time.perf_counter()
    y = cuconv.conv2d(x, w, **prob.conv_kwargs)
    ms = (time.perf_counter() - t0) * 1e3
    try:
        import torch

        ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), **prob.conv_kwargs).numpy()
        err = f"{_rel_err(y, ref):.1e} vs torch (CPU, float64)"
    except ImportError:
        err = "not checked (torch not installed)"
    print(f"{prob.name} reduced to {prob.input_shape} on the CPU: {ms:.1f} ms, output {y.shape}, "
          f"relative error {err}")
    if args.json:
        meta = dict(device="cpu (no CUDA GPU visible)", cuconv=cuconv.__version__, dtype="float64",
                    date=time.strftime("%Y-%m-%d"))
        with open(args.json, "w") as fh:
            json.dump(dict(meta=meta, rows=[dict(problem=f"{prob.name} (reduced)", algo="im2col_gemm",
                                                   ms=ms, rel_err=err)]), fh, indent=2)


def main(argv=None) -> int:
    from .. import _backend

    args, names, algos = _parse(argv)
    if args.layer_zoo:
        return layer_zoo.main(args)
    if args.models:
        return bench_models.main(args)
    if not _backend.gpu_available():
        _bench_cpu(args)
        return 0
    meta, rows = _bench_gpu(args, names, algos)
    _print_table(meta, rows)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(meta=meta, rows=rows), fh, indent=2)
    return 0
