"""The autoscaler's admin routes, beside the gateway's other admin routes.

- ``GET /gateway/autoscale``: the autoscaler's state (rule, range, desired count, the fleet it saw, the last
  snapshot's signals, recent decisions, held requests, members). ``?desired=N&wait_s=S`` is a long poll:
  the answer comes once the desired count is no longer N, or after S seconds (at most
  :data:`MAX_WAIT_S`), so an actuator acts on a decision at once without polling hard. 404 when autoscaling
  is off.
- ``PUT /gateway/autoscale/members``: the actuator's membership (:mod:`.members`); 400 naming what is wrong
  with a body, 409 unless the gateway runs with autoscaling on and ``--discovery actuator``.
"""

from __future__ import annotations

import json
import math

from aiohttp import web

from fleetserve.gateway.autoscale.members import parse_members
from fleetserve.gateway.autoscale.scaler import GatewayAutoscaler
from fleetserve.wire import error_response

AUTOSCALE_PATH = "/gateway/autoscale"
MEMBERS_PATH = "/gateway/autoscale/members"
MAX_WAIT_S = 30.0


def _long_poll(query: dict[str, str]) -> tuple[int | None, float]:
    """``desired`` and ``wait_s`` of a long poll (ValueError naming a bad one); wait 0 without them."""
    if "wait_s" not in query:
        return None, 0.0
    try:
        wait_s = float(query["wait_s"])
    except ValueError:
        wait_s = math.nan
    if not 0 <= wait_s <= MAX_WAIT_S:
        raise ValueError(f"wait_s must be a number of seconds in 0..{MAX_WAIT_S:g}, got {query['wait_s'][:32]!r}")
    text = query.get("desired", "")
    if text in ("", "null"):
        return None, wait_s
    try:
        return int(text), wait_s
    except ValueError:
        raise ValueError(f"desired must be a whole number or null, got {text[:32]!r}") from None


def add_autoscale_routes(app: web.Application, scaler: GatewayAutoscaler | None) -> None:
    async def state(request: web.Request) -> web.Response:
        if scaler is None:
            return error_response(404, "autoscaling is off on this gateway (start it with --autoscale hpa|predictive)")
        try:
            desired, wait_s = _long_poll(dict(request.query))
        except ValueError as exc:
            return error_response(400, str(exc))
        if wait_s > 0:
            await scaler.wait_change(desired, wait_s)
        return web.json_response(scaler.state())

    async def put_members(request: web.Request) -> web.Response:
        if scaler is None or scaler.membership is None:
            why = "autoscaling is off" if scaler is None else "its replicas come from its own discovery"
            return error_response(409, f"this gateway takes no members from an actuator: {why} (start it with "
                                  "--autoscale hpa|predictive --discovery actuator)")
        try:
            body = json.loads(await request.read())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return error_response(400, f"the body must be JSON: {exc}")
        try:
            members = parse_members(body)
        except ValueError as exc:
            return error_response(400, f"members: {exc}")
        inserted, removed = scaler.put_members(members)
        return web.json_response({"ready": len(members.ready), "starting": len(members.starting),
                                  "draining": len(members.draining), "inserted": inserted, "removed": removed})

    app.router.add_get(AUTOSCALE_PATH, state, allow_head=False)
    app.router.add_put(MEMBERS_PATH, put_members)
