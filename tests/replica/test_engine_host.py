"""The engine process's side of ``serve --frontends N`` (``fleetserve.replica.engine_host``): an
:class:`EngineHost` on a Unix socket, over a small fake engine, serving :class:`RemoteEngine` connections as the
front ends' batch slots do — answers, merging of waiting batches, errors. In this process, on threads."""

from __future__ import annotations

import concurrent.futures
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from fleetserve.batching.observer import NullObserver
from fleetserve.engine.base import EngineInstance, ShapeProfile, TensorSpec
from fleetserve.errors import FleetserveError, InvalidInput, NotReady
from fleetserve.replica.engine_host import EngineHost
from fleetserve.replica.engine_link import PREFIX, RemoteEngine, encode
from tests.support.waiting import until_sync

PROFILE = ShapeProfile(max_batch=4, max_seq=16, seq_buckets=(8, 16), batch_buckets=(1, 2, 4))


@dataclass
class EchoEngine:
    """An Engine whose outputs are simple functions of ``input_ids``: ``doubled`` (cut back to each batch's
    length) and ``total`` (per row). Records every call; ``hold_next`` holds the next call until ``release``;
    ``fail`` makes calls raise."""

    inputs: Sequence[TensorSpec] = (TensorSpec("input_ids", "INT64", (-1, -1)),)
    outputs: Sequence[TensorSpec] = (TensorSpec("doubled", "INT64", (-1, -1)), TensorSpec("total", "FP32", (-1,)))
    profile: ShapeProfile = PROFILE
    device: str = "cpu"
    calls: list[np.ndarray] = field(default_factory=list)
    requested: list[tuple[str, ...] | None] = field(default_factory=list)
    hold_next: bool = False
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    fail: Exception | None = None

    def instance(self) -> EngineInstance:
        return EchoInstance(self)

    def close(self) -> None:
        pass


