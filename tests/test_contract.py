"""Every registered algorithm honours the contract (``cuconv.algos.base``) on every case of the case table.

Plans are built on a fake device (``fake_device``): nothing runs, but every launch a plan prepares names an
instance of an existing source, and whatever ``can_implement`` accepts, ``plan`` plans, within the workspace limit.
A toy algorithm shows what adding one takes: its class and one entry in ``cuconv.algos.ALGORITHMS``.
"""

from __future__ import annotations

import numpy
import pytest

import cuconv
from cases import CASES, PROBLEM_CASES, case_spec, make_inputs, reference, rel_err, to_gpu, tolerance
from cuconv import _dtypes, _plan, algos, dispatch, select
from cuconv.algos import direct
from cuconv.algos.base import Algorithm
from cuconv.problem import ACTIVATIONS, BIAS, LAYOUTS, PASSES, PLAIN, WEIGHT_LAYOUTS, Epilogue, Problem
from fake_device import ENVS, fake_device

_DTYPES = [(numpy.float16, "ieee"), (numpy.float32, "tf32"), (numpy.float32, "ieee"), (numpy.float64, "ieee")]
if _dtypes.bfloat16 is not None:
    _DTYPES.append((_dtypes.bfloat16, "ieee"))
_ALL_CASES = [c for c in CASES + PROBLEM_CASES if len(c.values[0].x_shape) == 4]


def test_algorithms_declare_what_they_serve():
    names = [a.name for a in algos.ALGORITHMS]
    assert len(set(names)) == len(names) and names == list(algos.names())
    assert cuconv.algorithms("wgrad") == algos.names("wgrad")
    for a in algos.ALGORITHMS:
        assert isinstance(a, Algorithm) and algos.get(a.name) is a
        assert a.passes and set(a.passes) <= set(PASSES)
        assert "nchw" in a.layouts and set(a.layouts) <= set(LAYOUTS)
        assert "kcrs" in a.weight_layouts and set(a.weight_layouts) <= set(WEIGHT_LAYOUTS)
        assert set(a.activations) <= set(ACTIVATIONS)


def _problems(case, algorithm):
    spec = case_spec(case)
    for pass_ in algorithm.passes:
        for dtype, precision in _DTYPES:
            for layout in algorithm.layouts:
                for weights in ("kcrs", "krsc") if layout == "nhwc" else ("kcrs",):
                    epilogue = BIAS if pass_ == "fprop" and case.bias else PLAIN
                    yield Problem.of(spec, dtype, precision, pass_, layout, weights, epilogue)
                    if pass_ == "fprop":  # (and with an activation and a residual)
                        yield Problem.of(spec, dtype, precision, pass_, layout, weights,
                                         Epilogue(epilogue.bias, "silu", residual="before"))


@pytest.mark.parametrize("name", algos.names())
@pytest.mark.parametrize("case", _ALL_CASES)
def test_what_can_implement_accepts_plans(monkeypatch, case, name):
    """On every case, pass, dtype, layout and device (and under a workspace limit of 64 KiB): a problem the
    algorithm accepts plans without raising, with each of its knob settings, each launch an instance of an existing
    kernel source, the workspace within the limit; one it refuses has a reason."""
    recorder = fake_device(monkeypatch)
    algorithm = algos.get(name)
    accepted = 0
    for env in (*ENVS.values(), ENVS["sm90"]._replace(workspace_limit=64 << 10)):
        for problem in _problems(case, algorithm):
            reason = algorithm.can_implement(problem, env)
            if reason is not None:
                assert isinstance(reason, str) and reason
                continue
            settings = algorithm.knobs(problem, env)
            chosen = dict(select.knobs(name, problem, env))
            # the selector's choice comes first; each setting has a text of its own (the autotuner's cache)
            assert settings and settings[0] in ({}, chosen), (problem, settings[0], chosen)
            assert len({algorithm.knob_text(k) for k in settings}) == len(settings)
            for knobs in settings:
                plan = algorithm.plan(problem, env, **{**chosen, **knobs})
                assert plan.pass_ == problem.pass_ and plan.workspace <= env.workspace_limit, (problem, plan)
                accepted += 1
    if name in ("im2col_gemm", "direct"):  # the algorithms that serve every geometry
        assert accepted
    assert all(launch[1] for launch in recorder.launches)


