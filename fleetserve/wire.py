"""The contract between replicas and the gateway (and their clients), spelled once for both sides.

- **Headers.** ``X-Request-ID`` (kept end to end), ``X-Fleetserve-Timeout-Ms`` (a client's deadline at the
  gateway, and what is left of it when the gateway forwards a request: the replica drops work that outlives
  it), ``X-Fleetserve-Subject`` / ``-Tenant`` (the caller the gateway verified; only the gateway sets them),
  and ``Inference-Header-Content-Length`` (the binary tensor extension). gRPC metadata uses the same names in
  lowercase.
- **Errors.** Every error body is ``{"error": "..."}``; overload answers carry ``Retry-After`` in whole
  seconds, rounded up (RFC 9110 §10.2.3), so a client never comes back early. :func:`error_response` is the
  one aiohttp error answer of both servers.
- **Datatypes.** The KServe v2 / Open Inference Protocol datatype names and their little-endian numpy
  type codes (the wire order of raw tensors); the engine, batcher and codecs build their tables from it.
- **Backends.** ``URL[=WEIGHT]``, the form of ``--backend`` and discovery files; weights are positive
  numbers (floats) everywhere.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from aiohttp import web

REQUEST_ID_HEADER = "X-Request-ID"
TIMEOUT_HEADER = "X-Fleetserve-Timeout-Ms"
SUBJECT_HEADER = "X-Fleetserve-Subject"
TENANT_HEADER = "X-Fleetserve-Tenant"
IDENTITY_HEADERS = (SUBJECT_HEADER, TENANT_HEADER)
BINARY_HEADER_LENGTH = "Inference-Header-Content-Length"
RETRY_AFTER = "Retry-After"

# KServe v2 datatype -> numpy type code, explicitly little-endian.
DATATYPES: dict[str, str] = {"BOOL": "?", "BYTES": "O"}
DATATYPES |= {f"UINT{8 * n}": f"<u{n}" for n in (1, 2, 4, 8)}
DATATYPES |= {f"INT{8 * n}": f"<i{n}" for n in (1, 2, 4, 8)}
DATATYPES |= {f"FP{8 * n}": f"<f{n}" for n in (2, 4, 8)}

# The HTTP status each gRPC status code corresponds to (gRPC's "HTTP to gRPC status code mapping", read
# backwards), so both protocols share one vocabulary in metrics, retries and outlier detection.
GRPC_HTTP_STATUS: dict[str, int] = {
    "OK": 200, "INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "OUT_OF_RANGE": 400, "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403, "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "RESOURCE_EXHAUSTED": 429,
    "CANCELLED": 499, "UNIMPLEMENTED": 501, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504,
}
# The gRPC status code of an HTTP error status (the gateway's own refusals on its gRPC listener).
HTTP_GRPC_STATUS: dict[int, str] = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED", 413: "RESOURCE_EXHAUSTED", 429: "RESOURCE_EXHAUSTED", 431: "RESOURCE_EXHAUSTED",
    501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}

MAX_WEIGHT = 10_000.0


def retry_after(seconds: float) -> str:
    """A ``Retry-After`` value: whole seconds, rounded up, at least 1."""
    return str(max(1, math.ceil(seconds)))


def error_body(message: str) -> bytes:
    """The JSON error body, ``{"error": message}``."""
    return json.dumps({"error": message}).encode()


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    """The aiohttp error answer of both servers: ``{"error": message}`` with ``status`` and ``headers``."""
    return web.Response(status=status, body=error_body(message), content_type="application/json", headers=headers)


def parse_weighted(spec: str) -> tuple[str, float]:
    """``URL[=WEIGHT]`` -> (URL, weight); ValueError naming a weight that is not in (0, MAX_WEIGHT].

    The weight is whatever follows the last ``=`` when that parses as a number, so a URL may itself hold
    ``=`` only when a weight follows it.
    """
    text = spec.strip()
    url, sep, weight_text = text.rpartition("=")
    if not sep:
        return text, 1.0
    try:
        weight = float(weight_text)
    except ValueError:
        raise ValueError(f"backend {spec!r}: weight {weight_text!r} is not a number") from None
    return url, check_weight(weight, url)


def check_weight(weight: float, where: str) -> float:
    """``weight`` as a float when it is a finite number in (0, MAX_WEIGHT]; ValueError otherwise."""
    number = isinstance(weight, int | float) and not isinstance(weight, bool)
    if not (number and math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
        raise ValueError(f"backend {where}: weight must be a positive number up to {MAX_WEIGHT:g}, got {weight!r}")
    return float(weight)


def format_weighted(url: str, weight: float) -> str:
    """The ``URL[=WEIGHT]`` form of a backend (no ``=WEIGHT`` for weight 1)."""
    return url if weight == 1 else f"{url}={weight:g}"
