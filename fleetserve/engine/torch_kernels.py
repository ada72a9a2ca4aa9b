"""Fused operations of the GPU encoder, with a plain-PyTorch reference of each.

Outside the matrix products a BERT layer does bias, GELU, residual add, LayerNorm and, in FP8, the cast of
every linear input; in FP8 at batch 128 on the H200 that is about half of the GPU time (kernel profile,
``benchmarks/gpu.py --profile``). Each of those is one pass over memory when written
as a separate PyTorch op; :class:`TritonKernels` fuses them into one pass per chain (residual add +
LayerNorm + FP8 cast; GELU + FP8 cast; optionally the first feed-forward product + GELU + FP8 cast), which
is what bounds their cost on an H200 (4.8 TB/s HBM). :class:`TorchKernels` computes the same functions with
ordinary ops: it is the CPU path used by the tests and the reference the Triton kernels are checked against.

FP8 follows the usual per-tensor scaling recipe (NVIDIA Transformer Engine, "FP8 Formats for Deep
Learning", Micikevicius et al. 2022): ``q = clamp(x / scale, ±448)`` in e4m3 and ``x ≈ q · scale``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value; casts beyond it give NaN, so every cast clamps first
# Rows from which the fused FP8 FFN1 runs persistent (H200, `benchmarks/gpu_ffn1.py`: 13-18% faster than one
# tile per program from 16,384 rows in every width measured, in two of three at 8,192; BENCHMARKS.md §10.2).
PERSISTENT_MIN_ROWS = 8192
ATTENTION_HEAD_DIMS = (16, 32, 64, 128)  # head sizes the Triton attention takes (SDPA for the others)
_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Fp8Scales:
    """Scales of one FP8 product: input and weight as device scalars (cuBLAS), their product as a float."""

    x: torch.Tensor
    w: torch.Tensor
    product: float


class Kernels(Protocol):
    """The fused operations the encoder needs; ``qscale`` is the FP8 scale of the output (None: no FP8).

    ``attention``: self-attention of the fused QKV product's output ``qkv`` [b·s, 3·hidden] (Q, K, V side by
    side, ``heads`` heads each) with the additive key bias ``bias`` [b, s], as [b·s, hidden], the layout the
    output projection reads.
    """

    def add_layernorm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
        qscale: float | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def quantize(self, x: torch.Tensor, qscale: float) -> torch.Tensor: ...

    def attention(
        self, qkv: torch.Tensor, bias: torch.Tensor, heads: int, qscale: float | None
    ) -> torch.Tensor: ...

    def linear_gelu(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor: ...

    def fp8_linear(self, xq: torch.Tensor, wq: torch.Tensor, s: Fp8Scales, bias: torch.Tensor) -> torch.Tensor: ...

    def fp8_linear_gelu(
        self, xq: torch.Tensor, wq: torch.Tensor, s: Fp8Scales, bias: torch.Tensor, qscale: float
    ) -> torch.Tensor: ...


def quantize_reference(x: torch.Tensor, qscale: float) -> torch.Tensor:
    return (x.float() / qscale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def sdpa_attention(qkv: torch.Tensor, bias: torch.Tensor, heads: int) -> torch.Tensor:
    """:meth:`Kernels.attention` through PyTorch's ``scaled_dot_product_attention`` (without the cast)."""
    b, s = bias.shape
    hidden = qkv.shape[-1] // 3
    parts = qkv.view(b, s, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
    att = F.scaled_dot_product_attention(parts[0], parts[1], parts[2], attn_mask=bias.view(b, 1, 1, s))
    return att.transpose(1, 2).reshape(b * s, hidden)


class TorchKernels:
    """Unfused reference: GELU exact (erf) or, with ``tanh_gelu``, its tanh form; FP8 products emulated by
    dequantising to float32."""

    def __init__(self, tanh_gelu: bool = False) -> None:
        self.approximate = "tanh" if tanh_gelu else "none"

    def add_layernorm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
        qscale: float | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        y32 = F.layer_norm(x.float() + residual.float(), (x.shape[-1],), weight.float(), bias.float(), eps)
        return y32.to(x.dtype), (quantize_reference(y32, qscale) if qscale is not None else None)

    def gelu(self, x: torch.Tensor, qscale: float | None) -> torch.Tensor:
        y = F.gelu(x.float(), approximate=self.approximate)
        return quantize_reference(y, qscale) if qscale is not None else y.to(x.dtype)

    def quantize(self, x: torch.Tensor, qscale: float) -> torch.Tensor:
        return quantize_reference(x, qscale)

    def attention(self, qkv: torch.Tensor, bias: torch.Tensor, heads: int, qscale: float | None) -> torch.Tensor:
        att = sdpa_attention(qkv, bias, heads)
        return att if qscale is None else quantize_reference(att, qscale)

    def linear_gelu(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.gelu(F.linear(x, weight, bias), approximate=self.approximate)

    def fp8_linear(self, xq: torch.Tensor, wq: torch.Tensor, s: Fp8Scales, bias: torch.Tensor) -> torch.Tensor:
        out = (xq.float() * s.x) @ (wq.float() * s.w).t() + bias.float()
        return out.to(bias.dtype)

    def fp8_linear_gelu(
        self, xq: torch.Tensor, wq: torch.Tensor, s: Fp8Scales, bias: torch.Tensor, qscale: float
    ) -> torch.Tensor:
        return self.gelu(self.fp8_linear(xq, wq, s, bias).float(), qscale)


class TritonKernels:
    """CUDA path: Triton for the fused chains, cuBLASLt (through PyTorch) for the matrix products.

    ``tanh_gelu``: GELU in its tanh form. The half-precision first FFN product then runs with cuBLASLt's
    bias+GELU epilogue (one kernel, no extra pass over the 4×-wide intermediate), and the FP8 one's GELU + cast
    pass computes the tanh with one hardware instruction instead of the erf polynomial; otherwise an
    exact-GELU Triton pass follows the product. ``fused_ffn1``: the FP8 first FFN product is
    a Triton GEMM with bias+GELU+FP8 epilogue instead of ``_scaled_mm`` + a GELU/cast pass: the persistent TMA
    kernel from ``persistent_min_rows`` rows on, one tile per program below. Attention is PyTorch's SDPA with
    an additive mask (on the H200 it dispatches to cuDNN's fused flash kernel), or with ``fused_attention``
    a Triton kernel that reads the QKV product's output as it lies and writes the output projection's input,
    cast to e4m3 in FP8, in one pass (fp16 and bf16, head sizes :data:`ATTENTION_HEAD_DIMS`; SDPA otherwise).
    """

    def __init__(
        self, tanh_gelu: bool = True, fast_accum: bool = True, fused_ffn1: bool = False,
        persistent_min_rows: int = PERSISTENT_MIN_ROWS, fused_attention: bool = False,
    ) -> None:
        import triton

        from fleetserve.engine import torch_triton

        self.tanh_gelu = tanh_gelu
        self.fast_accum = fast_accum
        self.fused_ffn1 = fused_ffn1
        self.fused_attention = fused_attention
        self.persistent_min_rows = persistent_min_rows
        self._t: Any = torch_triton
        self._triton: Any = triton
        self._sms: dict[torch.device, int] = {}

    def add_layernorm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
        qscale: float | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        cols = x.shape[-1]
        rows = x.numel() // cols
        y = torch.empty_like(x)
        q = torch.empty(x.shape, dtype=FP8, device=x.device) if qscale is not None else y
        block = 1 << (cols - 1).bit_length()
        self._t.add_ln[(rows,)](
            x, residual, weight, bias, y, q, cols, eps, 1.0 / (qscale or 1.0),
            BLOCK=block, QUANT=qscale is not None, num_warps=max(1, min(8, block // 256)),
        )
        return y, (q if qscale is not None else None)

    def gelu(self, x: torch.Tensor, qscale: float | None) -> torch.Tensor:
        return self._pointwise(x, qscale, gelu=True)

    def quantize(self, x: torch.Tensor, qscale: float) -> torch.Tensor:
        return self._pointwise(x, qscale, gelu=False)

    def _pointwise(self, x: torch.Tensor, qscale: float | None, gelu: bool) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty(x.shape, dtype=FP8 if qscale is not None else x.dtype, device=x.device)
        n = x.numel()
        block = 2048
        self._t.pointwise[(math.ceil(n / block),)](
            x, out, n, 1.0 / (qscale or 1.0), BLOCK=block, GELU=gelu, TANH=self.tanh_gelu, QUANT=qscale is not None,
            num_warps=8,
        )
        return out

    def attention(self, qkv: torch.Tensor, bias: torch.Tensor, heads: int, qscale: float | None) -> torch.Tensor:
        rows, hidden = qkv.shape[0], qkv.shape[-1] // 3
        head_dim = hidden // heads
        # float32 stays on SDPA: Triton's dot would take its inputs as TF32.
        if not self.fused_attention or head_dim not in ATTENTION_HEAD_DIMS or qkv.dtype not in _HALF:
            att = sdpa_attention(qkv, bias, heads)
            return att if qscale is None else self.quantize(att, qscale)
        qkv, bias = qkv.contiguous(), bias.contiguous()
        b, s = bias.shape
        out = torch.empty((rows, hidden), dtype=FP8 if qscale is not None else qkv.dtype, device=qkv.device)

        def grid(meta: dict[str, int]) -> tuple[int]:
            return (triton_cdiv(s, meta["BM"]) * b * heads,)

        self._t.attention[grid](
            qkv, bias, out, s, 1 << (s - 1).bit_length(), heads, hidden, head_dim**-0.5, 1.0 / (qscale or 1.0),
            HD=head_dim, QUANT=qscale is not None,
        )
        return out

    def linear_gelu(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        if self.tanh_gelu:
            return torch._addmm_activation(bias, x, weight.t(), use_gelu=True)
        return self.gelu(F.linear(x, weight, bias), None)

    def fp8_linear(self, xq: torch.Tensor, wq: torch.Tensor, s: Fp8Scales, bias: torch.Tensor) -> torch.Tensor:
        # _scaled_mm wants the second operand column-major: wq is [out, in] row-major, so wq.t() is.
        return torch._scaled_mm(
            xq, wq.t(), scale_a=s.x, scale_b=s.w, bias=bias, out_dtype=bias.dtype, use_fast_accum=self.fast_accum,
        )

    def fp8_linear_gelu(
        self, xq: torch.Tensor, wq: torch.Tensor, s: Fp8Scales, bias: torch.Tensor, qscale: float
    ) -> torch.Tensor:
        if not self.fused_ffn1:
            return self.gelu(self.fp8_linear(xq, wq, s, bias), qscale)
        m, k = xq.shape
        n = wq.shape[0]
        device = xq.device
        out = torch.empty((m, n), dtype=FP8, device=device)
        args = (xq, wq, bias, out, m, n, k, 1 << (m - 1).bit_length(), s.product, 1.0 / qscale)
        if m < self.persistent_min_rows:
            def grid(meta: dict[str, int]) -> tuple[int]:
                return (triton_cdiv(m, meta["BM"]) * triton_cdiv(n, meta["BN"]),)

            self._t.fp8_gemm_gelu[grid](*args, TANH=self.tanh_gelu)
            return out
        if device not in self._sms:
            self._sms[device] = torch.cuda.get_device_properties(device).multi_processor_count
        sms = self._sms[device]

        def persistent_grid(meta: dict[str, int]) -> tuple[int]:
            return (min(sms, triton_cdiv(m, meta["BM"]) * triton_cdiv(n, meta["BN"])),)

        # The kernel builds its TMA descriptors on the device, in scratch memory Triton asks this for (the
        # setting is per thread, and graphs are captured on each instance's own thread).
        self._triton.set_allocator(lambda size, _align, _stream: torch.empty(size, dtype=torch.int8, device=device))
        self._t.fp8_gemm_gelu_persistent[persistent_grid](*args, TANH=self.tanh_gelu, PROGRAMS=sms)
        return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