@pytest.mark.parametrize("name", algos.names())
def test_epilogues_not_fused_are_a_pass_after_the_convolution(monkeypatch, name):
    """An activation and a residual the algorithm's kernels do not apply: its plan of the convolution with the bias,
    then one ``blocks.epilogue`` launch over the output reading the residual; a scale not declared is refused."""
    recorder = fake_device(monkeypatch)
    spec = cuconv.ConvSpec.from_args((2, 16, 8, 8), (16, 16, 3, 3), padding=1)
    algorithm = algos.get(name)
    env = ENVS["sm90"]
    if "fprop" not in algorithm.passes:
        return
    assert "epilogue" in algorithm.can_implement(Problem.of(spec, numpy.float32, epilogue=Epilogue(scale=0.5)), env)
    for epilogue in (Epilogue(bias=True, activation="relu"), Epilogue(residual="after"),
                     Epilogue(bias=True, activation="leaky_relu", alpha=0.1, residual="before")):
        for dtype, precision in _DTYPES:
            problem = Problem.of(spec, dtype, precision, "fprop", epilogue=epilogue)
            if algorithm.can_implement(problem, env) is not None or algorithm.fuses(problem):
                continue
            plain = Problem.of(spec, dtype, precision, "fprop", epilogue=Epilogue(bias=epilogue.bias))
            inner = algorithm.plan(plain, env, **dict(select.knobs(name, plain, env)))
            fused = algorithm.plan(problem, env, **dict(select.knobs(name, problem, env)))
            assert recorder.launches[-1][0] == "blocks/epilogue" and fused.workspace == inner.workspace
            (nested, last) = fused.steps
            assert isinstance(nested, _plan.Nested) and len(nested.plan.steps) == len(inner.steps)
            residual_index = len(_plan.OPERANDS["fprop"]) + 1
            assert last.refs == ((3, 0), (residual_index, 0) if epilogue.residual else _plan.NULL, (3, 0))


def test_problem_checks_its_fields():
    spec = cuconv.ConvSpec.from_args((1, 4, 5, 5), (4, 4, 3, 3))
    with pytest.raises(ValueError, match="unknown pass"):
        Problem.of(spec, numpy.float32, pass_="forward")
    with pytest.raises(ValueError, match="'krsc' weights"):
        Problem.of(spec, numpy.float32, weights="krsc")
    with pytest.raises(ValueError, match="no epilogue"):
        Problem.of(spec, numpy.float32, pass_="dgrad", epilogue=BIAS)
    with pytest.raises(ValueError, match="unknown activation"):
        Epilogue(activation="tanh")
    assert Problem.of(spec, "float32") == Problem.of(spec, numpy.float32)  # a cache key: dtype normalised


class Toy(Algorithm):
    """A new algorithm: the forward of float64 layers of one group, through ``direct``'s kernel."""

    name = "toy"
    passes = ("fprop",)

    def reason(self, problem, limits):
        if problem.dtype != numpy.float64 or problem.spec.groups != 1:
            return "it sums float64 layers of one group only"
        return None

    def build(self, problem, env, **knobs):
        return direct.prepare("fprop", problem.spec, problem.dtype, problem.precision, env, problem.bias)


@pytest.fixture
def toy(monkeypatch):
    """``Toy`` registered: one more entry in ``ALGORITHMS`` (the memoized answers forgotten around it)."""
    monkeypatch.setattr(algos, "ALGORITHMS", algos.ALGORITHMS + (Toy(),))
    select._clear()
    dispatch.plan.cache_clear()
    yield
    monkeypatch.undo()
    select._clear()
    dispatch.plan.cache_clear()


