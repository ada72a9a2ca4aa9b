"""The pure collation policy, driven by a fake clock: every ``now`` below is a number we choose."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetserve.batching.collator import Batch, Collator, Pending
from fleetserve.batching.config import BatcherConfig
from fleetserve.errors import Overloaded

DELAY = 0.010


def make(**kwargs: Any) -> Collator[str]:
    kwargs.setdefault("max_batch", 4)
    kwargs.setdefault("max_delay_s", DELAY)
    return Collator(BatcherConfig(**kwargs))


def push(
    c: Collator[str],
    name: str,
    *,
    rows: int = 1,
    bucket: int = 16,
    priority: int = 1,
    now: float = 0.0,
    deadline: float | None = None,
) -> Pending[str]:
    return c.push(name, rows=rows, bucket=bucket, priority=priority, now=now, deadline=deadline)


def names(batch: Batch[str] | None) -> list[str]:
    assert batch is not None
    return [e.payload for e in batch.entries]


def test_a_lone_request_waits_for_max_delay_then_goes() -> None:
    c = make()
    push(c, "a", now=0.0)
    early = c.poll(0.004)
    assert early.batch is None
    assert early.wake_at == pytest.approx(DELAY)
    assert names(c.poll(DELAY).batch) == ["a"]
    assert c.queued_requests == 0


def test_the_delay_counts_from_the_oldest_request_of_the_bucket() -> None:
    c = make()
    push(c, "a", now=0.0)
    push(c, "b", now=0.008)
    assert c.poll(0.009).batch is None
    assert names(c.poll(DELAY).batch) == ["a", "b"]


def test_a_full_batch_goes_at_once_and_the_rest_waits() -> None:
    c = make(max_batch=4)
    for i in range(5):
        push(c, f"r{i}")
    decision = c.poll(0.0)
    assert names(decision.batch) == ["r0", "r1", "r2", "r3"]
    assert decision.batch is not None and decision.batch.rows == 4
    assert c.queued_rows == 1
    assert c.poll(0.0).batch is None


def test_multi_row_requests_never_exceed_max_batch() -> None:
    c = make(max_batch=4)
    push(c, "three", rows=3)
    push(c, "two", rows=2)
    push(c, "one", rows=1)
    decision = c.poll(0.0)
    # "two" does not fit next to "three"; "one" does, and "two" leads the next batch.
    assert names(decision.batch) == ["three", "one"]
    assert names(c.poll(DELAY).batch) == ["two"]


def test_zero_delay_sends_whatever_is_queued() -> None:
    c = make(max_delay_s=0.0)
    push(c, "a")
    assert names(c.poll(0.0).batch) == ["a"]


def test_the_largest_preferred_size_reached_goes_at_once() -> None:
    c = make(max_batch=8, preferred_batch_sizes=(2, 4))
    push(c, "a")
    assert c.poll(0.0).batch is None
    for name in "bcd":
        push(c, name)
    push(c, "e")
    assert names(c.poll(0.0).batch) == ["a", "b", "c", "d"]
    # One left: 1 is not a preferred size, so it waits for its delay.
    assert c.poll(0.0).batch is None
    assert names(c.poll(DELAY).batch) == ["e"]


def test_batches_never_grow_past_the_largest_preferred_size() -> None:
    c = make(max_batch=8, preferred_batch_sizes=(4,))
    push(c, "a", rows=3)
    push(c, "b", rows=3)
    # 3 + 3 > 4: the batch cannot grow into a preferred size, so "a" goes alone right away.
    assert names(c.poll(0.0).batch) == ["a"]
    assert c.poll(0.0).batch is None
    assert names(c.poll(DELAY).batch) == ["b"]


def test_a_request_larger_than_the_preferred_sizes_still_runs() -> None:
    c = make(max_batch=8, preferred_batch_sizes=(2,))
    push(c, "big", rows=6)
    push(c, "small")
    assert names(c.poll(0.0).batch) == ["big"]


def test_buckets_are_batched_apart() -> None:
    c = make(promote_overdue=False)
    push(c, "long", bucket=64, now=0.0)
    push(c, "short", bucket=16, now=0.001)
    first = c.poll(0.02).batch
    assert names(first) == ["long"]
    assert first is not None and first.seq == 64
    second = c.poll(0.02).batch
    assert names(second) == ["short"]
    assert second is not None and second.seq == 16


def test_a_short_request_not_yet_overdue_does_not_ride_in_a_long_batch() -> None:
    c = make()
    push(c, "long", bucket=64, now=0.0)
    push(c, "short", bucket=16, now=0.005)
    decision = c.poll(DELAY)
    assert names(decision.batch) == ["long"]
    assert decision.wake_at == pytest.approx(0.005 + DELAY)


def test_an_overdue_short_request_rides_in_spare_rows_of_a_long_batch() -> None:
    c = make(max_batch=4, promote_overdue=True)
    push(c, "long", bucket=64, rows=3, now=0.0)
    push(c, "short1", bucket=16, now=0.001)
    push(c, "short2", bucket=16, now=0.002)
    batch = c.poll(0.02).batch
    assert names(batch) == ["long", "short1"]
    assert batch is not None and batch.seq == 64
    assert names(c.poll(0.02).batch) == ["short2"]


def test_a_long_request_never_rides_in_a_short_batch() -> None:
    c = make()
    push(c, "short", bucket=16, now=0.0)
    push(c, "long", bucket=64, now=0.001)
    assert names(c.poll(0.02).batch) == ["short"]
    assert names(c.poll(0.02).batch) == ["long"]


def test_high_priority_goes_first_within_a_bucket() -> None:
    c = make(max_batch=2)
    push(c, "low1", priority=1, now=0.0)
    push(c, "low2", priority=1, now=0.001)
    push(c, "high", priority=0, now=0.002)
    assert names(c.poll(0.0).batch) == ["high", "low1"]


def test_high_priority_bucket_goes_first_when_several_are_ready() -> None:
    c = make(promote_overdue=False)
    push(c, "low", bucket=16, priority=1, now=0.0)
    push(c, "high", bucket=64, priority=0, now=0.001)
    assert names(c.poll(0.02).batch) == ["high"]
    assert names(c.poll(0.02).batch) == ["low"]


def test_oldest_goes_first_among_equal_priorities() -> None:
    c = make(promote_overdue=False)
    push(c, "newer", bucket=16, now=0.001)
    push(c, "older", bucket=64, now=0.0)
    assert names(c.poll(0.02).batch) == ["older"]


def test_an_expired_request_is_reported_and_never_dispatched() -> None:
    c = make()
    push(c, "keep", now=0.0)
    push(c, "late", now=0.0, deadline=0.005)
    first = c.poll(0.0)
    assert first.wake_at == pytest.approx(0.005)
    decision = c.poll(0.005)
    assert [e.payload for e in decision.expired] == ["late"]
    assert decision.batch is None
    assert names(c.poll(DELAY).batch) == ["keep"]
    assert c.queued_requests == 0


def test_expiry_comes_before_dispatch_at_the_same_instant() -> None:
    c = make(max_batch=1)
    push(c, "late", now=0.0, deadline=0.001)
    decision = c.poll(0.001)
    assert decision.batch is None
    assert [e.payload for e in decision.expired] == ["late"]


def test_the_queue_is_bounded_in_rows() -> None:
    c = make(max_batch=4, max_queue=4)
    push(c, "a", rows=3)
    with pytest.raises(Overloaded, match="queue full: 3 of 4 rows"):
        push(c, "b", rows=2)
    push(c, "c", rows=1)
    assert (c.queued_rows, c.queued_requests) == (4, 2)
    c.poll(0.0)
    assert c.queued_rows == 0
    push(c, "d", rows=4)


def test_nothing_is_dispatched_without_a_free_instance_but_expiry_still_happens() -> None:
    c = make(max_batch=1)
    push(c, "ready", now=0.0)
    push(c, "late", now=0.0, deadline=0.003)
    busy = c.poll(0.0, can_dispatch=False)
    assert busy.batch is None
    # The ready bucket needs a free instance, not a timer; only the deadline wakes us.
    assert busy.wake_at == pytest.approx(0.003)
    assert [e.payload for e in c.poll(0.003, can_dispatch=False).expired] == ["late"]
    assert names(c.poll(0.003).batch) == ["ready"]


def test_wake_at_is_now_while_more_batches_are_ready() -> None:
    c = make(max_batch=1)
    push(c, "a")
    push(c, "b")
    decision = c.poll(0.5)
    assert names(decision.batch) == ["a"]
    assert decision.wake_at == 0.5


def test_wake_at_is_none_on_an_empty_queue() -> None:
    assert make().poll(1.0).wake_at is None


def test_flush_sends_everything_without_waiting() -> None:
    c = make(promote_overdue=False)
    push(c, "a", bucket=16)
    push(c, "b", bucket=64)
    assert names(c.poll(0.0, flush=True).batch) == ["a"]
    assert names(c.poll(0.0, flush=True).batch) == ["b"]


def test_remove_takes_a_queued_request_out_once() -> None:
    c = make()
    entry = push(c, "gone", rows=2)
    assert c.remove(entry)
    assert (c.queued_rows, c.queued_requests) == (0, 0)
    assert not c.remove(entry)
    assert c.poll(1.0).batch is None


def test_clear_returns_everything() -> None:
    c = make()
    push(c, "a", bucket=16)
    push(c, "b", bucket=64)
    assert sorted(e.payload for e in c.clear()) == ["a", "b"]
    assert c.queued_rows == 0


def test_push_rejects_rows_beyond_max_batch() -> None:
    with pytest.raises(ValueError, match=r"rows must be in 1\.\.4"):
        push(make(max_batch=4), "x", rows=5)


requests = st.lists(
    st.tuples(
        st.integers(1, 4),  # rows
        st.sampled_from([16, 32, 64]),  # bucket
        st.integers(0, 1),  # priority
        st.floats(0.0, 0.05),  # arrival gap
        st.one_of(st.none(), st.floats(0.001, 0.05)),  # timeout
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(requests, st.sampled_from([(), (2,), (2, 4)]), st.booleans())
def test_every_request_is_dispatched_or_expired_exactly_once(
    reqs: list[tuple[int, int, int, float, float | None]], preferred: tuple[int, ...], promote: bool
) -> None:
    c = make(max_batch=4, max_queue=1000, preferred_batch_sizes=preferred, promote_overdue=promote)
    now = 0.0
    seen: list[int] = []
    expired: list[int] = []

    def record(batch: Batch[str] | None) -> None:
        if batch is None:
            return
        assert 1 <= batch.rows <= 4
        assert all(e.bucket <= batch.seq for e in batch.entries)
        assert batch.seq in {e.bucket for e in batch.entries}
        for e in batch.entries:
            assert e.deadline is None or e.deadline > now
            seen.append(int(e.payload))

    for i, (rows, bucket, priority, gap, timeout) in enumerate(reqs):
        now += gap
        decision = c.poll(now)
        expired.extend(int(e.payload) for e in decision.expired)
        record(decision.batch)
        deadline = None if timeout is None else now + timeout
        push(c, str(i), rows=rows, bucket=bucket, priority=priority, now=now, deadline=deadline)
    while c.queued_requests:
        decision = c.poll(now)
        expired.extend(int(e.payload) for e in decision.expired)
        record(decision.batch)
        if decision.batch is None and c.queued_requests:
            assert decision.wake_at is not None and decision.wake_at > now
            now = decision.wake_at
    assert sorted(seen + expired) == list(range(len(reqs)))
