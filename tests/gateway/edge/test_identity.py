"""Identity headers: client-sent ones are stripped; the verified identity is forwarded, encoded safely."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from aiohttp.typedefs import Handler

from fleetserve.gateway.edge.identity import (
    IDENTITY_KEY,
    Identity,
    StripIdentityHeaders,
    header_value,
    identity_headers,
    identity_of,
)
from tests.support.jwt_keys import ServeFn


async def test_client_sent_identity_headers_never_reach_the_handler(serve: ServeFn) -> None:
    client = await serve([StripIdentityHeaders()])
    response = await client.get(
        "/", headers=[("X-Fleetserve-Subject", "root"), ("x-fleetserve-subject", "admin"), ("X-Fleetserve-Tenant", "t")]
    )
    body = await response.json()
    assert body["client_sent"] == {} and body["identity"] == {}
    other = await client.get("/", headers={"X-Fleetserve-Other": "kept"})
    assert (await other.json())["client_sent"] == {"X-Fleetserve-Other": "kept"}


async def test_identity_set_by_auth_is_forwarded(serve: ServeFn) -> None:
    @web.middleware
    async def fake_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        request[IDENTITY_KEY] = Identity("alice@example.com", "acme", frozenset({"read"}), {})
        return await handler(request)

    client = await serve([StripIdentityHeaders(), fake_auth])
    body = await (await client.get("/", headers={"X-Fleetserve-Tenant": "evil"})).json()
    assert body["identity"] == {"X-Fleetserve-Subject": "alice@example.com", "X-Fleetserve-Tenant": "acme"}


def test_identity_headers_of_anonymous_and_tenantless_requests() -> None:
    request = make_mocked_request("GET", "/")
    assert identity_of(request) is None and identity_headers(request) == {}
    request[IDENTITY_KEY] = Identity("svc", None, frozenset(), {})
    assert identity_headers(request) == {"X-Fleetserve-Subject": "svc"}


def test_header_values_cannot_smuggle_headers() -> None:
    assert header_value("plain user|42 (ok)") == "plain user|42 (ok)"
    assert header_value("a\r\nX-Evil: 1") == "a%0D%0AX-Evil: 1"
    assert header_value("100%") == "100%25"
    assert header_value("jürgen") == "j%C3%BCrgen"