@dataclass
class EchoInstance:
    engine: EchoEngine

    def infer(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        engine = self.engine
        ids = np.array(inputs["input_ids"])
        engine.calls.append(ids)
        engine.requested.append(None if outputs is None else tuple(outputs))
        if engine.hold_next:
            engine.hold_next = False
            engine.held.set()
            assert engine.release.wait(10), "the test never released the held engine call"
        if engine.fail is not None:
            raise engine.fail
        result = {"doubled": ids * 2, "total": ids.sum(axis=1).astype(np.float32)}
        return result if outputs is None else {name: result[name] for name in outputs}


class RecordingObserver(NullObserver):
    def __init__(self) -> None:
        self.batches: list[tuple[int, int, int]] = []  # rows, seq, front-end batches merged

    def on_batch(self, size: int, seq: int, queue_wait_s: list[float], compute_s: float) -> None:
        assert compute_s >= 0 and all(wait >= 0 for wait in queue_wait_s)
        self.batches.append((size, seq, len(queue_wait_s)))


@dataclass
class Host:
    engine: EchoEngine
    host: EngineHost
    observer: RecordingObserver
    remote: RemoteEngine

    def connect(self) -> EngineInstance:
        """A new connection, as one batch slot of a front end has."""
        return self.remote.instance()


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # Not tmp_path: a Unix socket's path must fit in 108 bytes, and pytest's can be longer.
    path = Path(tempfile.mkdtemp(prefix="fs-host-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def start_host(socket_dir: Path) -> Iterator[Callable[..., Host]]:
    started: list[Host] = []

    def start(*, instances: int = 1) -> Host:
        engine = EchoEngine()
        observer = RecordingObserver()
        host = EngineHost(engine, str(socket_dir / f"engine-{len(started)}.sock"), max_batch=4,
                          instances=instances, observer=observer)
        host.start()
        engine.calls.clear()  # the warm-up's
        engine.requested.clear()
        remote = RemoteEngine(host.path, engine.inputs, engine.outputs, engine.profile, engine.device, timeout_s=10)
        started.append(Host(engine, host, observer, remote))
        return started[-1]

    yield start
    for made in started:
        made.engine.release.set()
        made.remote.close()
        made.host.close(5)


def ids(*rows: list[int]) -> dict[str, np.ndarray]:
    return {"input_ids": np.array(rows, dtype=np.int64)}


def test_warm_up_runs_every_instance_on_every_shape_before_listening(socket_dir: Path) -> None:
    engine = EchoEngine()
    host = EngineHost(engine, str(socket_dir / "engine.sock"), max_batch=4, instances=2)
    assert host.warmup_shapes == ((1, 8), (1, 16), (2, 8), (2, 16), (4, 8), (4, 16))
    assert not (socket_dir / "engine.sock").exists()
    host.start()
    try:
        assert sorted(call.shape for call in engine.calls) == sorted(2 * list(host.warmup_shapes))
        assert (socket_dir / "engine.sock").exists()
    finally:
        host.close(5)


def test_a_remote_instance_gets_the_engine_processs_answer(start_host: Callable[..., Host]) -> None:
    link = start_host()
    instance = link.connect()
    answer = instance.infer(ids([1, 2, 3], [4, 5, 6]))
    assert set(answer) == {"doubled", "total"}
    np.testing.assert_array_equal(answer["doubled"], [[2, 4, 6], [8, 10, 12]])
    assert answer["doubled"].dtype == np.int64
    np.testing.assert_array_equal(answer["total"], np.array([6, 15], dtype=np.float32))
    assert answer["total"].dtype == np.float32
    # The same connection serves the next batch, and the engine is asked only for the outputs named.
    again = instance.infer(ids([7]), ["total"])
    assert list(again) == ["total"]
    np.testing.assert_array_equal(again["total"], [7.0])
    assert link.engine.requested == [None, ("total",)]
    assert link.observer.batches == [(2, 3, 1), (1, 1, 1)]


def test_batches_of_connections_that_wait_are_merged_into_one_engine_call(start_host: Callable[..., Host]) -> None:
    link = start_host()
    link.engine.hold_next = True
    first, second, third = link.connect(), link.connect(), link.connect()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        busy = pool.submit(first.infer, ids([1, 1, 1]))
        assert link.engine.held.wait(10)  # the engine is running the first batch
        fives = pool.submit(second.infer, ids([5, 5]))
        sevens = pool.submit(third.infer, ids([7, 7, 7], [7, 7, 7]))
        # White-box: nothing public says a frame was received and queued.
        until_sync(lambda: len(link.host._pending) == 2, 10, what="both waiting batches queued in the engine process")
        link.engine.release.set()
        answers = [f.result(10) for f in (busy, fives, sevens)]
    assert len(link.engine.calls) == 2
    merged = link.engine.calls[1]
    assert merged.shape == (3, 3)  # 1 + 2 rows, padded to the longest (3)
    assert sorted(merged[:, 0].tolist()) == [5, 7, 7]
    assert link.observer.batches[1] == (3, 3, 2)
    # Each connection got its own rows back, cut to its own length.
    np.testing.assert_array_equal(answers[0]["doubled"], [[2, 2, 2]])
    np.testing.assert_array_equal(answers[1]["doubled"], [[10, 10]])
    np.testing.assert_array_equal(answers[1]["total"], [10.0])
    np.testing.assert_array_equal(answers[2]["doubled"], [[14, 14, 14], [14, 14, 14]])
    np.testing.assert_array_equal(answers[2]["total"], [21.0, 21.0])


def test_waiting_batches_merge_only_within_max_batch_rows_and_their_sequence_bucket(
        start_host: Callable[..., Host]) -> None:
    link = start_host()
    link.engine.hold_next = True
    slots = [link.connect() for _ in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        busy = pool.submit(slots[0].infer, ids([1]))
        assert link.engine.held.wait(10)
        short = [pool.submit(slots[1].infer, ids([2, 2], [2, 2], [2, 2])),  # 3 rows, bucket 8
                 pool.submit(slots[2].infer, ids([3, 3], [3, 3]))]  # 2 more rows would pass max_batch 4
        until_sync(lambda: len(link.host._pending) == 2, 10, what="two short batches queued")
        long = pool.submit(slots[3].infer, ids([4] * 12))  # bucket 16
        until_sync(lambda: len(link.host._pending) == 3, 10, what="the long batch queued")
        link.engine.release.set()
        for future in (busy, *short, long):
            future.result(10)
    calls = link.engine.calls[1:]
    assert sorted(call.shape for call in calls) == [(1, 12), (2, 2), (3, 2)]
    assert all(len(set(call[:, 0].tolist())) == 1 for call in calls)  # none merged


def test_two_instances_run_two_batches_at_once(start_host: Callable[..., Host]) -> None:
    link = start_host(instances=2)
    link.engine.hold_next = True
    slots = [link.connect(), link.connect()]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        busy = pool.submit(slots[0].infer, ids([1]))
        assert link.engine.held.wait(10)
        # The other instance is free: this batch runs now, not after the held one.
        np.testing.assert_array_equal(slots[1].infer(ids([2]))["doubled"], [[4]])
        assert not busy.done()
        link.engine.release.set()
        np.testing.assert_array_equal(busy.result(10)["doubled"], [[2]])


def test_many_connections_at_once_each_get_their_own_rows(start_host: Callable[..., Host]) -> None:
    link = start_host(instances=2)
    slots = [link.connect() for _ in range(8)]
    def run(n: int) -> None:
        rng = np.random.default_rng(n)
        for _ in range(20):
            rows, seq = int(rng.integers(1, 3)), int(rng.integers(1, 17))
            batch = np.full((rows, seq), n, dtype=np.int64)
            answer = slots[n].infer({"input_ids": batch})
            np.testing.assert_array_equal(answer["doubled"], batch * 2)
            np.testing.assert_array_equal(answer["total"], np.full(rows, n * seq, dtype=np.float32))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for future in [pool.submit(run, n) for n in range(8)]:
            future.result(30)
    assert sum(rows for rows, _, _ in link.observer.batches) == sum(call.shape[0] for call in link.engine.calls)
    assert sum(merged for _, _, merged in link.observer.batches) == 8 * 20


@dataclass
class SlowEngine(EchoEngine):
    """An EchoEngine whose every call takes ``call_s``."""

    call_s: float = 0.005

    def instance(self) -> EngineInstance:
        inner = EchoInstance(self)
        call_s = self.call_s

        class Slow:
            def infer(self, inputs: Mapping[str, np.ndarray],
                      outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
                time.sleep(call_s)
                return inner.infer(inputs, outputs)

        return Slow()


def test_no_connection_starves_while_others_keep_the_engine_busy(socket_dir: Path) -> None:
    engine = SlowEngine()
    host = EngineHost(engine, str(socket_dir / "engine.sock"), max_batch=1, instances=1)
    host.start()
    remote = RemoteEngine(host.path, engine.inputs, engine.outputs, engine.profile, engine.device, timeout_s=30)
    slots = [remote.instance() for _ in range(3)]
    lock = threading.Lock()
    left = [120]  # engine calls, shared: each connection sends batches back to back until they are used up

    def run(slot: EngineInstance) -> int:
        done = 0
        while True:
            with lock:
                if left[0] == 0:
                    return done
                left[0] -= 1
            slot.infer(ids([1]))
            done += 1

    try:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            counts = [f.result(30) for f in [pool.submit(run, slot) for slot in slots]]
    finally:
        remote.close()
        host.close(5)
    # One instance, one row a call, three connections always waiting: each should get about a third of the calls.
    assert min(counts) >= max(counts) // 4, counts


def test_invalid_input_arrives_as_invalid_input_and_the_connection_keeps_serving(
        start_host: Callable[..., Host]) -> None:
    link = start_host()
    instance = link.connect()
    with pytest.raises(InvalidInput, match="5 rows; at most 4"):
        instance.infer(ids(*[[1]] * 5))
    with pytest.raises(InvalidInput, match="sequence length 17; the maximum is 16"):
        instance.infer(ids([1] * 17))
    with pytest.raises(InvalidInput, match="unknown input 'token_type_ids'"):
        instance.infer({**ids([1]), "token_type_ids": np.zeros((1, 1), dtype=np.int64)})
    with pytest.raises(InvalidInput, match="cannot be cast"):
        instance.infer({"input_ids": np.ones((1, 2), dtype=np.float32)})
    assert link.engine.calls == []
    np.testing.assert_array_equal(instance.infer(ids([3]))["doubled"], [[6]])


def test_an_engine_failure_fails_every_merged_batch_naming_it_and_the_host_keeps_serving(
        start_host: Callable[..., Host]) -> None:
    link = start_host()
    link.engine.hold_next = True
    slots = [link.connect() for _ in range(3)]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        busy = pool.submit(slots[0].infer, ids([1]))
        assert link.engine.held.wait(10)
        merged = [pool.submit(slot.infer, ids([n])) for n, slot in ((2, slots[1]), (3, slots[2]))]
        until_sync(lambda: len(link.host._pending) == 2, 10, what="two batches queued")
        link.engine.fail = RuntimeError("device lost")
        link.engine.release.set()
        for future in (busy, *merged):
            with pytest.raises(FleetserveError, match="device lost") as raised:
                future.result(10)
            assert type(raised.value) is FleetserveError
    assert len(link.engine.calls) == 2
    link.engine.fail = None
    np.testing.assert_array_equal(slots[1].infer(ids([2]))["doubled"], [[4]])


def test_a_connection_that_sends_garbage_is_dropped_and_the_others_keep_serving(
        start_host: Callable[..., Host]) -> None:
    link = start_host()
    good = link.connect()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bad:
        bad.settimeout(10)
        bad.connect(link.host.path)
        bad.sendall(PREFIX.pack(1 << 20, 0))  # a header past the bound
        assert bad.recv(1) == b""  # the host hung up
    np.testing.assert_array_equal(good.infer(ids([1]))["doubled"], [[2]])


def test_close_answers_what_is_queued_then_hangs_up(start_host: Callable[..., Host]) -> None:
    link = start_host()
    link.engine.hold_next = True
    slots = [link.connect(), link.connect()]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        busy = pool.submit(slots[0].infer, ids([1]))
        assert link.engine.held.wait(10)
        queued = pool.submit(slots[1].infer, ids([2]))
        until_sync(lambda: len(link.host._pending) == 1, 10, what="a batch queued")
        closing = pool.submit(link.host.close, 5)
        link.engine.release.set()
        closing.result(10)
        np.testing.assert_array_equal(busy.result(10)["doubled"], [[2]])
        np.testing.assert_array_equal(queued.result(10)["doubled"], [[4]])
    with pytest.raises(NotReady, match="unreachable"):
        slots[0].infer(ids([1]))
    with pytest.raises(OSError):
        link.connect()  # nothing listens any more


@dataclass
class WideEngine(EchoEngine):
    """An EchoEngine whose answers are 4 MB a row: more than a Unix socket buffers for a reader that waits."""

    def instance(self) -> EngineInstance:
        return WideInstance(self)


@dataclass
class WideInstance:
    engine: WideEngine

    def infer(self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        ids = np.array(inputs["input_ids"])
        self.engine.calls.append(ids)
        return {"doubled": ids * 2, "total": np.zeros((len(ids), 1 << 20), np.float32)}


def test_a_front_end_that_stops_reading_does_not_hold_the_engine(socket_dir: Path) -> None:
    engine = WideEngine(outputs=(TensorSpec("doubled", "INT64", (-1, -1)), TensorSpec("total", "FP32", (-1, -1))))
    host = EngineHost(engine, str(socket_dir / "engine.sock"), max_batch=4, send_timeout_s=0.3)
    host.start()
    remote = RemoteEngine(host.path, engine.inputs, engine.outputs, engine.profile, engine.device, timeout_s=10)
    frozen = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        frozen.connect(host.path)
        frozen.sendall(encode(ids([1, 2]), outputs=None))  # and never reads the 4 MB answer
        started = time.monotonic()
        answer = remote.instance().infer(ids([3, 4]), ["doubled"])
        np.testing.assert_array_equal(answer["doubled"], [[6, 8]])
        assert time.monotonic() - started < 5  # the frozen connection's send gave up after 0.3 s
        frozen.settimeout(5)
        received = 0
        while chunk := frozen.recv(1 << 20):  # the host dropped it: a partial answer, then end of stream
            received += len(chunk)
        assert received < (1 << 22)
    finally:
        frozen.close()
        remote.close()
        host.close(5)


def test_each_merged_batch_gets_only_the_outputs_it_asked_for(start_host: Callable[..., Host]) -> None:
    link = start_host()
    link.engine.hold_next = True
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        first = pool.submit(link.connect().infer, ids([1]), ["total"])
        assert link.engine.held.wait(5)
        narrow = pool.submit(link.connect().infer, ids([2]), ["total"])
        wide = pool.submit(link.connect().infer, ids([3]), None)
        until_sync(lambda: len(link.host._pending) == 2, 5, what="both batches queued behind the held call")
        link.engine.release.set()
        assert set(first.result(5)) == {"total"}
        assert set(narrow.result(5)) == {"total"}
        assert set(wide.result(5)) == {"doubled", "total"}
    assert link.engine.requested[-1] is None  # the merged call computed everything the wide batch needs


def test_a_connection_that_timed_out_is_never_reused(start_host: Callable[..., Host]) -> None:
    link = start_host()
    slot = RemoteEngine(link.host.path, link.engine.inputs, link.engine.outputs, PROFILE, "cpu",
                        timeout_s=0.3).instance()
    link.engine.hold_next = True
    with pytest.raises(NotReady, match="unreachable"):
        slot.infer(ids([1]), ["total"])  # times out while the engine holds the call
    link.engine.release.set()  # the late answer to [1] now goes out on that connection
    until_sync(lambda: len(link.observer.batches) == 1, 5, what="the held call answered")
    # Read on, the stream would hand the late answer ([1]) to this call for [5]; closed, it cannot.
    with pytest.raises(NotReady, match="unreachable"):
        slot.infer(ids([5]), ["total"])
