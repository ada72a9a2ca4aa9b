"""End to end: one request through a real gateway and replica yields one trace, received over real OTLP/HTTP.

The spans arrive at the test's OTLP receiver (:mod:`tests.support.otlp`: no OpenTelemetry Collector installs
from the registries this project reaches). "Adds up" is checked level by level: the gateway's request span
covers the latency the client measured within 10%, and at each level the children tile their parent (they
lie inside it and together cover at least 90% of it): gateway request = pick + attempt, attempt = the
replica's request, replica request = decode + queue wait + batch + encode. The replica adds 50 ms per batch
(``--batch-latency-ms``), an encoder's compute time on an accelerator, so that the few hundred microseconds
the client library spends on its side do not decide the 10%.
"""

from __future__ import annotations

import http.client
import json
import statistics
import time

import pytest

from fleetserve.deploy.local import free_port_block
from fleetserve.gateway.config import SERVERS
from tests.support.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from tests.support.procs import free_port, gateway, replica, spawn, wait_http
from tests.support.waiting import until_sync

pytest.importorskip("opentelemetry.sdk", reason="tracing needs the trace extra (opentelemetry-sdk)")

BODY = json.dumps({"inputs": [
    {"name": "input_ids", "datatype": "INT64", "shape": [1, 3], "data": [1, 2, 3]},
    {"name": "attention_mask", "datatype": "INT64", "shape": [1, 3], "data": [1, 1, 1]},
    {"name": "token_type_ids", "datatype": "INT64", "shape": [1, 3], "data": [0, 0, 0]},
]}).encode()
SERVER, CLIENT = 2, 3
CALLER_SPAN = "00f067aa0ba902b7"


