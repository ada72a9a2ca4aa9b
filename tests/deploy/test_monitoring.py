import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetserve.deploy.monitoring import MonitoringConfig, panels, render_grafana, render_prometheus
from fleetserve.deploy.templating import write_tree

DATA = Path(__file__).parent / "data"
PACKAGE = Path(__file__).parents[2] / "fleetserve"
GPU_SOURCE = PACKAGE / "telemetry" / "gpu.py"
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "info": ("_info",)}
_SERIES_SUFFIX = re.compile(r"_(?:total|bucket|sum|count|created|info)$")
# Exported families no dashboard panel needs, each with the reason an operator does not act on it.
NOT_ON_A_PANEL = {
    # The replica's --instances setting, constant while it runs: configuration, not a signal.
    "fleetserve_engine_instances",
    # How many workers' metrics a --workers N scrape merged: a check of the scrape itself, constant while it runs.
    "fleetserve_gateway_workers",
    # The same for a --frontends N replica: its front ends and its engine process.
    "fleetserve_replica_processes",
    # The adaptive limit's no-load latency: an input the limit panel already shows the effect of.
    "fleetserve_gateway_min_rtt_seconds",
}


def _registries() -> list[Any]:
    """The registries of a replica and of a gateway with every optional part on (a rate-limit rule registers
    its bucket-table gauge, the adaptive concurrency limit its gauges, autoscaling its metrics); the NVML
    gauges are read from their source below. A new metrics object belongs here, or the source scan fails."""
    from fleetserve.gateway.autoscale.metrics import AutoscaleMetrics
    from fleetserve.gateway.edge import EdgeConfig, RateLimitRule
    from fleetserve.gateway.edge.config import AdaptiveConcurrencyConfig
    from fleetserve.gateway.edge.guards import EdgeGuards
    from fleetserve.gateway.metrics import GatewayMetrics
    from fleetserve.telemetry.metrics import EngineMetrics, ReplicaMetrics
    from fleetserve.telemetry.scrape import PROCESSES, merge

    gateway = GatewayMetrics().registry
    EdgeGuards.create(EdgeConfig(rate_limits=(RateLimitRule(rate=100.0, burst=10),),
                                 adaptive=AdaptiveConcurrencyConfig(enabled=True)), gateway)
    AutoscaleMetrics(gateway, "hpa", lambda: 0)
    merged = CollectorRegistry()  # what a --workers N scrape adds to the families above
    merged.register(_Parsed(merge([generate_latest(gateway).decode()] * 2).decode()))
    replica = CollectorRegistry()  # what a --frontends N scrape adds
    replica.register(_Parsed(merge([generate_latest(EngineMetrics("m").registry).decode()], PROCESSES).decode()))
    return [ReplicaMetrics("m").registry, EngineMetrics("m").registry, gateway, merged, replica]


class _Parsed:
    """The families of an exposition text, as a collector."""

    def __init__(self, text: str) -> None:
        self._families = list(text_string_to_metric_families(text))

    def collect(self) -> list[Any]:
        return [f for f in self._families if f.name in ("fleetserve_gateway_workers", "fleetserve_replica_processes")]


def _exported_series() -> set[str]:
    """Every series name the replica and gateway metrics objects can expose, plus the NVML gauges."""
    names = set()
    for registry in _registries():
        for family in registry.collect():
            names |= {family.name + s for s in _SUFFIXES.get(family.type, ("",))}
    names |= set(re.findall(r'"(fleetserve_gpu_[a-z_]+)"', GPU_SOURCE.read_text()))
    return names


def _exported_families() -> set[str]:
    """fleetserve's own metric families (process_* and python_* come from prometheus_client)."""
    families = {f.name for registry in _registries() for f in registry.collect() if f.name.startswith("fleetserve_")}
    return families | set(re.findall(r'"(fleetserve_gpu_[a-z_]+)"', GPU_SOURCE.read_text()))  # gauges


def _family(series: str, families: set[str]) -> str:
    """The family a series in a query belongs to (``x_bucket`` -> ``x``; a gauge named ``x_info`` stays)."""
    return series if series in families else _SERIES_SUFFIX.sub("", series)


