"""``python -m cuconv`` as a user runs it, in a subprocess, on a machine without a usable GPU."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from cuconv import _backend

REPO = pathlib.Path(__file__).resolve().parent.parent

without_gpu = pytest.mark.skipif(_backend.gpu_available(),
                                 reason="checks the GPU-less behaviour; a GPU is visible here")


def run_cli(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "cuconv", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


@without_gpu
def test_info():
    proc = run_cli("info")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^cuconv\s+\d+\.\d+\.\d+ \(", proc.stdout, re.M)
    assert re.search(r"^numpy\s+\S+", proc.stdout, re.M)
    # No GPU: either CuPy is missing or it sees no device, and info says which in plain words.
    assert re.search(r"^(device\s+none visible|cupy\s+not available)", proc.stdout, re.M), proc.stdout
    assert re.search(r"^config\s+precision=ieee, workspace_limit=1073741824$", proc.stdout, re.M)


@without_gpu
def test_bench_without_gpu_checks_cpu_path():
    proc = run_cli("bench")
    assert proc.returncode == 0, proc.stderr
    assert "No CUDA GPU visible" in proc.stdout
    match = re.search(r"relative error (\S+) vs torch", proc.stdout)
    assert match, proc.stdout
    assert float(match.group(1)) < 1e-12  # float64 on both sides


def test_bench_unknown_problem_is_usage_error():
    proc = run_cli("bench", "--problem", "nope")
    assert proc.returncode == 2
    assert "usage: python -m cuconv bench" in proc.stderr
    assert "unknown problem(s) ['nope']" in proc.stderr


@pytest.mark.parametrize("args", [(), ("frobnicate",)], ids=["no_args", "unknown_command"])
def test_usage(args):
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert "usage: python -m cuconv [-h] {bench,info,profile,warmup}" in proc.stderr
    assert proc.stdout == ""


def test_help_lists_every_command_and_bench_help_is_whole():
    proc = run_cli("--help")
    assert proc.returncode == 0 and all(name in proc.stdout for name in ("bench", "info", "profile", "warmup"))
    bench = run_cli("bench", "--help")
    assert bench.returncode == 0
    description = bench.stdout.split("\n\n")[1]
    assert "with --models, on whole torchvision models and their layers (bench_models)." in " ".join(
        description.split()), bench.stdout


@without_gpu
def test_warmup_without_gpu_says_so():
    proc = run_cli("warmup", "resnet18", "--modes", "tf32")
    assert proc.returncode == 1  # (GPU work asked for and not done: a failure, with its reason)
    assert "No CUDA GPU visible" in proc.stderr


@pytest.mark.parametrize("args, message", [(("resnet18", "--modes", "fp8"), "unknown mode(s) ['fp8']"),
                                           (("resnet18", "--batch", "0"), "must be positive"),
                                           ((), "the following arguments are required: models")])
def test_warmup_bad_arguments_are_usage_errors(args, message):
    proc = run_cli("warmup", *args)
    assert proc.returncode == 2
    assert "usage: python -m cuconv warmup" in proc.stderr and message in proc.stderr


@without_gpu
def test_profile_without_gpu_says_so():
    proc = run_cli("profile", "--models", "resnet18")
    assert proc.returncode == 1
    assert "No CUDA GPU visible" in proc.stderr


@pytest.mark.parametrize("args, message", [(("--models", "resnet18", "--mode", "fp8"), "invalid choice: 'fp8'"),
                                           (("--models", "resnet18", "--iters", "0"), "--iters must be positive"),
                                           ((), "the following arguments are required: --models")])
def test_profile_bad_arguments_are_usage_errors(args, message):
    proc = run_cli("profile", *args)
    assert proc.returncode == 2
    assert "usage: python -m cuconv profile" in proc.stderr and message in proc.stderr


@without_gpu
def test_bench_models_without_gpu_fails_with_the_reason():
    proc = run_cli("bench", "--models", "resnet18", "--modes", "bf16")
    assert proc.returncode == 1
    assert "No CUDA GPU visible" in proc.stderr


@without_gpu
def test_bench_layer_zoo_without_gpu_fails_with_the_reason():
    proc = run_cli("bench", "--layer-zoo", "--models", "unet", "--modes", "bf16")
    assert proc.returncode == 1
    assert "No CUDA GPU visible" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (("--compile-modes", "default,fast"), "--compile-modes: fast is not one of default, reduce-overhead"),
    (("--compile-sides", "tensorflow"), "--compile-sides: tensorflow is not one of torch, cuconv"),
    (("--modes", "fp8"), "unknown mode(s) ['fp8']"),
])
def test_bench_models_bad_options_are_usage_errors_before_the_gpu_check(args, message):
    proc = run_cli("bench", "--models", "resnet18", "--compile", *args)
    assert proc.returncode == 2 and message in proc.stderr


def test_bench_torch_door_is_forward_only():
    proc = run_cli("bench", "--api", "torch", "--backward")
    assert proc.returncode == 2 and "--api torch times the forward alone" in proc.stderr


def test_bench_layer_zoo_refuses_an_unknown_layout():
    proc = run_cli("bench", "--layer-zoo", "--layouts", "nhwc")
    assert proc.returncode == 2 and "--layouts: expected nchw and/or channels_last" in proc.stderr


def test_info_refuses_unknown_options():
    proc = run_cli("info", "--bogus")
    assert proc.returncode == 2
    assert "usage: python -m cuconv info" in proc.stderr and "unrecognized arguments: --bogus" in proc.stderr
