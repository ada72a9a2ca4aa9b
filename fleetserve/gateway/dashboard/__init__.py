"""The live fleet dashboard the gateway serves at ``/dashboard``: per-replica traffic share, latency, load,
health and ejections, retries and hedges, updated every second from the gateway's own state (no
Prometheus needed). :mod:`.sampler` builds the frames, :mod:`.routes` serves them and the page."""

from fleetserve.gateway.dashboard.routes import DASHBOARD_PATH, FLEET_PATH, add_dashboard_routes

__all__ = ["DASHBOARD_PATH", "FLEET_PATH", "add_dashboard_routes"]
