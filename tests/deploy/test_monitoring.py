import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetserve.deploy.monitoring import PANELS, MonitoringConfig, render_grafana, render_prometheus
from fleetserve.deploy.templating import write_tree

DATA = Path(__file__).parent / "data"
GPU_SOURCE = Path(__file__).parents[2] / "fleetserve" / "telemetry" / "gpu.py"
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "info": ("_info",)}


def _exported_series() -> set[str]:
    """Every series name the replica and gateway metrics objects can expose, plus the NVML gauges."""
    from fleetserve.gateway.metrics import GatewayMetrics
    from fleetserve.telemetry.metrics import ReplicaMetrics

    names = set()
    for registry in (ReplicaMetrics("m").registry, GatewayMetrics().registry):
        for family in registry.collect():
            names |= {family.name + s for s in _SUFFIXES.get(family.type, ("",))}
    names |= set(re.findall(r'"(fleetserve_gpu_[a-z_]+)"', GPU_SOURCE.read_text()))
    return names


def _rules(config: MonitoringConfig | None = None) -> list[dict[str, Any]]:
    text = render_prometheus(config or MonitoringConfig())["rules.yml"]
    return [rule for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]


def _queries() -> list[str]:
    return [rule["expr"] for rule in _rules()] + [expr for _, _, queries in PANELS for expr, _ in queries]


def test_every_metric_queried_is_one_the_code_exports() -> None:
    exported = _exported_series()
    used = {name for expr in _queries() for name in re.findall(r"\bfleetserve_[a-z_]+", expr)}
    assert used and used <= exported, used - exported


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


def test_grafana_dashboard_is_well_formed() -> None:
    dashboard = json.loads(render_grafana())
    panels = dashboard["panels"]
    assert len(panels) == len(PANELS)
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
