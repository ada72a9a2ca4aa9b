"""Calibrated FP8 (e4m3) for the encoder's linear layers: activation statistics -> static per-tensor scales.

Post-training calibration as in NVIDIA's FP8 recipe ("FP8 Formats for Deep Learning", Micikevicius et al.
2022; TensorRT-LLM's max calibration): run the full-precision encoder over unlabelled text, record the
largest absolute value reaching each linear layer's input, and fix that input's scale to
``amax * margin / 448``. Weights get one scale per tensor from their own maximum. Because e4m3 is a float
format, a margin above 1 costs almost no precision (values only move down the exponent range) while it
keeps inputs longer or stranger than the calibration text from saturating.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from fleetserve.engine.torch_encoder import LINEARS, Encoder, EncoderConfig
from fleetserve.engine.torch_kernels import FP8, FP8_MAX

Batch = Mapping[str, torch.Tensor]


def observe_amax(encoder: Encoder, batches: Iterable[Batch]) -> dict[str, float]:
    """Largest |input| of every linear layer over ``batches`` (``encoder`` runs in full precision)."""
    amax: dict[str, torch.Tensor] = {}

    def observe(name: str, t: torch.Tensor) -> None:
        a = t.detach().abs().amax().float()
        amax[name] = torch.maximum(amax[name], a) if name in amax else a

    with torch.inference_mode():
        for batch in batches:
            encoder.forward(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], observe)
    if not amax:
        raise ValueError("FP8 calibration needs at least one batch of text")
    return {name: float(v) for name, v in amax.items()}


def activation_scales(amax: Mapping[str, float], margin: float) -> dict[str, float]:
    if margin < 1.0:
        raise ValueError(f"FP8 scale margin must be >= 1, got {margin}")
    # A tensor that is all zeros in calibration still needs a finite, positive scale.
    return {name: max(value, 1e-6) * margin / FP8_MAX for name, value in amax.items()}


def quantize_weights(weights: Mapping[str, torch.Tensor], cfg: EncoderConfig) -> dict[str, torch.Tensor]:
    """Replace each linear weight by its e4m3 copy and add its per-tensor scale as ``{name}_ws``."""
    out = dict(weights)
    for i in range(cfg.layers):
        for name in LINEARS:
            key = f"{i}.{name}_w"
            w = weights[key].float()
            scale = (w.abs().amax() / FP8_MAX).clamp(min=1e-12)
            out[key] = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
            out[f"{i}.{name}_ws"] = scale.reshape(())
    return out


def required_scales(cfg: EncoderConfig) -> list[str]:
    return [f"{i}.{name}" for i in range(cfg.layers) for name in LINEARS]
