"""The prometheus-adapter rules: their queries, expanded as the adapter expands them, and (slow) evaluated by a
real Prometheus that scrapes real replicas through the rendered Kubernetes scrape config."""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetserve.deploy.adapter import DESIRED_REPLICAS, GPU_UTILIZATION, QUEUE_DEPTH, adapter_rules
from fleetserve.deploy.monitoring import MonitoringConfig, render_prometheus
from tests.deploy.prometheus_server import running_prometheus
from tests.deploy.test_monitoring import _exported_series
from tests.support.procs import Proc, replica


def _rule(name: str, kind: str = "rules") -> dict[str, Any]:
    (rule,) = [r for r in adapter_rules()[kind] if r["name"]["as"] == name]
    return rule


def _expand(template: str, series: str, matchers: list[str], group_by: str) -> str:
    """What prometheus-adapter (pkg/naming/metrics_query.go) hands Prometheus: its Go template with
    ``<<.Series>>``, ``<<.LabelMatchers>>`` and ``<<.GroupBy>>`` filled in."""
    query = (template.replace("<<.Series>>", series).replace("<<.LabelMatchers>>", ",".join(matchers))
             .replace("<<.GroupBy>>", group_by))
    assert "<<" not in query, query
    return query


def pods_query(name: str, namespace: str, pods: list[str]) -> str:
    """A Pods metric for the HPA's pods: the namespace, then the pod label (=~ for several), grouped by pod."""
    pod = f'pod="{pods[0]}"' if len(pods) == 1 else f'pod=~"{"|".join(pods)}"'
    return _expand(_rule(name)["metricsQuery"], name, [f'namespace="{namespace}"', pod], "pod")


def external_query(name: str, namespace: str, selector: Mapping[str, str]) -> str:
    """An External metric: the HPA's selector (keys sorted, as Kubernetes label requirements are), then the
    namespace."""
    matchers = [f'{k}="{v}"' for k, v in sorted(selector.items())] + [f'namespace="{namespace}"']
    return _expand(_rule(name, "externalRules")["metricsQuery"], name, matchers, "")


def test_rules_serve_metrics_the_replicas_export() -> None:
    exported = _exported_series()
    for rule in adapter_rules()["rules"]:
        series = rule["name"]["as"]
        assert series in exported and re.fullmatch(rule["name"]["matches"], series)
        assert rule["seriesQuery"].startswith(series + "{")
    assert DESIRED_REPLICAS == "fleetserve_autoscale_desired_replicas"  # the gateway's, per DESIGN.md


def test_the_hpa_asks_for_the_metrics_the_rules_serve() -> None:
    from fleetserve.deploy.k8s import K8sConfig, render_k8s

    files = render_k8s(K8sConfig())
    hpa = yaml.safe_load(files["components/hpa/replica-hpa.yaml"])
    gpu = yaml.safe_load(files["overlays/gpu/replica-hpa-gpu.yaml"])
    pods = {m["pods"]["metric"]["name"] for m in [*hpa["spec"]["metrics"], *(op["value"] for op in gpu)]
            if m["type"] == "Pods"}
    external = {m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "External"}
    assert pods == {r["name"]["as"] for r in adapter_rules()["rules"]}
    assert external == {r["name"]["as"] for r in adapter_rules()["externalRules"]}


def test_expansion_matches_the_adapters() -> None:
    assert pods_query(QUEUE_DEPTH, "ns", ["a", "b"]) == (
        'sum by (pod) (fleetserve_queue_depth{namespace="ns",pod=~"a|b"})')
    assert pods_query(GPU_UTILIZATION, "ns", ["a"]) == (
        'max by (pod) (fleetserve_gpu_utilization_ratio{namespace="ns",pod="a",mig=""})')
    assert external_query(DESIRED_REPLICAS, "ns", {"rule": "predictive", "fleet": "f"}) == (
        'max(fleetserve_autoscale_desired_replicas{fleet="f",rule="predictive",namespace="ns"})')


NAMESPACE = "fleetserve-test"


