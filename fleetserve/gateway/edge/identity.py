"""The verified caller of a request, and the headers that carry it to replicas.

The auth guard stores an :class:`Identity` at ``request[IDENTITY_KEY]`` (an aiohttp ``RequestKey``
named ``fleetserve.identity``; read it with :func:`identity_of`); the rate limiter keys buckets
on it and the proxy forwards it with :func:`identity_headers`. Replicas may trust
``X-Fleetserve-Subject`` / ``X-Fleetserve-Tenant`` only because the gateway owns them:
:class:`StripIdentityHeaders` (always on) removes any value a client sent before anything reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import CIMultiDict

from fleetserve.wire import IDENTITY_HEADERS, SUBJECT_HEADER, TENANT_HEADER

# Printable ASCII except '%': claim values made only of these pass through unchanged; anything else
# (control characters that could split a header, non-ASCII) is percent-encoded (RFC 3986 §2.1).
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


@dataclass(frozen=True, slots=True)
class Identity:
    """Who sent a request, from a verified token."""

    subject: str
    tenant: str | None
    scopes: frozenset[str]
    claims: Mapping[str, Any]


# A typed request-storage key (aiohttp's RequestKey), named like the plain string key it replaces.
IDENTITY_KEY: web.RequestKey[Identity] = web.RequestKey("fleetserve.identity", Identity)


def identity_of(request: web.BaseRequest) -> Identity | None:
    return request.get(IDENTITY_KEY)


def header_value(value: str) -> str:
    return quote(value, safe=_HEADER_SAFE)


def identity_headers(request: web.BaseRequest) -> dict[str, str]:
    """Headers the proxy sets on the upstream request (empty when the request is anonymous)."""
    identity = identity_of(request)
    return {} if identity is None else headers_of(identity)


def headers_of(identity: Identity) -> dict[str, str]:
    """The identity headers that carry ``identity`` to replicas (lowercase them for gRPC metadata)."""
    headers = {SUBJECT_HEADER: header_value(identity.subject)}
    if identity.tenant is not None:
        headers[TENANT_HEADER] = header_value(identity.tenant)
    return headers


class StripIdentityHeaders:
    """Drops client-sent identity headers, so only the gateway can assert who a caller is."""

    __middleware_version__ = 1

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        headers = request.headers
        if SUBJECT_HEADER in headers or TENANT_HEADER in headers:
            clean = CIMultiDict(headers)
            for name in IDENTITY_HEADERS:
                clean.popall(name, None)
            request = request.clone(headers=clean)
        return await handler(request)