def test_a_new_algorithm_is_one_class_and_one_entry(monkeypatch, toy):
    spec = cuconv.ConvSpec.from_args((2, 3, 8, 8), (4, 3, 3, 3))
    assert "toy" in cuconv.algorithms("fprop") and "toy" not in cuconv.algorithms("dgrad")
    assert select.reason_unsupported("toy", spec, numpy.float64) is None
    assert "float64" in select.reason_unsupported("toy", spec, numpy.float32)
    assert "no dgrad" in select.reason_unsupported("toy", spec, numpy.float64, "dgrad")
    recorder = fake_device(monkeypatch)
    plan = dispatch.plan("toy", Problem.of(spec, numpy.float64), ENVS["sm80"])
    assert plan.algo == "direct" and [launch[1] for launch in recorder.launches] == ["direct<double>"]
    x, w, b = make_inputs(CASES[0].values[0])
    numpy.testing.assert_array_equal(cuconv.conv2d(x, w, b, algo="toy"), cuconv.conv2d(x, w, b))  # CPU path


@pytest.mark.gpu
def test_a_new_algorithm_runs_on_the_gpu(toy):
    x, w, b = make_inputs(CASES[1].values[0], seed=3)
    kwargs = CASES[1].values[0].kwargs
    y = cuconv.conv2d(to_gpu(x, "float64"), to_gpu(w, "float64"), to_gpu(b, "float64"), algo="toy", **kwargs)
    assert rel_err(y.get(), reference(x, w, b, **kwargs)) <= tolerance(numpy.float64)


def test_a_nested_plan_sees_the_operands_its_workspace_region_and_the_residual():
    seen = []

    def step(bases, stream):
        seen.append((bases, stream))

    inner = _plan.Plan("toy", "fprop", 512, [step])
    outer_builder = _plan.Builder("fprop", ENVS["sm90"])
    outer_builder.take(256)  # (a region before the nested plan's)
    offset = outer_builder.take(inner.workspace)[1]
    outer_builder.steps.append(_plan.Nested(inner, offset))
    outer = outer_builder.plan("toy")
    outer.run((1, 2, 3, 4), 99, 1 << 20, residual=777)
    ((bases, stream),) = seen
    assert stream == 99 and bases == (1, 2, 3, 4, (1 << 20) + offset, 777, 0) and outer.workspace >= offset + 512


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype,precision", [(numpy.float16, "ieee"), (numpy.float32, "tf32")])
def test_implicit_gemm_applies_its_epilogue_where_it_stores(monkeypatch, layout, dtype, precision):
    """implicit_gemm's kernels apply the activation and the residual: no epilogue pass, the residual's pointer
    given to the launch that writes the output (the GEMM, or the sum of its splits), every tile it offers; a TMA
    store's kernel copies the residual through a map of the residual's pointer (of the output's, without one)."""
    recorder = fake_device(monkeypatch)
    spec = cuconv.ConvSpec.from_args((2, 64, 8, 8), (64, 64, 3, 3), padding=1)
    env = ENVS["sm90"]
    algorithm = algos.get("implicit_gemm")
    residual_index = len(_plan.OPERANDS["fprop"]) + 1
    tma_stores = []
    for epilogue in (Epilogue(bias=True, activation="relu"), Epilogue(bias=True, activation="silu", residual="after")):
        problem = Problem.of(spec, dtype, precision, "fprop", layout, epilogue=epilogue)
        assert algorithm.fuses(problem) and algorithm.can_implement(problem, env) is None
        for knobs in algorithm.knobs(problem, env):
            del recorder.launches[:]
            plan = algorithm.plan(problem, env, **knobs)
            assert all(stem != "blocks/epilogue" for stem, *_ in recorder.launches)
            writers = [s for s in plan.steps if isinstance(s, _plan.Launch) and (3, 0) in s.refs]
            assert writers and all(s.refs[-1] == ((residual_index, 0) if epilogue.residual else _plan.NULL)
                                   for s in writers)
            for s in writers:
                if "_st<" in s.kernel.name or "_pst<" in s.kernel.name:
                    tma_stores.append(epilogue.residual)
                    assert s.kernel._maps[-1][0] == (4 if epilogue.residual else 3)  # (the launch's residual, or y)
    if layout == "nhwc" and dtype == numpy.float16:  # (the TMA store served both epilogues)
        assert None in tma_stores and "after" in tma_stores, tma_stores


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("shape,kwargs", [((2, 32, 16, 24), dict(padding=1)), ((3, 32, 13, 11), dict(stride=2,
                                                                                                   padding=2))])
