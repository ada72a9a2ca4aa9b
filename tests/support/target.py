"""Scriptable local HTTP servers for the load generator tests (aiohttp, 127.0.0.1, free ports).

``TargetServer`` answers every POST with a configurable status after a configurable delay, can
stall (hold every request that arrives during a window until the window ends, like a GC pause),
and records what it saw: request count, connections, peak concurrency, the last bodies and headers.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Behaviour:
    status: int = 200
    delay_s: float = 0.0
    stall_until: float = 0.0  # loop time: requests arriving before it wait until it


@dataclass
class Seen:
    requests: int = 0
    inflight: int = 0
    peak_inflight: int = 0
    peers: set[tuple[str, int]] = field(default_factory=set)
    bodies: list[bytes] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


class TargetServer:
    def __init__(self, keep: int = 50) -> None:
        self.behaviour = Behaviour()
        self.seen = Seen()
        self._keep = keep
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        seen = self.seen
        seen.requests += 1
        seen.inflight += 1
        seen.peak_inflight = max(seen.peak_inflight, seen.inflight)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer:
            seen.peers.add(tuple(peer[:2]))
        try:
            body = await request.read()
            if len(seen.bodies) < self._keep:
                seen.bodies.append(body)
                seen.headers.append(dict(request.headers))
                seen.paths.append(request.path)
            loop = asyncio.get_running_loop()
            if loop.time() < self.behaviour.stall_until:
                await asyncio.sleep(self.behaviour.stall_until - loop.time())
            if self.behaviour.delay_s:
                await asyncio.sleep(self.behaviour.delay_s)
            return web.json_response({"ok": True}, status=self.behaviour.status)
        finally:
            seen.inflight -= 1

    def stall(self, seconds: float) -> None:
        self.behaviour.stall_until = asyncio.get_running_loop().time() + seconds

    async def start(self) -> TargetServer:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def refused_url() -> str:
    """A URL on a port nothing listens on (bound then released, never listened on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"
