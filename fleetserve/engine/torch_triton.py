"""Triton kernels of the GPU encoder (imported only on CUDA machines, by :mod:`fleetserve.engine.torch_kernels`).

* ``add_ln``: residual add + LayerNorm over one row per program, optionally also writing the e4m3 copy
  of the output that the next linear layer reads (one read of each input, one write of each output).
* ``pointwise``: GELU and/or e4m3 cast over a flat tensor.
* ``gelu``: exact (erf) GELU, or its tanh form (Hendrycks & Gimpel 2016, the form cuBLASLt's GELU epilogue
  computes) on the GPU's ``tanh.approx.f32`` instruction: one special-function op per element where the erf
  polynomial takes a few dozen. Over BERT-base's 4×-wide intermediate the erf made the GELU + cast pass
  arithmetic-bound, at about half the H200's memory bandwidth (BENCHMARKS.md §2).
* ``fp8_gemm_gelu``: ``gelu(A·Bᵀ·s + bias)`` cast to e4m3, for the first feed-forward layer: the 4×-wide
  intermediate leaves the GPU's registers once, as FP8, instead of being written in bf16 by the matrix
  product and read back by a GELU pass. Tiled matrix product with grouped tile order for L2 reuse, as in
  Triton's matrix-multiplication tutorial; both operands K-contiguous, which is the layout Hopper's FP8
  tensor-core instructions take; tile shapes autotuned per problem size.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def add_ln(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, q_ptr, cols, eps, inv_scale,  # type: ignore[no-untyped-def]
           BLOCK: tl.constexpr, QUANT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    base = row * cols
    v = tl.load(x_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    v += tl.load(r_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(v, axis=0) / cols
    d = tl.where(mask, v - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / cols + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = d * rstd * w + b
    tl.store(y_ptr + base + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
    if QUANT:
        qv = tl.minimum(tl.maximum(y * inv_scale, -448.0), 448.0)
        tl.store(q_ptr + base + offs, qv.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gelu(v, TANH: tl.constexpr):  # type: ignore[no-untyped-def]
    if TANH:
        inner = 0.7978845608028654 * (v + 0.044715 * v * v * v)
        t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [inner], dtype=tl.float32, is_pure=True,
                                      pack=1)
        return 0.5 * v * (1.0 + t)
    return 0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476))


@triton.jit
def pointwise(x_ptr, y_ptr, n, inv_scale,  # type: ignore[no-untyped-def]
              BLOCK: tl.constexpr, GELU: tl.constexpr, TANH: tl.constexpr, QUANT: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if GELU:
        v = gelu(v, TANH)
    if QUANT:
        v = tl.minimum(tl.maximum(v * inv_scale, -448.0), 448.0)
    tl.store(y_ptr + offs, v.to(y_ptr.dtype.element_ty), mask=mask)


_GEMM_CONFIGS = [
    triton.Config({"BM": 128, "BN": 256, "BK": 128, "GROUP": 8}, num_stages=3, num_warps=8),
    triton.Config({"BM": 128, "BN": 128, "BK": 128, "GROUP": 8}, num_stages=4, num_warps=8),
    triton.Config({"BM": 64, "BN": 256, "BK": 128, "GROUP": 8}, num_stages=4, num_warps=4),
    triton.Config({"BM": 128, "BN": 128, "BK": 64, "GROUP": 8}, num_stages=5, num_warps=4),
    triton.Config({"BM": 64, "BN": 64, "BK": 128, "GROUP": 8}, num_stages=4, num_warps=4),
]


@triton.autotune(configs=_GEMM_CONFIGS, key=["M", "N", "K"])
@triton.jit
def fp8_gemm_gelu(a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K, ab_scale, inv_out_scale,  # type: ignore[no-untyped-def]
                  TANH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    """A [M, K] e4m3 row-major, B [N, K] e4m3 row-major (the weight), C [M, N] e4m3."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    per_group = GROUP * tiles_n
    first_m = (pid // per_group) * GROUP
    group_m = min(tiles_m - first_m, GROUP)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    # Out-of-range rows/columns wrap around for the loads (always in bounds) and are masked at the store.
    a_ptrs = a_ptr + (rows % M).to(tl.int64)[:, None] * K + ks[None, :]
    b_ptrs = b_ptr + (cols % N).to(tl.int64)[None, :] * K + ks[:, None]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k_left = K - k0
        a = tl.load(a_ptrs, mask=ks[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=ks[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BK
        b_ptrs += BK
    bias = tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    v = gelu(acc * ab_scale + bias[None, :], TANH)
    v = tl.minimum(tl.maximum(v * inv_out_scale, -448.0), 448.0)
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(c_ptrs, v.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))
