"""PyTorch definitions of the zoo's transformer models (export time and GPU backends only; imports torch).

``SentenceEncoder`` wraps a Hugging Face ``BertModel`` so one forward returns both the token states and the
mean-pooled, L2-normalised sentence embedding (what sentence-transformers computes for all-MiniLM-L6-v2),
which keeps pooling inside the engine instead of in Python.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from fleetserve.models.weights import minilm_dir

BERT_BASE_SEED = 20241202
BERT_LARGE_SEED = 20261203
# The seeded zoo models: Hugging Face BertConfig fields (bert-base-uncased, bert-large-uncased shapes) and seed.
SEEDED: dict[str, tuple[dict[str, int], int]] = {
    "bert-base": ({"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                   "intermediate_size": 3072}, BERT_BASE_SEED),
    "bert-large": ({"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                    "intermediate_size": 4096}, BERT_LARGE_SEED),
}


class SentenceEncoder(nn.Module):
    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.bert(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return hidden, nn.functional.normalize(pooled, p=2.0, dim=1)


def _quietly_from_pretrained(cls: Any, path: str, **kwargs: Any) -> Any:
    """``cls.from_pretrained`` without transformers' report of unused checkpoint weights: sentence-encoder
    checkpoints carry a pooler head that :class:`SentenceEncoder` leaves out on purpose (mean pooling instead)."""
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return cls.from_pretrained(path, local_files_only=True, **kwargs)
    finally:
        hf_logging.set_verbosity(previous)


def load_torch_model(name: str, attn_implementation: str = "eager") -> SentenceEncoder:
    """``minilm`` (real weights), ``bert-base`` / ``bert-large`` (seeded random) or a Hugging Face-style BERT
    directory."""
    from transformers import BertConfig, BertModel

    kwargs: dict[str, Any] = {"attn_implementation": attn_implementation, "add_pooling_layer": False}
    if name == "minilm":
        bert = _quietly_from_pretrained(BertModel, str(minilm_dir()), **kwargs)
    elif name in SEEDED:
        shape, seed = SEEDED[name]
        torch.manual_seed(seed)
        config = BertConfig(vocab_size=30522, max_position_embeddings=512, attn_implementation=attn_implementation,
                            **shape)
        bert = BertModel(config, add_pooling_layer=False)
    elif Path(name).is_dir():
        bert = _quietly_from_pretrained(BertModel, name, **kwargs)
    else:
        raise ValueError(f"no PyTorch definition for model {name!r}")
    return SentenceEncoder(bert).eval()
