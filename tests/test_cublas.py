"""``cuconv._cublas.gemm``: cuBLASLt plans (one per shape, alignment and workspace) against NumPy, exactly.

Integer-valued operands small enough that every product and sum is exact in each dtype (TF32 and half
inputs included), so any wrong stride, transpose, batch offset or alignment shows as a mismatch.
"""

from __future__ import annotations

import numpy
import pytest

from cuconv import _dtypes

_CASES = [  # dtype, precision, c_dtype, trans_a, trans_b, batch, shared B (stride 0), beta, padded
    # padded: leading dimensions and batch strides of whole 256-byte multiples, so that only the offset
    # decides the operands' alignment (odd ones make every matrix but the first 2- or 4-byte aligned)
    pytest.param("float32", "ieee", None, "N", "N", 3, True, 0.0, False, id="f32_nn_shared_b"),
    pytest.param("float32", "tf32", None, "T", "N", 2, False, 0.0, False, id="tf32_tn"),
    pytest.param("float32", "ieee", None, "N", "T", 1, False, 1.0, False, id="f32_nt_beta1"),
    pytest.param("float64", "ieee", None, "T", "T", 2, False, 0.0, False, id="f64_tt"),
    pytest.param("float16", "ieee", "float32", "N", "T", 2, True, 1.0, False, id="f16_into_f32_beta1"),
    pytest.param("float16", "ieee", None, "N", "N", 4, False, 0.0, False, id="f16_nn"),
    pytest.param("float32", "tf32", None, "N", "N", 3, False, 0.0, True, id="tf32_nn_padded"),
    pytest.param("float16", "ieee", "float32", "T", "N", 3, False, 1.0, True, id="f16_tn_padded_beta1"),
    pytest.param("float64", "ieee", None, "N", "T", 2, True, 0.0, True, id="f64_nt_padded_shared_b"),
]


