"""Triton kernels of the GPU encoder (imported only on CUDA machines, by :mod:`fleetserve.engine.torch_kernels`).

* ``add_ln``: residual add + LayerNorm over one row per program, optionally also writing the e4m3 copy
  of the output that the next linear layer reads (one read of each input, one write of each output).
* ``pointwise``: GELU and/or e4m3 cast over a flat tensor.
* ``gelu``: exact (erf) GELU, or its tanh form (Hendrycks & Gimpel 2016, the form cuBLASLt's GELU epilogue
  computes) on the GPU's ``tanh.approx.f32`` instruction: one special-function op per element where the erf
  polynomial takes a few dozen. Over BERT-base's 4×-wide intermediate the erf made the GELU + cast pass
  arithmetic-bound, at about half the H200's memory bandwidth (BENCHMARKS.md §2).
* ``fp8_gemm_gelu`` and ``fp8_gemm_gelu_persistent``: ``gelu(A·Bᵀ·s + bias)`` cast to e4m3, for the first
  feed-forward layer: the 4×-wide intermediate leaves the GPU's registers once, as FP8, instead of being
  written in bf16 by the matrix product and read back by a GELU pass. Tiled matrix products with grouped tile
  order for L2 reuse, as in Triton's matrix-multiplication tutorials; both operands K-contiguous, which is the
  layout Hopper's FP8 tensor-core instructions take; tile shapes autotuned per size class. The first runs one
  tile per program (small M); the second is persistent and loads through TMA (large M).
* ``attention``: multi-head self-attention with an additive key mask, read straight from the fused QKV
  product's output and written straight in the layout the output projection reads, optionally cast to e4m3
  for it: no permute copies and no cast pass. Online softmax over key blocks in exp2 (FlashAttention, Dao et
  al. 2022, as in Triton's fused-attention tutorial); for BERT's short sequences one key block often holds
  them all.
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


def _configs(shapes: list[tuple[int, int, int, int, int]]) -> list[triton.Config]:
    return [triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP": 8}, num_stages=stages, num_warps=warps)
            for bm, bn, bk, stages, warps in shapes]


# (BM, BN, BK, stages, warps): the winners of a wider sweep on the H200 (BENCHMARKS.md §10.2, ninth session).
_GEMM_CONFIGS = _configs([(128, 256, 64, 4, 8), (128, 256, 128, 3, 8), (128, 128, 64, 5, 4), (128, 128, 128, 4, 8),
                          (64, 256, 128, 4, 4)])
_PERSISTENT_CONFIGS = _configs([(128, 256, 128, 4, 8), (128, 256, 128, 3, 8), (128, 256, 64, 4, 8),
                                (256, 128, 128, 3, 8), (128, 128, 128, 4, 8)])
# Tuned once per power-of-two class of M (not per M: a CUDA-graph ladder has dozens of row counts) and per
# N, K; Triton keeps the choices in its on-disk cache, so the next start skips the tuning (BENCHMARKS.md §10.2).
_KEY = ["M_CLASS", "N", "K"]


@triton.jit
def _tile(tile, tiles_m, tiles_n, GROUP: tl.constexpr):  # type: ignore[no-untyped-def]
    """Grouped tile order (row tiles in groups of GROUP share B's columns in L2), as in Triton's tutorial."""
    per_group = GROUP * tiles_n
    first_m = (tile // per_group) * GROUP
    group_m = min(tiles_m - first_m, GROUP)
    return first_m + (tile % per_group) % group_m, (tile % per_group) // group_m


@triton.jit
def _gelu_fp8(acc, bias_ptr, cols, N, ab_scale, inv_out_scale, TANH: tl.constexpr):  # type: ignore[no-untyped-def]
    bias = tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    v = gelu(acc * ab_scale + bias[None, :], TANH)
    return tl.minimum(tl.maximum(v * inv_out_scale, -448.0), 448.0)


@triton.autotune(configs=_GEMM_CONFIGS, key=_KEY, cache_results=True)
@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BK"] == 0})
@triton.jit
def fp8_gemm_gelu(a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K, M_CLASS, ab_scale,  # type: ignore[no-untyped-def]
                  inv_out_scale, TANH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  GROUP: tl.constexpr, EVEN_K: tl.constexpr):
    """A [M, K] e4m3 row-major, B [N, K] e4m3 row-major (the weight), C [M, N] e4m3; one tile per program."""
    pid_m, pid_n = _tile(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP)
    rows = pid_m * BM + tl.arange(0, BM)
    cols = pid_n * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    # Out-of-range rows/columns wrap around for the loads (always in bounds) and are masked at the store.
    a_ptrs = a_ptr + (rows % M).to(tl.int64)[:, None] * K + ks[None, :]
    b_ptrs = b_ptr + (cols % N).to(tl.int64)[None, :] * K + ks[:, None]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=ks[None, :] < K - k0, other=0.0)
            b = tl.load(b_ptrs, mask=ks[:, None] < K - k0, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BK
        b_ptrs += BK
    v = _gelu_fp8(acc, bias_ptr, cols, N, ab_scale, inv_out_scale, TANH)
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(c_ptrs, v.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.autotune(configs=_PERSISTENT_CONFIGS, key=_KEY, cache_results=True)
@triton.jit
def fp8_gemm_gelu_persistent(a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K, M_CLASS,  # type: ignore[no-untyped-def]
                             ab_scale, inv_out_scale, TANH: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                             BK: tl.constexpr, GROUP: tl.constexpr, PROGRAMS: tl.constexpr):
    """The same product for large M: ``PROGRAMS`` (one per SM) programs loop over the tiles, loading through
    Hopper's tensor-memory accelerator (TMA descriptors, which also clip the edges), with the tile loop
    flattened so the next tile's loads overlap this tile's epilogue; Triton's persistent matmul tutorial
    (09-persistent-matmul) is the pattern. On the H200 it took BERT-base's FFN1 at 16,384 rows from 105 to
    86 µs; with few tiles (1,024 rows) one tile per program is faster."""
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True):
        pid_m, pid_n = _tile(tile, tiles_m, tiles_n, GROUP)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(tl.cdiv(K, BK)):
            a = a_desc.load([pid_m * BM, ki * BK])
            b = b_desc.load([pid_n * BN, ki * BK])
            acc = tl.dot(a, b.T, acc)
        v = _gelu_fp8(acc, bias_ptr, pid_n * BN + tl.arange(0, BN), N, ab_scale, inv_out_scale, TANH)
        c_desc.store([pid_m * BM, pid_n * BN], v.to(c_ptr.dtype.element_ty))


# (BM, BN, stages, warps) for attention, tuned per power-of-two class of the sequence length and per head size:
# the fastest of 15 tile shapes somewhere among BERT-base, MiniLM and BERT-Large serving shapes on the H200
# (``benchmarks/gpu_attention.py``, BENCHMARKS.md §10.2); TMA loads measured no faster. Not per batch size: a
# graph ladder has up to eight classes of it, each another tuning at a cold start, and a key with it measured
# no faster at batch 1-128 than the tile tuned at the largest batch (BENCHMARKS.md §10.2).
_ATTENTION_CONFIGS = [triton.Config({"BM": bm, "BN": bn}, num_stages=stages, num_warps=warps)
                      for bm, bn, stages, warps in ((128, 64, 2, 4), (64, 64, 1, 4), (64, 64, 2, 4),
                                                    (64, 32, 2, 4), (64, 128, 2, 4), (32, 128, 2, 4))]


@triton.autotune(configs=_ATTENTION_CONFIGS, key=["S_CLASS", "HD"], cache_results=True)
@triton.jit
def attention(qkv_ptr, bias_ptr, out_ptr, S, S_CLASS, heads, hidden, sm_scale,  # type: ignore[no-untyped-def]
              inv_out_scale, HD: tl.constexpr, QUANT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """qkv [b·S, 3·hidden] (Q, K, V side by side, head h at columns h·HD of each), bias [b, S] added to every
    query's score of that key, out [b·S, hidden]. One program per (batch × head, query block), the query
    blocks of one head next to each other (they share its K and V); a one-dimensional grid, since a second
    axis would stop at 65,535 batch × heads."""
    blocks = tl.cdiv(S, BM)
    bh = tl.program_id(0) // blocks
    batch = bh // heads
    head = bh % heads
    first = batch.to(tl.int64) * S
    stride = 3 * hidden
    q_rows = (tl.program_id(0) % blocks) * BM + tl.arange(0, BM)
    dims = tl.arange(0, HD)
    q_mask = q_rows[:, None] < S
    q = tl.load(qkv_ptr + (first + q_rows)[:, None] * stride + head * HD + dims[None, :], mask=q_mask, other=0.0)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, HD], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    for start in range(0, S, BN):
        keys = start + tl.arange(0, BN)
        k_valid = keys < S
        k_ptrs = qkv_ptr + (first + keys)[:, None] * stride + hidden + head * HD + dims[None, :]
        k = tl.load(k_ptrs, mask=k_valid[:, None], other=0.0)
        bias = tl.load(bias_ptr + first + keys, mask=k_valid, other=float("-inf")).to(tl.float32)
        scores = tl.dot(q, k.T) * qk_scale + bias[None, :] * 1.4426950408889634
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(k_ptrs + hidden, mask=k_valid[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    o = acc / l_i[:, None]
    if QUANT:
        o = tl.minimum(tl.maximum(o * inv_out_scale, -448.0), 448.0)
    o_ptrs = out_ptr + (first + q_rows)[:, None] * hidden + head * HD + dims[None, :]
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=q_mask)
