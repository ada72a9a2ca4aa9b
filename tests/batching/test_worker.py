"""The Batcher's worker loop on a real tiny ONNX encoder run by onnxruntime (see conftest.py).

These tests run real threads, so they wait on events and futures (bounded by timeouts), never on
sleeps standing in for logic.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest

from fleetserve.batching import Batcher, BatcherConfig
from fleetserve.errors import InvalidInput, NotReady, Overloaded, RequestExpired
from tests.support.tiny_encoder import HIDDEN, Gate, TinyEngine
from tests.support.waiting import until

MakeBatcher = Callable[..., Batcher]
MakeRequest = Callable[..., dict[str, np.ndarray]]
Reference = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


class RecordingObserver:
    def __init__(self) -> None:
        self.batches: list[tuple[int, int, list[float], float]] = []
        self.expired = 0
        self.rejected = 0
        self.cancelled = 0

    def on_batch(self, size: int, seq: int, queue_wait_s: list[float], compute_s: float) -> None:
        self.batches.append((size, seq, queue_wait_s, compute_s))

    def on_expired(self, n: int) -> None:
        self.expired += n

    def on_rejected(self) -> None:
        self.rejected += 1

    def on_cancelled(self, n: int) -> None:
        self.cancelled += n


async def held(gate: Gate) -> None:
    """Wait until an engine call is being held by the gate (its instance is busy)."""
    assert await asyncio.to_thread(gate.started.wait, 10)


@pytest.mark.parametrize("pad_to", ["longest", "bucket"])
async def test_mixed_lengths_batched_equal_each_request_alone(
    make_batcher: MakeBatcher, make_request: MakeRequest, reference: Reference, engine: TinyEngine, pad_to: str
) -> None:
    observer = RecordingObserver()
    batcher = make_batcher(max_batch=8, max_delay_s=0.05, observer=observer, pad_to=pad_to)
    await batcher.start()
    rng = np.random.default_rng(3)
    requests = [make_request(int(rng.integers(1, 4)), int(rng.integers(1, 65))) for _ in range(30)]
    results = await asyncio.gather(*(batcher.submit(r) for r in requests))
    for request, result in zip(requests, results, strict=True):
        alone = reference(request)
        rows, seq = request["input_ids"].shape
        assert result["last_hidden_state"].shape == (rows, seq, HIDDEN)
        assert result["sentence_embedding"].shape == (rows, HIDDEN)
        for name in ("last_hidden_state", "sentence_embedding"):
            np.testing.assert_allclose(result[name], alone[name], rtol=1e-5, atol=1e-6)
    assert len(engine.calls) < len(requests)  # they really were batched
    assert all(rows <= 8 and seq <= 64 for rows, seq in engine.calls)
    if pad_to == "bucket":
        assert all(seq in (8, 16, 32, 64) for _, seq in engine.calls)
    assert sum(size for size, *_ in observer.batches) == sum(r["input_ids"].shape[0] for r in requests)
    assert all(len(waits) >= 1 and compute >= 0 for _, _, waits, compute in observer.batches)


async def test_short_queries_are_not_padded_to_a_long_document(
    make_batcher: MakeBatcher, make_request: MakeRequest, engine: TinyEngine
) -> None:
    batcher = make_batcher(max_batch=8, max_delay_s=0.01)
    await batcher.start()
    await asyncio.gather(batcher.submit(make_request(2, 5)), batcher.submit(make_request(1, 60)))
    # Grouped by bucket, each batch padded only to its own longest request.
    assert sorted(engine.calls) == [(1, 60), (2, 5)]


@pytest.mark.parametrize(
    ("pad_to", "seq_buckets"), [("longest", None), ("bucket", (64,))], ids=["longest", "fixed-64"]
)
async def test_padding_modes_keep_batched_equal_to_alone(
    make_batcher: MakeBatcher,
    make_request: MakeRequest,
    reference: Reference,
    engine: TinyEngine,
    pad_to: str,
    seq_buckets: tuple[int, ...] | None,
) -> None:
    observer = RecordingObserver()
    batcher = make_batcher(max_batch=8, max_delay_s=0.05, pad_to=pad_to, seq_buckets=seq_buckets, observer=observer)
    await batcher.start()
    rng = np.random.default_rng(5)
    requests = [make_request(int(rng.integers(1, 4)), int(rng.integers(1, 65))) for _ in range(30)]
    results = await asyncio.gather(*(batcher.submit(r) for r in requests))
    for request, result in zip(requests, results, strict=True):
        alone = reference(request)
        assert result["last_hidden_state"].shape[:2] == request["input_ids"].shape
        for name in ("last_hidden_state", "sentence_embedding"):
            np.testing.assert_allclose(result[name], alone[name], rtol=1e-5, atol=1e-6)
    assert len(engine.calls) < len(requests)
    if seq_buckets is not None:
        assert {seq for _, seq in engine.calls} == set(seq_buckets)
    else:
        # Request ids are never 0, so a padded batch's last column is real tokens of its longest request.
        assert all((ids[:, -1] != 0).any() for ids in engine.fed_ids)
    assert [seq for _, seq, *_ in observer.batches] == [seq for _, seq in engine.calls]


async def test_longest_padding_batches_all_lengths_together(
    make_batcher: MakeBatcher, make_request: MakeRequest, engine: TinyEngine
) -> None:
    batcher = make_batcher(max_batch=8, max_delay_s=0.01, group_by_length=False)
    await batcher.start()
    await asyncio.gather(batcher.submit(make_request(2, 5)), batcher.submit(make_request(1, 40)))
    assert engine.calls == [(3, 40)]


async def test_two_instances_run_batches_concurrently(
    make_batcher: MakeBatcher, make_request: MakeRequest, engine: TinyEngine
) -> None:
    # Each engine call waits for a second one to be running; with one instance at a time this breaks.
    barrier = threading.Barrier(2, timeout=10)

    def wait_for_the_other(inputs: Mapping[str, np.ndarray]) -> None:
        barrier.wait()

    engine.before = wait_for_the_other
    batcher = make_batcher(instances=2, max_batch=8, max_delay_s=0.0)
    await batcher.start()
    # Different buckets, so they are two batches; only two instances can hold both at once.
    await asyncio.gather(batcher.submit(make_request(1, 4)), batcher.submit(make_request(1, 40)))
    assert engine.max_concurrent == 2


async def test_drain_finishes_everything_accepted_then_refuses(
    make_batcher: MakeBatcher, make_request: MakeRequest
) -> None:
    batcher = make_batcher(instances=2, max_batch=4, max_delay_s=0.5)
    await batcher.start()
    tasks = [asyncio.create_task(batcher.submit(make_request(1, 3 + 2 * i))) for i in range(25)]
    await until(lambda: batcher.queue_depth + batcher.inflight + sum(t.done() for t in tasks) == 25,
                what="every request was accepted")
    await batcher.drain(10)
    results = await asyncio.gather(*tasks)
    assert all(r["sentence_embedding"].shape == (1, HIDDEN) for r in results)
    assert (batcher.queue_depth, batcher.inflight, batcher.accepting) == (0, 0, False)
    with pytest.raises(NotReady, match="draining"):
        await batcher.submit(make_request(1, 3))


async def test_drain_timeout_answers_what_is_still_queued(
    make_batcher: MakeBatcher, make_request: MakeRequest, gate: Gate
) -> None:
    batcher = make_batcher(max_batch=1, max_delay_s=0.0)
    await batcher.start()
    running = asyncio.create_task(batcher.submit(make_request(1, 3)))
    await held(gate)
    queued = asyncio.create_task(batcher.submit(make_request(1, 3)))
    await until(lambda: batcher.queue_depth == 1, what="the second request is queued")
    await batcher.drain(0.05)
    with pytest.raises(NotReady, match="stopped before this request ran"):
        await queued
    gate.release.set()
    assert (await running)["sentence_embedding"].shape == (1, HIDDEN)


async def test_a_full_queue_rejects_at_once(
    make_batcher: MakeBatcher, make_request: MakeRequest, gate: Gate, engine: TinyEngine
) -> None:
    observer = RecordingObserver()
    batcher = make_batcher(max_batch=2, max_queue=2, max_delay_s=0.0, observer=observer, pad_to="bucket")
    await batcher.start()
    running = asyncio.create_task(batcher.submit(make_request(1, 3)))
    await held(gate)
    queued = asyncio.create_task(batcher.submit(make_request(2, 3)))
    await until(lambda: batcher.queue_depth == 2, what="the two-row request is queued")
    assert batcher.inflight == 1
    started = time.monotonic()
    with pytest.raises(Overloaded, match="queue full") as error:
        await batcher.submit(make_request(1, 3))
    assert time.monotonic() - started < 0.5
    assert error.value.retry_after_s is not None
    assert observer.rejected == 1
    gate.release.set()
    await asyncio.gather(running, queued)
    assert engine.calls == [(1, 8), (2, 8)]


async def test_an_expired_request_is_never_executed(
    make_batcher: MakeBatcher, make_request: MakeRequest, gate: Gate, engine: TinyEngine
) -> None:
    observer = RecordingObserver()
    batcher = make_batcher(max_batch=1, max_delay_s=0.0, observer=observer)
    await batcher.start()
    running = asyncio.create_task(batcher.submit(make_request(1, 3)))
    await held(gate)
    with pytest.raises(RequestExpired, match="past its timeout"):
        await batcher.submit(make_request(1, 3, first_id=49), timeout_s=0.05)
    assert observer.expired == 1
    gate.release.set()
    await running
    await batcher.submit(make_request(1, 3))
    assert len(engine.calls) == 2
    assert all(ids[0, 0] != 49 for ids in engine.fed_ids)


async def test_default_timeout_applies_to_requests_without_one(
    make_batcher: MakeBatcher, make_request: MakeRequest, gate: Gate
) -> None:
    batcher = make_batcher(max_batch=1, max_delay_s=0.0, default_timeout_s=0.05)
    await batcher.start()
    running = asyncio.create_task(batcher.submit(make_request(1, 3), timeout_s=10))
    await held(gate)
    with pytest.raises(RequestExpired):
        await batcher.submit(make_request(1, 3))
    gate.release.set()
    await running


async def test_high_priority_runs_before_queued_default_priority(
    make_batcher: MakeBatcher, make_request: MakeRequest, gate: Gate, engine: TinyEngine
) -> None:
    batcher = make_batcher(max_batch=1, max_delay_s=0.0)
    await batcher.start()
    first = asyncio.create_task(batcher.submit(make_request(1, 3, first_id=1)))
    await held(gate)
    low = asyncio.create_task(batcher.submit(make_request(1, 3, first_id=2)))
    high = asyncio.create_task(batcher.submit(make_request(1, 3, first_id=3), priority=0))
    await until(lambda: batcher.queue_depth == 2, what="both requests are queued")
    gate.release.set()
    await asyncio.gather(first, low, high)
    assert [int(ids[0, 0]) for ids in engine.fed_ids] == [1, 3, 2]


async def test_an_engine_error_fails_only_its_batch(
    make_batcher: MakeBatcher, make_request: MakeRequest, engine: TinyEngine
) -> None:
    def fail_short(inputs: Mapping[str, np.ndarray]) -> None:
        if inputs["input_ids"].shape[1] == 8:
            raise ValueError("device lost")

    engine.before = fail_short
    batcher = make_batcher(max_batch=8, max_delay_s=0.01, pad_to="bucket")
    await batcher.start()
    outcomes: list[Any] = await asyncio.gather(
        batcher.submit(make_request(1, 4)), batcher.submit(make_request(1, 40)), return_exceptions=True
    )
    failed, served = outcomes
    assert isinstance(failed, ValueError) and str(failed) == "device lost"
    assert isinstance(served, dict) and served["last_hidden_state"].shape == (1, 40, HIDDEN)
    engine.before = None
    assert (await batcher.submit(make_request(1, 4)))["sentence_embedding"].shape == (1, HIDDEN)


async def test_warmup_runs_every_shape_on_every_instance(make_batcher: MakeBatcher, engine: TinyEngine) -> None:
    batcher = make_batcher(instances=2, max_batch=4, preferred_batch_sizes=(3,))
    await batcher.start()
    assert batcher.warmup_shapes == tuple((b, s) for b in (1, 2, 3, 4) for s in (8, 16, 32, 64))
    await batcher.warmup()
    assert sorted(engine.calls) == sorted(batcher.warmup_shapes * 2)


async def test_warmup_runs_only_the_shapes_asked_for(make_batcher: MakeBatcher, engine: TinyEngine) -> None:
    batcher = make_batcher(instances=2, max_batch=4)
    await batcher.start()
    await batcher.warmup([(1, 8)])
    assert engine.calls == [(1, 8), (1, 8)]


async def test_requests_wait_while_warmup_holds_the_instances(
    make_batcher: MakeBatcher, make_request: MakeRequest, gate: Gate, engine: TinyEngine
) -> None:
    batcher = make_batcher(max_batch=1, max_delay_s=0.0, seq_buckets=(8,), pad_to="bucket")
    await batcher.start()
    warming = asyncio.create_task(batcher.warmup())
    await held(gate)
    request = asyncio.create_task(batcher.submit(make_request(1, 3)))
    await until(lambda: batcher.queue_depth == 1, what="the request is queued")
    for _ in range(5):  # loop turns (not time) in which the scheduler would dispatch it, if it wrongly would
        await asyncio.sleep(0)
    assert batcher.queue_depth == 1
    gate.release.set()
    await warming
    assert (await request)["sentence_embedding"].shape == (1, HIDDEN)
    assert engine.calls == [(1, 8), (1, 8)]


async def test_a_cancelled_request_leaves_the_queue(
    make_batcher: MakeBatcher, make_request: MakeRequest, gate: Gate, engine: TinyEngine
) -> None:
    batcher = make_batcher(max_batch=1, max_delay_s=0.0)
    await batcher.start()
    running = asyncio.create_task(batcher.submit(make_request(1, 3)))
    await held(gate)
    abandoned = asyncio.create_task(batcher.submit(make_request(1, 3)))
    await until(lambda: batcher.queue_depth == 1, what="the request is queued")
    abandoned.cancel()
    with pytest.raises(asyncio.CancelledError):
        await abandoned
    assert batcher.queue_depth == 0
    gate.release.set()
    await running
    assert len(engine.calls) == 1


async def test_a_cancelled_request_is_counted_once_and_never_run(
    make_batcher: MakeBatcher, make_request: MakeRequest, gate: Gate, engine: TinyEngine
) -> None:
    observer = RecordingObserver()
    batcher = make_batcher(max_batch=1, max_delay_s=0.0, observer=observer)
    await batcher.start()
    running = asyncio.create_task(batcher.submit(make_request(1, 3)))
    await held(gate)
    abandoned = [asyncio.create_task(batcher.submit(make_request(1, 3, first_id=49))) for _ in range(3)]
    await asyncio.sleep(0)
    for task in abandoned:
        task.cancel()
    await asyncio.gather(*abandoned, return_exceptions=True)
    running.cancel()  # already running: its batch finishes, but it left no queue entry to count
    gate.release.set()
    await asyncio.gather(running, return_exceptions=True)
    await batcher.submit(make_request(1, 3))
    assert observer.cancelled == 3
    assert len(engine.calls) == 2 and all(ids[0, 0] != 49 for ids in engine.fed_ids)


async def test_a_deadline_earlier_than_the_timeout_expires_the_request_unrun(
    make_batcher: MakeBatcher, make_request: MakeRequest, gate: Gate, engine: TinyEngine
) -> None:
    observer = RecordingObserver()
    batcher = make_batcher(max_batch=1, max_delay_s=0.0, observer=observer)
    await batcher.start()
    running = asyncio.create_task(batcher.submit(make_request(1, 3)))
    await held(gate)
    # The 50 ms deadline, not the 10 s timeout, applies (less what validation took on a loaded machine).
    with pytest.raises(RequestExpired, match=r"past its timeout of 0\.0[0-5]"):
        await batcher.submit(make_request(1, 3, first_id=49), timeout_s=10, deadline=time.monotonic() + 0.05)
    assert observer.expired == 1 and batcher.queue_depth == 0
    gate.release.set()
    await running
    assert len(engine.calls) == 1


async def test_a_deadline_already_passed_is_refused_without_queueing(
    make_batcher: MakeBatcher, make_request: MakeRequest, engine: TinyEngine
) -> None:
    observer = RecordingObserver()
    batcher = make_batcher(max_batch=1, max_delay_s=0.0, observer=observer)
    await batcher.start()
    with pytest.raises(RequestExpired, match="deadline passed"):
        await batcher.submit(make_request(1, 3), deadline=time.monotonic() - 0.001)
    assert observer.expired == 1 and engine.calls == []
    # A later deadline than the timeout leaves the timeout in charge; the request runs.
    await batcher.submit(make_request(1, 3), timeout_s=5, deadline=time.monotonic() + 60)
    assert len(engine.calls) == 1


@pytest.mark.parametrize(
    ("seq", "change", "kwargs", "message"),
    [
        (3, {"attention_mask": np.ones((1, 3), np.float64)}, {}, "'attention_mask' has dtype float64"),
        (65, {}, {}, "'input_ids' has sequence length 65; the maximum is 64"),
        (3, {}, {"priority": 2}, "priority must be an integer in 0..1"),
        (3, {}, {"timeout_s": -1.0}, "timeout must be a positive number"),
    ],
)
async def test_invalid_requests_are_refused_with_the_reason(
    make_batcher: MakeBatcher,
    make_request: MakeRequest,
    seq: int,
    change: dict[str, np.ndarray],
    kwargs: dict[str, Any],
    message: str,
) -> None:
    batcher = make_batcher(max_batch=8)
    await batcher.start()
    with pytest.raises(InvalidInput, match=message):
        await batcher.submit({**make_request(1, seq), **change}, **kwargs)
    assert batcher.queue_depth == 0


async def test_submit_before_start_is_not_ready(make_batcher: MakeBatcher, make_request: MakeRequest) -> None:
    observer = RecordingObserver()
    batcher = make_batcher(observer=observer, max_batch=8)
    with pytest.raises(NotReady, match="not running"):
        await batcher.submit(make_request(1, 3))
    assert observer.rejected == 1
    await batcher.start()
    with pytest.raises(RuntimeError, match="already started"):
        await batcher.start()


def test_config_must_fit_the_engine_profile(engine: TinyEngine) -> None:
    with pytest.raises(ValueError, match="max_batch 16 exceeds the engine profile's 8"):
        Batcher(engine, BatcherConfig(max_batch=16))
    with pytest.raises(ValueError, match="seq bucket 128 exceeds the engine profile's max_seq 64"):
        Batcher(engine, BatcherConfig(max_batch=8, seq_buckets=(16, 128)))
    with pytest.raises(ValueError, match="instances must be a positive integer"):
        Batcher(engine, BatcherConfig(max_batch=8), instances=0)


async def test_a_batch_asks_the_engine_only_for_the_outputs_its_requests_need(
    make_batcher: MakeBatcher, make_request: MakeRequest, engine: TinyEngine
) -> None:
    batcher = make_batcher(max_batch=8, max_delay_s=0.01)
    await batcher.start()
    only = await batcher.submit(make_request(1, 5), outputs=["sentence_embedding"])
    assert set(only) == {"sentence_embedding"}
    assert engine.requested_outputs[-1] == ("sentence_embedding",)
    # One request wanting everything makes the whole batch fetch everything.
    both = await asyncio.gather(
        batcher.submit(make_request(1, 5), outputs=["sentence_embedding"]), batcher.submit(make_request(1, 5))
    )
    assert engine.requested_outputs[-1] is None
    assert set(both[1]) == {"sentence_embedding", "last_hidden_state"}
    with pytest.raises(InvalidInput, match="unknown outputs"):
        await batcher.submit(make_request(1, 5), outputs=["logits"])


class AwaitedInstance:
    """A tiny-engine instance that also offers ``infer_async`` (as a front end's link to its engine process
    does), recording on which thread each kind of call ran."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.threads: list[tuple[str, threading.Thread]] = []

    def infer(self, inputs: Mapping[str, np.ndarray], outputs: Any = None) -> dict[str, np.ndarray]:
        self.threads.append(("infer", threading.current_thread()))
        return self.inner.infer(inputs, outputs)

    async def infer_async(self, inputs: Mapping[str, np.ndarray], outputs: Any = None) -> dict[str, np.ndarray]:
        self.threads.append(("infer_async", threading.current_thread()))
        await asyncio.sleep(0)  # suspends once, as a call waiting on a socket does; no time passes
        return self.inner.infer(inputs, outputs)


