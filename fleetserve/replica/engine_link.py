"""The link between a replica's front-end processes and the one process that owns its engine
(``fleetserve serve --frontends N``, :mod:`.frontends`).

A front end batches its own requests as a single-process replica does, then runs each batch on a
:class:`RemoteEngine`: every instance holds one Unix-socket connection to the engine process and has one
batch there at a time, so a front end with ``--frontend-batches K`` has at most K batches in the engine
process. The engine process (:mod:`.engine_host`) merges the batches of all front ends that wait while its
engine is busy. Triton does the same in one process with many HTTP threads; CPython's interpreter lock
makes the threads processes here.

A frame is an 8-byte big-endian header (JSON length, body length), a JSON object (``outputs``: the output
names wanted, or an ``error``; ``tensors``: ``[name, dtype, shape]`` in body order), then the tensors' bytes.
Only numeric dtypes are accepted; both lengths are bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from fleetserve.engine.base import EngineInstance, ShapeProfile, TensorSpec
from fleetserve.errors import (
    FleetserveError,
    InvalidInput,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    RequestExpired,
)

PREFIX = struct.Struct("!II")
MAX_HEADER_BYTES = 1 << 16
MAX_BODY_BYTES = 1 << 31
NUMERIC_KINDS = frozenset("biuf")
# The errors an engine process's batcher raises, by name, so a front end answers them as it would its own.
ERRORS: dict[str, type[FleetserveError]] = {
    cls.__name__: cls for cls in (InvalidInput, PayloadTooLarge, Overloaded, NotReady, RequestExpired, FleetserveError)
}


class LinkError(ConnectionError):
    """The peer sent something that is not a frame, or went away mid-frame."""


def encode(arrays: Mapping[str, np.ndarray], **header: Any) -> bytes:
    """One frame holding ``arrays`` and the JSON-able ``header`` fields."""
    tensors = []
    chunks = []
    for name, array in arrays.items():
        data = np.ascontiguousarray(array)
        tensors.append([name, data.dtype.str, list(data.shape)])
        chunks.append(data.tobytes())
    head = orjson.dumps({**header, "tensors": tensors})
    body = b"".join(chunks)
    return b"".join((PREFIX.pack(len(head), len(body)), head, body))


def sizes(prefix: bytes) -> tuple[int, int]:
    """The JSON and body lengths a frame's first 8 bytes announce; ``LinkError`` past the bounds."""
    head, body = PREFIX.unpack(prefix)
    if head > MAX_HEADER_BYTES or body > MAX_BODY_BYTES:
        raise LinkError(f"frame of {head} + {body} bytes exceeds the link's bounds")
    return head, body


