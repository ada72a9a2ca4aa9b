"""Work nobody waits for is never executed: a real replica whose one engine instance is held busy by a slow
batch (``--batch-latency-ms``) while other requests queue behind it, then leave — their client hangs up, their
forwarded deadline (``X-Fleetserve-Timeout-Ms``) or gRPC deadline passes, or the gRPC call is cancelled.

Executed work is read from the replica's own metrics: ``fleetserve_batch_size`` counts engine calls (its
``_sum`` the rows), so after the busy batch ends exactly one batch of one row must have run. Clients that hang
up do so on the replica itself and on a gateway in front of it (which cancels its attempt in turn). Every wait is
a poll of a real condition (queue depth, a counter) with a deadline, never a sleep standing in for one.
"""

from __future__ import annotations

import concurrent.futures
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetserve.replica.proto import grpc_service_pb2 as pb
from fleetserve.replica.proto import grpc_service_pb2_grpc as pb_grpc
from tests.support.procs import Proc, gateway, replica
from tests.support.waiting import until_sync

# Long enough that the queued requests leave, and the replica notices, while the first batch still runs.
BUSY_MS = 2500
INFER = "/v2/models/tiny/infer"
BODY = json.dumps({"inputs": [
    {"name": n, "datatype": "INT64", "shape": [1, 4], "data": v}
    for n, v in (("input_ids", [2, 7, 9, 3]), ("attention_mask", [1, 1, 1, 1]), ("token_type_ids", [0, 0, 0, 0]))
]}).encode()
N = 6


@pytest.fixture(scope="module")
def slow() -> Iterator[Proc]:
    # One instance, batches of one row, one padded shape (a single slow warm-up call).
    with replica("tiny", "--batch-latency-ms", str(BUSY_MS), "--max-batch", "1", "--padding", "fixed",
                 "--fixed-seq", "16", "--max-delay-ms", "0") as proc:
        yield proc


def metrics(url: str) -> dict[str, float]:
    """Every sample of the replica's /metrics, summed over labels."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        text = r.read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return samples


def load(url: str) -> tuple[int, int]:
    """(rows queued, HTTP inference requests in progress) from the replica's metrics."""
    samples = metrics(url)
    return int(samples["fleetserve_queue_depth"]), int(samples["fleetserve_inflight_requests"])


def post(url: str, headers: dict[str, str] | None = None, path: str = INFER,
         body: bytes = BODY) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def hang_up_later(port: int, n: int) -> list[socket.socket]:
    """``n`` raw connections that each sent one inference request; closing one hangs up on its request."""
    head = (f"POST {INFER} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(BODY)}\r\n\r\n").encode()
    clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]
    for client in clients:
        client.sendall(head + BODY)
    return clients


class Busy:
    """One request whose slow batch holds the replica's only engine instance; the test's work queues behind it."""

    def __init__(self, proc: Proc, pool: concurrent.futures.ThreadPoolExecutor) -> None:
        self.url = proc.url
        self.before = metrics(proc.url)
        self.answer = pool.submit(post, proc.url)
        # In progress and not queued: its batch runs.
        until_sync(lambda: load(self.url) == (0, 1), 20, "the busy batch to start")

    def queued(self, n: int) -> None:
        until_sync(lambda: load(self.url)[0] == n, 20, f"{n} rows queued")
        assert not self.answer.done(), "the busy batch ended before the test's requests queued: raise BUSY_MS"

    def executed_after(self) -> tuple[float, float]:
        """(batches, rows) the replica executed since this object was made, once the busy batch answered."""
        assert self.answer.result(timeout=30)[0] == 200
        after = metrics(self.url)
        return (after["fleetserve_batch_size_count"] - self.before["fleetserve_batch_size_count"],
                after["fleetserve_batch_size_sum"] - self.before["fleetserve_batch_size_sum"])

    def delta(self, name: str) -> float:
        return metrics(self.url).get(name, 0.0) - self.before.get(name, 0.0)


def test_clients_that_hang_up_while_queued_are_never_executed(slow: Proc) -> None:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        busy = Busy(slow, pool)
        clients = hang_up_later(slow.port, N)
        busy.queued(N)
        for client in clients:
            client.close()
        until_sync(lambda: busy.delta("fleetserve_requests_cancelled_total") == N, 20,
                   "the hung-up requests to leave the queue")
        assert load(slow.url)[0] == 0
        assert busy.executed_after() == (1, 1)
        assert busy.delta("fleetserve_requests_total") == N + 1  # N counted as 499, the busy one 200
        assert busy.delta("fleetserve_requests_expired_total") == 0