def static_kubernetes_config(rendered: str, pods: Mapping[str, str], interval_s: int = 1) -> dict[str, Any]:
    """The rendered Kubernetes scrape config with static targets in place of pod discovery (Debian's
    Prometheus is built without it): each target carries the ``__meta_kubernetes_*`` labels pod discovery
    would give a replica pod, so the rendered relabelling runs unchanged. ``pods``: pod name -> host:port."""
    config = yaml.safe_load(rendered)
    config["global"] = {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"}
    (job,) = config["scrape_configs"]
    del job["kubernetes_sd_configs"]
    job["static_configs"] = [{
        "targets": [address.split(":")[0]],  # the pod IP; the port comes from the annotation
        "labels": {
            "__meta_kubernetes_namespace": NAMESPACE,
            "__meta_kubernetes_pod_name": pod,
            "__meta_kubernetes_pod_label_app_kubernetes_io_name": "fleetserve",
            "__meta_kubernetes_pod_label_app_kubernetes_io_instance": "fleetserve",
            "__meta_kubernetes_pod_label_app_kubernetes_io_component": "replica",
            "__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true",
            "__meta_kubernetes_pod_annotation_prometheus_io_port": address.split(":")[1],
            "__meta_kubernetes_pod_annotation_prometheus_io_path": "/metrics",
        },
    } for pod, address in pods.items()]
    return config


def test_promtool_accepts_the_static_variant(promtool_bin: str, tmp_path: Path) -> None:
    files = render_prometheus(MonitoringConfig())
    (tmp_path / "rules.yml").write_text(files["rules.yml"])
    config = static_kubernetes_config(files["prometheus.yml"], {"replica-0": "10.0.0.1:8000"})
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = subprocess.run([promtool_bin, "check", "config", "prometheus.yml"], capture_output=True, text=True,
                            timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _queue_depth(proc: Proc) -> float:
    with urllib.request.urlopen(f"{proc.url}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(r"^fleetserve_queue_depth\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    return float(match.group(1)) if match else -1.0


def _hold(proc: Proc, count: int) -> None:
    """``count`` requests that wait in the replica's queue: its batch needs 32 rows or 60 s to close."""
    def send() -> None:
        request = urllib.request.Request(f"{proc.url}/inference", data=b'{"texts": ["held in the queue"]}',
                                         headers={"Content-Type": "application/json"})
        with contextlib.suppress(OSError):  # the replica stops before the batch closes
            urllib.request.urlopen(request, timeout=90).read()

    for _ in range(count):
        threading.Thread(target=send, daemon=True).start()


@pytest.mark.slow
def test_adapter_queries_return_the_fleets_real_queue_depth(tmp_path: Path) -> None:
    held = {"replica-0": 2, "replica-1": 5}
    extra = ("--max-delay-ms", "60000", "--max-batch", "32", "--drain-grace-s", "0", "--drain-timeout-s", "1")
    with replica("tiny", *extra, grpc=False) as first, replica("tiny", *extra, grpc=False) as second:
        procs = {"replica-0": first, "replica-1": second}
        files = render_prometheus(MonitoringConfig())
        config = static_kubernetes_config(files["prometheus.yml"],
                                          {pod: f"127.0.0.1:{p.port}" for pod, p in procs.items()})
        with running_prometheus(tmp_path, config, {"rules.yml": files["rules.yml"]}) as prom:
            for pod, count in held.items():
                _hold(procs[pod], count)
            for pod, count in held.items():
                prom.wait(lambda p=procs[pod], c=count: _queue_depth(p) == c, 30, f"{pod} holding {count} rows")
            query = pods_query(QUEUE_DEPTH, NAMESPACE, list(held))

            def answered() -> dict[str, float]:
                values = {r["metric"]["pod"]: float(r["value"][1]) for r in prom.query(query)}
                return values if values == {pod: float(c) for pod, c in held.items()} else {}

            by_pod = prom.wait(answered, 60, f"Prometheus answering {query} with {held}")
            assert by_pod == {pod: float(_queue_depth(procs[pod])) for pod in held}
            one = prom.query(pods_query(QUEUE_DEPTH, NAMESPACE, ["replica-1"]))
            assert [(r["metric"], float(r["value"][1])) for r in one] == [({"pod": "replica-1"}, 5.0)]
            # The relabelled target labels the HPA's other rules select on.
            (up,) = prom.query('up{pod="replica-0"}')
            assert {k: up["metric"][k] for k in ("job", "namespace", "fleet", "component")} == {
                "job": "fleetserve", "namespace": NAMESPACE, "fleet": "fleetserve", "component": "replica"}
            # Valid PromQL with nothing to return here: no GPU, and no gateway exporting recommendations.
            assert prom.query(pods_query(GPU_UTILIZATION, NAMESPACE, list(held))) == []
            assert prom.query(external_query(DESIRED_REPLICAS, NAMESPACE,
                                             {"rule": "predictive", "fleet": "fleetserve"})) == []
