"""The engine process of ``fleetserve serve --frontends N``: runs the front ends' batches on its engine
instances, merging the batches that wait while the instances are busy.

Threads, not an event loop: one reader thread accepts the front ends' connections and waits on all of them
at once (``selectors``; the interpreter lock is free meanwhile), and each time it wakes it reads what arrived
on every ready connection, checks each complete batch and queues them all under one lock. Each engine instance
has a dispatcher thread that takes the oldest queued batch and every other queued batch of the same sequence
bucket that fits in ``max_batch`` rows, runs them as one engine call (a lone batch as its front end padded it)
and sends each front end its rows. Batches that arrive while an instance is busy wait and merge into its next
call.

The engine process's CPU per front-end batch is what limits one GPU's single-text requests/s (BENCHMARKS §10.6).
Without an engine (``benchmarks/engine_host.py``, 2-core box), per batch:

- one reader thread (this): 79–93 µs at 4 clients × 2 connections, 119–123 µs at 2 × 2, 204–224 µs at 1 × 1;
- a reader thread per connection, the version measured on the H200: 122, 133–162 and 176–189 µs — one wake-up
  per batch, and the readers contending for the interpreter lock; not re-measured on the GPU since;
- the first version, an asyncio server feeding the replica's batcher: 266 µs at 2 × 2, 424 µs at 1 × 1; on the
  H200 it served the same requests/s as the reader threads;
- a leader/follower variant (Schmidt et al., 2000: the thread that received a batch runs it when an instance
  is free, no handoff): 125 µs at 1 × 1, but its leaders either starved their own connection under load or,
  handing the instance on to drain the queue fairly, served 8.4k instead of 10k minilm requests/s on the GPU.

The queue needs no bound of its own: each connection has one batch here at a time (the front end waits for
its answer), so it holds at most front ends × ``--frontend-batches`` batches.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import selectors
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from fleetserve.batching.observer import BatchObserver, NullObserver
from fleetserve.batching.tensors import Request, TensorLayout, warmup_batch_sizes
from fleetserve.engine.base import Engine, EngineInstance
from fleetserve.replica.engine_link import PREFIX, LinkError, decode, encode, error_fields, sizes

log = logging.getLogger(__name__)

# Most bytes one read takes from a connection.
READ_BYTES = 1 << 16
# Longest a dispatcher blocks sending one answer: a healthy front end reads its answer at once.
SEND_TIMEOUT_S = 5.0


@dataclass(eq=False)
class _Frame:
    """One front end's batch, queued."""

    connection: socket.socket
    request: Request
    bucket: int
    outputs: frozenset[str] | None
    arrived: float


class _Closed(LinkError):
    """A front end closed its connection between batches."""


