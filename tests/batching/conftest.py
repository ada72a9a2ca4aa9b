"""Fixtures for the batching tests, built on the tiny ONNX encoder of ``tiny_encoder.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetserve.batching import Batcher, BatcherConfig, BatchObserver
from tests.support.tiny_encoder import VOCAB, Gate, OrtInstance, TinyEngine, build_tiny_encoder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "tiny_encoder.onnx"
    build_tiny_encoder(path)
    return path


@pytest.fixture
def engine(tiny_model: Path) -> TinyEngine:
    return TinyEngine(tiny_model)


@pytest.fixture
def gate(engine: TinyEngine) -> Iterator[Gate]:
    gate = Gate()
    engine.before = gate
    yield gate
    gate.release.set()


@pytest.fixture
def reference(tiny_model: Path) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
    """Runs one request alone, unpadded, straight on onnxruntime."""
    instance = OrtInstance(tiny_model)
    return instance.infer


@pytest.fixture
def make_request() -> Callable[..., dict[str, np.ndarray]]:
    rng = np.random.default_rng(11)

    def make(rows: int, seq: int, *, first_id: int | None = None) -> dict[str, np.ndarray]:
        ids = rng.integers(1, VOCAB, size=(rows, seq), dtype=np.int64)
        if first_id is not None:
            ids[:, 0] = first_id
        mask = np.ones((rows, seq), dtype=np.int64)
        for row in range(rows):
            # Rows shorter than the request's own length, padded by the client, as a tokenizer does.
            mask[row, int(rng.integers(1, seq + 1)) :] = 0
        types = rng.integers(0, 2, size=(rows, seq), dtype=np.int64)
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}

    return make


@pytest.fixture
async def make_batcher(engine: TinyEngine) -> AsyncIterator[Callable[..., Batcher]]:
    """Builds batchers on the tiny engine; each is drained at teardown."""
    made: list[Batcher] = []

    def make(*, instances: int = 1, observer: BatchObserver | None = None, **config: Any) -> Batcher:
        batcher = Batcher(engine, BatcherConfig(**config), instances=instances, observer=observer)
        made.append(batcher)
        return batcher

    yield make
    if isinstance(engine.before, Gate):
        engine.before.release.set()
    for batcher in made:
        await batcher.drain(10)
