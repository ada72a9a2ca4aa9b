"""The served model: the KServe front ends' :class:`ServedModel` implemented over the dynamic batcher."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np

from fleetserve.batching.worker import Batcher
from fleetserve.engine.base import TensorSpec


class BatchedModel:
    """One engine behind one batcher. Ready once every instance has run every warm-up shape."""

    def __init__(
        self, name: str, batcher: Batcher, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
        max_batch_size: int, platform: str, version: str = "1", extra_latency_s: float = 0.0,
    ) -> None:
        self.name = name
        self.version = version
        self.platform = platform
        self.inputs: Sequence[TensorSpec] = list(inputs)
        self.outputs: Sequence[TensorSpec] = list(outputs)
        self.max_batch_size = max_batch_size
        self.batcher = batcher
        self.warm = False
        # Fault injection for scenario tests and benchmarks: a slow (e.g. thermally throttled) GPU.
        self.extra_latency_s = extra_latency_s

    def is_ready(self) -> bool:
        return self.warm and self.batcher.accepting

    async def infer(
        self, inputs: dict[str, np.ndarray], *, priority: int | None, timeout_s: float | None,
        outputs: Sequence[str] | None = None, deadline: float | None = None,
    ) -> dict[str, np.ndarray]:
        result = await self.batcher.submit(inputs, priority=priority, timeout_s=timeout_s, outputs=outputs,
                                           deadline=deadline)
        if self.extra_latency_s:
            await asyncio.sleep(self.extra_latency_s)
        return result
