"""The gateway's listeners. HTTP: every connection passes through the edge's :class:`ConnectionGuard`
(header-read deadline, connection cap), which acts below aiohttp where no middleware can. gRPC: a
``grpc.aio`` server whose message and metadata sizes are the edge's input limits (the request guards run
per call, :mod:`.grpc`). Worker processes sharing one port bind it with ``SO_REUSEPORT``.
"""

from __future__ import annotations

import grpc
import grpc.aio
from aiohttp import web

from fleetserve.gateway.edge import GuardedTCPSite, InputLimits, RejectionObserver

BACKLOG = 1024


def guarded_site(runner: web.BaseRunner, host: str, port: int, limits: InputLimits, observer: RejectionObserver,
                 *, reuse_port: bool = False) -> web.BaseSite:
    """The listener for ``runner``: guarded always, shared through SO_REUSEPORT when ``reuse_port``."""
    return GuardedTCPSite(runner, host, port, limits, observer, backlog=BACKLOG, reuse_port=reuse_port or None)


async def start_grpc_server(handler: grpc.GenericRpcHandler, host: str, port: int, limits: InputLimits, *,
                            reuse_port: bool = False) -> tuple[grpc.aio.Server, int]:
    """Start a ``grpc.aio`` server with ``handler`` on ``host:port``; returns it and the bound port."""
    size = limits.max_body_bytes
    server = grpc.aio.server(handlers=[handler], options=[
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        ("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", size),
        ("grpc.max_metadata_size", limits.max_header_bytes)])
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpcio reports a failed bind this way (older versions return 0)
        raise OSError(f"gRPC cannot listen on {address}: {exc}") from None
    if bound == 0:
        raise OSError(f"gRPC cannot listen on {address}")
    await server.start()
    return server, bound
