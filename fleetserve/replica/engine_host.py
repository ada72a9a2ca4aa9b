"""The engine process of ``fleetserve serve --frontends N``: runs the front ends' batches on its engine
instances, merging the batches that wait while the instances are busy.

Threads, not an event loop: each front-end connection has a thread that blocks in ``recv`` (the interpreter
lock is free meanwhile), checks the batch it receives and queues it; each engine instance has a dispatcher
thread that takes the oldest queued batch and every other queued batch of the same sequence bucket that fits
in ``max_batch`` rows, runs them as one engine call (a lone batch as its front end padded it) and sends each
front end its rows. Batches that arrive while an instance is busy wait and merge into its next call.

Without an engine (``benchmarks/engine_host.py``, 2-core box) this costs 189 µs of the process's CPU per batch
from one connection and 159 µs from four, against 424 and 266 µs for the first version, an asyncio server
feeding the replica's batcher; on the H200 host the two served the same requests/s, their engine process busy
0.6–1.0 of a core either way (BENCHMARKS §10.6). A leader/follower variant (Schmidt et al., 2000: the thread
that received a batch runs it when an instance is free, no handoff) cost less per batch on the 2-core box
(125 vs 178–189 µs, one connection), but its leaders either starved their own connection under load or, handing
the instance on to drain the queue fairly, served 8.4k instead of 10k minilm requests/s on the GPU.

The queue needs no bound of its own: each connection has one batch here at a time (the front end waits for
its answer), so it holds at most front ends × ``--frontend-batches`` batches.
"""

from __future__ import annotations

import bisect
import contextlib
import io
import logging
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fleetserve.batching.observer import BatchObserver, NullObserver
from fleetserve.batching.tensors import Request, TensorLayout
from fleetserve.engine.base import Engine, EngineInstance
from fleetserve.replica.engine_link import PREFIX, LinkError, decode, encode, error_fields, sizes

log = logging.getLogger(__name__)

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


def _read_exactly(stream: io.BufferedReader, n: int) -> bytes | None:
    """``n`` bytes, or None if the peer closed the connection before the first of them."""
    data = stream.read(n)
    if len(data) == n:
        return data
    if not data:
        return None
    raise LinkError("a front end closed its connection mid-frame")


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
        sizes = {b for b in self._engine.profile.batch_buckets if b <= self._max_batch} | {self._max_batch}
        return tuple((b, s) for b in sorted(sizes) for s in self._buckets)

    def start(self) -> None:
        """Create the instances, run each once on every shape of ``warmup_shapes``, then listen."""
        instances = [self._engine.instance() for _ in range(self._n)]
        for instance in instances:
            for rows, seq in self.warmup_shapes:
                request = self._layout.dummy(rows, seq)
                self._layout.split(instance.infer(self._layout.collate([request], seq)), [request], seq)
        for i, instance in enumerate(instances):
            threading.Thread(target=self._dispatch, name=f"fleetserve-engine-{i}", args=(instance,),
                             daemon=True).start()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=self._accept, name="fleetserve-engine-accept", args=(listener,), daemon=True).start()

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

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return  # closed
            # A front end that stops reading (frozen, or broken mid-answer) must not hold a dispatcher forever.
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, self._send_timeout)
            self._connections.add(connection)
            threading.Thread(target=self._serve, name="fleetserve-engine-link", args=(connection,),
                             daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        # Buffered: one recv usually brings a whole frame, instead of one per part.
        stream = connection.makefile("rb")
        try:
            while (frame := self._receive(connection, stream)) is not None:
                with self._lock:
                    self._pending.append(frame)
                    self._queued.notify()
        except (LinkError, OSError) as exc:
            log.warning("front-end connection dropped: %s", exc)
        finally:
            self._connections.discard(connection)
            stream.close()
            connection.close()

    def _receive(self, connection: socket.socket, stream: io.BufferedReader) -> _Frame | None:
        """The next well-formed batch of this connection (answering malformed ones); None at its end."""
        while True:
            prefix = _read_exactly(stream, PREFIX.size)
            if prefix is None:
                return None
            head_len, body_len = sizes(prefix)
            head = _read_exactly(stream, head_len) if head_len else b""
            body = _read_exactly(stream, body_len) if body_len else b""
            if head is None or body is None:
                raise LinkError("a front end closed its connection mid-frame")
            header, arrays = decode(head, body)
            try:
                request = self._layout.validate(arrays)
            except Exception as exc:
                connection.sendall(encode({}, error=error_fields(exc)))
                continue
            wanted = header.get("outputs")
            bucket = self._buckets[bisect.bisect_left(self._buckets, request.seq)]
            return _Frame(connection, request, bucket, None if wanted is None else frozenset(wanted), self._clock())

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
