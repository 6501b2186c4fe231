"""Record every plan (auto's choice and every algorithm's) on fake devices, as JSON lines: a refactoring that
must not change what runs is checked by recording before and after and comparing the files (no GPU needed).

    PYTHONPATH=.:tests python tests/record_plans.py before.jsonl    # on the old commit, then on the new one

The problems: the case tables, the tiling cases, the reduced large problems and a zoo of real layers (ResNet,
MobileNet, EfficientNet, RegNet, ConvNeXt, Inception, UNet, detection and dilated shapes at batch 1 and 16), every
pass, dtype, layout and weight layout, on a fake H200 (``tests/fake_device.py``), an A100-like device, the H200 with
unaligned operands and with a 4 MiB workspace limit. Each row: auto's choice and knobs, each algorithm's refusal or
its plan's workspace, launches (file, kernel, grid, block, shared memory) and GEMMs.
"""
import itertools, json, sys
import numpy
import pytest
sys.path.insert(0, "tests")  # (cases.py, fake_device.py)
import cuconv
from cuconv import _dtypes, algos, select
from cuconv.problem import BIAS, PLAIN, Problem
from cases import CASES, PROBLEM_CASES, TILING_CASES, case_spec
from fake_device import ENVS, fake_device

DTYPES = [(numpy.float16, "ieee"), (numpy.float32, "tf32"), (numpy.float32, "ieee"), (numpy.float64, "ieee")]
if _dtypes.bfloat16 is not None:
    DTYPES.append((_dtypes.bfloat16, "ieee"))

def zoo():
    """Layer geometries of real networks (resnet, mobilenet, efficientnet, regnet, convnext, unet, detection, video
    frames), at batch 1 and 16."""
    layers = []
    for n in (1, 16):
        for c, k, hw, r, s, g in [
            (3, 64, 224, 7, 2, 1), (64, 64, 56, 3, 1, 1), (64, 256, 56, 1, 1, 1), (256, 64, 56, 1, 1, 1),
            (128, 128, 28, 3, 1, 1), (128, 128, 56, 3, 2, 1), (256, 256, 14, 3, 1, 1), (512, 512, 7, 3, 1, 1),
            (1024, 2048, 14, 1, 2, 1), (512, 2048, 7, 1, 1, 1), (2048, 512, 7, 1, 1, 1),
            (16, 16, 112, 3, 1, 16), (72, 72, 56, 3, 2, 72), (120, 120, 28, 5, 1, 120), (672, 672, 14, 5, 2, 672),
            (960, 960, 7, 5, 1, 960), (16, 64, 112, 1, 1, 1), (32, 32, 112, 3, 1, 32), (144, 144, 56, 3, 1, 144),
            (240, 240, 28, 5, 1, 240), (1152, 1152, 7, 3, 1, 1152), (96, 24, 112, 1, 1, 1),
            (64, 64, 56, 3, 1, 4), (128, 128, 28, 3, 2, 8), (320, 320, 14, 3, 1, 20), (784, 784, 7, 3, 1, 49),
            (96, 96, 56, 7, 1, 96), (192, 192, 28, 7, 1, 192), (768, 768, 7, 7, 1, 768), (3, 96, 224, 4, 4, 1),
            (96, 384, 56, 1, 1, 1), (64, 128, 128, 3, 1, 1), (128, 64, 256, 3, 1, 1), (32, 32, 512, 3, 1, 1),
            (256, 256, 64, 3, 1, 1), (2048, 256, 32, 1, 1, 1), (256, 256, 100, 3, 1, 1), (3, 32, 299, 3, 2, 1),
            (48, 48, 35, 5, 1, 1), (192, 192, 17, 7, 1, 1), (64, 64, 80, 3, 1, 1), (40, 240, 28, 1, 1, 1),
        ]:
            pad = r // 2 if s == 1 or r > 1 and r % 2 else 0
            if r == 4:
                pad = 0
            layers.append(((n, c, hw, hw), (k, c // g, r, r), dict(stride=s, padding=pad, groups=g)))
        layers.append(((n, 64, 56, 56), (64, 64, 3, 3), dict(padding=2, dilation=2)))
        layers.append(((n, 256, 33, 33), (256, 256, 3, 3), dict(padding=6, dilation=6)))
        layers.append(((n, 64, 56, 56), (64, 64, 1, 7), dict(padding=(0, 3))))
        layers.append(((n, 64, 56, 56), (64, 64, 7, 1), dict(padding=(3, 0))))
    return [cuconv.ConvSpec.from_args(x, w, **kw) for x, w, kw in layers]

def specs():
    out = []
    for p in CASES + PROBLEM_CASES + TILING_CASES:
        case = p.values[0]
        if len(case.x_shape) == 4:
            out.append((p.id, case_spec(case), case.bias))
    for i, spec in enumerate(zoo()):
        out.append((f"zoo{i}", spec, True))
    return out

def main(path):
    mp = pytest.MonkeyPatch()
    rows = []
    for cid, spec, bias in specs():
        for env_name, env in dict(ENVS, sm90u=ENVS['sm90']._replace(aligned=False),
                                  sm90w=ENVS['sm90']._replace(workspace_limit=4 << 20)).items():
            for pass_, (dtype, precision), layout in itertools.product(("fprop", "dgrad", "wgrad"), DTYPES,
                                                                       ("nchw", "nhwc")):
                for weights in (("kcrs", "krsc") if layout == "nhwc" else ("kcrs",)):
                    ep = BIAS if pass_ == "fprop" and bias else PLAIN
                    problem = Problem.of(spec, dtype, precision, pass_, layout, weights, ep)
                    rec = fake_device(mp)
                    try:
                        choice = select.choose(problem, env)
                        choice = None if choice is None else [choice.name, repr(choice.knobs)]
                    except NotImplementedError as e:
                        choice = "NIE " + str(e)
                    row = {"case": cid, "env": env_name, "pass": pass_, "dtype": str(numpy.dtype(dtype)),
                           "precision": precision, "layout": layout, "weights": weights, "auto": choice, "algos": {}}
                    for a in algos.ALGORITHMS:
                        reason = a.can_implement(problem, env)
                        if reason is not None:
                            row["algos"][a.name] = "R " + reason
                            continue
                        n0, g0 = len(rec.launches), len(rec.gemms)
                        try:
                            pl = a.plan(problem, env, **dict(select.knobs(a.name, problem, env)))
                            launches = [list(map(str, launch)) for launch in rec.launches[n0:]]
                            row["algos"][a.name] = {"ws": pl.workspace, "launches": launches,
                                                    "gemms": [repr(g) for g in rec.gemms[g0:]]}
                        except Exception as e:
                            row["algos"][a.name] = "E " + type(e).__name__ + ": " + str(e)
                    rows.append(row)
                    mp.undo()
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    print(len(rows), "rows")

if __name__ == "__main__":
    main(sys.argv[1])