def _rules(config: MonitoringConfig | None = None) -> list[dict[str, Any]]:
    text = render_prometheus(config or MonitoringConfig())["rules.yml"]
    return [rule for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]


def _panel_queries(window: str = "5m") -> list[str]:
    return [expr for _, _, queries in panels(window) for expr, _ in queries]


def _queries() -> list[str]:
    return [rule["expr"] for rule in _rules()] + _panel_queries()


_METRIC = re.compile(r"\b(?:fleetserve|process)_[a-z_]+")


def test_every_metric_queried_is_one_the_code_exports() -> None:
    exported = _exported_series()
    used = {name for expr in _queries() for name in _METRIC.findall(expr)}
    assert used and used <= exported, used - exported


def test_every_exported_family_is_on_a_panel_or_listed_as_not_acted_on() -> None:
    """A panel showing a recorded series covers the families of that rule's expression."""
    recorded = {rule["record"]: rule["expr"] for rule in _rules() if "record" in rule}
    exported = _exported_families()
    shown = set()
    for expr in _panel_queries():
        expanded = expr + " ".join(recorded[name] for name in re.findall(r"\bfleetserve:[a-z0-9_:]+", expr))
        shown |= {_family(name, exported) for name in _METRIC.findall(expanded)}
    assert exported >= NOT_ON_A_PANEL, NOT_ON_A_PANEL - exported  # no stale excuses
    missing = exported - shown - NOT_ON_A_PANEL
    assert not missing, f"exported but on no Grafana panel: {sorted(missing)}"


def test_metric_names_follow_prometheus_conventions() -> None:
    """fleetserve_ prefix; counters exposed with _total and nothing else so; base units (seconds, bytes, ...)."""
    base_units = ("_seconds", "_bytes", "_ratio", "_celsius", "_hertz", "_watts")
    for registry in _registries():
        for family in registry.collect():
            name = family.name
            if name.startswith(("process_", "python_")):
                continue
            assert name.startswith("fleetserve_"), name
            exposed = {s.name for s in family.samples} or {name + s for s in _SUFFIXES[family.type]}
            if family.type == "counter":
                assert all(s.endswith("_total") for s in exposed), (name, exposed)
            else:
                assert not name.endswith("_total"), name
            assert not re.search(r"_(?:ms|milliseconds|microseconds|us|kb|mb|percent|minutes|hours)(?:_|$)", name), name
            if "duration" in name or "latency" in name:
                assert name.endswith("_seconds"), name
    for gpu in re.findall(r'"(fleetserve_gpu_[a-z_]+)"', GPU_SOURCE.read_text()):
        assert gpu.endswith((*base_units, "_throttled", "_info")), gpu


def test_every_metric_the_package_creates_is_counted_above() -> None:
    """Scan the source for metric constructors (a name literal, or a module constant of the same file), so a
    new metrics object cannot hide from the coverage test. Names merely referred to (e.g. the adapter's
    query of a metric another process exports) are no creation."""
    constructor = re.compile(r'(?:Counter|Gauge|Histogram|Summary|Info|MetricFamily)\(\s*(?:"(fleetserve_[a-z_]+)"'
                             r"|([A-Z_]+)\b)")
    constant = re.compile(r'^([A-Z_]+) = "(fleetserve_[a-z_]+)"$', re.M)
    families = _exported_families()
    created = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        constants = dict(constant.findall(text))
        for literal, name in constructor.findall(text):
            if literal or name in constants:
                created.add(_family(literal or constants[name], families))
    assert created and created <= families, created - families


def test_recorded_names_and_the_dashboard_follow_the_window() -> None:
    files = render_prometheus(MonitoringConfig(window="20s"))
    records = {rule["record"] for group in yaml.safe_load(files["rules.yml"])["groups"] for rule in group["rules"]
               if "record" in rule}
    assert "fleetserve:gateway_requests:rate20s" in records and not any(r.endswith("5m") for r in records)
    assert "[20s]" in files["rules.yml"] and "[5m]" not in files["rules.yml"]
    used = set(re.findall(r"\bfleetserve:[a-z0-9_:]+", render_grafana(MonitoringConfig(window="20s"))))
    assert used and used <= records, used - records
    for bad in ("5", "5 m", "0s", "1d"):
        with pytest.raises(ValueError, match="window"):
            MonitoringConfig(window=bad)


