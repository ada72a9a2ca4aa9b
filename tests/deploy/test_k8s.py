import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetserve import cli
from fleetserve.deploy.k8s import BASE_FILES, K8sConfig, manifests, render_k8s
from fleetserve.deploy.templating import write_tree
from fleetserve.replica.config import ReplicaConfig


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def _by_kind_name(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def _options(command: str, *argv: str) -> Any:
    return cli.parse(command, argv, {})[1]


@pytest.fixture(scope="module")
def base() -> dict[tuple[str, str], dict[str, Any]]:
    return _by_kind_name(_docs(manifests(K8sConfig())))


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_every_file_parses_and_the_stream_holds_the_base() -> None:
    files = render_k8s(K8sConfig())
    for path, text in files.items():
        assert _docs(text), path
    kustomization = yaml.safe_load(files["base/kustomization.yaml"])
    assert kustomization["resources"] == list(BASE_FILES)
    assert len(_docs(manifests(K8sConfig()))) == len(BASE_FILES)


def test_defaults_match_the_cli_defaults() -> None:
    serve: ReplicaConfig = _options("serve", "minilm")
    gateway = _options("gateway", "--backend", "http://replica:8000").gateway
    config = K8sConfig()
    assert (config.port, config.grpc_port) == (serve.port, serve.grpc_port)
    assert (config.drain_grace_s, config.drain_timeout_s) == (serve.drain_grace_s, serve.drain_timeout_s)
    assert config.model == serve.engine.model
    assert (config.gateway_port, config.port) == (gateway.port, gateway.dns_port)


def test_replica_args_probes_and_ports_agree(base: dict[tuple[str, str], dict[str, Any]]) -> None:
    deployment = base[("Deployment", "fleetserve-replica")]
    container = _container(deployment)
    assert container["command"] == ["fleetserve"] and container["args"][0] == "serve"
    config: ReplicaConfig = _options("serve", *container["args"][1:])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": config.port, "grpc": config.grpc_port}
    assert config.engine.model == "minilm" and config.host == "0.0.0.0"
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # an engine build takes minutes
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": str(config.port),
                           "prometheus.io/path": "/metrics"}


def test_termination_grace_covers_prestop_and_the_replicas_drain(base: dict[tuple[str, str], dict[str, Any]]) -> None:
    deployment = base[("Deployment", "fleetserve-replica")]
    container = _container(deployment)
    config: ReplicaConfig = _options("serve", *container["args"][1:])
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > float(sleep[1]) + config.drain_grace_s + config.drain_timeout_s


def test_replica_service_is_headless_and_the_gateway_resolves_it(base: dict[tuple[str, str], dict[str, Any]]) -> None:
    service = base[("Service", "fleetserve-replica")]
    assert service["spec"]["clusterIP"] == "None"
    replica_labels = base[("Deployment", "fleetserve-replica")]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= replica_labels.items()
    gateway = _container(base[("Deployment", "fleetserve-gateway")])
    assert gateway["args"][0] == "gateway"
    config = _options("gateway", *gateway["args"][1:]).config()
    assert config.discovery == "dns"
    assert config.dns_name == service["metadata"]["name"]
    assert config.dns_port == {p["name"]: p["port"] for p in service["spec"]["ports"]}["http"]
    gateway_ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert gateway_ports == {"http": config.port, "grpc": config.grpc_port}
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_selectors_match_their_pods(base: dict[tuple[str, str], dict[str, Any]]) -> None:
    for component in ("replica", "gateway"):
        deployment = base[("Deployment", f"fleetserve-{component}")]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        pdb = base[("PodDisruptionBudget", f"fleetserve-{component}")]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert pdb["spec"]["maxUnavailable"] == 1
        service = base[("Service", f"fleetserve-{component}")]
        container_ports = {p["name"] for p in _container(deployment)["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports


def test_options_reach_the_manifests() -> None:
    config = K8sConfig(model="bert-base", replicas=5, image="registry.example/fs:1.2", name="ranker",
                       drain_grace_s=2.5, drain_timeout_s=10)
    docs = _by_kind_name(_docs(manifests(config)))
    replica = docs[("Deployment", "ranker-replica")]
    assert replica["spec"]["replicas"] == 5
    container = _container(replica)
    assert container["image"] == "registry.example/fs:1.2"
    assert container["args"][1] == "bert-base"
    assert container["args"][container["args"].index("--drain-grace-s") + 1] == "2.5"
    assert replica["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == config.termination_grace_s == 23
    assert "--dns-name" in _container(docs[("Deployment", "ranker-gateway")])["args"]
    assert ("Service", "ranker-replica") in docs


@pytest.mark.parametrize(("field", "value", "message"), [
    ("name", "Bad_Name", "DNS label"),
    ("model", 'x" evil', "model"),
    ("image", "bad image", "image"),
    ("replicas", 0, "replicas"),
    ("memory", "lots", "quantity"),
    ("grpc_port", 8000, "differ"),
    ("drain_timeout_s", 0, "drain"),
    ("gpu_precision", "fp4", "gpu_precision"),
])
def test_bad_settings_are_refused(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        K8sConfig(**{field: value})  # type: ignore[arg-type]


def _kustomize(kubectl: str, path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    result = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return _by_kind_name(_docs(result.stdout))


def test_kustomize_builds_base_and_gpu_overlay(kubectl_bin: str, tmp_path: Path) -> None:
    write_tree(tmp_path, render_k8s(K8sConfig()))
    base = _kustomize(kubectl_bin, tmp_path / "base")
    assert len(base) == len(BASE_FILES)
    assert all(d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "fleetserve" for d in base.values())
    gpu = _kustomize(kubectl_bin, tmp_path / "overlays" / "gpu")
    replica = gpu[("Deployment", "fleetserve-replica")]
    container = _container(replica)
    assert container["resources"]["limits"] == {"memory": "4Gi", "nvidia.com/gpu": 1}
    args: ReplicaConfig = _options("serve", *container["args"][1:])
    assert (args.engine.device, args.engine.precision) == ("cuda", "fp16")
    assert replica["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert container["startupProbe"]["failureThreshold"] > _container(
        base[("Deployment", "fleetserve-replica")])["startupProbe"]["failureThreshold"]
    assert gpu[("Deployment", "fleetserve-gateway")] == base[("Deployment", "fleetserve-gateway")]
