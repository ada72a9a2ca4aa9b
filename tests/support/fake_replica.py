"""An in-process fake KServe replica (aiohttp on 127.0.0.1) for gateway tests: scripted answers, load headers."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from aiohttp import web
from multidict import CIMultiDict

from fleetserve.wire import LOAD_REPORT_HEADER, encode_load_report


@dataclass
class FakeReplica:
    """A fake KServe replica: answers ``mode`` and reports its load (ORCA) on every answer.

    Modes: ``ok`` (200 JSON naming the replica, after ``delay_s``), ``overloaded`` (503), ``bad``
    (400), ``hang`` (never answers), ``reset`` (closes the connection without answering),
    ``unready`` (health 503).
    """

    name: str
    mode: str = "ok"
    queue_depth: int = 0
    inflight: int = 0  # rows reported running besides the answered request (which is done when it answers)
    delay_s: float = 0.0
    hits: int = 0
    last_headers: CIMultiDict[str] = field(default_factory=CIMultiDict)  # names are case-insensitive
    last_body: bytes = b""
    url: str = ""
    runner: web.AppRunner | None = None

    async def _infer(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        self.last_headers = CIMultiDict(request.headers)
        self.last_body = await request.read()
        load = {LOAD_REPORT_HEADER: encode_load_report(self.queue_depth, self.inflight)}
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.mode == "reset":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if self.mode == "overloaded":
            load["Retry-After"] = "1"
            return web.json_response({"error": "queue full"}, status=503, headers=load)
        if self.mode == "bad":
            return web.json_response({"error": "bad input from client"}, status=400, headers=load)
        payload = {"replica": self.name, "path": request.path_qs, "echo_len": len(self.last_body)}
        return web.Response(body=json.dumps(payload).encode(), content_type="application/json", headers=load)

    async def _ready(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.mode == "unready" else 200)

    async def start(self) -> FakeReplica:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v2/health/ready", self._ready)
        app.router.add_route("*", "/v2/{tail:.*}", self._infer)
        app.router.add_route("*", "/v2", self._infer)
        app.router.add_post("/inference", self._infer)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
