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


@dataclass(frozen=True)
class ReplicaConfig:
    """One replica process (``fleetserve serve``): engine, batcher, servers and lifecycle."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = "0.0.0.0"
    port: int = 8000
    grpc_port: int = 8001  # 0 = no gRPC server
    model_name: str | None = None  # name served under /v2/models/{name}; default: the model's name
    instances: int = 1
    threads: int = 0  # intra-op threads per instance; 0 = cores // instances
    max_batch: int = 32
    max_delay_ms: float = 2.0
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue: int = 1024
    default_timeout_ms: float | None = None
    max_body_bytes: int = 16 * 1024 * 1024
    drain_grace_s: float = 5.0
    drain_timeout_s: float = 30.0
    extra_latency_ms: float = 0.0  # fault injection: added service time per request (a slow GPU)
    # bucket: group requests by sequence bucket, pad each batch to its longest request; longest: one
    # queue for all lengths, pad to the longest; fixed: truncate and pad every request to fixed_seq tokens
    # (a tokenizer's fixed padding).
    padding: str = "bucket"
    fixed_seq: int = 128
    # Let overdue short requests ride in a longer bucket's spare rows (BatcherConfig.promote_overdue).
    promote_overdue: bool = False

    def __post_init__(self) -> None:
        for name in ("port", "grpc_port"):
            value = getattr(self, name)
            if not 0 <= value <= 65535:
                raise ValueError(f"{name} must be in 0..65535, got {value}")
        if self.instances < 1:
            raise ValueError(f"instances must be >= 1, got {self.instances}")
        if self.max_batch > self.engine.max_batch:
            raise ValueError(f"max_batch {self.max_batch} exceeds the engine's max_batch {self.engine.max_batch}")
        if self.max_delay_ms < 0 or self.drain_grace_s < 0 or self.drain_timeout_s <= 0 or self.extra_latency_ms < 0:
            raise ValueError("delays and timeouts must be non-negative (drain timeout positive)")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.padding not in ("bucket", "longest", "fixed"):
            raise ValueError(f"padding must be bucket, longest or fixed, got {self.padding!r}")
        if self.fixed_seq < 1:
            raise ValueError(f"fixed_seq must be >= 1, got {self.fixed_seq}")