class EngineHost:
    """Serves ``engine`` to front ends on the Unix socket ``path`` (see the module docstring)."""

    def __init__(
        self, engine: Engine, path: str, *, max_batch: int, seq_buckets: Sequence[int] | None = None,
        instances: int = 1, observer: BatchObserver | None = None, clock: Callable[[], float] = time.monotonic,
        send_timeout_s: float = SEND_TIMEOUT_S,
    ) -> None:
        if max_batch < 1 or instances < 1:
            raise ValueError("max_batch and instances must be >= 1")
        buckets = tuple(seq_buckets or engine.profile.seq_buckets)
        self._engine = engine
        self.path = path
        self._layout = TensorLayout(engine.inputs, engine.outputs, max_batch=max_batch, max_seq=buckets[-1])
        self._buckets = buckets if self._layout.has_sequence else (0,)
        self._max_batch = max_batch
        self._n = instances
        self._observer: BatchObserver = observer or NullObserver()
        self._clock = clock
        self._send_timeout = struct.pack("ll", int(send_timeout_s), int(send_timeout_s % 1 * 1e6))
        self._lock = threading.Lock()
        self._queued = threading.Condition(self._lock)
        self._idle_changed = threading.Condition(self._lock)
        self._pending: deque[_Frame] = deque()
        self._busy = 0
        self._listener: socket.socket | None = None
        self._connections: set[socket.socket] = set()

    @property
    def warmup_shapes(self) -> tuple[tuple[int, int], ...]:
        """The (rows, sequence length) shapes ``start`` runs on every instance."""
        sizes = warmup_batch_sizes(self._engine.profile.batch_buckets, self._max_batch)
        return tuple((b, s) for b in sizes for s in self._buckets)

    def start(self) -> None:
        """Create the instances, run each once on every shape of ``warmup_shapes``, then listen."""
        instances = [self._engine.instance() for _ in range(self._n)]
        for instance in instances:
            self._layout.warm(instance, self.warmup_shapes)
        for i, instance in enumerate(instances):
            threading.Thread(target=self._dispatch, name=f"fleetserve-engine-{i}", args=(instance,),
                             daemon=True).start()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(128)
        self._listener = listener
        selector = selectors.DefaultSelector()
        # Registered here, not on the reader thread: a close() right after start() still wakes it.
        selector.register(listener, selectors.EVENT_READ)
        threading.Thread(target=self._read, name="fleetserve-engine-read", args=(listener, selector),
                         daemon=True).start()

    def close(self, timeout_s: float) -> bool:
        """Stop taking connections and wait, at most ``timeout_s``, for the engine calls under way; True if
        none is left running (the engine can then be closed)."""
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        deadline = self._clock() + timeout_s
        with self._idle_changed:
            while (self._pending or self._busy) and (left := deadline - self._clock()) > 0:
                self._idle_changed.wait(left)
            idle = not self._pending and not self._busy
        for connection in list(self._connections):
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        return idle

    def _read(self, listener: socket.socket, selector: selectors.BaseSelector) -> None:
        """Accept front ends and read every connection's batches, on one thread: one wake-up reads whatever
        arrived on any connection, and the queue's lock is taken once per wake-up."""
        with selector:
            self._read_until_closed(listener, selector)

    def _read_until_closed(self, listener: socket.socket, selector: selectors.BaseSelector) -> None:
        while True:
            try:
                ready = selector.select()
            except (OSError, ValueError):
                return  # the listener was closed
            frames: list[_Frame] = []
            for key, _ in ready:
                if key.fileobj is listener:
                    if not self._accept(listener, selector):
                        return
                    continue
                connection = cast(socket.socket, key.fileobj)
                try:
                    frames += self._receive(connection, key.data)
                except Exception as exc:  # that connection ends; the others are still read
                    if not isinstance(exc, _Closed):
                        log.warning("front-end connection dropped: %r", exc)
                    selector.unregister(connection)
                    self._connections.discard(connection)
                    connection.close()
            if frames:
                with self._lock:
                    self._pending.extend(frames)
                    self._queued.notify(len(frames))

    def _accept(self, listener: socket.socket, selector: selectors.BaseSelector) -> bool:
        try:
            connection, _ = listener.accept()
        except OSError:
            return False  # closed
        # A front end that stops reading (frozen, or broken mid-answer) must not hold a dispatcher forever.
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, self._send_timeout)
        self._connections.add(connection)
        selector.register(connection, selectors.EVENT_READ, bytearray())
        return True

    def _receive(self, connection: socket.socket, buffer: bytearray) -> list[_Frame]:
        """The complete batches now readable on ``connection`` (malformed ones answered at once)."""
        chunk = connection.recv(READ_BYTES)
        if not chunk:
            if buffer:
                raise LinkError("a front end closed its connection mid-frame")
            raise _Closed
        buffer += chunk
        frames = []
        while len(buffer) >= PREFIX.size:
            head_len, body_len = sizes(bytes(buffer[:PREFIX.size]))
            end = PREFIX.size + head_len + body_len
            if len(buffer) < end:
                break
            header, arrays = decode(bytes(buffer[PREFIX.size:PREFIX.size + head_len]),
                                    bytes(buffer[PREFIX.size + head_len:end]))
            del buffer[:end]
            try:
                request = self._layout.validate(arrays)
            except Exception as exc:
                connection.sendall(encode({}, error=error_fields(exc)))
                continue
            wanted = header.get("outputs")
            bucket = self._buckets[bisect.bisect_left(self._buckets, request.seq)]
            frames.append(_Frame(connection, request, bucket, None if wanted is None else frozenset(wanted),
                                 self._clock()))
        return frames

    def _dispatch(self, instance: EngineInstance) -> None:
        """Run queued batches on ``instance``, for as long as the process lives."""
        while True:
            with self._lock:
                while not self._pending:
                    self._queued.wait()
                frames = self._take()
                self._busy += 1
            try:
                self._run(instance, frames)
            finally:
                with self._lock:
                    self._busy -= 1
                    self._idle_changed.notify_all()

    def _take(self) -> list[_Frame]:
        """The oldest queued batch and every other of its bucket that fits; the caller holds the lock and
        something is queued."""
        bucket = self._pending[0].bucket
        taken, kept, rows = [], deque[_Frame](), 0
        for frame in self._pending:
            if frame.bucket == bucket and rows + frame.request.rows <= self._max_batch:
                taken.append(frame)
                rows += frame.request.rows
            else:
                kept.append(frame)
        self._pending = kept
        return taken

    def _run(self, instance: EngineInstance, frames: list[_Frame]) -> None:
        requests = [f.request for f in frames]
        seq = max(r.seq for r in requests)
        names: tuple[str, ...] | None = None
        if all(f.outputs is not None for f in frames):
            names = tuple(sorted(frozenset[str]().union(*(f.outputs or () for f in frames))))
        started = self._clock()
        try:
            # A lone batch is already padded to its own length by its front end.
            feeds = requests[0].arrays if len(requests) == 1 else self._layout.collate(requests, seq)
            outputs = instance.infer(feeds) if names is None else instance.infer(feeds, names)
            compute_s = self._clock() - started
            # Views: each is encoded (copied) before this instance runs again.
            parts: list[dict[str, np.ndarray]] = self._layout.split(outputs, requests, seq, copy=False)
            # Each front end gets only what it asked for, whatever the merged call computed.
            answers = [encode(part if f.outputs is None else {k: v for k, v in part.items() if k in f.outputs})
                       for f, part in zip(frames, parts, strict=True)]
        except Exception as exc:  # every front end of the call gets the error; the engine keeps serving
            log.warning("engine call of %d front-end batches (seq %d) failed: %r", len(frames), seq, exc)
            answers = [encode({}, error=error_fields(exc))] * len(frames)
        else:
            self._observer.on_batch(sum(f.request.rows for f in frames), seq, [started - f.arrived for f in frames],
                                    compute_s)
        for frame, answer in zip(frames, answers, strict=True):
            self._send(frame, answer)

    @staticmethod
    def _send(frame: _Frame, data: bytes) -> None:
        try:
            frame.connection.sendall(data)
        except OSError as exc:
            # Gone, or not reading (``send_timeout_s``): drop the connection rather than hold the instance; its
            # front end answers that slot's requests 503 and the replica's supervisor sees a broken replica.
            log.warning("dropping a front-end connection that did not take its answer: %s", exc)
            with contextlib.suppress(OSError):
                frame.connection.shutdown(socket.SHUT_RDWR)