def test_alignment_is_the_lowest_set_bit_of_address_and_stride_capped_at_256():
    from cuconv._cublas import _alignment

    assert _alignment(0x1004, 0) == 4
    assert _alignment(0x1000, 6) == 2  # a batch stride of 6 bytes misaligns every other matrix
    assert _alignment(0x1000, 0) == _alignment(0, 0) == _alignment(0x10000, 1 << 20) == 256
    assert _alignment(0x1010, 0x200) == 16


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset_one_element"])
@pytest.mark.parametrize("dtype,precision,c_dtype,trans_a,trans_b,batch,shared_b,beta,padded", _CASES)
def test_gemm_matches_numpy_exactly(dtype, precision, c_dtype, trans_a, trans_b, batch, shared_b, beta, padded,
                                    offset):
    import cupy

    from cuconv import _cublas

    dt, ct = _dtypes.by_name(dtype), _dtypes.by_name(c_dtype or dtype)
    m, n, k = 37, 19, 23  # odd sizes; lda/ldb/ldc padded past the rows
    rng = numpy.random.default_rng(7)
    a_rows, a_cols = (m, k) if trans_a == "N" else (k, m)
    b_rows, b_cols = (k, n) if trans_b == "N" else (n, k)
    lda, ldb, ldc = a_rows + 3, b_rows + 1, m + 2
    stride_a, stride_b, stride_c = lda * a_cols + 5, ldb * b_cols + 2, ldc * n + 1
    if padded:
        up = lambda v: -(-v // 128) * 128  # noqa: E731 (128 elements: 256 bytes or more in every dtype)
        lda, ldb, ldc = up(lda), up(ldb), up(ldc)
        stride_a, stride_b, stride_c = up(lda * a_cols), up(ldb * b_cols), up(ldc * n)
    stride_b = 0 if shared_b else stride_b
    b_batches = 1 if shared_b else batch

    def operand(batches, stride, ld, cols, typ):  # column-major matrices at `offset` elements into a buffer
        return rng.integers(-3, 4, offset + stride * (batches - 1) + ld * cols).astype(typ)

    a, b, c = operand(batch, stride_a, lda, a_cols, dt), operand(b_batches, stride_b, ldb, b_cols, dt), \
        operand(batch, stride_c, ldc, n, ct)
    a_gpu, b_gpu, c_gpu = cupy.asarray(a), cupy.asarray(b), cupy.asarray(c)
    _cublas.gemm(dt, precision, m, n, k,
                 a_gpu.data.ptr + offset * dt.itemsize, lda, stride_a,
                 b_gpu.data.ptr + offset * dt.itemsize, ldb, stride_b,
                 c_gpu.data.ptr + offset * ct.itemsize, ldc, stride_c,
                 batch, beta, trans_a=trans_a, trans_b=trans_b, c_dtype=c_dtype)
    got = cupy.asnumpy(c_gpu).astype(numpy.float64)

    def matrix(flat, i, stride, ld, rows, cols):
        start = offset + i * stride
        return flat[start:start + ld * cols].astype(numpy.float64).reshape(cols, ld).T[:rows]

    want = c.astype(numpy.float64)
    for i in range(batch):
        ai = matrix(a, i, stride_a, lda, a_rows, a_cols)
        bi = matrix(b, 0 if shared_b else i, stride_b, ldb, b_rows, b_cols)
        ai = ai if trans_a == "N" else ai.T
        bi = bi if trans_b == "N" else bi.T
        start = offset + i * stride_c
        view = want[start:start + ldc * n].reshape(n, ldc).T  # a view of `want`: written in place
        view[:m] = ai @ bi + beta * view[:m]
    numpy.testing.assert_array_equal(got, want)  # padding rows and gaps between batches untouched too


@pytest.mark.gpu
def test_gemm_plans_are_made_once_per_shape_and_alignment():
    import cupy

    from cuconv import _cublas

    a = cupy.arange(64 * 64 + 1, dtype=numpy.float32) % 7
    aligned, offset = (cupy.full(64 * 64 + 1, numpy.nan, dtype=numpy.float32) for _ in range(2))
    before = len(_cublas._lt_plans)
    for _ in range(3):
        _cublas.gemm(numpy.float32, "ieee", 64, 64, 64, a.data.ptr, 64, 0, a.data.ptr, 64, 0, aligned.data.ptr,
                     64, 0, 1)
    assert len(_cublas._lt_plans) == before + 1
    _cublas.gemm(numpy.float32, "ieee", 64, 64, 64, a.data.ptr + 4, 64, 0, a.data.ptr + 4, 64, 0,
                 offset.data.ptr + 4, 64, 0, 1)  # 4-byte aligned operands: a plan of their own
    assert len(_cublas._lt_plans) == before + 2
    host = cupy.asnumpy(a).astype(numpy.float64)
    for got, start in ((aligned, 0), (offset, 1)):
        m = host[start:start + 4096].reshape(64, 64).T  # column-major
        numpy.testing.assert_array_equal(cupy.asnumpy(got)[start:start + 4096].reshape(64, 64).T, m @ m)


@pytest.mark.gpu
def test_a_gemm_made_before_takes_new_pointers_and_streams():
    """Calls seen before skip their planning (``_lt_calls``): only the shapes, alignments, device, stream and
    thread are kept, never the operands, so other arrays of the same shape and another stream compute their own
    product."""
    import cupy

    from cuconv import _cublas

    rng = numpy.random.default_rng(7)
    results = []
    for trial in range(4):
        stream = cupy.cuda.Stream(non_blocking=True) if trial % 2 else cupy.cuda.Stream.null
        # column-major, a (48, 40) row-major is aᵀ (40x48, ld 40): C (40x40) = aᵀ @ op(bᵀ) = aᵀ b, read back
        # row-major as its transpose bᵀ a. The operands are made on the GEMM's stream: a non-blocking stream
        # does not wait for the null stream's copies and NaN fill (an H200 run read the fill back, once).
        with stream:
            a, b = (cupy.asarray(rng.integers(-4, 5, (48, 40)).astype(numpy.float32)) for _ in range(2))
            c = cupy.full((40, 40), numpy.nan, dtype=numpy.float32)
            _cublas.gemm(numpy.float32, "ieee", 40, 40, 48, a.data.ptr, 40, 0, b.data.ptr, 40, 0, c.data.ptr, 40, 0,
                         1, trans_b="T")
        stream.synchronize()
        results.append(cupy.asnumpy(c))
        want = cupy.asnumpy(b).T @ cupy.asnumpy(a)
        numpy.testing.assert_array_equal(results[-1], want)
    assert len({r.tobytes() for r in results}) == 4
