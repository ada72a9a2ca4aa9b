"""Render the monitoring assets (``fleetserve deploy prometheus`` / ``grafana``).

``prometheus.yml`` scrapes annotated pods through plain Kubernetes pod discovery (no Operator),
``prometheus-local.yml`` the static ports of ``fleetserve up``, and ``rules.yml`` records p50/p99
latency, error ratio, queue depth and gateway ejections and alerts on them. The Grafana dashboard is
built from a panel list here rather than kept as a hand-edited JSON blob, so every query it shows is
also visible in one place and checked by the tests against the metric names the code exports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fleetserve.deploy.templating import render
from fleetserve.options import option

DASHBOARD_UID = "fleetserve"


@dataclass(frozen=True)
class MonitoringConfig:
    """Alert thresholds and scrape targets. Times are seconds."""

    scrape_interval_s: int = 15
    # The seed's ranking service ran at 18 ms; 50 ms leaves room for peaks.
    p99_seconds: float = option(0.05, "p99 latency alert threshold")
    error_ratio: float = option(0.01, "5xx ratio alert threshold")
    queue_depth: int = option(512, "queued rows per replica alert threshold (half the replica's --max-queue)")
    ejections: int = 3
    gateway_port: int = 8080  # `fleetserve up` defaults: gateway port, then replicas at base_port + 2i
    base_port: int = 8100
    local_replicas: int = 3

    def __post_init__(self) -> None:
        if self.scrape_interval_s < 1:
            raise ValueError(f"scrape_interval_s must be >= 1, got {self.scrape_interval_s}")
        if not self.p99_seconds > 0:
            raise ValueError(f"p99_seconds must be > 0, got {self.p99_seconds}")
        if not 0 < self.error_ratio < 1:
            raise ValueError(f"error_ratio must be in (0, 1), got {self.error_ratio}")
        if self.queue_depth < 1 or self.ejections < 0 or self.local_replicas < 1:
            raise ValueError("queue_depth and local_replicas must be >= 1 and ejections >= 0")
        if not (0 < self.gateway_port < 65536 and 0 < self.base_port + 2 * self.local_replicas < 65536):
            raise ValueError("local ports must be in 1..65535")


def render_prometheus(config: MonitoringConfig) -> dict[str, str]:
    """``prometheus.yml``, ``prometheus-local.yml`` and ``rules.yml``: file name -> text."""
    replicas = ", ".join(f'"127.0.0.1:{config.base_port + 2 * i}"' for i in range(config.local_replicas))
    values = {
        "scrape_interval": f"{config.scrape_interval_s}s",
        "gateway_targets": f'"127.0.0.1:{config.gateway_port}"',
        "replica_targets": replicas,
        "p99_seconds": config.p99_seconds,
        "error_ratio": config.error_ratio,
        "error_ratio_percent": f"{config.error_ratio * 100:g}",
        "queue_depth": config.queue_depth,
        "ejections": config.ejections,
    }
    return {name: render(f"prometheus/{name}", values)
            for name in ("prometheus.yml", "prometheus-local.yml", "rules.yml")}


# (title, unit, [(PromQL, legend)]): two panels per row, in this order.
PANELS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("Replica requests by status", "reqps",
     (('sum by (code) (rate(fleetserve_requests_total[$__rate_interval]))', "{{code}}"),)),
    ("Replica 5xx ratio", "percentunit",
     (("fleetserve:request_errors:ratio_rate5m", "{{model}}"),)),
    ("Replica latency p50 / p99 (total)", "s",
     (('fleetserve:request_duration_seconds:p50_5m{stage="total"}', "p50 {{model}}"),
      ('fleetserve:request_duration_seconds:p99_5m{stage="total"}', "p99 {{model}}"))),
    ("Replica latency p99 by stage", "s",
     (('fleetserve:request_duration_seconds:p99_5m{stage=~"queue|compute"}', "{{stage}}"),)),
    ("Queue depth per replica", "short",
     (("fleetserve_queue_depth", "{{instance}}"),)),
    ("In-flight requests per replica", "short",
     (("fleetserve_inflight_requests", "{{instance}}"),)),
    ("Mean batch size", "short",
     (("fleetserve:batch_size:mean_5m", "{{model}}"),)),
    ("GPU utilization", "percentunit",
     (("fleetserve_gpu_utilization_ratio", "{{instance}}"),)),
    ("Gateway requests by backend", "reqps",
     (('sum by (backend) (rate(fleetserve_gateway_requests_total[$__rate_interval]))', "{{backend}}"),)),
    ("Gateway upstream p99", "s",
     (("fleetserve:gateway_upstream_duration_seconds:p99_5m", "p99"),)),
    ("Gateway backends by state", "short",
     (("sum by (state) (fleetserve_gateway_backends)", "{{state}}"),)),
    ("Gateway ejections and retries", "short",
     (("sum by (backend) (increase(fleetserve_gateway_ejections_total[$__rate_interval]))", "ejected {{backend}}"),
      ("sum(increase(fleetserve_gateway_retries_total[$__rate_interval]))", "retries"))),
)


def _panel(index: int, title: str, unit: str, queries: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    datasource = {"type": "prometheus", "uid": "${datasource}"}
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "datasource": datasource,
        "gridPos": {"x": 12 * (index % 2), "y": 8 * (index // 2), "w": 12, "h": 8},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": datasource, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(queries)
        ],
    }


def render_grafana() -> str:
    """The Grafana dashboard JSON (datasource chosen on import through the ``datasource`` variable)."""
    dashboard = {
        "uid": DASHBOARD_UID,
        "title": "fleetserve",
        "tags": ["fleetserve"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"},
        ]},
        "panels": [_panel(i, *panel) for i, panel in enumerate(PANELS)],
    }
    return json.dumps(dashboard, indent=2) + "\n"