def test_every_recording_rule_queried_is_defined() -> None:
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    used = {name for expr in _queries() for name in re.findall(r"\bfleetserve:[a-z0-9_:]+", expr)}
    assert used <= recorded, used - recorded


def test_alerts_cover_latency_errors_queue_and_ejections() -> None:
    alerts = {rule["alert"]: rule for rule in _rules() if "alert" in rule}
    assert {"FleetserveHighLatencyP99", "FleetserveHighErrorRatio", "FleetserveQueueBacklog",
            "FleetserveGatewayEjections"} <= alerts.keys()
    assert all(rule["labels"]["severity"] in ("warning", "critical") for rule in alerts.values())
    assert all({"summary", "description"} <= rule["annotations"].keys() for rule in alerts.values())


def test_thresholds_follow_the_config() -> None:
    config = MonitoringConfig(p99_seconds=0.2, error_ratio=0.05, queue_depth=64)
    alerts = {rule["alert"]: rule["expr"] for rule in _rules(config) if "alert" in rule}
    assert alerts["FleetserveHighLatencyP99"].endswith("> 0.2")
    assert alerts["FleetserveHighErrorRatio"].endswith("> 0.05")
    assert alerts["FleetserveQueueBacklog"].endswith("> 64")
    with pytest.raises(ValueError, match="error_ratio"):
        MonitoringConfig(error_ratio=1.5)


def test_scrape_configs_keep_annotated_pods_and_the_local_fleet() -> None:
    files = render_prometheus(MonitoringConfig(local_replicas=2, base_port=9000, gateway_port=9999))
    k8s = yaml.safe_load(files["prometheus.yml"])
    (job,) = k8s["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    address = next(r for r in job["relabel_configs"] if r.get("target_label") == "__address__")
    pattern = re.compile(address["regex"])
    assert pattern.fullmatch("10.1.2.3:9999;8000") and pattern.fullmatch("10.1.2.3;8000")
    local = yaml.safe_load(files["prometheus-local.yml"])
    targets = {g["labels"]["component"]: g["targets"] for g in local["scrape_configs"][0]["static_configs"]}
    assert targets == {"gateway": ["127.0.0.1:9999"], "replica": ["127.0.0.1:9000", "127.0.0.1:9002"]}


def _panel_titles() -> list[str]:
    return [title for title, _, _ in panels()]


def test_grafana_dashboard_is_well_formed() -> None:
    dashboard = json.loads(render_grafana())
    panels = dashboard["panels"]
    assert len(panels) == len(_panel_titles())
    assert len({p["id"] for p in panels}) == len(panels)
    positions = {(p["gridPos"]["x"], p["gridPos"]["y"]) for p in panels}
    assert len(positions) == len(panels)  # no two panels overlap
    assert all(t["expr"] and t["refId"] for p in panels for t in p["targets"])


def _promtool(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_promtool_accepts_rules_and_local_config(promtool_bin: str, tmp_path: Path) -> None:
    write_tree(tmp_path, render_prometheus(MonitoringConfig()))
    for args in (("check", "rules", "rules.yml"), ("check", "config", "prometheus-local.yml")):
        result = _promtool(promtool_bin, *args, cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_accepts_kubernetes_config(promtool_bin: str, tmp_path: Path) -> None:
    """Debian's promtool is built without Kubernetes discovery; there the rest of the file (relabelling,
    rule files) is still checked, with static targets in place of the pod discovery block."""
    write_tree(tmp_path, render_prometheus(MonitoringConfig()))
    result = _promtool(promtool_bin, "check", "config", "prometheus.yml", cwd=tmp_path)
    if "kubernetes_sd_configs not found" in result.stdout + result.stderr:
        config = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
        job = config["scrape_configs"][0]
        del job["kubernetes_sd_configs"]
        job["static_configs"] = [{"targets": ["127.0.0.1:8000"]}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        result = _promtool(promtool_bin, "check", "config", "prometheus.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rule_unit_tests(promtool_bin: str, tmp_path: Path) -> None:
    write_tree(tmp_path, render_prometheus(MonitoringConfig()))
    shutil.copy(DATA / "rules_test.yml", tmp_path)
    result = _promtool(promtool_bin, "test", "rules", "rules_test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
