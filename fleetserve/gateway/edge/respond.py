"""The JSON error responses every edge guard answers with: ``{"error": "..."}`` plus headers."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from aiohttp import web


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps({"error": message}).encode(),
        content_type="application/json",
        headers=headers,
    )


def retry_after(seconds: float) -> str:
    """Retry-After takes whole seconds (RFC 9110 §10.2.3); round up so clients never come back early."""
    return str(max(1, math.ceil(seconds)))
