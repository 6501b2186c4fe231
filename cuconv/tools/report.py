"""``python -m cuconv.tools.report [RESULTS.json] [--readme README.md] [--plot PATH.png]``: the README's
benchmark table and plot, generated from a model-benchmark results file.

The results file is what ``python -m cuconv bench --models ... --json PATH`` writes (``bench_models.run``):
``meta`` (device, date, torch and cuDNN versions, memory format, modes; the commit, kept there and not in the
README) and, per model and mode, ``e2e`` (end-to-end times, eager, and with ``--fuse`` fused and as CUDA-graph
replays) and ``sums`` (the per-layer times summed by occurrence). Without RESULTS.json the latest file in ``benchmarks/results/`` is taken (by its
``meta.date``, then its name). Every figure is optional: a run of one mode, without end-to-end times or without
layers, or one whose mode failed, gives a table of what it holds ("–" elsewhere).

The table replaces whatever lies between ``<!-- benchmark-table -->`` and ``<!-- /benchmark-table -->`` in the
README, so running it again on the same results leaves the README as it is. The plot (matplotlib, Agg) goes
beside the results file unless ``--plot`` names another path; the README links it by a path relative to itself,
which GitHub renders. Neither a GPU nor torch is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

__all__ = ["BEGIN", "END", "latest_results", "table_rows", "caption", "readme_block", "block_for", "replace_block",
           "render_plot", "main"]

BEGIN = "<!-- benchmark-table -->"
END = "<!-- /benchmark-table -->"
RESULTS_DIR = pathlib.Path("benchmarks") / "results"

# (heading, how a row's cell is computed): a ratio is torch time / cuconv time (above 1: cuconv faster)
HEADINGS = ("model", "mode", "inference", "fused inference: vs torch", "vs torch folded", "CUDA graph",
            "training step", "layers, GPU alone: fwd", "fwd+bwd", "layers, eager: fwd", "fwd+bwd",
            "host µs, cuconv / torch: fwd", "fwd+bwd")
# each cell after model and mode: ("ratio", section, key) of torch_<key> / cuconv_<key>; ("fused", torch's key)
# of that e2e time over cuconv fused's of its kind (eager or graph); ("host", key) the medians side by side
_CELLS = (("ratio", "e2e", "infer_ms"), ("fused", "torch_eager_infer_ms"), ("fused", "torch_folded_eager_infer_ms"),
          ("fused", "torch_graph_infer_ms"), ("ratio", "e2e", "train_ms"), ("ratio", "sums", "fwd_gpu_ms"),
          ("ratio", "sums", "fb_gpu_ms"), ("ratio", "sums", "fwd_ms"), ("ratio", "sums", "fb_ms"),
          ("host", "fwd_host_us"), ("host", "fb_host_us"))
_PANELS = ((("ratio", "sums", "fwd_gpu_ms"), "layers, GPU time alone: forward"),
           (("ratio", "sums", "fb_gpu_ms"), "layers, GPU time alone: forward+backward"))
_PANELS_E2E = ((("ratio", "e2e", "infer_ms"), "eager inference"), (("ratio", "e2e", "train_ms"), "eager training step"))
_PANELS_FUSED = ((("fused", "torch_eager_infer_ms"), "fused inference, eager: vs torch eager"),
                 (("fused", "torch_graph_infer_ms"), "fused inference, CUDA graph: vs torch's"))
_MODE_WORDS = {"tf32": "TF32", "ieee": "float32 without TF32"}
_AUTOCAST = ("bf16", "fp16")
DASH = "–"


# --------------------------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------------------------
def _load(path) -> dict:
    with open(path, encoding="utf-8") as fh:
        report = json.load(fh)
    if not isinstance(report, dict) or not isinstance(report.get("models"), dict):
        raise ValueError(f"{path}: not a model-benchmark results file (no 'models' object)")
    report.setdefault("meta", {})
    return report


def latest_results(directory=RESULTS_DIR) -> pathlib.Path:
    """The model-benchmark results file of ``directory`` with the latest ``meta.date`` (then the last name)."""
    found = []
    for path in sorted(pathlib.Path(directory).glob("*.json")):
        try:
            report = _load(path)
        except (OSError, ValueError):  # other JSON files (single-layer runs, notes) are not candidates
            continue
        found.append((str(report["meta"].get("date", "")), path.name, path))
    if not found:
        raise FileNotFoundError(f"no model-benchmark results (*.json with a 'models' object) in {directory}")
    return max(found)[2]


def _ratio(result: dict, section: str, key: str):
    """torch time / cuconv time of ``result[section]`` (the stored ratio where the sums carry one), or None."""
    data = result.get(section) or {}
    if section == "sums" and isinstance(data.get(f"ratio_{key}"), (int, float)):
        return float(data[f"ratio_{key}"])
    theirs, ours = data.get(f"torch_{key}"), data.get(f"cuconv_{key}")
    if not isinstance(theirs, (int, float)) or not isinstance(ours, (int, float)) or ours <= 0:
        return None
    return theirs / ours


def _fused(result: dict, key: str):
    """torch's e2e time ``key`` over cuconv fused's eager or graph inference time, whichever ``key`` is, or None."""
    e2e = result.get("e2e") or {}
    theirs = e2e.get(key)
    ours = e2e.get("cuconv_fused_graph_infer_ms" if "_graph_" in key else "cuconv_fused_eager_infer_ms")
    if not isinstance(theirs, (int, float)) or not isinstance(ours, (int, float)) or ours <= 0:
        return None
    return theirs / ours


def _host(result: dict, key: str):
    sums = result.get("sums") or {}
    ours, theirs = sums.get(f"cuconv_median_{key}"), sums.get(f"torch_median_{key}")
    if not isinstance(ours, (int, float)) or not isinstance(theirs, (int, float)):
        return None
    return ours, theirs


def _cell(result: dict, how: tuple) -> str:
    kind, *args = how
    if kind == "host":
        pair = _host(result, *args)
        return DASH if pair is None else f"{pair[0]:.0f} / {pair[1]:.0f}"
    value = _ratio(result, *args) if kind == "ratio" else _fused(result, *args)
    return DASH if value is None else f"{value:.2f}"


def _modes(report: dict) -> list:
    """The modes in the run's order (``meta.modes``), then any other a model holds."""
    order = list(report["meta"].get("modes") or [])
    for entry in report["models"].values():
        for mode in (entry.get("modes") or {}):
            if mode not in order:
                order.append(mode)
    return order


