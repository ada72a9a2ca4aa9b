"""The routes the gateway forwards to replicas, defined once for the aiohttp router, the Granian front, the access
log and tracing: ``GET``/``POST`` on ``/v2``, everything below ``/v2/`` (KServe v2) and ``/inference``. Every
other path is the gateway's own (admin API, ``/metrics``, dashboard) or a 404.
"""

from __future__ import annotations

PROXIED_METHODS = ("GET", "POST")
# aiohttp router patterns, the catch-all first: the router tries the resources indexed under "/v2" in this order,
# and nearly every request is below /v2/.
PROXIED_PATHS = ("/v2/{tail:.*}", "/v2", "/inference")


def proxied(path: str) -> bool:
    """Whether ``path`` is one the gateway forwards. By path alone: every request on it is timed, traced and
    logged as client traffic; only :data:`PROXIED_METHODS` are forwarded (others get a 405)."""
    return path.startswith("/v2/") or path == "/v2" or path == "/inference"
