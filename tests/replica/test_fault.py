"""The slow-engine fault injection: the delay is spent on the instance's call, after the real work."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from fleetserve.engine.base import ShapeProfile, TensorSpec
from fleetserve.replica.fault import SlowEngine


class _Instance:
    def infer(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        return {"y": inputs["x"] * 2}


class _Engine:
    def __init__(self) -> None:
        self.inputs = [TensorSpec("x", "FP32", (-1,))]
        self.outputs = [TensorSpec("y", "FP32", (-1,))]
        self.profile = ShapeProfile()
        self.device = "cpu"
        self.closed = False

    def instance(self) -> _Instance:
        return _Instance()

    def close(self) -> None:
        self.closed = True


def test_every_engine_call_sleeps_on_its_own_thread_after_computing() -> None:
    slept: list[float] = []
    inner = _Engine()
    engine = SlowEngine(inner, 0.02, sleep=slept.append)
    assert engine.inputs == inner.inputs and engine.profile is inner.profile and engine.device == "cpu"
    instance = engine.instance()
    out = instance.infer({"x": np.array([1.0, 2.0], dtype=np.float32)})
    instance.infer({"x": np.array([3.0], dtype=np.float32)})
    np.testing.assert_array_equal(out["y"], [2.0, 4.0])
    assert slept == [0.02, 0.02]
    engine.close()
    assert inner.closed


def test_the_delay_must_be_positive() -> None:
    with pytest.raises(ValueError, match="delay_s"):
        SlowEngine(_Engine(), 0.0)
