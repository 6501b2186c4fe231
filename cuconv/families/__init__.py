"""The algorithm families and the kernels they share: each module is the Python twin of ``kernels_cu/<stem>.cu``.

A family (``im2col_gemm``, ``implicit_gemm``, ``depthwise``, ``direct``, ``direct_smem``, ``winograd``,
``winograd_fused``) answers ``reason_unsupported(...)`` and builds plans with ``prepare(pass_, spec, dtype,
precision, env, bias=False) -> cuconv._plan.Plan``; ``cuconv.registry`` lists the families and the passes each
serves. The other modules are building blocks the families' plans use: gathers (``im2col``, ``col2im``), bias
(``bias``), fills, casts and sums (``elementwise``), pointer arrays for batched GEMMs (``gemm_ptrs``), and dgrad
computed as a forward convolution of a flipped weight (``dgrad_forward``). Each twin names its source (``STEM``)
and the kernels it instantiates (``NAME_EXPRESSIONS``).
"""