def table_rows(report: dict) -> list:
    """[(model, mode, [cell, ...])] with the cells of ``HEADINGS[2:]`` as strings; a failed mode's cells are
    dashes and its first cell says so."""
    rows = []
    for name, entry in report["models"].items():
        results = entry.get("modes") or {}
        for mode in _modes(report):
            result = results.get(mode)
            if result is None:
                continue
            if "error" in result:
                cells = ["failed (see the results file)"] + [DASH] * (len(_CELLS) - 1)
            else:
                cells = [_cell(result, how) for how in _CELLS]
            rows.append((name, mode, cells))
    return rows


def _cudnn(version) -> str:
    """cuDNN's integer version as x.y.z (9.x: major·10000 + minor·100 + patch; 8.x: major·1000 + ...)."""
    if not isinstance(version, int) or version <= 0:
        return str(version)
    base = 10000 if version >= 90000 else 1000
    return f"{version // base}.{version % base // 100}.{version % 100}"


def caption(report: dict, source: str = "") -> str:
    """One paragraph: what was run where, taken from ``meta``, and how to read the table."""
    meta = report["meta"]
    where = ", ".join(str(meta[k]) for k in ("device", "date") if meta.get(k)) or "device and date not recorded"
    versions = []
    if meta.get("torch"):
        versions.append(f"torch {meta['torch']}")
    if meta.get("cudnn"):
        versions.append(f"cuDNN {_cudnn(meta['cudnn'])}")
    run = [{"nchw": "NCHW", "channels_last": "channels-last"}.get(meta.get("memory_format"), "NCHW")]
    if meta.get("batch"):
        run.append(f"batch {meta['batch']}" + (f" ({meta['infer_batch']} for inference)"
                                               if meta.get("infer_batch") else ""))
    if meta.get("image"):
        run.append(f"{meta['image']}×{meta['image']}")
    modes = [f"{m}: {_MODE_WORDS[m]}" if m in _MODE_WORDS else m for m in _modes(report) if m not in _AUTOCAST]
    halves = [m for m in _modes(report) if m in _AUTOCAST]
    if halves:
        modes.append(f"{' and '.join(halves)}: `torch.autocast`")
    setting = "; ".join(filter(None, [", ".join(run), ", ".join(modes)]))
    results = [r for e in report["models"].values() for r in (e.get("modes") or {}).values() if isinstance(r, dict)]
    measures = ["eager end to end"]
    if any(_fused(r, "torch_eager_infer_ms") is not None for r in results):
        measures.append("fused inference (`convert(model, fuse=True)`) against torch eager, torch with its "
                        "BatchNorms folded into its convolutions, and as one CUDA-graph replay against torch's")
    if any(r.get("sums") for r in results):
        measures.append("per distinct layer summed by occurrence, GPU time alone (CUDA-graph replay) and eager; "
                        "host: median µs per call over the layers")
    text = (f"**{where}**, {', '.join(versions)}; {setting} (both sides alike). Ratio = torch time / cuconv time "
            f"(above 1: cuconv faster): {'; '.join(measures)}.")
    if source:
        text += f" From `{source}`."
    return text


