"""What the KServe v2 front ends (HTTP and gRPC) talk to: served models and the repository holding them.

The front ends only decode requests, call :meth:`ServedModel.infer` and encode the answer; batching,
queueing and engines live behind this protocol (the replica app implements it over the batcher).
Health follows the KServe v2 protocol: *live* means the process can answer at all, *ready* means every
model can take inference requests and the server is not draining.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from fleetserve import __version__
from fleetserve.engine.base import TensorSpec
from fleetserve.errors import ModelNotFound


@runtime_checkable
class ServedModel(Protocol):
    """One model as the front ends see it.

    ``inputs``/``outputs`` shapes include the batch dimension, with ``-1`` for variable dimensions;
    ``max_batch_size`` is 0 when the model does not batch.
    """

    name: str
    version: str
    platform: str
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    max_batch_size: int

    def is_ready(self) -> bool: ...

    async def infer(
        self, inputs: dict[str, np.ndarray], *, priority: int | None, timeout_s: float | None,
        outputs: Sequence[str] | None = None, deadline: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Run one request; raises a :class:`~fleetserve.errors.FleetserveError` the front ends map.

        ``outputs`` names the outputs the answer needs (None: all); others may be left out.
        ``deadline`` (``time.monotonic()`` seconds) is the caller's: work still queued then is dropped
        (``RequestExpired``); cancelling the call drops queued work too.
        Input arrays may be read-only views on the request body; copy before writing into them.
        """
        ...


@dataclass(frozen=True)
class ServerInfo:
    """Answer to ``GET /v2`` and ``ServerMetadata``; ``extensions`` lists only what is implemented."""

    name: str = "fleetserve"
    version: str = __version__
    extensions: tuple[str, ...] = ("binary_tensor_data",)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("server name must not be empty")

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "version": self.version, "extensions": list(self.extensions)}


class ModelRepository:
    """The models one replica serves, by name, plus the server-level health flags.

    ``draining`` is set by the app on shutdown so load balancers stop sending traffic while in-flight
    requests finish; ``live`` is cleared only when the process cannot recover (e.g. its engine died).
    """

    def __init__(self, models: Iterable[ServedModel] = (), info: ServerInfo | None = None) -> None:
        self.info = info if info is not None else ServerInfo()
        self.draining = False
        self.live = True
        self._models: dict[str, ServedModel] = {}
        for model in models:
            self.add(model)

    def add(self, model: ServedModel) -> None:
        if not model.name:
            raise ValueError("a served model needs a non-empty name")
        if model.name in self._models:
            raise ValueError(f"model {model.name!r} is already in the repository")
        self._models[model.name] = model

    def names(self) -> list[str]:
        return sorted(self._models)

    def models(self) -> list[ServedModel]:
        return [self._models[n] for n in self.names()]

    def get(self, name: str, version: str | None = None) -> ServedModel:
        """The model called ``name``; ``version`` None or empty means the served version."""
        model = self._models.get(name)
        if model is None:
            raise ModelNotFound(f"unknown model {name!r}; this server serves {self.names()}")
        if version and version != model.version:
            raise ModelNotFound(f"model {name!r} has no version {version!r}; available: [{model.version!r}]")
        return model

    def is_live(self) -> bool:
        return self.live

    def is_ready(self) -> bool:
        return (
            self.live and not self.draining and bool(self._models) and all(m.is_ready() for m in self._models.values())
        )
