"""Input limits: head and body size, body read deadline, JSON bounds, and the aiohttp settings."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from aiohttp.typedefs import Middleware

from fleetserve.gateway.edge.config import InputLimits
from fleetserve.gateway.edge.limits import BodyLimits, HeadLimits, app_kwargs, server_kwargs
from tests.support.jwt_keys import ServeFn


class Recorder:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def rejected(self, reason: str) -> None:
        self.reasons.append(reason)


LIMITS = InputLimits(max_body_bytes=1000, max_header_bytes=512, json_max_depth=4, json_max_elements=50)


def test_server_and_app_kwargs_follow_the_limits() -> None:
    limits = InputLimits(max_header_bytes=4096, max_headers=20, keepalive_timeout_s=15, body_read_timeout_s=1)
    assert server_kwargs(limits) == {
        "keepalive_timeout": 15.0,
        "max_line_size": 4096,
        "max_field_size": 4096,
        "max_headers": 20,
        "lingering_time": 1.0,
    }
    assert app_kwargs(limits) == {"client_max_size": InputLimits().max_body_bytes}


async def _stack(
    serve: ServeFn, recorder: Recorder, limits: InputLimits = LIMITS, **app: Any
) -> TestClient[web.Request, web.Application]:
    middlewares: list[Middleware] = [HeadLimits(limits, recorder), BodyLimits(limits, recorder)]
    return await serve(middlewares, app=app, server=server_kwargs(limits))


async def test_body_within_limit_reaches_the_handler(serve: ServeFn) -> None:
    recorder = Recorder()
    client = await _stack(serve, recorder)
    response = await client.post("/v2/models/m/infer", data=b"x" * 1000)
    assert response.status == 200
    assert (await response.json())["body_len"] == 1000
    response = await client.get("/v2/models/m")
    assert response.status == 200
    assert recorder.reasons == []


async def test_declared_body_over_limit_is_413_before_reading(serve: ServeFn) -> None:
    recorder = Recorder()
    client = await _stack(serve, recorder)
    response = await client.post("/v2/models/m/infer", data=b"x" * 1001)
    assert response.status == 413
    assert "1001 bytes; the limit is 1000" in (await response.json())["error"]
    assert response.headers["Connection"] == "close"
    assert recorder.reasons == ["body_too_large"]


async def _chunks(total: int) -> AsyncIterator[bytes]:
    for _ in range(total // 100):
        yield b"y" * 100


@pytest.mark.parametrize("client_max_size", [1000, 1024**2])
async def test_chunked_body_over_limit_is_413(serve: ServeFn, client_max_size: int) -> None:
    recorder = Recorder()
    client = await _stack(serve, recorder, client_max_size=client_max_size)
    response = await client.post("/v2/models/m/infer", data=_chunks(5000))
    assert response.status == 413
    assert "exceeds 1000 bytes" in (await response.json())["error"]
    assert recorder.reasons == ["body_too_large"]


async def test_head_over_limit_is_431(serve: ServeFn) -> None:
    recorder = Recorder()
    client = await _stack(serve, recorder)
    response = await client.get("/", headers={"X-Big": "b" * 300, "X-Big2": "c" * 300})
    assert response.status == 431
    assert "the limit is 512" in (await response.json())["error"]
    assert recorder.reasons == ["headers_too_large"]


async def test_json_too_deep_is_400_and_too_many_values_413(serve: ServeFn) -> None:
    recorder = Recorder()
    client = await _stack(serve, recorder)
    deep = await client.post("/v2/models/m/infer", json=[[[[[1]]]]])
    assert deep.status == 400
    assert "nests 5 levels deep; the limit is 4" in (await deep.json())["error"]
    many = await client.post("/v2/models/m/infer", json=list(range(60)))
    assert many.status == 413
    assert "the limit is 50" in (await many.json())["error"]
    assert recorder.reasons == ["json_too_deep", "json_too_many_elements"]
    fine = await client.post("/v2/models/m/infer", json={"inputs": [[1, 2], [3, 4]]})
    assert fine.status == 200


async def test_non_json_bodies_are_not_scanned(serve: ServeFn) -> None:
    client = await _stack(serve, Recorder())
    response = await client.post("/upload", data=b"[" * 500, headers={"Content-Type": "text/plain"})
    assert response.status == 200
    vendor_json = await client.post("/upload", data=b"[" * 10, headers={"Content-Type": "application/vnd.api+json"})
    assert vendor_json.status == 400


async def test_slow_body_gets_408_and_the_connection_closes(serve: ServeFn) -> None:
    recorder = Recorder()
    limits = InputLimits(max_body_bytes=1000, body_read_timeout_s=0.3)
    client = await _stack(serve, recorder, limits)
    assert client.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    try:
        writer.write(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789")
        await writer.drain()
        # The answer comes after the deadline; the close follows the (short) lingering time.
        answer = await asyncio.wait_for(reader.read(), timeout=3)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert "within 0.3 s" in json.loads(body)["error"]
    assert recorder.reasons == ["body_timeout"]
