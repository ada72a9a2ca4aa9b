"""Backend registry: short name -> ``"module:Class"``, imported lazily so TensorRT and torch load only when chosen.

``auto`` picks the first backend, in order of expected speed, whose module imports, whose ``available()``
says the hardware it needs is present and, when a precision and device are given, which ``supports`` them
(so a CPU build on a GPU machine gets ONNX Runtime, not the CUDA backend; when none does, the fastest
present one, whose refusal names what it can run); the uvicorn pattern of
import-string tables with fallback.
"""

from __future__ import annotations

from typing import Any

from fleetserve.engine.base import Backend, EngineError, Precision
from fleetserve.importer import Registry

BACKENDS: Registry[Any] = Registry("backend", {
    "tensorrt": "fleetserve.engine.tensorrt:TensorRTBackend",
    "torch-cuda": "fleetserve.engine.torch_cuda:TorchCudaBackend",
    "onnxruntime": "fleetserve.engine.onnxruntime:OnnxRuntimeBackend",
})
AUTO_ORDER = ("tensorrt", "torch-cuda", "onnxruntime")


def get_backend(name: str, precision: Precision | None = None, device: str | None = None) -> Backend:
    if name == "auto":
        fastest: Backend | None = None
        for candidate in AUTO_ORDER:  # stops at the first that can: slower ones are never imported
            try:
                cls = BACKENDS.load(candidate)
            except ImportError:
                continue
            if not cls.available():
                continue
            backend: Backend = cls()
            if precision is None or device is None or backend.supports(precision, device):
                return backend
            fastest = fastest or backend
        if fastest is None:
            raise EngineError("no engine backend is available")
        # None that can: the fastest one, whose "does not support ..." error then says what it can do.
        return fastest
    if name not in BACKENDS:
        raise EngineError(f"unknown backend {name!r}; choose one of: auto, {', '.join(BACKENDS)}")
    try:
        cls = BACKENDS.load(name)
    except ImportError as exc:
        raise EngineError(f"backend {name!r} cannot be imported here: {exc}") from None
    if not cls.available():
        raise EngineError(f"backend {name!r} needs hardware or libraries this machine lacks")
    chosen: Backend = cls()
    return chosen
