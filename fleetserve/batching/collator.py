"""Pure collation logic of the dynamic batcher: which queued requests form the next batch, and when.

No asyncio, threads or clock of its own: the caller passes ``now`` to :meth:`Collator.poll` and gets a
:class:`Decision` (a batch to run or none, the requests whose deadline passed, and when to poll next),
so every rule is unit-tested with a fake clock.

The policy follows NVIDIA Triton's dynamic batcher (model configuration guide, "Dynamic Batcher";
``dynamic_batch_scheduler.cc``), made aware of sequence length:

- Requests are grouped by *sequence bucket* (the padded length of their longest row). A batch holds one
  bucket, so short queries never pay for a long document's padding.
- Within a bucket, requests are ordered by (priority, arrival); a lower priority number goes first.
  The first request is always taken; later ones join while the batch stays within the *capacity*
  (the largest preferred batch size, else ``max_batch``); ones that do not fit wait for the next batch.
- A bucket is sent when a prefix of its batch hits a preferred size (the largest such prefix is sent),
  when it cannot grow any more (its queued rows reach the capacity), or when its oldest request has
  waited ``max_delay_s``. While draining (``flush``) every bucket is sent at once.
- Among buckets ready together, the one whose first request has the best (priority, arrival) goes.
- With ``promote_overdue``, spare rows of a batch sent for being full or overdue are filled with
  requests of *shorter* buckets that have already waited past ``max_delay_s`` (they are padded up):
  such requests would otherwise need another engine call after this one.
- A request whose deadline passes while queued is removed and reported as expired, never dispatched.

Each poll is linear in the queue length, which ``max_queue`` bounds; it plans every bucket once, keeps
per-bucket row counts, and skips the deadline scans while no queued request has a deadline (the fleet
simulator polls a collator per simulated replica millions of times).
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from fleetserve.batching.config import BatcherConfig
from fleetserve.errors import Overloaded

T = TypeVar("T")


@dataclass(eq=False)
class Pending(Generic[T]):
    """One queued request: the caller's payload plus what the policy needs to know about it."""

    payload: T
    rows: int
    bucket: int
    priority: int
    enqueued_at: float
    deadline: float | None
    order: int

    def rank(self) -> tuple[int, float, int]:
        return (self.priority, self.enqueued_at, self.order)


@dataclass(slots=True)
class Batch(Generic[T]):
    """Requests to run in one engine call, padded to sequence length ``seq``; ``rows`` in all.

    Like :class:`Decision`, a plain record the caller only reads: not frozen, because a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__`` (about three times the cost), and the fleet
    simulator builds one of these per simulated batch and a :class:`Decision` per poll.
    """

    entries: tuple[Pending[T], ...]
    seq: int
    rows: int


@dataclass(slots=True)
class Decision(Generic[T]):
    """What to do at ``now``: run ``batch`` (if any), answer ``expired``, poll again by ``wake_at``.

    ``wake_at`` is None when only a new request or a freed instance can change anything.
    """

    batch: Batch[T] | None
    expired: tuple[Pending[T], ...]
    wake_at: float | None


