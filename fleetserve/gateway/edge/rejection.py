"""A guard's refusal in one form for both listeners: the HTTP answer it becomes (``{"error": ...}`` with its
headers) and, on the gRPC listener, the status code and trailing metadata (:mod:`.grpc`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web

from fleetserve.wire import error_response


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a guard turned a request away: an HTTP ``status``, the ``reason`` it was counted under
    (:data:`~.metrics.REASONS`), a message for the client and headers (``Retry-After``, challenges)."""

    status: int
    reason: str
    message: str
    headers: Mapping[str, str] | None = None

    def response(self) -> web.Response:
        return error_response(self.status, self.message, self.headers)
