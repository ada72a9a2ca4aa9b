"""Request bodies for the load generator, one builder per workload, all seeded.

Lengths follow a search-traffic mix: most texts are 5–30 tokens, a ``long_fraction`` tail is
100–300 tokens (product descriptions, long queries). Texts are built from :data:`WORDS`, where one
word is about one WordPiece token, so the mix holds without a tokenizer; the KServe v2 workloads
send token ids directly (``[CLS] ids... [SEP]``, BERT's special ids) in the shapes a replica expects.

``v2-binary`` uses the KServe v2 binary tensor extension: the JSON header, with each input's byte
length in ``parameters.binary_data_size``, is followed by the raw little-endian tensors, and the
``Inference-Header-Content-Length`` header says where the JSON ends.

``lengths="squad"`` draws v2 lengths from a question-answering mix instead (:func:`squad_tokens`), for
MLPerf-style BERT-Large runs.

A v2 request carries ``rows`` sequences of one length (v2 tensors are rectangular), e.g. the 32–64
candidates of one ranking call; ``tokens`` fixes that length instead of drawing it from the mix, and
``outputs`` names the outputs to ask for (binary in ``v2-binary``), so a response need not carry every
output the model has.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote

import numpy as np

from fleetserve.bench.words import WORDS
from fleetserve.wire import BINARY_HEADER_LENGTH

SHORT_TOKENS = (5, 30)
LONG_TOKENS = (100, 300)
# Search queries are shorter than the texts they are matched against.
QUERY_TOKENS = (2, 10)
RANK_CANDIDATES = 10
RANK_TOP_K = 3
CLS_ID = 101
SEP_ID = 102
# SQuAD-like features at MLPerf's max_seq 384: median and log-spread of the bulk, and the share of windows cut
# from long contexts, which fill all 384 tokens.
SQUAD_MEDIAN, SQUAD_SIGMA, SQUAD_RANGE, SQUAD_FULL = 170, 0.35, (40, 384), 0.03
# Skip BERT's reserved and special ids at the bottom of the vocabulary (30522 entries).
VOCAB_IDS = (1000, 30000)
V2_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# Bounds that keep one pooled body small (rows x tokens x 3 inputs x 8 bytes <= ~24 MB).
MAX_ROWS = 1024
MAX_TOKENS = 8192
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"
HEADER_LENGTH = BINARY_HEADER_LENGTH


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
    rows: int = 1  # sequences per v2 request
    tokens: int | None = None  # tokens per v2 row including [CLS]/[SEP]; None: the length mix
    outputs: tuple[str, ...] = ()  # v2 outputs to ask for; empty: the server's default (all)
    lengths: str = "search"  # v2 length mix when tokens is None: "search" or "squad"
    candidates: int = RANK_CANDIDATES  # rank: candidates per query

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise ValueError(f"unknown workload {self.name!r}; choose one of {sorted(WORKLOADS)}")
        v2 = self.name.startswith("v2-")
        if not 1 <= self.rows <= MAX_ROWS:
            raise ValueError(f"rows must be in 1..{MAX_ROWS}, got {self.rows}")
        if self.tokens is not None and not 2 <= self.tokens <= MAX_TOKENS:
            raise ValueError(f"tokens must be in 2..{MAX_TOKENS} (with [CLS] and [SEP]), got {self.tokens}")
        if not v2 and (self.rows != 1 or self.tokens is not None or self.outputs):
            raise ValueError(f"rows, tokens and outputs apply to the v2 workloads, not {self.name!r}")
        if any(not o for o in self.outputs):
            raise ValueError("output names must not be empty")
        if not 1 <= self.candidates < MAX_ROWS:
            raise ValueError(f"candidates must be in 1..{MAX_ROWS - 1}, got {self.candidates}")
        if self.name != "rank" and self.candidates != RANK_CANDIDATES:
            raise ValueError(f"candidates apply to the rank workload, not {self.name!r}")
        if not self.model:
            raise ValueError("model name must not be empty")
        if self.lengths not in LENGTH_MIXES:
            raise ValueError(f"unknown length mix {self.lengths!r}; choose one of {sorted(LENGTH_MIXES)}")
        if self.lengths != "search" and not v2:
            raise ValueError(f"length mixes other than 'search' apply to the v2 workloads, not {self.name!r}")
        if not 0.0 <= self.long_fraction <= 1.0:
            raise ValueError(f"long_fraction must be in [0, 1], got {self.long_fraction}")
        if self.pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {self.pool_size}")


def token_count(rng: random.Random, long_fraction: float) -> int:
    low, high = LONG_TOKENS if rng.random() < long_fraction else SHORT_TOKENS
    return rng.randint(low, high)


def squad_tokens(rng: random.Random) -> int:
    """A SQuAD v1.1-like feature length under BERT's preprocessing (question + context window, max 384).

    An approximation, not the data set (which is not shipped): a log-normal bulk around 170 tokens (a
    ~12-token question and a 120-180 word paragraph) clipped to 40..384, and 3% full 384-token windows of
    contexts that needed several. Its mean is about 185 tokens.
    """
    if rng.random() < SQUAD_FULL:
        return SQUAD_RANGE[1]
    return int(min(max(rng.lognormvariate(math.log(SQUAD_MEDIAN), SQUAD_SIGMA), SQUAD_RANGE[0]), SQUAD_RANGE[1]))


LENGTH_MIXES: dict[str, Callable[[WorkloadConfig, random.Random], int]] = {
    "search": lambda config, rng: token_count(rng, config.long_fraction),
    "squad": lambda config, rng: squad_tokens(rng),
}


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(WORDS, k=words))


def token_ids(rng: random.Random, length: int, rows: int = 1) -> np.ndarray:
    """``rows`` x ``length`` ids, each row with ``[CLS]`` and ``[SEP]``, as little-endian INT64."""
    ids = np.empty((rows, max(length, 2)), dtype="<i8")
    ids[:, 0], ids[:, -1] = CLS_ID, SEP_ID
    inner = ids.shape[1] - 2
    ids[:, 1:-1] = np.array([rng.randrange(*VOCAB_IDS) for _ in range(rows * inner)], dtype="<i8").reshape(rows, inner)
    return ids


def _json(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def texts_payload(config: WorkloadConfig, rng: random.Random) -> Payload:
    text = sentence(rng, token_count(rng, config.long_fraction))
    return Payload("/inference", _json({"texts": [text]}))


def rank_payload(config: WorkloadConfig, rng: random.Random) -> Payload:
    query = sentence(rng, rng.randint(*QUERY_TOKENS))
    candidates = [sentence(rng, token_count(rng, config.long_fraction)) for _ in range(config.candidates)]
    return Payload("/inference", _json({"query": query, "candidates": candidates, "top_k": RANK_TOP_K}))


def _v2_tensors(config: WorkloadConfig, rng: random.Random) -> list[tuple[str, np.ndarray]]:
    length = config.tokens if config.tokens is not None else LENGTH_MIXES[config.lengths](config, rng)
    ids = token_ids(rng, length, config.rows)
    return [
        ("input_ids", ids),
        ("attention_mask", np.ones_like(ids)),
        ("token_type_ids", np.zeros_like(ids)),
    ]


def infer_path(model: str) -> str:
    return f"/v2/models/{quote(model, safe='')}/infer"


def v2_json_payload(config: WorkloadConfig, rng: random.Random) -> Payload:
    inputs = [
        {"name": name, "shape": list(t.shape), "datatype": "INT64", "data": t.ravel().tolist()}
        for name, t in _v2_tensors(config, rng)
    ]
    return Payload(infer_path(config.model), _json(_v2_request(inputs, config.outputs, binary=False)))


def _v2_request(inputs: Sequence[Mapping[str, object]], outputs: tuple[str, ...], binary: bool) -> dict[str, object]:
    request: dict[str, object] = {"inputs": inputs}
    if outputs:
        request["outputs"] = [{"name": o, "parameters": {"binary_data": binary}} for o in outputs]
    return request


def v2_binary_payload(config: WorkloadConfig, rng: random.Random) -> Payload:
    tensors = _v2_tensors(config, rng)
    inputs = [
        {
            "name": name,
            "shape": list(t.shape),
            "datatype": "INT64",
            "parameters": {"binary_data_size": t.nbytes},
        }
        for name, t in tensors
    ]
    header = _json(_v2_request(inputs, config.outputs, binary=True))
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
