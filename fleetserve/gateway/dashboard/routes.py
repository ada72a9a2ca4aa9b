"""The dashboard's HTTP side: ``GET /dashboard`` (the page), its two static assets, and ``GET /gateway/fleet``
(the JSON the page polls once a second), plus the sampler task that builds a frame every second while the
gateway runs (started and stopped with the application).

The assets ship in the package (``static/``: one HTML file, one script, one style sheet; no CDN, no build
step) and are read once when the routes are added. ``/gateway/fleet?since=T`` returns the latest frame and
the chart points newer than ``T`` (a wall-clock second from an earlier answer); without ``since``, every
kept point, so a page opened now draws the last two minutes at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from importlib import resources

from aiohttp import web

from fleetserve.gateway.dashboard.sampler import AutoscaleView, FleetSampler, FleetState
from fleetserve.gateway.metrics import GatewayMetrics

DASHBOARD_PATH = "/dashboard"
FLEET_PATH = "/gateway/fleet"
_ASSETS = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}
_SAMPLER_KEY = web.AppKey("fleetserve_dashboard_sampler", FleetSampler)


def _asset(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _since(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"since must be a number of seconds, got {text[:32]!r}")
    return value


def add_dashboard_routes(app: web.Application, fleet: FleetState, metrics: GatewayMetrics, policy: str,
                         autoscale: AutoscaleView | None = None) -> None:
    """Serve the dashboard from ``app`` and run its sampler for the application's lifetime."""
    sampler = FleetSampler(metrics, fleet, policy, autoscale=autoscale)
    app[_SAMPLER_KEY] = sampler
    page = _asset("index.html")
    assets = {name: (_asset(name), content_type) for name, content_type in _ASSETS.items()}
    headers = {"Cache-Control": "no-cache"}

    async def index(request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html", charset="utf-8", headers=headers)

    async def asset(request: web.Request) -> web.Response:
        found = assets.get(request.match_info["name"])
        if found is None:
            raise web.HTTPNotFound()
        body, content_type = found
        return web.Response(body=body, content_type=content_type, charset="utf-8", headers=headers)

    async def fleet_json(request: web.Request) -> web.Response:
        try:
            since = _since(request.query.get("since"))
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(sampler.payload(since), headers=headers)

    async def run_sampler(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(_sample(sampler))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.router.add_get(DASHBOARD_PATH, index, allow_head=False)
    app.router.add_get(DASHBOARD_PATH + "/{name}", asset, allow_head=False)
    app.router.add_get(FLEET_PATH, fleet_json, allow_head=False)
    app.cleanup_ctx.append(run_sampler)


async def _sample(sampler: FleetSampler) -> None:
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while True:
        sampler.tick()
        # On a fixed beat rather than "interval after the last tick", so a slow tick does not drift the chart.
        next_at = max(next_at + sampler.interval_s, loop.time())
        await asyncio.sleep(next_at - loop.time())
