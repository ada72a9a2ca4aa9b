"""The batcher's worker loop: one asyncio task feeds batches from the :class:`Collator` to N engine
instances, each of which runs ``infer`` on its own thread of a dedicated ThreadPoolExecutor, so the
event loop never blocks and instances compute concurrently.

The scheduler task sleeps until a request arrives, an instance frees up or the collator's next
wake-up time (a bucket's ``max_delay_s`` or a request's deadline), then polls the collator: expired
requests are answered ``RequestExpired`` (also while every instance is busy), and each ready batch
goes to a free instance. A caller that gives up (its task is cancelled, e.g. because the client hung
up) takes its request out of the queue, so no engine call is spent on an answer nobody reads.
Padding, the engine call and splitting all happen on the instance's thread, except for an instance that
is an :class:`~fleetserve.engine.base.AsyncEngineInstance` (a front end's link to its engine process): its
call is awaited on the loop, and its small batches are padded and split there.
An engine error fails only the requests of that batch; the loop keeps serving.

``queue_depth`` and ``inflight`` count rows, like ``BatcherConfig.max_queue``.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import cast

import numpy as np

from fleetserve.batching.collator import Batch, Collator, Pending
from fleetserve.batching.config import BatcherConfig
from fleetserve.batching.observer import BatchObserver, NullObserver
from fleetserve.batching.tensors import Request, TensorLayout, warmup_batch_sizes
from fleetserve.batching.timing import TIMING, JobTiming
from fleetserve.engine.base import AsyncEngineInstance, Engine, EngineInstance
from fleetserve.errors import InvalidInput, NotReady, Overloaded, RequestExpired

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Job:
    request: Request
    future: asyncio.Future[dict[str, np.ndarray]]
    timeout_s: float | None
    outputs: frozenset[str] | None = None  # None: every output
    timing: JobTiming | None = None  # filled in for a caller that asked (see .timing)


class Batcher:
    """Dynamic batcher in front of one engine; see ``BatcherConfig`` for the knobs."""

    def __init__(
        self,
        engine: Engine,
        config: BatcherConfig,
        *,
        instances: int = 1,
        observer: BatchObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
            raise ValueError(f"instances must be a positive integer, got {instances!r}")
        profile = engine.profile
        if config.max_batch > profile.max_batch:
            raise ValueError(f"max_batch {config.max_batch} exceeds the engine profile's {profile.max_batch}")
        buckets = config.seq_buckets or profile.seq_buckets
        if buckets[-1] > profile.max_seq:
            raise ValueError(f"seq bucket {buckets[-1]} exceeds the engine profile's max_seq {profile.max_seq}")
        self._engine = engine
        self._config = config
        self._layout = TensorLayout(engine.inputs, engine.outputs, max_batch=config.max_batch, max_seq=buckets[-1])
        self._output_names = frozenset(spec.name for spec in engine.outputs)
        self._seq_buckets = buckets if self._layout.has_sequence else (0,)
        self._batch_sizes = warmup_batch_sizes(profile.batch_buckets, config.max_batch, config.preferred_batch_sizes)
        self._collator: Collator[_Job] = Collator(config)
        self._n = instances
        self._observer: BatchObserver = observer or NullObserver()
        self._clock = clock
        self._executor: ThreadPoolExecutor | None = None
        self._instances: list[EngineInstance] = []
        self._awaited = False  # every instance an AsyncEngineInstance, decided once at start
        self._idle: list[EngineInstance] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._scheduler: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._freed = asyncio.Event()
        self._accepting = False
        self._draining = False
        self._paused = 0
        self._inflight_rows = 0

    @property
    def queue_depth(self) -> int:
        """Rows waiting in the queue."""
        return self._collator.queued_rows

    @property
    def inflight(self) -> int:
        """Rows in batches an engine instance is running now."""
        return self._inflight_rows

    @property
    def accepting(self) -> bool:
        """True between ``start`` and ``drain``."""
        return self._accepting

    @property
    def warmup_shapes(self) -> tuple[tuple[int, int], ...]:
        """The (rows, sequence length) shapes ``warmup`` runs on every instance."""
        return tuple((b, s) for b in self._batch_sizes for s in self._seq_buckets)

    async def start(self) -> None:
        """Create the engine instances (on the executor: sessions can be slow to create) and the scheduler."""
        if self._executor is not None:
            raise RuntimeError("the batcher was already started")
        loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(max_workers=self._n, thread_name_prefix="fleetserve-engine")
        try:
            for _ in range(self._n):
                self._instances.append(await loop.run_in_executor(self._executor, self._engine.instance))
        except BaseException:
            self._executor.shutdown(wait=False)
            self._executor = None
            self._instances.clear()
            raise
        self._idle = list(self._instances)
        self._awaited = all(isinstance(i, AsyncEngineInstance) for i in self._instances)
        self._scheduler = asyncio.create_task(self._schedule(), name="fleetserve-batcher")
        self._scheduler.add_done_callback(self._scheduler_done)
        self._accepting = True

    async def warmup(self, shapes: Sequence[tuple[int, int]] | None = None) -> None:
        """Run every instance once on every shape in ``shapes`` (default ``warmup_shapes``); batches wait
        meanwhile."""
        if self._executor is None:
            raise RuntimeError("start() the batcher before warmup()")
        executor = self._executor
        loop = asyncio.get_running_loop()
        self._paused += 1
        try:
            while len(self._idle) < len(self._instances):
                self._freed.clear()
                await self._freed.wait()
            chosen = self.warmup_shapes if shapes is None else tuple(shapes)
            await asyncio.gather(*(loop.run_in_executor(executor, self._layout.warm, i, chosen)
                                   for i in self._instances))
        finally:
            self._paused -= 1
            self._wake.set()

    async def submit(
        self, inputs: Mapping[str, np.ndarray], *, priority: int | None = None, timeout_s: float | None = None,
        outputs: Sequence[str] | None = None, deadline: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Queue one request and await its outputs; ``InvalidInput``/``Overloaded``/``NotReady`` at once.

        ``outputs`` names the outputs the caller needs (None: all); a batch asks the engine for the union
        of its requests' outputs only, so nobody pays for copying back tensors nobody reads.
        ``timeout_s`` bounds the time in the queue from now; ``deadline`` (on the batcher's clock) is an
        absolute bound from the caller's caller, e.g. a gateway's forwarded deadline. The earlier of the
        two applies; a request still queued then is answered ``RequestExpired`` and never run, and one
        whose deadline has already passed is refused at once.
        """
        if not self._accepting:
            self._observer.on_rejected()
            raise NotReady("the batcher is draining" if self._draining else "the batcher is not running")
        level = self._config.default_level if priority is None else priority
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level < self._config.priority_levels:
            raise InvalidInput(f"priority must be an integer in 0..{self._config.priority_levels - 1}, got {level!r}")
        timeout = self._config.default_timeout_s if timeout_s is None else timeout_s
        if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
            raise InvalidInput(f"timeout must be a positive number of seconds, got {timeout!r}")
        request = self._layout.validate(inputs)
        if not self._config.group_by_length:
            # One queue for every length, so batches form by arrival alone.
            bucket = self._seq_buckets[-1]
        else:
            bucket = self._seq_buckets[bisect.bisect_left(self._seq_buckets, request.seq)]
        now = self._clock()
        wanted = frozenset(outputs) if outputs else None
        if wanted is not None and (unknown := wanted - self._output_names):
            known = sorted(self._output_names)
            raise InvalidInput(f"unknown outputs {sorted(unknown)}; the model's outputs are {known}")
        expires = None if timeout is None else now + timeout
        if deadline is not None:
            if deadline <= now:
                self._observer.on_expired(1)
                raise RequestExpired(f"the request's deadline passed {now - deadline:.3f}s before it could be "
                                     "queued; it was not run")
            expires = deadline if expires is None else min(expires, deadline)
        timing = TIMING.get()
        job = _Job(request, asyncio.get_running_loop().create_future(), None if expires is None else expires - now,
                   wanted, timing)
        if timing is not None:
            timing.queued_ns = time.time_ns()
        try:
            entry = self._collator.push(
                job, rows=request.rows, bucket=bucket, priority=level, now=now, deadline=expires,
            )
        except Overloaded:
            self._observer.on_rejected()
            raise
        self._wake.set()
        try:
            return await job.future
        except asyncio.CancelledError:
            # The caller gave up (e.g. the client disconnected): do not spend an engine call on it.
            if self._collator.remove(entry):
                self._observer.on_cancelled(1)
            raise

    async def drain(self, timeout_s: float) -> None:
        """Stop accepting, then finish everything queued and in flight within ``timeout_s``.

        Requests still queued at the timeout are answered ``NotReady``; batches already running finish
        on their threads. The engine itself is not closed: its owner does that.
        """
        self._accepting = False
        self._draining = True
        scheduler = self._scheduler
        if scheduler is None:
            return
        self._wake.set()
        done, _ = await asyncio.wait({scheduler}, timeout=timeout_s)
        if not done:
            log.warning(
                "drain timed out after %.3fs; answering %d queued requests NotReady",
                timeout_s,
                self._collator.queued_requests,
            )
            scheduler.cancel()
            await asyncio.wait({scheduler})
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    async def _schedule(self) -> None:
        while True:
            self._wake.clear()
            now = self._clock()
            can_dispatch = bool(self._idle) and not self._paused
            decision = self._collator.poll(now, can_dispatch=can_dispatch, flush=self._draining)
            self._expire(decision.expired, now)
            if decision.batch is not None:
                self._dispatch(decision.batch, now)
                continue
            if self._draining and self._collator.queued_requests == 0 and len(self._idle) == len(self._instances):
                return
            timeout = None if decision.wake_at is None else max(0.0, decision.wake_at - now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _expire(self, expired: tuple[Pending[_Job], ...], now: float) -> None:
        if not expired:
            return
        for entry in expired:
            job = entry.payload
            if not job.future.done():
                job.future.set_exception(
                    RequestExpired(
                        f"request waited {now - entry.enqueued_at:.3f}s in the queue, "
                        f"past its timeout of {job.timeout_s:.3f}s; it was not run"
                    )
                )
        self._observer.on_expired(len(expired))

    def _dispatch(self, batch: Batch[_Job], now: float) -> None:
        instance = self._idle.pop()
        self._inflight_rows += batch.rows
        waits = [now - e.enqueued_at for e in batch.entries]
        for entry in batch.entries:
            timing = entry.payload.timing
            if timing is not None:
                timing.dispatched_ns = time.time_ns()
                timing.batch_rows = batch.rows
                timing.seq = batch.seq
                timing.instance = self._instances.index(instance)
        task = asyncio.create_task(self._run(instance, batch, waits))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, instance: EngineInstance, batch: Batch[_Job], waits: list[float]) -> None:
        assert self._executor is not None
        jobs = [e.payload for e in batch.entries]
        seq = max(job.request.seq for job in jobs) if self._config.pad_to == "longest" else batch.seq
        loop = asyncio.get_running_loop()
        try:
            if self._awaited:
                results, compute_s = await self._execute_async(cast(AsyncEngineInstance, instance), jobs, seq)
            else:
                results, compute_s = await loop.run_in_executor(self._executor, self._execute, instance, jobs, seq)
        except Exception as exc:
            log.warning("batch of %d rows (seq %d) failed: %r", batch.rows, seq, exc)
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(exc)
        else:
            for job, result in zip(jobs, results, strict=True):
                if job.timing is not None:
                    job.timing.finished_ns = time.time_ns()
                if not job.future.done():
                    job.future.set_result(result)
            self._observer.on_batch(batch.rows, seq, waits, compute_s)
        finally:
            self._inflight_rows -= batch.rows
            self._idle.append(instance)
            self._freed.set()
            self._wake.set()

    def _feeds(self, jobs: list[_Job], seq: int) -> tuple[list[Request], dict[str, np.ndarray], tuple[str, ...] | None]:
        """The batch's requests, their collated inputs, and the union of the outputs they asked for (None as
        soon as one wants everything)."""
        requests = [job.request for job in jobs]
        names: tuple[str, ...] | None = None
        if all(job.outputs is not None for job in jobs):
            names = tuple(sorted(frozenset[str]().union(*(job.outputs or () for job in jobs))))
        return requests, self._layout.collate(requests, seq), names

    def _execute(
        self, instance: EngineInstance, jobs: list[_Job], seq: int
    ) -> tuple[list[dict[str, np.ndarray]], float]:
        requests, feeds, names = self._feeds(jobs, seq)
        started = self._clock()
        outputs = instance.infer(feeds) if names is None else instance.infer(feeds, names)
        compute_s = self._clock() - started
        return self._layout.split(outputs, requests, seq), compute_s

    async def _execute_async(
        self, instance: AsyncEngineInstance, jobs: list[_Job], seq: int
    ) -> tuple[list[dict[str, np.ndarray]], float]:
        requests, feeds, names = self._feeds(jobs, seq)
        started = self._clock()
        outputs = await instance.infer_async(feeds, names)
        compute_s = self._clock() - started
        return self._layout.split(outputs, requests, seq), compute_s

    def _scheduler_done(self, task: asyncio.Task[None]) -> None:
        """Answer everything still queued once the scheduler stops, so no caller waits forever."""
        self._accepting = False
        if not task.cancelled() and task.exception() is not None:
            log.error("batcher scheduler failed", exc_info=task.exception())
        for entry in self._collator.clear():
            if not entry.payload.future.done():
                entry.payload.future.set_exception(NotReady("the batcher stopped before this request ran"))
