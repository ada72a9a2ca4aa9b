"""The floor under the gateway: an aiohttp server whose one handler forwards to one upstream through
fleetserve's httptools pool — no balancing, health checks, retries, metrics, tracing or guards.

``benchmarks/gateway_cpu.py --fronts bare,...`` runs it as a front, so the gateway's CPU per request can be
read against what the prescribed stack (aiohttp public side + httptools upstream pool) costs on its own.

    python benchmarks/bare_proxy.py --upstream http://127.0.0.1:8000 --port 8080
"""

from __future__ import annotations

import argparse

import uvloop
from aiohttp import web

from fleetserve.gateway.forward.upstream import PoolConfig, UpstreamPool

_SKIP = frozenset({"host", "content-length", "connection", "keep-alive", "transfer-encoding"})


def build(upstream: str) -> web.Application:
    pools: list[UpstreamPool] = []

    async def forward(request: web.Request) -> web.Response:
        if not pools:
            pools.append(UpstreamPool(upstream, PoolConfig()))
        body = await request.read()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _SKIP]
        reply = await pools[0].request(request.method, request.raw_path, headers, body)
        return web.Response(status=reply.status, body=reply.body,
                            headers={k: v for k, v in reply.headers if k.lower() not in _SKIP})

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    web.run_app(build(args.upstream), host=args.host, port=args.port, access_log=None, print=None,
                loop=uvloop.new_event_loop())
