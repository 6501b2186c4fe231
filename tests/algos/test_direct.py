"""``direct``, the readable baseline (one thread per output): its forward on every case of the shared table equals
the CPU path bit for bit on integers, in every dtype, into a NaN-poisoned output."""

import pytest

from cases import CASES, EXACT_DTYPES, assert_forward_equals_cpu_on_integers

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype_name", EXACT_DTYPES)
@pytest.mark.parametrize("case", [c for c in CASES if 0 not in c.values[0].x_shape])
def test_direct_equals_cpu_exactly_on_integers(case, dtype_name):
    from cuconv.algos import direct

    assert_forward_equals_cpu_on_integers(case, dtype_name, 11, lambda x, w, b, spec, out: direct.forward_gpu(
        x, w, b, spec, out, "ieee"))
