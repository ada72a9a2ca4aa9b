"""Every object of every overlay, as ``kubectl kustomize`` renders it, against the Kubernetes API schemas
of 1.30, 1.33, 1.35 and 1.37 (``kubernetes-validate --strict``: unknown fields are errors) and, for custom
resources, against the CRDs their projects publish (``data/crds``, sources in its README). No cluster is
involved: this checks what the API server's schema validation would, not what a controller does."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from fleetserve.deploy.adapter import render_adapter_config
from fleetserve.deploy.k8s import K8sConfig, render_k8s
from fleetserve.deploy.templating import write_tree
from tests.deploy.crds import crd_schemas, validate_custom_resource
from tests.deploy.kustomize import kustomize, with_components

KUBERNETES_VERSIONS = ("1.30.0", "1.33.0", "1.35.0", "1.37.0")  # oldest to newest kubernetes-validate knows
ADAPTER_SCHEMA = Path(__file__).parent / "data" / "prometheus-adapter-config.schema.json"
OVERLAYS = ("cpu", "keda", "gpu", "mig-1g.18gb", "mig-3g.71gb")
CUSTOM_KINDS = {"ScaledObject", "PodMonitor", "ServiceMonitor", "PrometheusRule", "HTTPRoute", "InferencePool"}


@pytest.fixture(scope="module")
def rendered(kubectl_bin: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Each distinct object of every overlay and of the optional components, for two differently set fleets."""
    seen: dict[str, dict[str, Any]] = {}
    for config in (K8sConfig(), K8sConfig(name="emb-b", model="tiny", precision="fp32", namespace="search",
                                          cpu="500m", mig_profiles=("2g.35gb",))):
        root = tmp_path_factory.mktemp(config.name)
        write_tree(root, render_k8s(config))
        overlays = [root / "overlays" / o for o in (*OVERLAYS[:3], *(f"mig-{p}" for p in config.mig_profiles))]
        overlays.append(with_components(root, "optional", ("gateway-api", "inference-pool", "shared-cache",
                                                           "frontends")))
        for overlay in overlays:
            for obj in kustomize(kubectl_bin, overlay):
                seen[json.dumps(obj, sort_keys=True)] = obj
    return list(seen.values())


def test_every_kind_we_render_is_checked_by_one_of_the_two_validators(rendered: list[dict[str, Any]]) -> None:
    kinds = {obj["kind"] for obj in rendered}
    assert kinds >= CUSTOM_KINDS
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "NetworkPolicy", "HorizontalPodAutoscaler",
            "PersistentVolumeClaim"} <= kinds
    custom = {kind for (_, kind) in crd_schemas()}
    assert kinds & custom == CUSTOM_KINDS


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_builtin_objects_pass_strict_validation(rendered: list[dict[str, Any]], version: str) -> None:
    builtin = [obj for obj in rendered if obj["kind"] not in CUSTOM_KINDS]
    assert len(builtin) >= 15
    for obj in builtin:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} on Kubernetes {version}: {exc}")


def test_strict_validation_catches_a_misplaced_field(rendered: list[dict[str, Any]]) -> None:
    hpa = copy.deepcopy(next(o for o in rendered if o["kind"] == "HorizontalPodAutoscaler"))
    hpa["spec"]["metrics"][0]["pods"]["targetAverageValue"] = "16"  # autoscaling/v2beta1's spelling
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(hpa, KUBERNETES_VERSIONS[-1], strict=True)


def test_custom_resources_match_their_published_crds(rendered: list[dict[str, Any]]) -> None:
    custom = [obj for obj in rendered if obj["kind"] in CUSTOM_KINDS]
    assert {obj["kind"] for obj in custom} == CUSTOM_KINDS
    for obj in custom:
        try:
            validate_custom_resource(obj)
        except jsonschema.ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message} at {list(exc.absolute_path)}")


@pytest.mark.parametrize(("kind", "path", "value"), [
    ("ScaledObject", ("spec", "minReplicas"), 0),  # the HPA's spelling; KEDA's is minReplicaCount
    ("PodMonitor", ("spec", "podMetricsEndpoints", 0, "relabelings", 0, "target_label"), "job"),
    ("InferencePool", ("spec", "targetPorts", 0, "number"), 0),
    ("HTTPRoute", ("spec", "rules", 0, "backendRefs", 0, "port"), "http"),
])
def test_crd_validation_catches_mistakes(rendered: list[dict[str, Any]], kind: str, path: tuple[Any, ...],
                                         value: object) -> None:
    obj = copy.deepcopy(next(o for o in rendered if o["kind"] == kind))
    node: Any = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        validate_custom_resource(obj)


def test_adapter_config_matches_prometheus_adapters_format() -> None:
    schema = json.loads(ADAPTER_SCHEMA.read_text())
    config = yaml.safe_load(render_adapter_config())
    jsonschema.Draft7Validator(schema).validate(config)
    config["rules"][0]["metricQuery"] = config["rules"][0].pop("metricsQuery")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(config)