async def test_an_async_instance_is_awaited_on_the_loop_and_warmed_from_a_thread(
    engine: TinyEngine, make_request: MakeRequest, reference: Reference
) -> None:
    made: list[AwaitedInstance] = []
    plain = engine.instance

    def instance() -> AwaitedInstance:
        made.append(AwaitedInstance(plain()))
        return made[-1]

    engine.instance = instance  # type: ignore[method-assign]
    batcher = Batcher(engine, BatcherConfig(max_batch=8, max_delay_s=0.02))
    await batcher.start()
    try:
        await batcher.warmup([(1, 8)])
        requests = [make_request(1, 12) for _ in range(6)]
        results = await asyncio.gather(*(batcher.submit(r) for r in requests))
        for request, result in zip(requests, results, strict=True):
            np.testing.assert_allclose(result["sentence_embedding"], reference(request)["sentence_embedding"],
                                       rtol=1e-5, atol=1e-6)
    finally:
        await batcher.drain(5)
    (awaited,) = made
    assert awaited.threads[0][0] == "infer" and awaited.threads[0][1] is not threading.current_thread()
    served = awaited.threads[1:]
    assert served and all(kind == "infer_async" and thread is threading.current_thread() for kind, thread in served)
    assert len(served) < len(requests)  # batched