def _post(port: int, traceparent: str, answers: list[bytes] | None = None) -> tuple[int, float]:
    """POST one inference over a connection opened beforehand; the status and the latency the client saw (the
    answer's body is appended to ``answers``)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.connect()
        headers = {"Content-Type": "application/json", "traceparent": traceparent}
        started = time.perf_counter()
        conn.request("POST", "/v2/models/tiny/infer", BODY, headers)
        response = conn.getresponse()
        body = response.read()
        latency = time.perf_counter() - started
        if answers is not None:
            answers.append(body)
        return response.status, latency
    finally:
        conn.close()


def _children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return sorted((s for s in spans if s.parent_id == parent.span_id), key=lambda s: s.start_ns)


def _coverage(parent: ReceivedSpan, children: list[ReceivedSpan]) -> float:
    """The share of ``parent`` its children cover, once each instant; asserts they lie within it (1 ms of
    clock slack between processes)."""
    slack = 1_000_000
    covered, reach = 0, parent.start_ns
    for child in children:
        assert parent.start_ns - slack <= child.start_ns <= child.end_ns <= parent.end_ns + slack, (parent, child)
        start = max(child.start_ns, reach)
        covered += max(0, child.end_ns - start)
        reach = max(reach, child.end_ns)
    return covered / (parent.end_ns - parent.start_ns)


def _one_trace(receiver: OtlpReceiver, trace_id: str, count: int) -> list[ReceivedSpan]:
    until_sync(lambda: len(receiver.trace(trace_id)) >= count, timeout_s=30,
               what=f"{count} spans of trace {trace_id} exported")
    return receiver.trace(trace_id)


def _check_structure(spans: list[ReceivedSpan], replica_url: str) -> tuple[ReceivedSpan, list[ReceivedSpan]]:
    """One trace of gateway request → pick + attempt → replica request → its four stages; returns the root and
    the levels to tile (parent first)."""
    assert len(spans) >= 6, sorted(s.name for s in spans)
    [root] = [s for s in spans if s.parent_id == CALLER_SPAN]
    assert (root.service, root.name, root.kind) == ("fleetserve-gateway", "POST /v2/models/{model}/infer", SERVER)
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["http.route"] == "/v2/models/{model}/infer"
    pick, attempt = _children(spans, root)
    assert pick.name == "pick" and pick.attributes["fleetserve.replica"] == replica_url
    assert pick.attributes["fleetserve.balancer.policy"] and "fleetserve.replica.load" in pick.attributes
    assert (attempt.name, attempt.kind, attempt.attributes["http.response.status_code"]) == ("POST", CLIENT, 200)
    [served] = _children(spans, attempt)
    assert (served.service, served.name, served.kind) == ("fleetserve-replica", "POST /v2/models/{model}/infer",
                                                          SERVER)
    stages = _children(spans, served)
    assert [s.name for s in stages] == ["decode", "queue wait", "batch", "encode"]
    batch = stages[2]
    assert batch.attributes["fleetserve.batch.size"] == 1 and batch.attributes["fleetserve.batch.instance"] == 0
    assert batch.attributes["fleetserve.batch.bucket"] >= 3
    return root, [root, pick, attempt, attempt, served, *stages]


@pytest.mark.parametrize("server", SERVERS)
def test_one_request_is_one_trace_whose_spans_add_up_to_the_client_latency(monkeypatch: pytest.MonkeyPatch,
                                                                           server: str) -> None:
    """Seven requests, each its own trace of the same shape; the time checks hold for the median of the seven, as
    scheduling on a loaded 2-core box can hold any single request back between two processes (the client's
    write and the gateway's read, say), where no span can see it. The SDK's batch processor is told (through
    the standard ``OTEL_BSP_SCHEDULE_DELAY``) to export only when the processes stop, so no export competes with
    the requests for the two cores: the spans arrive at shutdown, which the test thereby checks too."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
    traces = [f"{i:x}bf92f3577b34da6a3ce929d0e0e4736" for i in range(1, 8)]
    latencies = {}
    with otlp_receiver() as (receiver, url):
        with replica("tiny", "--otlp-endpoint", url, "--batch-latency-ms", "50", grpc=False) as rep, \
                gateway([rep.url], "--otlp-endpoint", url, "--server", server) as gw:
            # A first request, not sampled, opens the gateway's connection to the replica and warms both up.
            assert _post(gw.port, "00-abf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")[0] == 200
            answers: list[bytes] = []
            for trace_id in traces:
                status, latencies[trace_id] = _post(gw.port, f"00-{trace_id}-{CALLER_SPAN}-01", answers)
                assert status == 200
            assert receiver.requests == 0  # nothing exported while serving
        found = {trace_id: _one_trace(receiver, trace_id, 8) for trace_id in traces}
    # One access-log line per request at each hop, under the request's trace id; the answer passes unchanged.
    out_bytes = len(answers[0])
    for proc, extra in [(gw, f"replica={rep.url} attempts=1"), (rep, "")]:
        [line] = [line for line in proc.output().splitlines() if f"[trace={traces[0]}]" in line]
        assert "POST /v2/models/tiny/infer 200 " in line and extra in line, line
        assert line.endswith(f"bytes={len(BODY)}/{out_bytes}") and out_bytes > 0, line
    checked = {trace_id: _check_structure(spans, rep.url) for trace_id, spans in found.items()}

    gaps, request, attempt, replica_request = [], [], [], []
    for trace_id, (root, (_, pick, attempt_span, _, served, *stages)) in checked.items():
        gaps.append(abs(root.duration_s - latencies[trace_id]) / latencies[trace_id])
        request.append(_coverage(root, [pick, attempt_span]))
        attempt.append(_coverage(attempt_span, [served]))
        replica_request.append(_coverage(served, stages))
    assert statistics.median(gaps) <= 0.1, (gaps, latencies)
    for name, shares in [("gateway request", request), ("attempt", attempt), ("replica request", replica_request)]:
        assert statistics.median(shares) >= 0.9, f"the {name}'s children cover {shares}"


@pytest.mark.parametrize("server", SERVERS)
def test_sample_ratio_zero_records_nothing_at_either_hop_and_a_sampled_caller_is_followed(server: str) -> None:
    unsampled, sampled = "5bf92f3577b34da6a3ce929d0e0e4736", "6bf92f3577b34da6a3ce929d0e0e4736"
    with otlp_receiver() as (receiver, url), \
            replica("tiny", "--otlp-endpoint", url, "--trace-sample-ratio", "0", grpc=False) as rep, \
            gateway([rep.url], "--otlp-endpoint", url, "--trace-sample-ratio", "0", "--server", server) as gw:
        assert _post(gw.port, f"00-{unsampled}-00f067aa0ba902b7-00")[0] == 200
        # A new trace (no traceparent) at ratio 0 is not sampled either; the caller's sampled flag is followed.
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
        conn.request("POST", "/v2/models/tiny/infer", BODY, {"Content-Type": "application/json"})
        assert conn.getresponse().status == 200
        conn.close()
        assert _post(gw.port, f"00-{sampled}-00f067aa0ba902b7-01")[0] == 200
        spans = _one_trace(receiver, sampled, 8)
    assert {s.service for s in spans} == {"fleetserve-gateway", "fleetserve-replica"}
    assert {s.trace_id for s in receiver.spans} == {sampled}


def test_a_grpc_call_through_the_gateway_is_one_trace_across_both_processes() -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient

    trace_id = "8bf92f3577b34da6a3ce929d0e0e4736"
    base, gateway_grpc = free_port_block(2), free_port()
    with otlp_receiver() as (receiver, url):
        # The gateway finds a replica's gRPC port at its HTTP port + 1 (--backend-grpc-port-offset's default).
        rep = spawn(["serve", "tiny", "--host", "127.0.0.1", "--port", str(base), "--grpc-port", str(base + 1),
                     "--drain-grace-s", "0.2", "--otlp-endpoint", url], base, base + 1)
        try:
            wait_http(f"{rep.url}/v2/health/ready", proc=rep)
            with gateway([rep.url], "--otlp-endpoint", url, "--grpc-port", str(gateway_grpc)):
                client = grpcclient.InferenceServerClient(f"127.0.0.1:{gateway_grpc}")
                inputs = []
                for name, data in [("input_ids", [1, 2, 3]), ("attention_mask", [1, 1, 1]),
                                   ("token_type_ids", [0, 0, 0])]:
                    tensor = grpcclient.InferInput(name, [1, 3], "INT64")
                    tensor.set_data_from_numpy(np.asarray([data], dtype=np.int64))
                    inputs.append(tensor)
                client.infer("tiny", inputs, headers={"traceparent": f"00-{trace_id}-{CALLER_SPAN}-01"})
                client.close()
                spans = _one_trace(receiver, trace_id, 8)
        finally:
            rep.stop()
    [root] = [s for s in spans if s.parent_id == CALLER_SPAN]
    method = "inference.GRPCInferenceService/ModelInfer"
    assert (root.service, root.name, root.kind, root.attributes["rpc.grpc.status_code"]) == (
        "fleetserve-gateway", method, SERVER, 0)
    pick, attempt = _children(spans, root)
    assert pick.name == "pick" and (attempt.name, attempt.kind) == (method, CLIENT)
    assert attempt.attributes["rpc.system"] == "grpc" and attempt.attributes["rpc.method"] == "ModelInfer"
    [served] = _children(spans, attempt)
    assert (served.service, served.name, served.kind, served.attributes["rpc.grpc.status_code"]) == (
        "fleetserve-replica", method, SERVER, 0)
    assert [s.name for s in _children(spans, served)] == ["decode", "queue wait", "batch", "encode"]


@pytest.mark.parametrize("server", SERVERS)
def test_a_client_that_hangs_up_ends_its_span_marked_with_the_cancellation(server: str) -> None:
    """The request's span ends when its client goes away before the answer, on either server: marked with
    ``error.type``, without a status code (none was sent)."""
    trace_id = "7bf92f3577b34da6a3ce929d0e0e4736"
    with otlp_receiver() as (receiver, url), replica("tiny", "--extra-latency-ms", "1500", grpc=False) as rep, \
                gateway([rep.url], "--otlp-endpoint", url, "--server", server) as gw:
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=0.2)
        conn.request("POST", "/v2/models/tiny/infer", BODY,
                     {"Content-Type": "application/json", "traceparent": f"00-{trace_id}-{CALLER_SPAN}-01"})
        with pytest.raises(TimeoutError):
            conn.getresponse()
        conn.close()
        until_sync(lambda: any(s.parent_id == CALLER_SPAN for s in receiver.trace(trace_id)), timeout_s=30,
                   what="the request's span exported")
    [root] = [s for s in receiver.trace(trace_id) if s.parent_id == CALLER_SPAN]
    assert root.attributes["error.type"] == "CancelledError", root.attributes
    assert "http.response.status_code" not in root.attributes
    assert root.duration_s < 1.2  # ended at the hang-up: had it waited for the answer, 1.5 s or more
