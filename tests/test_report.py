"""``python -m cuconv.tools.report``: the README's benchmark table and plot from a model-benchmark results file,
on synthetic results (CPU only)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from cuconv.tools import report

REPO = pathlib.Path(__file__).resolve().parent.parent


def _sums(fwd_gpu, fb_gpu):
    """Per-layer sums as bench_models writes them (torch times fixed, cuconv's from the wanted ratios)."""
    sums = {}
    for key, ratio in (("fwd_ms", 0.9), ("fb_ms", 0.8), ("fwd_gpu_ms", fwd_gpu), ("fb_gpu_ms", fb_gpu)):
        sums[f"torch_{key}"], sums[f"cuconv_{key}"], sums[f"ratio_{key}"] = 2.0, 2.0 / ratio, ratio
    for key, (ours, theirs) in (("fwd_host_us", (45.2, 40.0)), ("fb_host_us", (350.0, 300.4))):
        sums[f"cuconv_median_{key}"], sums[f"torch_median_{key}"] = ours, theirs
    return sums


def _results(date="2026-12-01", device="NVIDIA H200"):
    e2e = dict(torch_infer_ms=10.0, cuconv_infer_ms=8.0, torch_train_ms=30.0, cuconv_train_ms=40.0)
    fused = dict(e2e, torch_eager_infer_ms=10.0, torch_folded_eager_infer_ms=9.0, cuconv_fused_eager_infer_ms=5.0,
                 torch_graph_infer_ms=6.0, cuconv_fused_graph_infer_ms=4.0)  # (--fuse)
    return dict(
        meta=dict(device=device, torch="2.11.0+cu130", cudnn=91900, date=date, batch=32, infer_batch=64,
                  image=224, memory_format="channels_last", modes=["bf16"], commit="abc1234"),
        models=dict(
            resnet50=dict(modes=dict(bf16=dict(e2e=fused, sums=_sums(1.10, 1.05)))),
            # layers only (--no-e2e), and a mode the meta does not list
            regnet_y_800mf=dict(modes=dict(bf16=dict(sums=_sums(1.02, 0.95)), tf32=dict(e2e=e2e))),
            # a failed mode keeps its row
            convnext_tiny=dict(modes=dict(bf16=dict(error="RuntimeError: out of memory"))),
        ))


def _readme(path):
    path.write_text("# title\n\nintro\n\n" + report.BEGIN + "\nold table\n" + report.END + "\n\n## after\n",
                    encoding="utf-8")


def test_table_and_plot_written_idempotently(tmp_path):
    pytest.importorskip("matplotlib")
    results = tmp_path / "benchmarks" / "results" / "models-h200-2026-12-01.json"
    results.parent.mkdir(parents=True)
    results.write_text(json.dumps(_results()), encoding="utf-8")
    readme = tmp_path / "README.md"
    _readme(readme)

    assert report.main([str(results), "--readme", str(readme)]) == 0
    first = readme.read_text(encoding="utf-8")
    plot = results.with_suffix(".png")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "old table" not in first
    assert first.startswith("# title\n\nintro\n\n" + report.BEGIN + "\n")
    assert first.endswith(report.END + "\n\n## after\n")
    assert first.count(report.BEGIN) == 1 and first.count(report.END) == 1
    assert ("**NVIDIA H200, 2026-12-01**, torch 2.11.0+cu130, cuDNN 9.19.0; channels-last, batch 32 "
            "(64 for inference), 224×224; tf32: TF32, bf16: `torch.autocast` (both sides alike)") in first
    assert "](benchmarks/results/models-h200-2026-12-01.png)" in first  # relative to the README
    assert "abc1234" not in first  # (the commit stays in the results file)
    assert ("| resnet50 | bf16 | 1.25 | 2.00 | 1.80 | 1.50 | 0.75 | 1.10 | 1.05 | 0.90 | 0.80 | 45 / 40 | 350 / 300 |"
            in first)
    assert "| regnet_y_800mf | bf16 | – | – | – | – | – | 1.02 | 0.95 | 0.90 | 0.80 | 45 / 40 | 350 / 300 |" in first
    assert "| regnet_y_800mf | tf32 | 1.25 | – | – | – | 0.75 | – | – | – | – | – | – |" in first
    assert "| convnext_tiny | bf16 | failed (see the results file) | – |" in first

    assert report.main([str(results), "--readme", str(readme)]) == 0
    assert readme.read_text(encoding="utf-8") == first


def test_latest_results_by_date_through_the_command(tmp_path):
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    (results / "models-h100-2026-11-25.json").write_text(json.dumps(_results("2026-11-25", "NVIDIA H100")))
    (results / "models-a100-2026-12-02.json").write_text(json.dumps(_results("2026-12-02", "NVIDIA A100")))
    (results / "bench-fp16.json").write_text(json.dumps(dict(meta={}, rows=[])))  # a single-layer run: skipped
    assert report.latest_results(results).name == "models-a100-2026-12-02.json"
    _readme(tmp_path / "README.md")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "cuconv.tools.report", "--no-plot"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "**NVIDIA A100, 2026-12-02**" in text and "From `benchmarks/results/models-a100-2026-12-02.json`" in text
    assert "![" not in text  # --no-plot: no image


def test_columns_no_model_has_are_left_out():
    results = _results()
    results["models"] = {"resnet50": results["models"]["resnet50"]}
    del results["models"]["resnet50"]["modes"]["bf16"]["sums"]  # (--no-layers)
    block = report.readme_block(results)
    assert "| model | mode | inference | fused inference: vs torch | vs torch folded | CUDA graph | training step |" \
        in block
    assert "| resnet50 | bf16 | 1.25 | 2.00 | 1.80 | 1.50 | 0.75 |" in block and "host µs" not in block


def test_missing_markers_is_an_error(tmp_path):
    results = tmp_path / "r.json"
    results.write_text(json.dumps(_results()))
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    assert report.main([str(results), "--readme", str(readme), "--no-plot"]) == 2
    assert readme.read_text() == "# no markers\n"


def test_cudnn_8_and_no_commit_in_the_caption():
    meta = dict(device="X", date="d", cudnn=8907, commits=dict(a="1111111", b="2222222"))
    text = report.caption(dict(meta=meta, models={}))
    assert "cuDNN 8.9.7; NCHW (both sides alike)." in text and "1111111" not in text


def test_readme_table_is_generated_from_the_latest_results():
    """The README's table and plot link are what the script makes of the latest results file: after a new
    results file, run ``python -m cuconv.tools.report`` (and commit the README and the plot)."""
    results = report.latest_results(REPO / "benchmarks" / "results")
    plot = results.with_suffix(".png")
    assert plot.is_file(), f"{plot.name} is missing: run python -m cuconv.tools.report"
    readme = REPO / "README.md"
    text = readme.read_text(encoding="utf-8")
    assert report.replace_block(text, report.block_for(results, readme, plot)) == text, (
        "README.md's benchmark table is not the latest results': run python -m cuconv.tools.report")
