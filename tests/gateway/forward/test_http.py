"""The proxy end to end: a real gateway in front of fake replicas that answer, fail, hang or die."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import aiohttp

from fleetserve.gateway.balance import BalancerConfig
from fleetserve.telemetry.tracing import parse_traceparent
from fleetserve.wire import LOAD_REPORT_HEADER
from tests.support.fake_replica import FakeReplica
from tests.support.gateways import StartGateway
from tests.support.rawserver import Handler, RawServer, read_request

StartReplicas = Callable[[int], Awaitable[list[FakeReplica]]]
StartRaw = Callable[[Handler], Awaitable[RawServer]]
INFER = "/v2/models/m/infer"


async def infer(client: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None,
                body: bytes = b'{"inputs": []}') -> tuple[int, dict[str, str], bytes]:
    async with client.post(url + INFER, data=body, headers=headers) as res:
        return res.status, dict(res.headers), await res.read()


async def test_every_request_goes_to_the_replica_the_balancer_picks(replicas: StartReplicas,
                                                                     gateway: StartGateway,
                                                                     client: aiohttp.ClientSession) -> None:
    fleet = await replicas(3)
    gw = await gateway([r.url for r in fleet], balancer=BalancerConfig(policy="round-robin"))
    answers = [await infer(client, gw.url) for _ in range(30)]
    assert [status for status, _, _ in answers] == [200] * 30
    assert [r.hits for r in fleet] == [10, 10, 10]


async def test_concurrent_requests_spread_across_replicas(replicas: StartReplicas, gateway: StartGateway,
                                                          client: aiohttp.ClientSession) -> None:
    fleet = await replicas(3)
    for replica in fleet:
        replica.delay_s = 0.02  # requests overlap, so pending counts steer the default policy
    gw = await gateway([r.url for r in fleet])
    for _ in range(3):
        answers = await asyncio.gather(*(infer(client, gw.url) for _ in range(20)))
        assert [status for status, _, _ in answers] == [200] * 20
    assert sum(r.hits for r in fleet) == 60
    assert min(r.hits for r in fleet) >= 6, [r.hits for r in fleet]


async def test_killed_replica_causes_no_client_errors(replicas: StartReplicas, gateway: StartGateway,
                                                      client: aiohttp.ClientSession) -> None:
    fleet = await replicas(3)
    # Round robin reaches the stopped replica within three picks; p2c may never pick it in 30 (its peak EWMA can
    # stay above both others'), and then no request would be retried (CI saw that once).
    gw = await gateway([r.url for r in fleet], balancer=BalancerConfig(policy="round-robin"))
    statuses = [(await infer(client, gw.url))[0] for _ in range(9)]  # warm keep-alive connections
    await fleet[0].stop()
    for _ in range(10):
        statuses += [s for s, _, _ in await asyncio.gather(*(infer(client, gw.url) for _ in range(3)))]
    assert statuses == [200] * 39
    assert gw.metrics.retries._value.get() >= 1
    ejected = [b for b in gw.balancer.snapshot() if b["url"] == fleet[0].url]
    assert ejected[0]["consecutive_failures"] or ejected[0]["state"] == "ejected"


async def test_reset_before_response_is_retried_elsewhere(replicas: StartReplicas, gateway: StartGateway,
                                                          client: aiohttp.ClientSession) -> None:
    bad, good = await replicas(2)
    bad.mode = "reset"
    gw = await gateway([bad.url, good.url])
    statuses = [(await infer(client, gw.url))[0] for _ in range(12)]
    assert statuses == [200] * 12
    assert bad.hits >= 1
    assert good.hits == 12


async def test_overloaded_replica_503_is_retried_once_on_another(replicas: StartReplicas,
                                                                  gateway: StartGateway,
                                                                  client: aiohttp.ClientSession) -> None:
    busy, idle = await replicas(2)
    busy.mode = "overloaded"
    gw = await gateway([busy.url, idle.url], balancer=BalancerConfig(policy="round-robin"))
    statuses = [(await infer(client, gw.url))[0] for _ in range(6)]
    assert statuses == [200] * 6
    assert busy.hits >= 1 and idle.hits == 6


async def test_when_every_replica_is_overloaded_the_replica_503_passes_through(
        replicas: StartReplicas, gateway: StartGateway, client: aiohttp.ClientSession) -> None:
    fleet = await replicas(3)
    for replica in fleet:
        replica.mode = "overloaded"
    gw = await gateway([r.url for r in fleet])
    status, headers, body = await infer(client, gw.url)
    assert status == 503
    assert body == b'{"error": "queue full"}'
    assert headers["Retry-After"] == "1"
    assert sum(r.hits for r in fleet) == 2  # the first try and exactly one retry


async def test_client_errors_pass_through_unchanged_and_are_not_retried(
        replicas: StartReplicas, gateway: StartGateway, client: aiohttp.ClientSession) -> None:
    fleet = await replicas(2)
    for replica in fleet:
        replica.mode = "bad"
    gw = await gateway([r.url for r in fleet])
    for _ in range(4):
        status, headers, body = await infer(client, gw.url)
        assert (status, body) == (400, b'{"error": "bad input from client"}')
        assert headers["Content-Type"].startswith("application/json")
    assert sum(r.hits for r in fleet) == 4


async def test_retry_budget_exhausted_returns_the_first_answer(replicas: StartReplicas, gateway: StartGateway,
                                                               client: aiohttp.ClientSession) -> None:
    fleet = await replicas(2)
    for replica in fleet:
        replica.mode = "overloaded"
    budget = BalancerConfig(retry_budget_percent=0.0, retry_min_concurrency=0)
    gw = await gateway([r.url for r in fleet], balancer=budget)
    status, _, _ = await infer(client, gw.url)
    assert status == 503
    assert sum(r.hits for r in fleet) == 1
    assert gw.metrics.retry_budget_exhausted._value.get() == 1


async def test_a_refused_connection_is_retried_even_without_retry_budget(
        replicas: StartReplicas, gateway: StartGateway, client: aiohttp.ClientSession) -> None:
    dead, alive = await replicas(2)
    budget = BalancerConfig(policy="round-robin", retry_budget_percent=0.0, retry_min_concurrency=0)
    gw = await gateway([dead.url, alive.url], balancer=budget)
    await dead.stop()  # connections refused: the request reached no replica, so retrying costs none
    statuses = [(await infer(client, gw.url))[0] for _ in range(4)]
    assert statuses == [200] * 4
    assert gw.metrics.retries._value.get() >= 1
    assert gw.metrics.retry_budget_exhausted._value.get() == 0


async def test_response_broken_midway_is_a_502_and_never_retried(raw_server: StartRaw, replicas: StartReplicas,
                                                                 gateway: StartGateway,
                                                                 client: aiohttp.ClientSession) -> None:
    async def truncating(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{\"partial")
        await writer.drain()

    broken = await raw_server(truncating)
    (good,) = await replicas(1)
    gw = await gateway([broken.url, good.url], balancer=BalancerConfig(policy="round-robin"))
    statuses = Counter([(await infer(client, gw.url))[0] for _ in range(6)])
    assert statuses == {200: 3, 502: 3}
    assert good.hits == 3


async def test_deadline_bounds_the_request(replicas: StartReplicas, gateway: StartGateway,
                                           client: aiohttp.ClientSession) -> None:
    (slow,) = await replicas(1)
    slow.mode = "hang"
    gw = await gateway([slow.url], request_timeout_ms=300)
    started = time.monotonic()
    status, headers, body = await infer(client, gw.url, {"X-Fleetserve-Timeout-Ms": "100"})
    elapsed = time.monotonic() - started
    # The attempt's read timeout is the time left, so it and the request's deadline fall due together:
    # either may answer first, and each names the bound. Upper bounds far below the hang (an hour), loose
    # enough for a loaded 2-core box.
    assert status == 504 and re.search(rb"deadline of 100 ms|within 0\.(0\d\d|100) s", body), body
    assert 0.09 <= elapsed < 1.0
    assert 1 <= int(slow.last_headers["X-Fleetserve-Timeout-Ms"]) <= 100  # what was left when it went out
    started = time.monotonic()
    status, _, body = await infer(client, gw.url)  # the configured default
    assert status == 504 and re.search(rb"deadline of 300 ms|within 0\.(\d\d\d|300) s", body), body
    assert 0.29 <= time.monotonic() - started < 1.2
    assert headers["X-Request-ID"]


async def test_invalid_timeout_header_is_a_400(replicas: StartReplicas, gateway: StartGateway,
                                               client: aiohttp.ClientSession) -> None:
    (replica,) = await replicas(1)
    gw = await gateway([replica.url], request_timeout_ms=1000, max_request_timeout_ms=5000)
    for value in ("soon", "0", "-5", "5001", "1.5"):
        status, _, body = await infer(client, gw.url, {"X-Fleetserve-Timeout-Ms": value})
        assert status == 400 and b"X-Fleetserve-Timeout-Ms" in body, value
    assert replica.hits == 0


async def test_all_replicas_down_is_a_fast_503(replicas: StartReplicas, gateway: StartGateway,
                                               client: aiohttp.ClientSession) -> None:
    fleet = await replicas(2)
    gw = await gateway([r.url for r in fleet])
    for replica in fleet:
        await replica.stop()
    for _ in range(3):
        started = time.monotonic()
        status, headers, body = await infer(client, gw.url)
        assert status == 503
        assert body.startswith(b'{"error": "no healthy replica')
        assert headers["Retry-After"] == "1"
        assert time.monotonic() - started < 0.5


async def test_request_body_bytes_and_query_pass_through(replicas: StartReplicas, gateway: StartGateway,
                                                         client: aiohttp.ClientSession) -> None:
    (replica,) = await replicas(1)
    gw = await gateway([replica.url])
    payload = bytes(range(256)) * 1000
    async with client.post(gw.url + INFER + "?a=1&b=%20", data=payload,
                           headers={"Inference-Header-Content-Length": "17"}) as res:
        assert res.status == 200
        answer = await res.json()
    assert replica.last_body == payload
    assert answer == {"replica": replica.name, "path": INFER + "?a=1&b=%20", "echo_len": len(payload)}
    assert replica.last_headers["Inference-Header-Content-Length"] == "17"


async def test_trace_context_and_request_id_propagate(replicas: StartReplicas, gateway: StartGateway,
                                                      client: aiohttp.ClientSession) -> None:
    (replica,) = await replicas(1)
    gw = await gateway([replica.url])
    incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    status, headers, _ = await infer(client, gw.url, {"traceparent": incoming, "tracestate": "k=v",
                                                          "X-Request-ID": "req-42"})
    assert status == 200 and headers["X-Request-ID"] == "req-42"
    sent = parse_traceparent(replica.last_headers["traceparent"])
    assert sent is not None
    assert (sent.trace_id, sent.sampled) == ("4bf92f3577b34da6a3ce929d0e0e4736", True)
    assert sent.parent_id != "00f067aa0ba902b7"
    assert replica.last_headers["tracestate"] == "k=v"
    assert replica.last_headers["X-Request-ID"] == "req-42"
    assert replica.last_headers["X-Forwarded-For"] == "127.0.0.1"

    status, headers, _ = await infer(client, gw.url, {"traceparent": "00-zz-bad", "tracestate": "k=v",
                                                          "X-Request-ID": "bad id with spaces"})
    fresh = parse_traceparent(replica.last_headers["traceparent"])
    assert fresh is not None and not fresh.sampled
    assert "tracestate" not in replica.last_headers
    assert headers["X-Request-ID"] == replica.last_headers["X-Request-ID"]
    assert len(headers["X-Request-ID"]) == 32


async def test_hop_by_hop_headers_are_not_forwarded(replicas: StartReplicas, gateway: StartGateway,
                                                    client: aiohttp.ClientSession) -> None:
    (replica,) = await replicas(1)
    gw = await gateway([replica.url])
    status, _, _ = await infer(client, gw.url, {"Connection": "keep-alive, X-Secret", "X-Secret": "1",
                                                "Proxy-Authorization": "x", "X-Kept": "yes"})
    assert status == 200
    assert replica.last_headers["X-Kept"] == "yes"
    assert "X-Secret" not in replica.last_headers
    assert "Proxy-Authorization" not in replica.last_headers


async def test_replica_load_headers_reach_the_balancer(replicas: StartReplicas, gateway: StartGateway,
                                                       client: aiohttp.ClientSession) -> None:
    (replica,) = await replicas(1)
    replica.queue_depth = 7
    gw = await gateway([replica.url])
    status, headers, _ = await infer(client, gw.url)
    assert status == 200 and "named_metrics.queue_depth=7" in headers[LOAD_REPORT_HEADER]
    (row,) = gw.balancer.snapshot()
    assert row["reported_queue_depth"] == 7
    assert row["pending"] == 0
    assert gw.metrics.inflight._value.get() == 0


async def test_get_routes_are_proxied(replicas: StartReplicas, gateway: StartGateway,
                                      client: aiohttp.ClientSession) -> None:
    (replica,) = await replicas(1)
    gw = await gateway([replica.url])
    for path in ("/v2", "/v2/models/m", "/v2/models/m/ready"):
        async with client.get(gw.url + path) as res:
            assert res.status == 200
            assert (await res.json())["path"] == path
    async with client.post(gw.url + "/inference", json={"texts": ["a"]}) as res:
        assert res.status == 200


async def test_a_client_that_hangs_up_closes_the_upstream_connection(raw_server: StartRaw,
                                                                     gateway: StartGateway) -> None:
    asked, closed = asyncio.Event(), asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        asked.set()
        if await reader.read(1) == b"":
            closed.set()

    upstream = await raw_server(silent)
    gw = await gateway([upstream.url])
    _, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(f"POST {INFER} HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\n{{}}".encode())
    await writer.drain()
    await asyncio.wait_for(asked.wait(), 5.0)
    writer.close()  # the client gives up: the replica must see its connection close too
    await asyncio.wait_for(closed.wait(), 5.0)

    async def settled() -> None:
        while gw.balancer.active_requests:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(settled(), 5.0)
    (row,) = gw.balancer.snapshot()
    assert (row["pending"], row["consecutive_failures"]) == (0, 0)  # no verdict on the replica
