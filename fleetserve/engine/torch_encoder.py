"""A BERT encoder written directly against PyTorch ops, for the GPU backend.

It computes what Hugging Face's ``BertModel`` plus mean pooling computes (Devlin et al. 2019; pooling as in
sentence-transformers), from the same weights, but laid out for inference on a GPU: Q, K and V are one
matrix product with concatenated weights, attention is one fused kernel (``scaled_dot_product_attention``
or a Triton one) and so are the element-wise chains (:mod:`fleetserve.engine.torch_kernels`); in FP8 mode the
four linear layers of every block take e4m3 inputs with static, calibrated per-tensor scales. No module
state changes during ``forward``, so the whole forward can be captured in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from fleetserve.engine.torch_kernels import FP8, Fp8Scales, Kernels

# Additive attention bias of masked keys: large enough to zero their softmax weight, small enough that a
# row whose keys are all masked (a padding row) stays finite in fp16 instead of turning into NaN.
MASK_BIAS = -10000.0
LINEARS = ("qkv", "o", "ff1", "ff2")
Observer = Callable[[str, torch.Tensor], None]


@dataclass(frozen=True)
class EncoderConfig:
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int
    type_vocab: int
    eps: float

    def __post_init__(self) -> None:
        if min(self.vocab_size, self.hidden, self.layers, self.heads, self.intermediate) < 1:
            raise ValueError(f"encoder dimensions must be positive: {self}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden size {self.hidden} is not a multiple of {self.heads} heads")

    @classmethod
    def from_hf(cls, cfg: object) -> EncoderConfig:
        act = getattr(cfg, "hidden_act", "gelu")
        if act != "gelu":
            raise ValueError(f"only BERT models with exact GELU are supported (hidden_act={act!r})")
        if getattr(cfg, "position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        return cls(
            vocab_size=int(cfg.vocab_size),  # type: ignore[attr-defined]
            hidden=int(cfg.hidden_size),  # type: ignore[attr-defined]
            layers=int(cfg.num_hidden_layers),  # type: ignore[attr-defined]
            heads=int(cfg.num_attention_heads),  # type: ignore[attr-defined]
            intermediate=int(cfg.intermediate_size),  # type: ignore[attr-defined]
            max_positions=int(cfg.max_position_embeddings),  # type: ignore[attr-defined]
            type_vocab=int(cfg.type_vocab_size),  # type: ignore[attr-defined]
            eps=float(cfg.layer_norm_eps),  # type: ignore[attr-defined]
        )

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def weights_from_hf(state: Mapping[str, torch.Tensor], cfg: EncoderConfig) -> dict[str, torch.Tensor]:
    """Hugging Face ``BertModel`` (or ``SentenceEncoder``) state dict -> this encoder's flat fp32 weights."""
    prefix = "bert." if any(k.startswith("bert.") for k in state) else ""

    def get(name: str) -> torch.Tensor:
        try:
            return state[prefix + name].detach().float()
        except KeyError:
            raise ValueError(f"weight {name!r} is missing from the model's state dict") from None

    out = {
        "emb.word": get("embeddings.word_embeddings.weight"),
        "emb.pos": get("embeddings.position_embeddings.weight"),
        "emb.type": get("embeddings.token_type_embeddings.weight"),
        "emb.ln_w": get("embeddings.LayerNorm.weight"),
        "emb.ln_b": get("embeddings.LayerNorm.bias"),
    }
    for i in range(cfg.layers):
        p = f"encoder.layer.{i}."
        att = p + "attention.self."
        out[f"{i}.qkv_w"] = torch.cat([get(att + n + ".weight") for n in ("query", "key", "value")])
        out[f"{i}.qkv_b"] = torch.cat([get(att + n + ".bias") for n in ("query", "key", "value")])
        out[f"{i}.o_w"] = get(p + "attention.output.dense.weight")
        out[f"{i}.o_b"] = get(p + "attention.output.dense.bias")
        out[f"{i}.ln1_w"] = get(p + "attention.output.LayerNorm.weight")
        out[f"{i}.ln1_b"] = get(p + "attention.output.LayerNorm.bias")
        out[f"{i}.ff1_w"] = get(p + "intermediate.dense.weight")
        out[f"{i}.ff1_b"] = get(p + "intermediate.dense.bias")
        out[f"{i}.ff2_w"] = get(p + "output.dense.weight")
        out[f"{i}.ff2_b"] = get(p + "output.dense.bias")
        out[f"{i}.ln2_w"] = get(p + "output.LayerNorm.weight")
        out[f"{i}.ln2_b"] = get(p + "output.LayerNorm.bias")
    return out