def decode(head: bytes, body: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The header and arrays (read-only views on ``body``) of one frame."""
    try:
        header = orjson.loads(head)
        if not isinstance(header, dict):
            raise LinkError(f"frame header is {type(header).__name__}, not an object")
        arrays: dict[str, np.ndarray] = {}
        offset = 0
        for name, dtype_text, shape in header.pop("tensors"):
            dtype = np.dtype(dtype_text)
            if dtype.kind not in NUMERIC_KINDS:
                raise LinkError(f"tensor {name!r} has a non-numeric dtype {dtype_text!r}")
            count = math.prod(shape)
            arrays[name] = np.frombuffer(body, dtype, count, offset).reshape(shape)
            offset += count * dtype.itemsize
    except (ValueError, TypeError, KeyError) as exc:  # orjson.JSONDecodeError is a ValueError
        raise LinkError(f"malformed frame: {exc}") from exc
    if offset != len(body):
        raise LinkError(f"frame body has {len(body)} bytes, its tensors {offset}")
    return header, arrays


def error_fields(exc: BaseException) -> dict[str, Any]:
    """The ``error`` header field an engine process answers ``exc`` with."""
    if isinstance(exc, FleetserveError):
        return {"kind": type(exc).__name__ if type(exc).__name__ in ERRORS else "FleetserveError",
                "message": exc.message, "retry_after_s": exc.retry_after_s}
    return {"kind": "FleetserveError", "message": f"the engine failed: {exc!r}", "retry_after_s": None}


def raise_error(fields: Mapping[str, Any]) -> None:
    """Raise, in a front end, the error the engine process answered."""
    cls = ERRORS.get(str(fields.get("kind")), FleetserveError)
    message = str(fields.get("message"))
    if issubclass(cls, Overloaded):
        raise cls(message, float(fields.get("retry_after_s") or 1.0))
    raise cls(message)


class _RemoteInstance:
    """One connection to the engine process. ``infer`` blocks its (batcher worker) thread until the answer;
    ``infer_async`` awaits it on the event loop, which then owns the connection: a later ``infer`` from a
    thread runs there too (the batcher warms an instance with ``infer`` and serves with ``infer_async``)."""

    def __init__(self, path: str, timeout_s: float | None) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        self._sock.connect(path)
        self._timeout_s = timeout_s
        # Buffered: one recv usually brings a whole answer, instead of one per part.
        self._stream = self._sock.makefile("rb")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._closed = False

    async def infer_async(self, inputs: Mapping[str, np.ndarray],
                          outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        if self._closed:
            raise NotReady("the engine process is unreachable: this connection failed before")
        try:
            async with asyncio.timeout(self._timeout_s):
                if self._streams is None:
                    self._loop = asyncio.get_running_loop()
                    self._streams = await asyncio.open_unix_connection(sock=self._sock)
                reader, writer = self._streams
                writer.write(encode(inputs, outputs=None if outputs is None else list(outputs)))
                head_len, body_len = sizes(await reader.readexactly(PREFIX.size))
                header, arrays = decode(await reader.readexactly(head_len), await reader.readexactly(body_len))
        except (OSError, asyncio.IncompleteReadError) as exc:  # LinkError and the timeout included
            self.close()
            raise NotReady(f"the engine process is unreachable: {exc!r}") from exc
        except BaseException:  # cancelled mid-call: the stream's place in the frames is lost
            self.close()
            raise
        if "error" in header:
            raise_error(header["error"])
        return arrays

    def infer(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        if self._loop is not None:
            try:
                call = asyncio.run_coroutine_threadsafe(self.infer_async(inputs, outputs), self._loop)
            except RuntimeError as exc:  # its loop is closed
                raise NotReady(f"the engine process is unreachable: {exc}") from exc
            return call.result()
        try:
            self._sock.sendall(encode(inputs, outputs=None if outputs is None else list(outputs)))
            head_len, body_len = sizes(self._read(PREFIX.size))
            header, arrays = decode(self._read(head_len), self._read(body_len))
        except OSError as exc:  # LinkError included
            # The stream's place in the frames is lost (a timeout, a half-read answer): never reuse it. This
            # slot then answers NotReady at once; the engine process stops the replica if it is gone.
            self.close()
            raise NotReady(f"the engine process is unreachable: {exc}") from exc
        if "error" in header:
            raise_error(header["error"])
        return arrays

    def _read(self, n: int) -> bytes:
        data = self._stream.read(n)
        if len(data) != n:
            raise LinkError("the engine process closed the connection")
        return data

    def close(self) -> None:
        self._closed = True
        if self._streams is not None:
            with contextlib.suppress(RuntimeError):  # its loop already closed
                self._streams[1].close()
            self._streams = None
        self._stream.close()
        self._sock.close()


class RemoteEngine:
    """The :class:`~fleetserve.engine.base.Engine` a front end batches for: its instances are connections to
    the engine process at ``path``; shapes and tensor specs are the engine process's. ``timeout_s`` bounds
    each call (None: the engine process's liveness is watched instead); a connection that fails or times out
    is closed for good."""

    def __init__(self, path: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                 profile: ShapeProfile, device: str, timeout_s: float | None = None) -> None:
        self.path = path
        self.inputs: Sequence[TensorSpec] = list(inputs)
        self.outputs: Sequence[TensorSpec] = list(outputs)
        self.profile = profile
        self.device = device
        self._timeout_s = timeout_s
        self._instances: list[_RemoteInstance] = []

    def instance(self) -> EngineInstance:
        instance = _RemoteInstance(self.path, self._timeout_s)
        self._instances.append(instance)
        return instance

    def close(self) -> None:
        for instance in self._instances:
            instance.close()