# --------------------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------------------
def readme_block(report: dict, source: str = "", plot: str = "") -> str:
    """The markdown between the markers: caption, table and (where ``plot`` is a path) the plot."""
    rows = table_rows(report)
    # (a column the run did not measure for any model, --no-layers' or a run without --fuse, is left out)
    keep = [i for i in range(len(HEADINGS) - 2) if not rows or any(cells[i] != DASH for _, _, cells in rows)]
    headings = list(HEADINGS[:2]) + [HEADINGS[2 + i] for i in keep]
    lines = [caption(report, source), "", "| " + " | ".join(headings) + " |", "|" + "---|" * len(headings)]
    for name, mode, cells in rows:
        lines.append("| " + " | ".join([name, mode, *(cells[i] for i in keep)]) + " |")
    if plot:
        lines += ["", f"![torch time / cuconv time per model and mode]({plot})"]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """``text`` with what lies between the markers replaced by ``block`` (the markers kept, each on its line)."""
    start, stop = text.find(BEGIN), text.find(END)
    if start < 0 or stop < start:
        raise ValueError(f"the README has no {BEGIN} ... {END} block")
    return text[:start + len(BEGIN)] + "\n" + block.strip("\n") + "\n" + text[stop:]


def render_plot(report: dict, path) -> bool:
    """Bars of torch time / cuconv time per model and mode, one panel per measure (the layers' GPU time alone,
    forward and forward+backward; the end-to-end times where the run has no layers; fused inference, eager and
    as a CUDA-graph replay, where the run has it), a line at 1. False where
    the results hold nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes, models = _modes(report), list(report["models"])

    def values(kind, *args):
        of = _ratio if kind == "ratio" else _fused
        return {(n, m): of(r, *args) for n, e in report["models"].items()
                for m, r in (e.get("modes") or {}).items() if "error" not in r}

    panels = [(title, values(*what)) for what, title in _PANELS]
    if not any(v is not None for _, vals in panels for v in vals.values()):
        panels = [(title, values(*what)) for what, title in _PANELS_E2E]
    panels += [(title, values(*what)) for what, title in _PANELS_FUSED]
    panels = [(t, v) for t, v in panels if any(x is not None for x in v.values())]
    if not panels:
        return False
    top = max(x for _, v in panels for x in v.values() if x is not None)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.9), sharey=True, squeeze=False)
    width = 0.8 / max(len(modes), 1)
    colors = {"tf32": "#4c72b0", "bf16": "#dd8452", "fp16": "#55a868"}
    for ax, (title, vals) in zip(axes[0], panels):
        for i, mode in enumerate(modes):
            heights = [vals.get((n, mode)) for n in models]
            xs = [j + (i - (len(modes) - 1) / 2) * width for j in range(len(models))]
            bars = ax.bar(xs, [h if h is not None else 0.0 for h in heights], width, label=mode,
                          color=colors.get(mode))
            ax.bar_label(bars, labels=[f"{h:.2f}" if h is not None else "" for h in heights], fontsize=6,
                         padding=1, rotation=90)
        ax.axhline(1.0, color="k", lw=1)
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(len(models)), models, rotation=25, ha="right", fontsize=8)
        ax.set_ylim(0, max(top, 1.0) * 1.25)
    axes[0][0].set_ylabel("torch time / cuconv time\n(above 1: cuconv faster)")
    axes[0][-1].legend(title="mode", fontsize=8, loc="upper left")
    meta = report["meta"]
    layout = {"channels_last": "channels-last"}.get(meta.get("memory_format"), "NCHW")
    fig.suptitle(", ".join(str(x) for x in (meta.get("device"), meta.get("date"), f"{layout} on both sides")
                           if x), fontsize=10)
    fig.tight_layout()
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})  # no version stamp: the same results, the same file
    plt.close(fig)
    return True


def _posix_relpath(path, start) -> str:
    return pathlib.PurePath(os.path.relpath(path, start)).as_posix()


def block_for(results, readme, plot=None, report=None) -> str:
    """The block ``readme`` gets from the results file ``results`` and the plot file ``plot`` (None: none), the
    two named by paths relative to the README."""
    base = pathlib.Path(readme).resolve().parent
    report = _load(results) if report is None else report
    return readme_block(report, _posix_relpath(pathlib.Path(results).resolve(), base),
                        _posix_relpath(pathlib.Path(plot).resolve(), base) if plot else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cuconv.tools.report",
                                 description="Write the README's benchmark table (between its benchmark-table "
                                             "markers) and plot from a model-benchmark results file.")
    ap.add_argument("results", nargs="?", help=f"results JSON (default: the latest in {RESULTS_DIR.as_posix()}/)")
    ap.add_argument("--readme", default="README.md", help="the README to update (default README.md)")
    ap.add_argument("--plot", help="the PNG to write (default: beside the results, the same name with .png)")
    ap.add_argument("--no-plot", action="store_true", help="the table only (no matplotlib needed)")
    ap.add_argument("--print", action="store_true", help="print the block to stdout instead of writing the README")
    args = ap.parse_args(argv)
    try:
        results = pathlib.Path(args.results) if args.results else latest_results()
        report = _load(results)
    except (OSError, ValueError) as exc:
        print(f"python -m cuconv.tools.report: {exc}", file=sys.stderr)
        return 2
    readme = pathlib.Path(args.readme)
    plot = None
    if not args.no_plot:
        plot = pathlib.Path(args.plot) if args.plot else results.with_suffix(".png")
        try:
            drawn = render_plot(report, plot)
        except ImportError as exc:
            print(f"python -m cuconv.tools.report: the plot needs matplotlib ({exc}); or pass --no-plot",
                  file=sys.stderr)
            return 2
        if not drawn:
            print(f"{results}: nothing to plot (no ratios)", file=sys.stderr)
            plot = None
    block = block_for(results, readme, plot, report)
    if args.print:
        print(block)
        return 0
    try:
        text = readme.read_text(encoding="utf-8")
        updated = replace_block(text, block)
    except (OSError, ValueError) as exc:
        print(f"python -m cuconv.tools.report: {readme}: {exc}", file=sys.stderr)
        return 2
    if updated != text:
        readme.write_text(updated, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
