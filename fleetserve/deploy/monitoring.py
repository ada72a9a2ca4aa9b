"""Render the monitoring assets (``fleetserve deploy prometheus`` / ``grafana``).

``prometheus.yml`` scrapes annotated pods through plain Kubernetes pod discovery (no Operator),
``prometheus-local.yml`` the static ports of ``fleetserve up``, and ``rules.yml`` records p50/p99
latency (replicas by stage, the gateway end to end), error ratio, request rates, queue depth and batch
size over ``window`` and alerts on them. A recorded series names its window (``..._p99_5m``), so the
Grafana dashboard, which shows recorded series, is rendered for the same window.

The dashboard is built from the panel list of :func:`panels` rather than kept as a hand-edited JSON blob,
so every query it shows is visible in one place; the tests check each against the metric names the code
exports and fail when an exported family appears on no panel (unless listed, with its reason, as one no
operator acts on). Its data source is a dashboard variable of type ``datasource`` restricted to
Prometheus: Grafana offers every Prometheus data source it has, the first one is preselected, and each
panel's queries go to the one chosen (``${datasource}``), so the JSON names no data source of its own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from fleetserve.deploy.templating import render
from fleetserve.options import option

DASHBOARD_UID = "fleetserve"
_DURATION = re.compile(r"[1-9][0-9]*[smh]")


@dataclass(frozen=True)
class MonitoringConfig:
    """Alert thresholds and scrape targets. Times are seconds."""

    scrape_interval_s: int = 15
    window: str = option("5m", "range of the recorded rates and quantiles (a Prometheus duration: 30s, 5m, 1h); "
                         "the recorded series' names end in it")
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
        if not _DURATION.fullmatch(self.window):
            raise ValueError(f"window must be a Prometheus duration such as 30s, 5m or 1h, got {self.window!r}")
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
        "window": config.window,
    }
    return {name: render(f"prometheus/{name}", values)
            for name in ("prometheus.yml", "prometheus-local.yml", "rules.yml")}


Panel = tuple[str, str, tuple[tuple[str, str], ...]]  # (title, unit, [(PromQL, legend)])
_RATE = "[$__rate_interval]"
# Each GPU series joined with its model name and MIG profile (``fleetserve_gpu_info``, value 1).
_GPU_NAMES = "* on (instance, gpu, uuid, mig) group_left (name, profile) fleetserve_gpu_info"


def _quantiles(series: str, by: str, legend: str) -> tuple[tuple[str, str], ...]:
    return tuple((f"histogram_quantile({q}, sum by ({by}le) (rate({series}_bucket{_RATE})))", f"p{q * 100:g} {legend}")
                 for q in (0.5, 0.99))


def panels(window: str = "5m") -> tuple[Panel, ...]:
    """The dashboard's panels, two per row in this order; recorded series are those of ``window``."""
    return (
        # Replicas: traffic, errors, latency.
        ("Replica requests by status", "reqps",
         (("sum by (code) (rate(fleetserve_requests_total[$__rate_interval]))", "{{code}}"),)),
        ("Replica 5xx ratio", "percentunit",
         ((f"fleetserve:request_errors:ratio_rate{window}", "{{model}}"),)),
        ("Replica latency p50 / p99 (total)", "s",
         ((f'fleetserve:request_duration_seconds:p50_{window}{{stage="total"}}', "p50 {{model}}"),
          (f'fleetserve:request_duration_seconds:p99_{window}{{stage="total"}}', "p99 {{model}}"))),
        ("Replica latency p99 by stage", "s",
         ((f'fleetserve:request_duration_seconds:p99_{window}{{stage=~"queue|compute"}}', "{{stage}}"),)),
        # Replicas: load and batching.
        ("Queue depth per replica", "short",
         (("fleetserve_queue_depth", "{{instance}}"),)),
        ("In-flight requests per replica", "short",
         (("fleetserve_inflight_requests", "{{instance}}"),)),
        ("Mean batch size", "short",
         ((f"fleetserve:batch_size:mean_{window}", "{{model}}"),)),
        ("Padded sequence length per batch", "short",
         _quantiles("fleetserve_batch_sequence_length", "model, ", "{{model}}")),
        # Replicas with --frontends: the engine process's calls, merged from the front ends' batches.
        ("Engine process: rows and front-end batches per engine call (--frontends)", "short",
         (("sum by (model) (rate(fleetserve_engine_batch_size_sum[$__rate_interval])) / sum by (model) "
           "(rate(fleetserve_engine_batch_size_count[$__rate_interval]))", "rows {{model}}"),
          ("sum by (model) (rate(fleetserve_engine_merged_batches_sum[$__rate_interval])) / sum by (model) "
           "(rate(fleetserve_engine_merged_batches_count[$__rate_interval]))", "batches {{model}}"))),
        ("Engine process: call time and front-end batch wait p99 (--frontends)", "s",
         (*_quantiles("fleetserve_engine_compute_seconds", "model, ", "call {{model}}")[1:],
          *_quantiles("fleetserve_engine_queue_seconds", "model, ", "wait {{model}}")[1:])),
        ("Replica refusals: full queue, expired deadline, caller gone; truncated texts", "reqps",
         (("sum by (model) (rate(fleetserve_requests_rejected_total[$__rate_interval]))", "queue full {{model}}"),
          ("sum by (model) (rate(fleetserve_requests_expired_total[$__rate_interval]))", "expired {{model}}"),
          ("sum by (model) (rate(fleetserve_requests_cancelled_total[$__rate_interval]))", "cancelled {{model}}"),
          ("sum by (model) (rate(fleetserve_texts_truncated_total[$__rate_interval]))", "truncated {{model}}"))),
        # GPUs (NVML; absent on CPU replicas).
        ("GPU utilization", "percentunit",
         ((f"fleetserve_gpu_utilization_ratio {_GPU_NAMES}", "{{instance}} {{gpu}} {{name}}"),)),
        ("GPU memory used (MIG instances: each slice)", "percentunit",
         ((f"fleetserve_gpu_memory_used_bytes / fleetserve_gpu_memory_total_bytes {_GPU_NAMES}",
           "{{instance}} {{gpu}} {{name}} {{profile}}"),)),
        ("GPU power draw", "watt",
         (("fleetserve_gpu_power_watts", "{{instance}} {{gpu}}"),)),
        ("GPU temperature", "celsius",
         (("fleetserve_gpu_temperature_celsius", "{{instance}} {{gpu}}"),)),
        ("GPU SM clock", "hertz",
         (("fleetserve_gpu_sm_clock_hertz", "{{instance}} {{gpu}}"),)),
        ("GPUs held back, by throttle reason", "short",
         (("sum by (reason) (fleetserve_gpu_throttled)", "{{reason}}"),)),
        # Gateway.
        ("Gateway requests by backend", "reqps",
         (("sum by (backend) (rate(fleetserve_gateway_requests_total[$__rate_interval]))", "{{backend}}"),)),
        ("Gateway end-to-end latency p50 / p99", "s",
         ((f"fleetserve:gateway_request_duration_seconds:p50_{window}", "p50"),
          (f"fleetserve:gateway_request_duration_seconds:p99_{window}", "p99"))),
        ("Gateway upstream attempt latency p50 / p99 by backend", "s",
         _quantiles("fleetserve_gateway_upstream_duration_seconds", "backend, ", "{{backend}}")),
        ("Gateway backends by state", "short",
         (("sum by (state) (fleetserve_gateway_backends)", "{{state}}"),)),
        ("Gateway ejections and retries", "short",
         (("sum by (backend) (increase(fleetserve_gateway_ejections_total[$__rate_interval]))", "ejected {{backend}}"),
          ("sum(increase(fleetserve_gateway_retries_total[$__rate_interval]))", "retries"),
          ("sum(increase(fleetserve_gateway_retry_budget_exhausted_total[$__rate_interval]))",
           "retries refused: budget spent"))),
        ("Gateway hedges", "reqps",
         (("sum by (outcome) (rate(fleetserve_gateway_hedges_total[$__rate_interval]))", "hedge {{outcome}}"),
          ("sum by (reason) (rate(fleetserve_gateway_hedges_skipped_total[$__rate_interval]))",
           "skipped: {{reason}}"))),
        ("Gateway edge rejections by reason", "reqps",
         (("sum by (reason) (rate(fleetserve_gateway_rejected_total[$__rate_interval]))", "{{reason}}"),)),
        ("Gateway adaptive concurrency: limit and requests holding a slot (on by default)", "short",
         (("sum by (instance) (fleetserve_gateway_concurrency_limit)", "limit {{instance}}"),
          ("sum by (instance) (fleetserve_gateway_concurrency_inflight)", "in flight {{instance}}"))),
        ("Gateway in-flight requests and rate-limit buckets", "short",
         (("sum by (instance) (fleetserve_gateway_inflight_requests)", "in flight {{instance}}"),
          ("sum by (instance, prefix) (fleetserve_gateway_ratelimit_entries)", "buckets {{prefix}} {{instance}}"))),
        # Autoscaling (the rules run in the gateway; absent while --autoscale is off).
        ("Autoscaling: desired vs actual replicas", "short",
         (("max by (rule) (fleetserve_autoscale_desired_replicas)", "desired ({{rule}})"),
          ("sum by (state) (fleetserve_autoscale_replicas)", "{{state}}"))),
        ("Autoscaling decisions; requests held at zero replicas", "short",
         (('sum by (direction, reason) (increase(fleetserve_autoscale_decisions_total{direction!="hold"}'
           '[$__rate_interval]))', "{{direction}}: {{reason}}"),
          ("sum(fleetserve_autoscale_held_requests)", "held now"),
          ("sum by (outcome) (increase(fleetserve_autoscale_holds_total[$__rate_interval]))", "held: {{outcome}}"))),
        # Processes.
        ("Process CPU (cores)", "short",
         (('sum by (component, instance) (rate(process_cpu_seconds_total{job="fleetserve"}[$__rate_interval]))',
           "{{component}} {{instance}}"),)),
        ("Process resident memory", "bytes",
         (('process_resident_memory_bytes{job="fleetserve"}', "{{component}} {{instance}}"),)),
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


def render_grafana(config: MonitoringConfig | None = None) -> str:
    """The Grafana dashboard JSON for the recorded series of ``config.window`` (data source chosen in
    Grafana through the ``datasource`` variable)."""
    window = (config or MonitoringConfig()).window
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
        "panels": [_panel(i, *panel) for i, panel in enumerate(panels(window))],
    }
    return json.dumps(dashboard, indent=2) + "\n"
