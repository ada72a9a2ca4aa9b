"""Engine protocols: what every backend builds, loads and runs.

A *backend* turns a model (an ONNX file, or a PyTorch definition for GPU backends) into a serialized
*artifact* once; ``load`` turns the artifact into an :class:`Engine`; an engine hands out independent
:class:`EngineInstance` objects, each with its own session/context and pre-allocated buffers, so the
batcher can run several batches at once. Inputs and outputs are name -> numpy array dicts.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from fleetserve.errors import FleetserveError


class Precision(enum.StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"
    FP8 = "fp8"


class EngineError(FleetserveError):
    """A build or load failed for a reason the user can act on; the message says which."""


@dataclass(frozen=True)
class TensorSpec:
    """One named input or output; ``-1`` marks a variable dimension (KServe v2 convention)."""

    name: str
    datatype: str  # KServe v2 datatype: INT64, FP32, ...
    shape: tuple[int, ...]
    # For integer index inputs (token ids): values must lie in [0, value_limit). None: unchecked.
    value_limit: int | None = None

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def batch_ladder(max_batch: int) -> tuple[int, ...]:
    """1, 2, 4, then every multiple of 8 up to ``max_batch`` (and ``max_batch`` itself).

    The batch sizes vLLM captures CUDA graphs for: a batch pads by at most 7 rows above 8, where powers of two
    pad a batch of 33 to 64 (or, capped at ``max_batch``, to 128).
    """
    ladder = {b for b in (1, 2, 4) if b < max_batch} | set(range(8, max_batch, 8)) | {max_batch}
    return tuple(sorted(ladder))


@dataclass(frozen=True)
class ShapeProfile:
    """The shapes an engine is built and warmed for: batch up to ``max_batch``, sequence up to ``max_seq``.

    ``seq_buckets`` are the padded sequence lengths the batcher uses; a backend that captures one graph
    per shape (CUDA graphs, TensorRT profiles) builds one per bucket. ``batch_buckets`` are the batch
    sizes such a backend pads a batch up to (GPU engines take :func:`batch_ladder`, see
    :meth:`EngineConfig.profile`); an engine that runs any batch shape only warms up at them.
    """

    max_batch: int = 32
    max_seq: int = 512
    seq_buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32)

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_seq < 1:
            raise ValueError("max_batch and max_seq must be positive")
        object.__setattr__(
            self, "seq_buckets", tuple(sorted({min(b, self.max_seq) for b in self.seq_buckets} | {self.max_seq}))
        )
        object.__setattr__(
            self,
            "batch_buckets",
            tuple(sorted({min(b, self.max_batch) for b in self.batch_buckets} | {self.max_batch})),
        )

    def key(self) -> str:
        return f"b{self.max_batch}-s{self.max_seq}-" + "_".join(map(str, self.seq_buckets))


@dataclass(frozen=True)
class BuildSpec:
    """Everything that determines an engine artifact (and therefore its cache key)."""

    model_name: str
    model_path: Path
    precision: Precision
    profile: ShapeProfile
    device: str = "cpu"
    calibration_texts: tuple[str, ...] = ()
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass
class BuildReport:
    """What a build did, printed by ``fleetserve build`` and stored next to the artifact."""

    backend: str
    precision: str
    device: str
    method: str = ""
    fusions: dict[str, int] = field(default_factory=dict)
    accuracy: dict[str, float] = field(default_factory=dict)
    build_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


@runtime_checkable
class EngineInstance(Protocol):
    """One independent execution context. ``infer`` may be called from a worker thread."""

    def infer(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run one batch; ``outputs`` names the outputs to return (None: all). On a GPU, skipping the
        token-level hidden states saves the largest device-to-host copy of the call."""
        ...


@runtime_checkable
class AsyncEngineInstance(Protocol):
    """An instance whose calls wait on another process, not on compute here (a front end's link to its engine
    process): the batcher awaits ``infer_async`` on its event loop instead of parking a worker thread in
    ``infer``, which saves the two thread hand-offs per batch."""

    async def infer_async(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """What ``infer`` returns, awaited on the running event loop."""
        ...


@runtime_checkable
class Engine(Protocol):
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    profile: ShapeProfile
    device: str

    def instance(self) -> EngineInstance: ...

    def close(self) -> None: ...


class Backend(Protocol):
    """A backend builds artifacts into a directory and loads them back."""

    name: str

    def version(self) -> str: ...

    def supports(self, precision: Precision, device: str) -> bool: ...

    def build(self, spec: BuildSpec, out_dir: Path) -> BuildReport: ...

    def load(self, artifact_dir: Path, profile: ShapeProfile, threads: int = 0) -> Engine: ...
