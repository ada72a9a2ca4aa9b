"""Served models that compute their outputs with numpy, for the KServe front-end tests (no engine, no batcher)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fleetserve.engine.base import TensorSpec

Transform = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass
class InferCall:
    inputs: dict[str, np.ndarray]
    priority: int | None
    timeout_s: float | None
    deadline: float | None = None


@dataclass
class FakeModel:
    """A ServedModel whose ``infer`` applies ``transform``; can be made unready, failing or held on a gate."""

    name: str
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    transform: Transform
    version: str = "1"
    platform: str = "fake_numpy"
    max_batch_size: int = 8
    ready: bool = True
    error: Exception | None = None
    gate: asyncio.Event | None = None  # when set, infer waits for it: lets a test hold requests in flight
    calls: list[InferCall] = field(default_factory=list)

    def is_ready(self) -> bool:
        return self.ready

    async def infer(
        self, inputs: dict[str, np.ndarray], *, priority: int | None, timeout_s: float | None,
        outputs: Sequence[str] | None = None, deadline: float | None = None,
    ) -> dict[str, np.ndarray]:
        self.calls.append(InferCall(inputs, priority, timeout_s, deadline))
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        return self.transform(inputs)


def make_math_model() -> FakeModel:
    """``doubled = 2 * x`` (FP32) and ``id_sum = ids.sum(axis=1)`` (INT64)."""
    return FakeModel(
        name="math",
        inputs=[TensorSpec("x", "FP32", (-1, 3)), TensorSpec("ids", "INT64", (-1, -1))],
        outputs=[TensorSpec("doubled", "FP32", (-1, 3)), TensorSpec("id_sum", "INT64", (-1,))],
        transform=lambda t: {"doubled": t["x"] * 2, "id_sum": t["ids"].sum(axis=1)},
    )


def make_text_model() -> FakeModel:
    """``upper`` = upper-cased BYTES ``text``, ``length`` = byte length of each element (INT32)."""

    def transform(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        items = t["text"].ravel().tolist()
        upper = np.array([s.upper() for s in items], dtype=object).reshape(t["text"].shape)
        length = np.array([len(s) for s in items], dtype=np.int32).reshape(t["text"].shape)
        return {"upper": upper, "length": length}

    return FakeModel(
        name="text",
        inputs=[TensorSpec("text", "BYTES", (-1,))],
        outputs=[TensorSpec("upper", "BYTES", (-1,)), TensorSpec("length", "INT32", (-1,))],
        transform=transform,
    )
