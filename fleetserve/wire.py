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
- **Load reports.** Replicas report their load on every response in ORCA's ``endpoint-load-metrics``
  header, native HTTP form (``TEXT name=value,...``; Envoy's ``source/common/orca/orca_parser.cc`` and the
  field names of xds' ``xds/data/orca/v3/orca_load_report.proto``): ``application_utilization`` (the share
  of the last second the engine instances spent computing), ``rps_fractional`` (requests answered per
  second over that second; Envoy's client-side weighted round robin weighs a replica by
  ``rps_fractional / utilization`` and rejects a report without it), and named metrics ``queue_depth`` and
  ``inflight`` (rows queued and running now), plus ``gpu_utilization`` and ``gpu_throttled`` (0 or 1) where
  a GPU is watched. Over gRPC the same text is the ``endpoint-load-metrics`` trailing metadata. The
  gateway's policies read it through :func:`parse_load_report`, which accepts ``=`` or ``:`` between a name
  and its value (as Envoy does) and ignores fields it does not use.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import NamedTuple

from aiohttp import web

REQUEST_ID_HEADER = "X-Request-ID"
TIMEOUT_HEADER = "X-Fleetserve-Timeout-Ms"
SUBJECT_HEADER = "X-Fleetserve-Subject"
TENANT_HEADER = "X-Fleetserve-Tenant"
IDENTITY_HEADERS = (SUBJECT_HEADER, TENANT_HEADER)
BINARY_HEADER_LENGTH = "Inference-Header-Content-Length"
RETRY_AFTER = "Retry-After"
LOAD_REPORT_HEADER = "endpoint-load-metrics"

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

MAX_WEIGHT = 1_000_000.0  # measured throughputs (sequences/s) are used as weights as they are


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
        raise ValueError(f"backend {where}: weight must be a positive number up to {MAX_WEIGHT:.0f}, got {weight!r}")
    return float(weight)


def format_weighted(url: str, weight: float) -> str:
    """The ``URL[=WEIGHT]`` form of a backend (no ``=WEIGHT`` for weight 1)."""
    return url if weight == 1 else f"{url}={weight:g}"


# Named ORCA metrics of a fleetserve replica.
QUEUE_DEPTH = "queue_depth"
INFLIGHT = "inflight"
GPU_UTILIZATION = "gpu_utilization"
GPU_THROTTLED = "gpu_throttled"
_TEXT = "TEXT "
_QUEUE_DEPTH = "named_metrics." + QUEUE_DEPTH
_INFLIGHT = "named_metrics." + INFLIGHT
_GPU_UTILIZATION = "named_metrics." + GPU_UTILIZATION
_GPU_THROTTLED = "named_metrics." + GPU_THROTTLED
# Counts above this are read as this: a garbage report must not overflow a score.
_MAX_COUNT = 1_000_000.0
_CACHE_ENTRIES = 1024


class LoadReport(NamedTuple):
    """The part of an ORCA load report the gateway uses; counts are rows, utilizations fractions."""

    application_utilization: float = 0.0
    queue_depth: float = 0.0
    inflight: float = 0.0
    gpu_utilization: float | None = None  # None: the replica reports no GPU (a CPU replica)
    gpu_throttled: bool = False


def encode_load_report(queue_depth: int, inflight: int, utilization: float = 0.0, rps: float = 0.0,
                       gpu: Mapping[str, float] | None = None) -> str:
    """The ``endpoint-load-metrics`` value for a replica with ``queue_depth`` rows queued and ``inflight``
    running, busy ``utilization`` of the time and answering ``rps`` requests per second; ``gpu`` adds named GPU
    metrics (``gpu_utilization``, ``gpu_throttled``)."""
    text = (f"TEXT application_utilization={utilization:.4g},rps_fractional={rps:.4g},"
            f"named_metrics.queue_depth={queue_depth},named_metrics.inflight={inflight}")
    if gpu:
        text += "".join(f",named_metrics.{name}={value:.4g}" for name, value in gpu.items())
    return text


_parsed: dict[str, LoadReport | None] = {}


def parse_load_report(text: str | None) -> LoadReport | None:
    """The report in an ``endpoint-load-metrics`` value (native ``TEXT`` form), or None for none or an invalid one.

    Like Envoy, a value that is not a finite number, or a name given twice, invalidates the whole report.
    Replicas repeat a few distinct reports under steady load, so parsed reports are cached by their text.
    """
    if text is None:
        return None
    cached = _parsed.get(text)
    if cached is not None or text in _parsed:
        return cached
    report = _parse(text)
    if len(_parsed) >= _CACHE_ENTRIES:
        _parsed.clear()
    _parsed[text] = report
    return report


def _parse(text: str) -> LoadReport | None:
    if not text.startswith(_TEXT):
        return None  # the BIN and JSON forms are not read
    utilization = queue = inflight = 0.0
    gpu: float | None = None
    throttled = False
    seen: set[str] = set()
    for item in text[len(_TEXT):].split(","):
        name, sep, value = item.partition("=")
        if not sep:
            name, sep, value = item.partition(":")
        try:
            number = float(value)
        except ValueError:
            return None
        name = name.strip()
        if not sep or not name or name in seen or not math.isfinite(number):
            return None
        seen.add(name)
        if name == _QUEUE_DEPTH:
            queue = number
        elif name == _INFLIGHT:
            inflight = number
        elif name == "application_utilization":
            utilization = number
        elif name == _GPU_UTILIZATION:
            gpu = number
        elif name == _GPU_THROTTLED:
            throttled = number > 0.0
    gpu_share = None if gpu is None else min(1.0, max(0.0, gpu))
    return LoadReport(max(0.0, utilization), _count(queue), _count(inflight), gpu_share, throttled)


def _count(value: float) -> float:
    return min(_MAX_COUNT, max(0.0, value))
