"""Synthetic fleet snapshots for the autoscaling rules' unit tests."""

from __future__ import annotations

from typing import Any

from fleetserve.autoscale.signals import FleetSignals


def signals(at_s: float, ready: int, **fields: Any) -> FleetSignals:
    """A snapshot at ``at_s`` with ``ready`` replicas; every other field defaults to an idle fleet."""
    base: dict[str, Any] = {"starting": 0, "draining": 0, "request_rate": 0.0, "queue_depth": 0.0,
                            "inflight": 0.0, "p50_s": None, "p99_s": None}
    base.update(fields)
    return FleetSignals(at_s=at_s, ready=ready, **base)
