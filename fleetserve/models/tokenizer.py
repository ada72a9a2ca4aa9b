"""Text -> token id batches with the model's own ``tokenizer.json`` (Hugging Face ``tokenizers``).

Padding is dynamic (to the longest text in the call, never a fixed 128) and truncation happens at the
model maximum; the batcher later pads to its sequence bucket. ``encode`` reports which texts were truncated
so the HTTP layer can flag them. ``encode_groups`` tokenises several callers' texts in one ``encode_batch``
call (one crossing into the Rust library, which splits the work over its threads) and packs each group apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer


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
        return _pack(self._tok.encode_batch(texts))

    def encode_groups(self, groups: list[list[str]]) -> list[Encoded]:
        """``[encode(g) for g in groups]``, with one ``encode_batch`` over every group's texts."""
        encs = self._tok.encode_batch([t for g in groups for t in g])
        out, start = [], 0
        for g in groups:
            out.append(_pack(encs[start : start + len(g)]))
            start += len(g)
        return out


def _pack(encs: list[Encoding]) -> Encoded:
    """Token rows padded with zeros to the longest; one text needs no padding, so it is copied in one step."""
    if len(encs) == 1:
        e = encs[0]
        return Encoded(np.array([e.ids], dtype=np.int64), np.array([e.attention_mask], dtype=np.int64),
                       np.array([e.type_ids], dtype=np.int64), [bool(e.overflowing)])
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
