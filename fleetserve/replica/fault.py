"""Fault injection for scenario tests and benchmarks: an engine slower than the one loaded.

:class:`SlowEngine` adds a fixed time to every engine call on the instance's own thread, so the instance
stays busy meanwhile, like a slower accelerator: one instance then runs at most ``1 / batch_latency_s``
batches a second, and a replica's capacity is about ``instances * max_batch / batch_latency_s`` requests a
second when batches fill. Requests queue behind it as they would behind a saturated GPU. (The replica's
``extra_latency_ms`` instead delays each answer without holding an instance: latency without a capacity
limit.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from fleetserve.engine.base import Engine, EngineInstance, ShapeProfile, TensorSpec


class _SlowInstance:
    def __init__(self, inner: EngineInstance, delay_s: float, sleep: Callable[[float], None]) -> None:
        self._inner = inner
        self._delay_s = delay_s
        self._sleep = sleep

    def infer(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        result = self._inner.infer(inputs, outputs)
        self._sleep(self._delay_s)
        return result


class SlowEngine:
    """``engine`` with ``delay_s`` more per engine call, spent on the calling (instance) thread."""

    def __init__(self, engine: Engine, delay_s: float, sleep: Callable[[float], None] = time.sleep) -> None:
        if not delay_s > 0:
            raise ValueError(f"delay_s must be > 0, got {delay_s}")
        self._engine = engine
        self._delay_s = delay_s
        self._sleep = sleep
        self.inputs: Sequence[TensorSpec] = engine.inputs
        self.outputs: Sequence[TensorSpec] = engine.outputs
        self.profile: ShapeProfile = engine.profile
        self.device: str = engine.device

    def instance(self) -> EngineInstance:
        return _SlowInstance(self._engine.instance(), self._delay_s, self._sleep)

    def close(self) -> None:
        self._engine.close()
