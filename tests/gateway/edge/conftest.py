"""Fixtures for the edge guard tests: signing keys made once a session, and an in-process aiohttp server
(the echo downstream of ``tests/support/jwt_keys.py``) behind a list of middlewares."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.typedefs import Middleware

from tests.support.jwt_keys import ServeFn, SigningKey, echo, make_signing_keys


@pytest.fixture(scope="session")
def signing_keys() -> dict[str, SigningKey]:
    return make_signing_keys()


@pytest.fixture
async def serve() -> AsyncIterator[ServeFn]:
    """Start an in-process server with the given middlewares in front of :func:`echo`;
    ``app`` and ``server`` are keyword arguments for ``web.Application`` and ``web.AppRunner``."""
    clients: list[TestClient[web.Request, web.Application]] = []

    async def start(
        middlewares: Sequence[Middleware],
        app: Mapping[str, Any] | None = None,
        server: Mapping[str, Any] | None = None,
    ) -> TestClient[web.Request, web.Application]:
        application = web.Application(middlewares=list(middlewares), **(app or {}))
        application.router.add_route("*", "/{tail:.*}", echo)
        test_server = TestServer(application)
        await test_server.start_server(**(server or {}))
        client = TestClient(test_server)
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for client in clients:
        await client.close()
