"""Typed, validated configuration: one frozen object per component, built by the CLI from flags, environment
(``FLEETSERVE_<NAME>``) and an optional YAML file. Nothing here reads the environment at import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fleetserve.engine.base import Precision, ShapeProfile


@dataclass(frozen=True)
class EngineConfig:
    """What to build and how to load it (``fleetserve build`` and the engine part of ``fleetserve serve``)."""

    model: str = "minilm"
    precision: Precision = Precision.FP32
    backend: str = "auto"
    calibration: Path | None = None
    max_batch: int = 32
    max_seq: int | None = None  # None = the model's maximum
    device: str = "cpu"
    accuracy_threshold: float = 0.99
    int8_method: str | None = None  # None = the backend's choice for the device
    home: Path | None = None  # None = $FLEETSERVE_HOME or ~/.cache/fleetserve
    options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", Precision(self.precision))
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_seq is not None and not 1 <= self.max_seq <= 8192:
            raise ValueError(f"max_seq must be in 1..8192, got {self.max_seq}")
        if not 0.0 < self.accuracy_threshold <= 1.0:
            raise ValueError(f"accuracy_threshold must be in (0, 1], got {self.accuracy_threshold}")
        if self.int8_method not in (None, "dynamic", "static"):
            raise ValueError(f"int8_method must be dynamic or static, got {self.int8_method!r}")

    def profile(self, model_max_seq: int) -> ShapeProfile:
        max_seq = min(self.max_seq or model_max_seq, model_max_seq)
        return ShapeProfile(max_batch=self.max_batch, max_seq=max_seq)