class Encoder:
    """Runs the encoder on ``weights`` (already on the target device and in the compute dtype).

    In FP8 mode (``act_scales`` given) each ``{i}.{linear}_w`` is e4m3 with a ``{i}.{linear}_ws`` weight
    scale, and ``act_scales[f"{i}.{linear}"]`` is the static scale of that linear's input.
    """

    def __init__(
        self, cfg: EncoderConfig, weights: Mapping[str, torch.Tensor], kernels: Kernels, dtype: torch.dtype,
        act_scales: Mapping[str, float] | None = None,
    ) -> None:
        self.cfg = cfg
        self.w = dict(weights)
        self.k = kernels
        self.dtype = dtype
        self.act_scales = dict(act_scales) if act_scales is not None else None
        self._fp8: dict[str, Fp8Scales] = {}
        if self.act_scales is not None:
            device = self.w["emb.word"].device
            # Created once, outside any graph capture: device scalars for cuBLAS, floats for Triton.
            for name, s in self.act_scales.items():
                ws = self.w[name + "_ws"]
                self._fp8[name] = Fp8Scales(torch.tensor(s, dtype=torch.float32, device=device), ws, s * float(ws))

    def _qscale(self, name: str) -> float | None:
        return self.act_scales[name] if self.act_scales is not None else None

    def _linear(self, i: int, name: str, x: torch.Tensor) -> torch.Tensor:
        """``x`` is e4m3 (already scaled) in FP8 mode, else in the compute dtype."""
        key = f"{i}.{name}"
        if x.dtype == FP8:
            return self.k.fp8_linear(x, self.w[key + "_w"], self._fp8[key], self.w[key + "_b"])
        return F.linear(x, self.w[key + "_w"], self.w[key + "_b"])

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
        observe: Observer | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (last_hidden_state [b, s, hidden] fp32, L2-normalised mean-pooled embedding [b, hidden] fp32).

        ``observe(name, tensor)`` sees the input of every linear layer (calibration).
        """
        cfg, w = self.cfg, self.w
        b, s = input_ids.shape
        rows = b * s

        word = F.embedding(input_ids, w["emb.word"]).view(rows, cfg.hidden)
        posn = (w["emb.pos"][:s].unsqueeze(0) + F.embedding(token_type_ids, w["emb.type"])).view(rows, cfg.hidden)
        h, hq = self.k.add_layernorm(word, posn, w["emb.ln_w"], w["emb.ln_b"], cfg.eps, self._qscale("0.qkv"))
        bias = (1.0 - attention_mask.to(self.dtype)) * MASK_BIAS

        for i in range(cfg.layers):
            if observe:
                observe(f"{i}.qkv", h)
            qkv = self._linear(i, "qkv", h if hq is None else hq)
            # e4m3, ready for the output projection, in FP8 mode (calibration runs without scales).
            att = self.k.attention(qkv, bias, cfg.heads, self._qscale(f"{i}.o"))
            if observe:
                observe(f"{i}.o", att)
            h, hq = self.k.add_layernorm(
                self._linear(i, "o", att), h, w[f"{i}.ln1_w"], w[f"{i}.ln1_b"], cfg.eps,
                self._qscale(f"{i}.ff1"),
            )
            if observe:
                observe(f"{i}.ff1", h)
            ff2_scale = self._qscale(f"{i}.ff2")
            if hq is not None and ff2_scale is not None:
                key = f"{i}.ff1"
                inner = self.k.fp8_linear_gelu(hq, w[key + "_w"], self._fp8[key], w[key + "_b"], ff2_scale)
            else:
                inner = self.k.linear_gelu(h, w[f"{i}.ff1_w"], w[f"{i}.ff1_b"])
            if observe:
                observe(f"{i}.ff2", inner)
            nxt = self._qscale(f"{i + 1}.qkv") if i + 1 < cfg.layers else None
            h, hq = self.k.add_layernorm(
                self._linear(i, "ff2", inner), h, w[f"{i}.ln2_w"], w[f"{i}.ln2_b"], cfg.eps, nxt
            )

        hidden = h.view(b, s, cfg.hidden).float()
        mask = attention_mask.unsqueeze(-1).float()
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return hidden, F.normalize(pooled, p=2.0, dim=1)
