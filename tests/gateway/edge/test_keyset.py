"""JWKS URLs served by a local aiohttp server: first fetch, refresh on unknown kid, refresh rate
limit, periodic refresh, merged concurrent refreshes, failures keeping the old keys."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from fleetserve.gateway.edge.jwtconfig import JwtConfig, KeySpec
from fleetserve.gateway.edge.keyset import MAX_JWKS_BYTES, KeyLookupError, KeySet
from tests.support.clock import FakeClock
from tests.support.jwt_keys import SigningKey


@dataclass
class JwksServer:
    """Serves ``document`` at /jwks.json; counts requests; optional delay and failure status."""

    document: Any = field(default_factory=lambda: {"keys": []})
    status: int = 200
    delay_s: float = 0.0
    hits: int = 0
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if isinstance(self.document, bytes):
            return web.Response(body=self.document, status=self.status)
        return web.json_response(self.document, status=self.status)


@pytest.fixture
async def jwks_server() -> AsyncIterator[JwksServer]:
    state = JwksServer()
    app = web.Application()
    app.router.add_get("/jwks.json", state.handle)
    server = TestServer(app)
    await server.start_server()
    state.url = str(server.make_url("/jwks.json"))
    yield state
    await server.close()


def _keyset(url: str, clock: FakeClock) -> KeySet:
    config = JwtConfig(
        keys=(KeySpec("jwks_url", url, ("RS256", "ES256")),),
        jwks_refresh_interval_s=300,
        jwks_min_refresh_interval_s=30,
        jwks_fetch_timeout_s=2,
    )
    return KeySet.from_config(config, clock=clock)


async def test_fetch_on_first_use_and_refresh_on_a_rotated_kid(
    jwks_server: JwksServer, signing_keys: dict[str, SigningKey]
) -> None:
    clock = FakeClock(1000.0)
    keys = _keyset(jwks_server.url, clock)
    jwks_server.document = {"keys": [signing_keys["rsa"].jwk("k1")]}
    assert [k.kid for k in await keys.select("k1", "RS256")] == ["k1"]
    assert jwks_server.hits == 1
    await keys.select("k1", "RS256")
    assert jwks_server.hits == 1  # fresh and known: no fetch

    jwks_server.document = {"keys": [signing_keys["ec256"].jwk("k2")]}
    clock.now += 31
    assert [k.kid for k in await keys.select("k2", "ES256")] == ["k2"]
    assert jwks_server.hits == 2
    with pytest.raises(KeyLookupError, match="unknown key id 'k1'"):
        await keys.select("k1", "RS256")  # rotated out; refresh is rate limited, so no new fetch
    assert jwks_server.hits == 2


async def test_unknown_kids_cannot_hammer_the_key_server(
    jwks_server: JwksServer, signing_keys: dict[str, SigningKey]
) -> None:
    clock = FakeClock(1000.0)
    keys = _keyset(jwks_server.url, clock)
    jwks_server.document = {"keys": [signing_keys["rsa"].jwk("k1")]}
    for i in range(100):
        with pytest.raises(KeyLookupError, match="unknown key id"):
            await keys.select(f"made-up-{i}", "RS256")
        clock.now += 0.1  # 100 tries over 10 s, all within the 30 s minimum interval
    assert jwks_server.hits == 1
    clock.now += 30
    with pytest.raises(KeyLookupError):
        await keys.select("made-up-again", "RS256")
    assert jwks_server.hits == 2


async def test_periodic_refresh_when_stale(jwks_server: JwksServer, signing_keys: dict[str, SigningKey]) -> None:
    clock = FakeClock(1000.0)
    keys = _keyset(jwks_server.url, clock)
    jwks_server.document = {"keys": [signing_keys["rsa"].jwk("k1")]}
    await keys.select("k1", "RS256")
    clock.now += 299
    await keys.select("k1", "RS256")
    assert jwks_server.hits == 1
    clock.now += 1
    await keys.select("k1", "RS256")
    assert jwks_server.hits == 2


async def test_concurrent_refreshes_are_merged(jwks_server: JwksServer, signing_keys: dict[str, SigningKey]) -> None:
    clock = FakeClock(1000.0)
    keys = _keyset(jwks_server.url, clock)
    jwks_server.document = {"keys": [signing_keys["rsa"].jwk("k1")]}
    jwks_server.delay_s = 0.05
    results = await asyncio.gather(*(keys.select("k1", "RS256") for _ in range(20)))
    assert all(len(r) == 1 for r in results)
    assert jwks_server.hits == 1


@pytest.mark.parametrize(
    ("status", "document"),
    [(500, {"keys": []}), (200, b"not json"), (200, {"no": "keys"}), (200, b" " * (MAX_JWKS_BYTES + 1))],
)
async def test_failed_refresh_keeps_the_old_keys(
    jwks_server: JwksServer, signing_keys: dict[str, SigningKey], status: int, document: Any
) -> None:
    clock = FakeClock(1000.0)
    keys = _keyset(jwks_server.url, clock)
    jwks_server.document = {"keys": [signing_keys["rsa"].jwk("k1")]}
    await keys.select("k1", "RS256")
    jwks_server.status, jwks_server.document = status, document
    clock.now += 301
    assert [k.kid for k in await keys.select("k1", "RS256")] == ["k1"]
    assert jwks_server.hits == 2


async def test_unreachable_key_server_means_unknown_key() -> None:
    keys = _keyset("http://127.0.0.1:9/jwks.json", FakeClock(1000.0))
    with pytest.raises(KeyLookupError, match="unknown key id 'k1'"):
        await keys.select("k1", "RS256")
    with pytest.raises(KeyLookupError, match="no key allows algorithm RS256"):
        await keys.select(None, "RS256")