def test_depthwise_applies_its_epilogue_where_it_stores(monkeypatch, layout, shape, kwargs):
    """depthwise's forward kernels apply the activation and the residual in their kEpi instances (every kernel it
    offers, the residual's pointer given to the launch that writes the output); float64 runs the plain instance and
    the pass after."""
    recorder = fake_device(monkeypatch)
    k = 5 if kwargs.get("stride") else 3
    spec = cuconv.ConvSpec.from_args(shape, (shape[1], 1, k, k), groups=shape[1], **kwargs)
    env = ENVS["sm90"]
    algorithm = algos.get("depthwise")
    residual_index = len(_plan.OPERANDS["fprop"]) + 1
    epilogue = Epilogue(bias=True, activation="hardswish", residual="after")
    for dtype in (numpy.float16, numpy.float32):
        problem = Problem.of(spec, dtype, "ieee", "fprop", layout, epilogue=epilogue)
        assert algorithm.fuses(problem) and algorithm.can_implement(problem, env) is None
        for knobs in algorithm.knobs(problem, env):
            del recorder.launches[:]
            plan = algorithm.plan(problem, env, **knobs)
            assert all(stem != "blocks/epilogue" for stem, *_ in recorder.launches), knobs
            writer = plan.steps[-1]
            assert writer.kernel.name.endswith(",true>") and writer.refs[3:] == ((3, 0), (residual_index, 0))
    problem = Problem.of(spec, numpy.float64, "ieee", "fprop", layout, epilogue=epilogue)
    assert not algorithm.fuses(problem)
    plan = algorithm.plan(problem, env)
    assert isinstance(plan.steps[0], _plan.Nested) and plan.steps[0].plan.steps[-1].kernel.name.endswith(",false>")
    assert recorder.launches[-1][0] == "blocks/epilogue"


def test_a_split_asked_of_an_nchw_tile_does_not_apply(monkeypatch):
    """An NchwTile's kernel reduces every k tile itself: a plan given splits runs it unsplit, writing the output
    (a split geometry's fp32 partial sums written into the output were garbage)."""
    recorder = fake_device(monkeypatch)
    from cuconv.algos import implicit_gemm

    spec = cuconv.ConvSpec.from_args((2, 64, 9, 7), (64, 64, 3, 3), padding=1)
    problem = Problem.of(spec, numpy.float16, "ieee", "fprop", epilogue=Epilogue(bias=True))
    plan = algos.get("implicit_gemm").plan(problem, ENVS["sm90"], tile=implicit_gemm.TILES["nchw64"], splits=3)
    assert plan.workspace == 0 and [launch[1].split("<")[0] for launch in recorder.launches] == [
        "implicit_gemm_wgmma_nchw"]
    (step,) = plan.steps
    assert step.kernel._keep[0]["split_stride"] == 0


def test_an_epilogue_has_one_form_in_implicit_gemm_launches():
    """The slope matters to leaky_relu alone: another activation (or none) with a slope set keys and runs as the
    same epilogue (the block-diagonal forward, which takes no epilogue codes, still plans it)."""
    from cuconv.blocks.epilogue import epilogue_codes

    assert epilogue_codes(Epilogue(activation="relu", alpha=0.3)) == epilogue_codes(Epilogue(activation="relu"))
    assert epilogue_codes(Epilogue(bias=True, alpha=0.3)) == (0, 0, 0.0)
    assert epilogue_codes(Epilogue(activation="leaky_relu", alpha=0.3))[2] == pytest.approx(0.3)
