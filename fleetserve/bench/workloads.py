"""Request bodies for the load generator, one builder per workload, all seeded.

Lengths follow a search-traffic mix: most texts are 5–30 tokens, a ``long_fraction`` tail is
100–300 tokens (product descriptions, long queries). Texts are built from :data:`WORDS`, where one
word is about one WordPiece token, so the mix holds without a tokenizer; the KServe v2 workloads
send token ids directly (``[CLS] ids... [SEP]``, BERT's special ids) in the shapes a replica expects.

``v2-binary`` uses the KServe v2 binary tensor extension: the JSON header, with each input's byte
length in ``parameters.binary_data_size``, is followed by the raw little-endian tensors, and the
``Inference-Header-Content-Length`` header says where the JSON ends.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

import numpy as np

from fleetserve.bench.words import WORDS

SHORT_TOKENS = (5, 30)
LONG_TOKENS = (100, 300)
# Search queries are shorter than the texts they are matched against.
QUERY_TOKENS = (2, 10)
RANK_CANDIDATES = 10
RANK_TOP_K = 3
CLS_ID = 101
SEP_ID = 102
# Skip BERT's reserved and special ids at the bottom of the vocabulary (30522 entries).
VOCAB_IDS = (1000, 30000)
V2_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"
HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class Payload:
    """One ready-to-send POST: path below the base URL, body bytes, content type and extra headers."""

    path: str
    body: bytes
    content_type: str = JSON_TYPE
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class WorkloadConfig:
    name: str = "texts"
    model: str = "minilm"
    long_fraction: float = 0.1
    pool_size: int = 512

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise ValueError(f"unknown workload {self.name!r}; choose one of {sorted(WORKLOADS)}")
        if not self.model:
            raise ValueError("model name must not be empty")
        if not 0.0 <= self.long_fraction <= 1.0:
            raise ValueError(f"long_fraction must be in [0, 1], got {self.long_fraction}")
        if self.pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {self.pool_size}")


def token_count(rng: random.Random, long_fraction: float) -> int:
    low, high = LONG_TOKENS if rng.random() < long_fraction else SHORT_TOKENS
    return rng.randint(low, high)


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(WORDS, k=words))


def token_ids(rng: random.Random, length: int) -> np.ndarray:
    """``length`` ids including ``[CLS]`` and ``[SEP]``, as a little-endian INT64 row."""
    ids = np.empty(max(length, 2), dtype="<i8")
    ids[0], ids[-1] = CLS_ID, SEP_ID
    ids[1:-1] = [rng.randrange(*VOCAB_IDS) for _ in range(len(ids) - 2)]
    return ids


def _json(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def texts_payload(config: WorkloadConfig, rng: random.Random) -> Payload:
    text = sentence(rng, token_count(rng, config.long_fraction))
    return Payload("/inference", _json({"texts": [text]}))


def rank_payload(config: WorkloadConfig, rng: random.Random) -> Payload:
    query = sentence(rng, rng.randint(*QUERY_TOKENS))
    candidates = [sentence(rng, token_count(rng, config.long_fraction)) for _ in range(RANK_CANDIDATES)]
    return Payload("/inference", _json({"query": query, "candidates": candidates, "top_k": RANK_TOP_K}))


def _v2_tensors(config: WorkloadConfig, rng: random.Random) -> list[tuple[str, np.ndarray]]:
    ids = token_ids(rng, token_count(rng, config.long_fraction))
    return [
        ("input_ids", ids),
        ("attention_mask", np.ones_like(ids)),
        ("token_type_ids", np.zeros_like(ids)),
    ]


def infer_path(model: str) -> str:
    return f"/v2/models/{quote(model, safe='')}/infer"


def v2_json_payload(config: WorkloadConfig, rng: random.Random) -> Payload:
    inputs = [
        {"name": name, "shape": [1, len(t)], "datatype": "INT64", "data": t.tolist()}
        for name, t in _v2_tensors(config, rng)
    ]
    return Payload(infer_path(config.model), _json({"inputs": inputs}))


def v2_binary_payload(config: WorkloadConfig, rng: random.Random) -> Payload:
    tensors = _v2_tensors(config, rng)
    inputs = [
        {
            "name": name,
            "shape": [1, len(t)],
            "datatype": "INT64",
            "parameters": {"binary_data_size": t.nbytes},
        }
        for name, t in tensors
    ]
    header = _json({"inputs": inputs})
    body = header + b"".join(t.tobytes() for _, t in tensors)
    return Payload(infer_path(config.model), body, BINARY_TYPE, ((HEADER_LENGTH, str(len(header))),))


WORKLOADS: dict[str, Callable[[WorkloadConfig, random.Random], Payload]] = {
    "texts": texts_payload,
    "rank": rank_payload,
    "v2-json": v2_json_payload,
    "v2-binary": v2_binary_payload,
}


def make_payloads(config: WorkloadConfig, rng: random.Random) -> list[Payload]:
    """A pool of ``pool_size`` payloads; the generator cycles through it so building bodies costs nothing
    per request while the length mix is preserved."""
    build = WORKLOADS[config.name]
    return [build(config, rng) for _ in range(config.pool_size)]
