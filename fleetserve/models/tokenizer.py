"""Text -> token id batches with the model's own ``tokenizer.json`` (Hugging Face ``tokenizers``).

Padding is dynamic (to the longest text in the call, never a fixed 128) and truncation happens at the
model maximum; the batcher later pads to its sequence bucket. ``encode`` reports which texts were truncated
so the HTTP layer can flag them. ``encode_groups`` tokenises several callers' texts in one ``encode_batch``
call (one crossing into the Rust library) and packs each group apart.

Both call the library's ``encode_batch_fast``, which skips the character offsets of each token (nothing here
reads them; ids, type ids and truncation are the same): on the 2-core box, the search mix's texts (36 words on
average) cost 51-54 µs each against 64-65 µs with ``encode_batch``, in calls of 1, 4 or 16 texts.

The library's own thread pool is turned off (``TOKENIZERS_PARALLELISM=false``, unless the environment already
sets it): by default every batch call fans its texts out over a Rayon pool of one thread per core, and a
server tokenising a few texts per call pays for waking and parking that pool each time. On the 2-core box
(``benchmarks/tokenizer_threads.py``), two short texts cost 278 µs of CPU per call with the pool and 125 µs
without it, 32 texts 859 against 695 µs (though 575 against 756 µs of wall time on an idle machine). On a
16-core H200 host, where each of a replica's front ends owned a 16-thread pool, turning it off served 1.10-1.20x
the one-text requests/s (BENCHMARKS.md §10.8). Parallelism across requests comes from the replica's processes
and threads instead.

Packing reads only each text's token ids from the Rust encoding: without padding every attention mask is all
ones, and the token types of a single text are the same for every text under the tokenizer's template (all
zeros for BERT's ``[CLS] $A [SEP]``), which the constructor checks on a probe text. Each list read from an
encoding is a conversion done while holding the interpreter lock, the lock the replica's event loop needs.
"""

from __future__ import annotations

import os
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


# The tokenizers library reads it at every call; a value the user set wins.
PARALLELISM_ENV = "TOKENIZERS_PARALLELISM"


class TextTokenizer:
    def __init__(self, path: Path, max_length: int) -> None:
        os.environ.setdefault(PARALLELISM_ENV, "false")
        self.max_length = max_length
        self._tok = Tokenizer.from_file(str(path))
        self._tok.no_padding()
        self._tok.enable_truncation(max_length)
        probe = self._tok.encode("probe text")
        # One type id for a whole single text (the template's type for its sequence): None when they differ.
        self._type_id: int | None = probe.type_ids[0] if len(set(probe.type_ids)) == 1 else None

    def encode(self, texts: list[str]) -> Encoded:
        return self._pack(self._tok.encode_batch_fast(texts))

    def encode_groups(self, groups: list[list[str]]) -> list[Encoded]:
        """``[encode(g) for g in groups]``, with one batch call over every group's texts."""
        encs = self._tok.encode_batch_fast([t for g in groups for t in g])
        out, start = [], 0
        for g in groups:
            out.append(self._pack(encs[start : start + len(g)]))
            start += len(g)
        return out

    def _pack(self, encs: list[Encoding]) -> Encoded:
        """Token rows padded with zeros to the longest (masked out); one text needs no padding."""
        rows = [e.ids for e in encs]
        n, seq = len(rows), max(len(r) for r in rows)
        if n == 1:
            ids = np.array(rows, dtype=np.int64)
            mask = np.ones((1, seq), dtype=np.int64)
        else:
            ids = np.zeros((n, seq), dtype=np.int64)
            mask = np.zeros((n, seq), dtype=np.int64)
            for i, row in enumerate(rows):
                ids[i, : len(row)] = row
                mask[i, : len(row)] = 1
        if self._type_id is None:
            types = np.zeros((n, seq), dtype=np.int64)
            for i, e in enumerate(encs):
                types[i, : len(rows[i])] = e.type_ids
        else:
            types = mask * self._type_id
        return Encoded(ids, mask, types, [bool(e.overflowing) for e in encs])