class Collator(Generic[T]):
    """Queue state of the batcher; see the module docstring for the policy."""

    def __init__(self, config: BatcherConfig) -> None:
        self._config = config
        self._preferred = frozenset(config.preferred_batch_sizes)
        self._capacity = config.preferred_batch_sizes[-1] if config.preferred_batch_sizes else config.max_batch
        self._buckets: dict[int, list[Pending[T]]] = {}
        self._bucket_rows: dict[int, int] = {}
        # When each bucket is due: its oldest request's arrival plus max_delay_s, kept as requests come and go.
        self._bucket_due: dict[int, float] = {}
        self._with_deadline = 0
        # Rows and requests queued: plain attributes for the callers to read (the fleet simulator reads them
        # several times per simulated request); only the collator changes them.
        self.queued_rows = 0
        self.queued_requests = 0
        self._arrivals = 0

    def push(
        self, payload: T, *, rows: int, bucket: int, priority: int, now: float, deadline: float | None = None
    ) -> Pending[T]:
        """Queue a request; raises ``Overloaded`` when its rows do not fit in ``max_queue``."""
        if not 1 <= rows <= self._config.max_batch:
            raise ValueError(f"rows must be in 1..{self._config.max_batch}, got {rows}")
        if self.queued_rows + rows > self._config.max_queue:
            raise Overloaded(f"queue full: {self.queued_rows} of {self._config.max_queue} rows waiting; retry later")
        entry = Pending(payload, rows, bucket, priority, now, deadline, self._arrivals)
        self._arrivals += 1
        queue = self._buckets.get(bucket)
        if queue is None:
            self._buckets[bucket] = [entry]
            self._bucket_rows[bucket] = rows
            self._bucket_due[bucket] = now + self._config.max_delay_s
        else:
            last = queue[-1]
            if (last.priority, last.enqueued_at) <= (priority, now):
                queue.append(entry)  # the usual case: it ranks last (its order is the largest yet)
            else:
                bisect.insort(queue, entry, key=Pending.rank)
            self._bucket_rows[bucket] += rows
            due = now + self._config.max_delay_s
            if due < self._bucket_due[bucket]:
                self._bucket_due[bucket] = due
        self.queued_rows += rows
        self.queued_requests += 1
        if deadline is not None:
            self._with_deadline += 1
        return entry

    def remove(self, entry: Pending[T]) -> bool:
        """Take a still-queued request out (its caller gave up); False if it already left the queue."""
        queue = self._buckets.get(entry.bucket, [])
        if not any(e is entry for e in queue):
            return False
        self._take([entry])
        return True

    def clear(self) -> list[Pending[T]]:
        """Empty the queue and return everything that was in it."""
        entries = [e for queue in self._buckets.values() for e in queue]
        self._take(entries)
        return entries

    def poll(self, now: float, *, can_dispatch: bool = True, flush: bool = False) -> Decision[T]:
        """Expire overdue requests and, if ``can_dispatch`` (an instance is free), pick the next batch."""
        expired: list[Pending[T]] = []
        if self._with_deadline:
            expired = [e for q in self._buckets.values() for e in q if e.deadline is not None and e.deadline <= now]
            self._take(expired)
        plans: dict[int, list[Pending[T]] | None] = {}
        for bucket, queue in self._buckets.items():
            plans[bucket] = plan = self._plan(bucket, queue, now, flush)
        if len(plans) == 1 and plan is None and not expired and not self._with_deadline:
            # The usual poll on a new request: its one bucket keeps waiting, so nothing is selected and the
            # next poll is due when that bucket is (what _select and _wake_at would find).
            return Decision(None, (), self._bucket_due[bucket])
        batch = self._select(plans, now, flush) if can_dispatch else None
        return Decision(batch, tuple(expired) if expired else (), self._wake_at(plans, now, can_dispatch))

    def _plan(self, bucket: int, queue: list[Pending[T]], now: float, flush: bool) -> list[Pending[T]] | None:
        """The batch this bucket would send at ``now``, or None while it should keep waiting."""
        rows = self._bucket_rows[bucket]
        ready = flush or rows >= self._capacity or now >= self._bucket_due[bucket]
        if not ready and not self._preferred:
            return None
        if rows <= self._capacity:
            fill = queue[:]  # everything fits
        else:
            fill = [queue[0]]
            used = queue[0].rows
            for entry in queue[1:]:
                if used + entry.rows <= self._capacity:
                    fill.append(entry)
                    used += entry.rows
        if self._preferred:
            best, used = 0, 0
            for i, entry in enumerate(fill):
                used += entry.rows
                if used in self._preferred:
                    best = i + 1
            if best:
                return fill[:best]
        return fill if ready else None

    def _select(self, plans: dict[int, list[Pending[T]] | None], now: float, flush: bool) -> Batch[T] | None:
        """Take the batch to send from the buckets' ``plans`` and re-plan the buckets it took from."""
        best: tuple[int, list[Pending[T]]] | None = None
        for bucket, plan in plans.items():
            if plan is not None and (best is None or plan[0].rank() < best[1][0].rank()):
                best = (bucket, plan)
        if best is None:
            return None
        bucket, entries = best
        used = 0
        for entry in entries:
            used += entry.rows
        grown_to_preferred = bool(self._preferred) and used in self._preferred
        riders: list[Pending[T]] = []
        if self._config.promote_overdue and not grown_to_preferred:
            riders = self._riders(bucket, now, flush, max(self._capacity, used) - used)
        touched: Collection[int] = (bucket,)
        if riders:
            entries = entries + riders
            used += sum(e.rows for e in riders)
            self._take(entries)
            touched = {e.bucket for e in entries}
        else:
            self._take_from(bucket, entries)  # the usual case: one bucket's head
        for b in touched:
            queue = self._buckets.get(b)
            if queue is None:
                del plans[b]
            else:
                plans[b] = self._plan(b, queue, now, flush)
        return Batch(tuple(entries), bucket, used)

    def _riders(self, bucket: int, now: float, flush: bool, spare: int) -> list[Pending[T]]:
        """Overdue requests of shorter buckets that fit in ``spare`` rows, best (priority, arrival) first."""
        overdue = sorted(
            (
                e
                for b, queue in self._buckets.items()
                if b < bucket
                for e in queue
                if flush or now >= e.enqueued_at + self._config.max_delay_s
            ),
            key=Pending.rank,
        )
        riders = []
        for entry in overdue:
            if entry.rows <= spare:
                riders.append(entry)
                spare -= entry.rows
        return riders

    def _wake_at(self, plans: dict[int, list[Pending[T]] | None], now: float, can_dispatch: bool) -> float | None:
        wake = None
        if self._with_deadline:
            wake = min((e.deadline for q in self._buckets.values() for e in q if e.deadline is not None), default=None)
        for bucket in self._buckets:
            if plans[bucket] is None:
                due = self._bucket_due[bucket]
            elif can_dispatch:
                due = now
            else:
                continue
            if wake is None or due < wake:
                wake = due
        return wake

    def _take(self, entries: Iterable[Pending[T]]) -> None:
        by_bucket: dict[int, list[Pending[T]]] = {}
        for e in entries:
            by_bucket.setdefault(e.bucket, []).append(e)
        for bucket, taken in by_bucket.items():
            self._take_from(bucket, taken)

    def _take_from(self, bucket: int, taken: list[Pending[T]]) -> None:
        """Remove ``taken``, all queued in ``bucket``, from the queue."""
        queue = self._buckets[bucket]
        n = len(taken)
        if queue[:n] == taken:  # identity (Pending compares by identity): the batch is the bucket's head, in order
            del queue[:n]
        else:
            gone = {id(e) for e in taken}
            queue[:] = [e for e in queue if id(e) not in gone]
        rows = 0
        for e in taken:
            rows += e.rows
        if queue:
            self._bucket_rows[bucket] -= rows
            oldest = queue[0].enqueued_at if len(queue) == 1 else min(e.enqueued_at for e in queue)
            self._bucket_due[bucket] = oldest + self._config.max_delay_s
        else:
            del self._buckets[bucket]
            del self._bucket_rows[bucket]
            del self._bucket_due[bucket]
        self.queued_rows -= rows
        self.queued_requests -= n
        if self._with_deadline:
            self._with_deadline -= sum(1 for e in taken if e.deadline is not None)
