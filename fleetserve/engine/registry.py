"""Backend registry: short name -> ``"module:Class"``, imported lazily so TensorRT and torch load only when chosen.

``auto`` picks the first backend, in order of expected speed, whose module imports and whose ``available()``
says the hardware it needs is present (the uvicorn pattern of import-string tables with fallback).
"""

from __future__ import annotations

import importlib
from typing import Any

from fleetserve.engine.base import Backend, EngineError

BACKENDS: dict[str, str] = {
    "tensorrt": "fleetserve.engine.tensorrt:TensorRTBackend",
    "torch-cuda": "fleetserve.engine.torch_cuda:TorchCudaBackend",
    "onnxruntime": "fleetserve.engine.onnxruntime:OnnxRuntimeBackend",
}
AUTO_ORDER = ("tensorrt", "torch-cuda", "onnxruntime")


def _import_class(target: str) -> Any:
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def get_backend(name: str) -> Backend:
    if name == "auto":
        for candidate in AUTO_ORDER:
            try:
                cls = _import_class(BACKENDS[candidate])
            except ImportError:
                continue
            if cls.available():
                backend: Backend = cls()
                return backend
        raise EngineError("no engine backend is available")
    if name not in BACKENDS:
        raise EngineError(f"unknown backend {name!r}; choose one of: auto, {', '.join(BACKENDS)}")
    try:
        cls = _import_class(BACKENDS[name])
    except ImportError as exc:
        raise EngineError(f"backend {name!r} cannot be imported here: {exc}") from None
    if not cls.available():
        raise EngineError(f"backend {name!r} needs hardware or libraries this machine lacks")
    chosen: Backend = cls()
    return chosen
