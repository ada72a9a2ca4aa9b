"""The gateway's public port on Granian (``--server granian``): what the RSGI front does itself — input limits,
the loopback hop to the gateway's own routes, headers — with real Granian and fake replicas.

Everything else the gateway does is the same code on both servers; ``make test`` runs the whole gateway suite on
Granian, the default, and a second time on aiohttp (``FLEETSERVE_TEST_GATEWAY_SERVER=aiohttp``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from fleetserve.gateway.edge import EdgeConfig, InputLimits
from fleetserve.gateway.edge.granian import batch_schedule, thread_ids
from fleetserve.gateway.server import GatewayHandle, serve_gateway
from fleetserve.wire import TIMEOUT_HEADER
from tests.support.fake_replica import FakeReplica
from tests.support.gateways import StartGateway, gateway_config
from tests.support.procs import free_port
from tests.support.waiting import until

StartReplicas = Callable[[int], Awaitable[list[FakeReplica]]]
INFER = "/v2/models/m/infer"


async def granian(replicas: StartReplicas, gateway: StartGateway, **overrides: Any) -> tuple[GatewayHandle,
                                                                                              FakeReplica]:
    (replica,) = await replicas(1)
    return await gateway([replica.url], server="granian", **overrides), replica


async def test_proxied_routes_are_forwarded_and_the_gateway_routes_answered_over_loopback(
        replicas: StartReplicas, gateway: StartGateway, client: aiohttp.ClientSession) -> None:
    gw, replica = await granian(replicas, gateway)
    async with client.post(gw.url + INFER + "?x=1", data=b"{}", headers={"X-Request-ID": "r-1"}) as res:
        assert res.status == 200 and res.headers["X-Request-ID"] == "r-1"
        assert (await res.json())["path"] == INFER + "?x=1"
    assert replica.hits == 1
    async with client.get(gw.url + "/metrics") as res:
        assert res.status == 200
        assert 'fleetserve_gateway_requests_total{backend="' + replica.url in await res.text()
    async with client.get(gw.url + "/nowhere") as res:
        assert res.status == 404 and "GET /nowhere" in (await res.json())["error"]
    async with client.put(gw.url + "/inference", data=b"{}") as res:
        assert res.status == 405 and "error" in await res.json()
    assert replica.hits == 1


async def test_forwarded_headers_name_the_client_and_drop_what_the_gateway_sets(
        replicas: StartReplicas, gateway: StartGateway, client: aiohttp.ClientSession) -> None:
    gw, replica = await granian(replicas, gateway)
    headers = {"X-Forwarded-For": "10.1.2.3", "X-Fleetserve-Subject": "forged", "Connection": "keep-alive, X-Hop",
               "X-Hop": "1", "X-Kept": "yes"}
    async with client.post(gw.url + INFER, data=b"{}", headers=headers) as res:
        assert res.status == 200
    sent = replica.last_headers
    assert sent["X-Forwarded-For"] == "10.1.2.3, 127.0.0.1"
    assert sent["X-Kept"] == "yes" and "X-Hop" not in sent and "X-Fleetserve-Subject" not in sent
    assert 1 <= int(sent[TIMEOUT_HEADER]) <= gw.config.request_timeout_ms


@pytest.mark.parametrize(("value", "status"), [("abc", 400), ("0", 400), ("250", 200)])
async def test_the_deadline_header_is_checked(replicas: StartReplicas, gateway: StartGateway,
                                              client: aiohttp.ClientSession, value: str, status: int) -> None:
    gw, replica = await granian(replicas, gateway)
    async with client.post(gw.url + INFER, data=b"{}", headers={TIMEOUT_HEADER: value}) as res:
        assert res.status == status
        if status == 400:
            assert TIMEOUT_HEADER in (await res.json())["error"]
    assert replica.hits == (status == 200)


@pytest.fixture
async def limited(replicas: StartReplicas, gateway: StartGateway) -> AsyncIterator[tuple[GatewayHandle,
                                                                                         FakeReplica]]:
    limits = InputLimits(max_header_bytes=1024, max_headers=20, body_read_timeout_s=0.5, json_max_depth=4)
    yield await granian(replicas, gateway, max_body_bytes=4096, edge=EdgeConfig(limits=limits))


async def test_heads_over_the_limits_are_431(limited: tuple[GatewayHandle, FakeReplica],
                                             client: aiohttp.ClientSession) -> None:
    gw, replica = limited
    async with client.post(gw.url + INFER, data=b"{}", headers={"X-Big": "a" * 2000}) as res:
        assert res.status == 431 and "1024" in (await res.json())["error"]
    many = {f"X-H{i}": "1" for i in range(25)}
    async with client.post(gw.url + INFER, data=b"{}", headers=many) as res:
        assert res.status == 431
    assert replica.hits == 0


async def test_bodies_over_the_limit_are_413_declared_or_chunked(limited: tuple[GatewayHandle, FakeReplica],
                                                                 client: aiohttp.ClientSession) -> None:
    gw, replica = limited
    async with client.post(gw.url + INFER, data=b"x" * 5000) as res:
        assert res.status == 413 and "4096" in (await res.json())["error"]

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(5):
            yield b"y" * 1000

    async with client.post(gw.url + INFER, data=chunks()) as res:
        assert res.status == 413
    async with client.post(gw.url + INFER, data=b"z" * 4000) as res:
        assert res.status == 200
    assert replica.hits == 1 and replica.last_body == b"z" * 4000


async def test_json_too_deep_is_400(limited: tuple[GatewayHandle, FakeReplica],
                                    client: aiohttp.ClientSession) -> None:
    gw, replica = limited
    async with client.post(gw.url + INFER, data=b"[[[[[[1]]]]]]", headers={"Content-Type": "application/json"}) as res:
        assert res.status == 400 and "deep" in (await res.json())["error"]
    assert replica.hits == 0


async def test_a_body_that_stops_arriving_is_408(limited: tuple[GatewayHandle, FakeReplica]) -> None:
    gw, replica = limited
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(f"POST {INFER} HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\n{{".encode())
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert replica.hits == 0


async def test_a_restart_on_the_same_port_is_not_blocked_by_connections_in_time_wait(
        replicas: StartReplicas) -> None:
    (replica,) = await replicas(1)
    port = free_port()
    # Each gateway closes first (Connection: close), so the port holds its connections in TIME_WAIT; aiohttp's
    # listener (one process) does not set SO_REUSEPORT, Granian's does.
    for server in ("aiohttp", "granian", "granian"):
        async with serve_gateway(gateway_config([replica.url], server=server, port=port)):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"POST {INFER} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{{}}"
                         .encode())
            answer = await asyncio.wait_for(reader.read(), timeout=5)  # to EOF: the server closed first
            writer.close()
            assert answer.startswith(b"HTTP/1.1 200"), answer
    assert replica.hits == 3


async def test_access_log_lines_carry_the_size_of_each_answer(
        replicas: StartReplicas, gateway: StartGateway, client: aiohttp.ClientSession,
        caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    """The replica's answer and the gateway's own error alike (the aiohttp front logs both sizes too)."""
    caplog.set_level(logging.INFO, logger="fleetserve.access")
    gw, _ = await granian(replicas, gateway)
    sizes = []
    for headers in ({}, {TIMEOUT_HEADER: "soon"}):
        async with client.post(gw.url + INFER, data=b"{}", headers=headers) as res:
            sizes.append((res.status, len(await res.read())))
    async with client.put(gw.url + INFER, data=b"{}") as res:  # a proxied path, not forwarded: 405 from loopback
        assert res.status == 405
    err: list[str] = []

    def logged() -> bool:  # the access log writes its lines in batches, a second after a batch's first line
        err.extend(capsys.readouterr().err.splitlines())
        return any(f"PUT {INFER} 405 " in line for line in err)

    await until(logged, timeout_s=10, what="the access-log lines written")
    lines = [line for line in err if f"POST {INFER} " in line]
    assert [status for status, _ in sizes] == [200, 400] and all(size > 0 for _, size in sizes)
    assert len(lines) == 2
    for line, (status, size) in zip(lines, sizes, strict=True):
        assert f" {status} " in line and line.endswith(f"bytes=2/{size}"), line
    assert "replica=" in lines[0] and "replica=" not in lines[1]  # the 400 was answered before any pick
    # Logged once, by the Granian front (the loopback app behind it logs nothing), as on aiohttp.
    assert len([line for line in err if f"PUT {INFER} 405 " in line]) == 1


def _batch_threads() -> set[int]:
    batch = set()
    for tid in thread_ids():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            if os.sched_getscheduler(tid) == os.SCHED_BATCH:
                batch.add(tid)
    return batch


def test_batch_schedule_puts_a_thread_under_sched_batch_and_skips_one_that_does_not_exist() -> None:
    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    thread.start()
    try:
        assert thread.native_id is not None
        assert os.sched_getscheduler(thread.native_id) == os.SCHED_OTHER
        assert batch_schedule({thread.native_id}) == 1
        assert os.sched_getscheduler(thread.native_id) == os.SCHED_BATCH
    finally:
        release.set()
        thread.join()
    with open("/proc/sys/kernel/pid_max") as f:
        no_such_thread = int(f.read()) + 1
    assert batch_schedule({no_such_thread}) == 0  # gone (or never was): nothing to schedule, no error


@pytest.mark.parametrize("batch", [True, False])
async def test_granians_threads_run_under_sched_batch_and_the_event_loop_does_not(
        replicas: StartReplicas, gateway: StartGateway, client: aiohttp.ClientSession, batch: bool) -> None:
    before = _batch_threads()
    gw, _ = await granian(replicas, gateway, batch_threads=batch)
    async with client.post(gw.url + INFER, data=b"{}") as res:
        assert res.status == 200
    started = _batch_threads() - before
    assert threading.get_native_id() not in started
    assert bool(started) is batch
