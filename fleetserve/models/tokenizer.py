"""Text -> token id batches with the model's own ``tokenizer.json`` (Hugging Face ``tokenizers``).

Padding is dynamic (to the longest text in the call, never a fixed 128) and truncation happens at the
model maximum; the batcher later pads to its sequence bucket. ``encode`` reports which texts were truncated
so the HTTP layer can flag them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer


@dataclass(frozen=True)
class Encoded:
    input_ids: np.ndarray  # int64 [n, seq]
    attention_mask: np.ndarray
    token_type_ids: np.ndarray
    truncated: list[bool]

    def as_inputs(self) -> dict[str, np.ndarray]:
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "token_type_ids": self.token_type_ids,
        }


class TextTokenizer:
    def __init__(self, path: Path, max_length: int) -> None:
        self.max_length = max_length
        self._tok = Tokenizer.from_file(str(path))
        self._tok.no_padding()
        self._tok.enable_truncation(max_length)

    def encode(self, texts: list[str]) -> Encoded:
        encs = self._tok.encode_batch(texts)
        seq = max(len(e.ids) for e in encs)
        n = len(encs)
        ids = np.zeros((n, seq), dtype=np.int64)
        mask = np.zeros((n, seq), dtype=np.int64)
        types = np.zeros((n, seq), dtype=np.int64)
        for i, e in enumerate(encs):
            k = len(e.ids)
            ids[i, :k] = e.ids
            mask[i, :k] = e.attention_mask
            types[i, :k] = e.type_ids
        return Encoded(ids, mask, types, [bool(e.overflowing) for e in encs])
