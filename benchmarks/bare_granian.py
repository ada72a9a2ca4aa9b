"""The same floor as ``bare_proxy.py`` on Granian, the Rust HTTP server for Python, instead of aiohttp: an RSGI
app whose one handler forwards to one upstream through fleetserve's httptools pool — no balancing, health
checks, retries, metrics, tracing or guards.

``benchmarks/gateway_cpu.py --fronts bare,bare-granian`` runs both, so the two public-side servers can be read
side by side under the one upstream pool (Granian 2.x, one worker, one runtime thread, uvloop). Granian is not a
dependency of fleetserve: install it to run this front (``pip install granian``).

    python benchmarks/bare_granian.py --upstream http://127.0.0.1:8000 --port 8080
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from fleetserve.gateway.forward.upstream import PoolConfig, UpstreamPool

_SKIP = frozenset({"host", "content-length", "connection", "keep-alive", "transfer-encoding"})
UPSTREAM_ENV = "FLEETSERVE_BARE_UPSTREAM"


class Forward:
    """RSGI application: read the body, forward it through the pool, answer with the upstream's reply."""

    def __init__(self) -> None:
        self._pool: UpstreamPool | None = None

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if self._pool is None:
            self._pool = UpstreamPool(os.environ[UPSTREAM_ENV], PoolConfig())
        body = await proto()
        target = scope.path if not scope.query_string else f"{scope.path}?{scope.query_string}"
        headers = [(k, v) for k, v in scope.headers.items() if k.lower() not in _SKIP]
        reply = await self._pool.request(scope.method, target, headers, body)
        proto.response_bytes(reply.status, [(k, v) for k, v in reply.headers if k.lower() not in _SKIP], reply.body)


app = Forward()


def serve(target: str, upstream_env: str, description: str) -> None:
    """Parse ``--upstream/--host/--port`` and serve the RSGI app ``target`` (``module:attribute`` in this folder)
    on Granian: one worker, one runtime thread, uvloop, HTTP/1; the upstream reaches the app in ``upstream_env``."""
    from granian import Granian

    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    os.environ[upstream_env] = args.upstream
    Granian(target, address=args.host, port=args.port, interface="rsgi", workers=1,  # type: ignore[arg-type]
            runtime_threads=1, loop="uvloop", http="1", websockets=False, log_enabled=False,  # type: ignore[arg-type]
            working_dir=Path(__file__).resolve().parent).serve()


if __name__ == "__main__":
    serve("bare_granian:app", UPSTREAM_ENV, __doc__)