@pytest.mark.parametrize(("path", "body"), [(INFER, BODY), ("/inference", b'{"texts": ["a", "b", "c"]}')])
def test_a_forwarded_deadline_that_passes_in_the_queue_is_a_504_never_executed(
    slow: Proc, path: str, body: bytes
) -> None:
    with concurrent.futures.ThreadPoolExecutor(N + 1) as pool:
        busy = Busy(slow, pool)
        answers = [pool.submit(post, slow.url, {"X-Fleetserve-Timeout-Ms": "300"}, path, body) for _ in range(N)]
        results = [a.result(timeout=30) for a in answers]
        assert [status for status, _ in results] == [504] * N
        assert all("it was not run" in str(body["error"]) for _, body in results)
        assert not busy.answer.done(), "the deadlines passed while the busy batch still ran"
        # /inference splits 3 texts into 3 one-row requests (--max-batch 1): the first to expire cancels the others.
        expired, cancelled = busy.delta("fleetserve_requests_expired_total"), busy.delta(
            "fleetserve_requests_cancelled_total")
        assert expired >= N and expired + cancelled == N * (1 if path == INFER else 3)
        assert busy.executed_after() == (1, 1)


def test_a_deadline_forwarded_through_the_gateway_is_honoured_at_the_replica(slow: Proc) -> None:
    with gateway([slow.url]) as front, concurrent.futures.ThreadPoolExecutor(N + 1) as pool:
        busy = Busy(slow, pool)
        answers = [pool.submit(post, front.url, {"X-Fleetserve-Timeout-Ms": "400"}) for _ in range(N)]
        assert [a.result(timeout=30)[0] for a in answers] == [504] * N
        # The replica dropped each one itself (deadline) or because the gateway hung up on it (cancelled).
        until_sync(lambda: busy.delta("fleetserve_requests_expired_total")
                   + busy.delta("fleetserve_requests_cancelled_total") == N, 20, "the replica to drop the requests")
        assert busy.executed_after() == (1, 1)


def test_clients_that_hang_up_on_the_gateway_are_never_executed_at_the_replica(slow: Proc) -> None:
    with gateway([slow.url]) as front, concurrent.futures.ThreadPoolExecutor(2) as pool:
        busy = Busy(slow, pool)
        clients = hang_up_later(front.port, N)
        busy.queued(N)
        for client in clients:
            client.close()
        until_sync(lambda: busy.delta("fleetserve_requests_cancelled_total") == N, 20,
                   "the gateway's hung-up requests to leave the replica's queue")
        assert busy.executed_after() == (1, 1)


def _grpc_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="tiny")
    for name, values in (("input_ids", [2, 7, 9, 3]), ("attention_mask", [1, 1, 1, 1]),
                         ("token_type_ids", [0, 0, 0, 0])):
        tensor = request.inputs.add(name=name, datatype="INT64", shape=[1, 4])
        tensor.contents.int64_contents.extend(values)
    return request


def test_grpc_calls_past_their_deadline_or_cancelled_are_never_executed(slow: Proc) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{slow.grpc_port}") as channel, \
            concurrent.futures.ThreadPoolExecutor(2) as pool:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        grpc.channel_ready_future(channel).result(timeout=10)
        busy = Busy(slow, pool)
        late = [stub.ModelInfer.future(_grpc_request(), timeout=0.3) for _ in range(N)]
        for call in late:
            with pytest.raises(grpc.RpcError) as failure:
                call.result(timeout=30)
            assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        abandoned = [stub.ModelInfer.future(_grpc_request(), timeout=30) for _ in range(N)]
        busy.queued(N)
        for call in abandoned:
            assert call.cancel()
        until_sync(lambda: busy.delta("fleetserve_requests_expired_total")
                   + busy.delta("fleetserve_requests_cancelled_total") == 2 * N, 20, "the replica to drop every call")
        assert busy.delta("fleetserve_requests_cancelled_total") >= N
        assert busy.executed_after() == (1, 1)
