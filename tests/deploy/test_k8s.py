from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetserve import cli
from fleetserve.deploy.accelerators import WHOLE_GPU, mig_slice
from fleetserve.deploy.k8s import BASE_FILES, COMPONENTS, AutoscaleConfig, K8sConfig, manifests, render_k8s
from fleetserve.deploy.templating import write_tree
from fleetserve.replica.config import ReplicaConfig
from tests.deploy.kustomize import by_kind_name, docs, kustomize, with_components

Objects = dict[tuple[str, str], dict[str, Any]]


def _options(command: str, *argv: str, env: dict[str, str] | None = None) -> Any:
    return cli.parse(command, argv, env or {})[1]


def _env(objects: Objects, container: dict[str, Any]) -> dict[str, str]:
    """The FLEETSERVE_* variables a container gets from its ConfigMap and plain values (downward API aside)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source["configMapRef"]["name"]
        (configmap,) = [d for (kind, name), d in objects.items() if kind == "ConfigMap" and name == ref]
        env |= configmap["data"]
    env |= {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    return {k: v for k, v in env.items() if k.startswith("FLEETSERVE_") and k != "FLEETSERVE_HOME"}


@pytest.fixture(scope="module")
def base() -> Objects:
    return by_kind_name(docs(manifests(K8sConfig())))


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _init_container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["initContainers"]
    return container


def test_every_file_parses_and_the_stream_holds_the_base() -> None:
    files = render_k8s(K8sConfig())
    for path, text in files.items():
        assert docs(text), path
    kustomization = yaml.safe_load(files["base/kustomization.yaml"])
    assert kustomization["resources"] == list(BASE_FILES)
    for component, names in COMPONENTS.items():
        listed = yaml.safe_load(files[f"components/{component}/kustomization.yaml"])
        files_patched = (p["path"] for p in listed.get("patches", []) if "path" in p)  # inline patches name no file
        assert {*listed.get("resources", []), *files_patched} == set(names[1:])
    kinds = sorted(d["kind"] for d in docs(manifests(K8sConfig())))
    assert kinds == sorted(["ConfigMap", "Deployment", "Deployment", "Service", "Service", "PodDisruptionBudget",
                            "PodDisruptionBudget", "NetworkPolicy"])


def test_defaults_match_the_cli_defaults() -> None:
    serve: ReplicaConfig = _options("serve", "minilm")
    gateway = _options("gateway", "--backend", "http://replica:8000").gateway
    config = K8sConfig()
    assert (config.port, config.grpc_port) == (serve.port, serve.grpc_port)
    assert (config.drain_grace_s, config.drain_timeout_s) == (serve.drain_grace_s, serve.drain_timeout_s)
    assert (config.gateway_port, config.port) == (gateway.port, gateway.dns_port)


def test_the_init_container_builds_exactly_the_engine_the_replica_loads(base: Objects) -> None:
    """Both read the engine settings from one ConfigMap; the cache key is a function of the EngineConfig."""
    deployment = base[("Deployment", "fleetserve-replica")]
    init, container = _init_container(deployment), _container(deployment)
    assert init["command"] == container["command"] == ["fleetserve"]
    assert init["args"] == ["build"] and container["args"][0] == "serve"
    built = _options("build", *init["args"][1:], env=_env(base, init)).engine
    served: ReplicaConfig = _options("serve", *container["args"][1:], env=_env(base, container))
    assert built == served.engine
    assert served.engine.model == "/opt/fleetserve/models/minilm/model.onnx"
    assert str(served.engine.precision) == "int8" and served.instances == 1
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert mounts == {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    home = {e["name"]: e.get("value") for e in container["env"]}["FLEETSERVE_HOME"]
    assert mounts["engine-cache"] == home == {e["name"]: e.get("value") for e in init["env"]}["FLEETSERVE_HOME"]


def test_threads_come_from_the_cpu_request(base: Objects) -> None:
    container = _container(base[("Deployment", "fleetserve-replica")])
    (threads,) = [e for e in container["env"] if e["name"] == "FLEETSERVE_THREADS"]
    ref = threads["valueFrom"]["resourceFieldRef"]
    assert ref == {"containerName": container["name"], "resource": "requests.cpu", "divisor": "1"}
    assert container["resources"]["requests"]["cpu"] == "2"
    env = _env(base, container) | {"FLEETSERVE_THREADS": "2"}  # what the kubelet resolves the reference to
    served: ReplicaConfig = _options("serve", *container["args"][1:], env=env)
    assert served.threads == 2


def test_probes_and_a_start_up_budget_for_loading_not_building(base: Objects) -> None:
    deployment = base[("Deployment", "fleetserve-replica")]
    container = _container(deployment)
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    startup = container["startupProbe"]
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    assert 60 <= budget <= 180  # load + warm-up (14.5 s measured), not an engine build (minutes)
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": "8000",
                           "prometheus.io/path": "/metrics"}


def test_termination_grace_covers_prestop_and_the_replicas_drain(base: Objects) -> None:
    deployment = base[("Deployment", "fleetserve-replica")]
    container = _container(deployment)
    config: ReplicaConfig = _options("serve", *container["args"][1:], env=_env(base, container))
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > float(sleep[1]) + config.drain_grace_s + config.drain_timeout_s


def test_replica_service_is_headless_and_the_gateway_resolves_it(base: Objects) -> None:
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


def test_selectors_match_their_pods(base: Objects) -> None:
    for component in ("replica", "gateway"):
        deployment = base[("Deployment", f"fleetserve-{component}")]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "fleetserve"
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        pdb = base[("PodDisruptionBudget", f"fleetserve-{component}")]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert pdb["spec"]["maxUnavailable"] == 1
        service = base[("Service", f"fleetserve-{component}")]
        container_ports = {p["name"] for p in _container(deployment)["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports


def test_replicas_admit_only_their_gateway_and_prometheus(base: Objects) -> None:
    policy = base[("NetworkPolicy", "fleetserve-replica")]["spec"]
    replica = base[("Deployment", "fleetserve-replica")]["spec"]["template"]["metadata"]["labels"]
    gateway = base[("Deployment", "fleetserve-gateway")]["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= replica.items()
    assert policy["policyTypes"] == ["Ingress"]
    from_gateway, from_prometheus = policy["ingress"]
    assert from_gateway["from"][0]["podSelector"]["matchLabels"].items() <= gateway.items()
    assert {p["port"] for p in from_gateway["ports"]} == {"http", "grpc"}
    assert from_prometheus["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"}
    assert [p["port"] for p in from_prometheus["ports"]] == ["http"]


def test_options_reach_the_manifests() -> None:
    config = K8sConfig(model="bert-base", replicas=5, image="registry.example/fs:1.2", name="ranker",
                       drain_grace_s=2.5, drain_timeout_s=10, precision="fp32", cpu="500m")
    objects = by_kind_name(docs(manifests(config)))
    replica = objects[("Deployment", "ranker-replica")]
    assert replica["spec"]["replicas"] == 5
    container = _container(replica)
    assert container["image"] == _init_container(replica)["image"] == "registry.example/fs:1.2"
    served: ReplicaConfig = _options("serve", *container["args"][1:], env=_env(objects, container))
    assert served.engine.model == "/opt/fleetserve/models/bert-base/model.onnx"
    assert str(served.engine.precision) == "fp32" and served.drain_grace_s == 2.5
    assert container["resources"]["requests"]["cpu"] == "500m"
    assert replica["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == config.termination_grace_s == 23
    assert "--dns-name" in _container(objects[("Deployment", "ranker-gateway")])["args"]
    assert ("Service", "ranker-replica") in objects
    assert K8sConfig(model="/models/mine.onnx").model_path == "/models/mine.onnx"


@pytest.mark.parametrize(("field", "value", "message"), [
    ("name", "Bad_Name", "DNS label"),
    ("namespace", "Bad.NS", "DNS label"),
    ("model", 'x" evil', "model"),
    ("model", "relative/model.onnx", "absolute path"),
    ("image", "bad image", "image"),
    ("gpu_image", "bad image", "image"),
    ("replicas", 0, "replicas"),
    ("memory", "lots", "quantity"),
    ("grpc_port", 8000, "differ"),
    ("drain_timeout_s", 0, "drain"),
    ("precision", "fp16", "precision"),
    ("gpu_precision", "fp4", "gpu_precision"),
    ("mig_profiles", ("8g.1gb",), "MIG profile"),
    ("prometheus_url", "ftp://x", "URL"),
    ("frontends", 0, "frontends"),
])
def test_bad_settings_are_refused(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        K8sConfig(**{field: value})  # type: ignore[arg-type]


def test_bad_autoscale_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="min_replicas"):
        AutoscaleConfig(min_replicas=5, max_replicas=4)
    with pytest.raises(ValueError, match="target_gpu_utilization"):
        AutoscaleConfig(target_gpu_utilization=1.5)


def test_mig_settings_scale_with_the_slice() -> None:
    small, half = mig_slice("1g.18gb"), mig_slice("3g.71gb")
    assert (small.resource, small.instances, small.max_batch) == ("nvidia.com/mig-1g.18gb", 1, 32)
    assert (half.resource, half.instances, half.max_batch) == ("nvidia.com/mig-3g.71gb", 2, 64)
    assert mig_slice("7g.141gb").max_batch == WHOLE_GPU.max_batch and mig_slice("7g.141gb").instances == 4
    with pytest.raises(ValueError, match="MIG profile"):
        mig_slice("1g")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("k8s")
    write_tree(root, render_k8s(K8sConfig()))
    return root


def _replica_pod(objects: Objects, name: str = "fleetserve") -> dict[str, Any]:
    return objects[("Deployment", f"{name}-replica")]["spec"]["template"]


def test_cpu_overlay_scales_on_queue_depth_and_the_gateways_recommendation(kubectl_bin: str, tree: Path) -> None:
    objects = by_kind_name(kustomize(kubectl_bin, tree / "overlays" / "cpu"))
    assert all(d["metadata"].get("namespace") == "fleetserve" for d in objects.values())
    hpa = objects[("HorizontalPodAutoscaler", "fleetserve-replica")]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "fleetserve-replica"}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 10)
    pods, external = hpa["metrics"]
    assert pods["pods"]["metric"]["name"] == "fleetserve_queue_depth"
    assert pods["pods"]["target"] == {"type": "AverageValue", "averageValue": "16"}
    assert external["external"]["metric"] == {"name": "fleetserve_autoscale_desired_replicas", "selector": {
        "matchLabels": {"rule": "predictive", "fleet": "fleetserve"}}}
    assert external["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    assert hpa["behavior"]["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    assert hpa["behavior"]["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 60}]
    assert {("PodMonitor", "fleetserve-replica"), ("ServiceMonitor", "fleetserve-gateway"),
            ("PrometheusRule", "fleetserve")} <= objects.keys()
    auto = _gateway_options(objects).gateway.autoscale  # what makes the External metric exist
    assert (auto.rule, auto.min_replicas, auto.max_replicas) == ("predictive", 2, 10)


def _gateway_options(objects: Objects) -> Any:
    """The gateway's options as the real CLI parses the rendered container's arguments."""
    (container,) = objects[("Deployment", "fleetserve-gateway")]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["fleetserve"] and container["args"][0] == "gateway"
    return _options("gateway", *container["args"][1:], env=_env(objects, container))


@pytest.mark.parametrize("accel", [WHOLE_GPU, mig_slice("1g.18gb"), mig_slice("3g.71gb")], ids=lambda a: a.overlay)
def test_gpu_overlays_run_the_gpu_image_with_their_settings(kubectl_bin: str, tree: Path, accel: Any) -> None:
    objects = by_kind_name(kustomize(kubectl_bin, tree / "overlays" / accel.overlay))
    deployment = objects[("Deployment", "fleetserve-replica")]
    pod = deployment["spec"]["template"]["spec"]
    init, container = pod["initContainers"][0], pod["containers"][0]
    assert init["image"] == container["image"] == "fleetserve:0.1.0-gpu"
    assert init["resources"]["limits"][accel.resource] == container["resources"]["limits"][accel.resource] == 1
    served: ReplicaConfig = _options("serve", *container["args"][1:], env=_env(objects, container))
    built = _options("build", *init["args"][1:], env=_env(objects, init)).engine
    assert built == served.engine
    assert (served.engine.backend, served.engine.device, str(served.engine.precision)) == ("torch-cuda", "cuda", "fp16")
    assert (served.instances, served.engine.max_batch) == (accel.instances, accel.max_batch)
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    # Triton's kernel and tuning cache lives on the engine-cache volume, beside the engine both containers use.
    for c in (init, container):
        env = {e["name"]: e.get("value") for e in c["env"]}
        cache = next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == "engine-cache")
        assert env["TRITON_CACHE_DIR"].startswith(cache + "/") and env["FLEETSERVE_HOME"] == cache
    metrics = [m["pods"]["metric"]["name"] for m in objects[("HorizontalPodAutoscaler", "fleetserve-replica")]
               ["spec"]["metrics"] if m["type"] == "Pods"]
    gpu_metric = ["fleetserve_gpu_utilization_ratio"] if accel.whole else []
    assert metrics == ["fleetserve_queue_depth", *gpu_metric]
    cpu = by_kind_name(kustomize(kubectl_bin, tree / "overlays" / "cpu"))
    assert objects[("Deployment", "fleetserve-gateway")] == cpu[("Deployment", "fleetserve-gateway")]


def test_the_frontends_component_runs_front_ends_on_the_gpu_overlay(kubectl_bin: str, tree: Path) -> None:
    overlay = tree / "overlays" / "gpu-frontends"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../gpu"], "components": ["../../components/frontends"]}))
    objects = by_kind_name(kustomize(kubectl_bin, overlay))
    gpu = by_kind_name(kustomize(kubectl_bin, tree / "overlays" / "gpu"))
    container = _replica_pod(objects)["spec"]["containers"][0]
    served: ReplicaConfig = _options("serve", *container["args"][1:], env=_env(objects, container))
    assert served.frontends == 10 and served.engine == _options(
        "serve", *container["args"][1:], env=_env(gpu, _replica_pod(gpu)["spec"]["containers"][0])).engine
    assert container["resources"]["requests"]["cpu"] == "7"  # 0.6 of a core per front end + the engine process
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1  # the overlay's settings stay
    unchanged = {k: v for k, v in objects.items() if k != ("Deployment", "fleetserve-replica")}
    assert unchanged == {k: v for k, v in gpu.items() if k != ("Deployment", "fleetserve-replica")}


def test_keda_overlay_scales_to_zero_from_a_shared_cache(kubectl_bin: str, tree: Path) -> None:
    objects = by_kind_name(kustomize(kubectl_bin, tree / "overlays" / "keda"))
    assert not [k for k in objects if k[0] == "HorizontalPodAutoscaler"]
    scaled = objects[("ScaledObject", "fleetserve-replica")]["spec"]
    assert scaled["minReplicaCount"] == 0 and scaled["scaleTargetRef"]["name"] == "fleetserve-replica"
    triggers = {t["name"]: t["metadata"] for t in scaled["triggers"]}
    assert "fleetserve_autoscale_held_requests" in triggers["gateway-held-requests"]["query"]
    gateway = _gateway_options(objects).gateway  # the activator: holds requests at zero replicas
    assert (gateway.autoscale.rule, gateway.autoscale.min_replicas, gateway.discovery) == ("predictive", 0, "dns")
    assert all(t["activationThreshold"] == "0" for t in triggers.values())
    assert all('namespace="fleetserve", fleet="fleetserve"' in t["query"] for t in triggers.values())
    volumes = {v["name"]: v for v in _replica_pod(objects)["spec"]["volumes"]}
    assert volumes["engine-cache"] == {"name": "engine-cache",
                                      "persistentVolumeClaim": {"claimName": "fleetserve-engine-cache"}}
    assert objects[("PersistentVolumeClaim", "fleetserve-engine-cache")]["spec"]["accessModes"] == ["ReadWriteMany"]


def test_gateway_api_and_inference_pool_components(kubectl_bin: str, tree: Path) -> None:
    overlay = with_components(tree, "gateway-api-test", ("gateway-api", "inference-pool"))
    objects = by_kind_name(kustomize(kubectl_bin, overlay))
    route = objects[("HTTPRoute", "fleetserve")]["spec"]
    assert route["rules"][0]["backendRefs"] == [{"name": "fleetserve-gateway", "port": 8080}]
    pool = objects[("InferencePool", "fleetserve")]["spec"]
    assert pool["selector"]["matchLabels"].items() <= _replica_pod(objects)["metadata"]["labels"].items()
    assert pool["targetPorts"] == [{"number": 8000}]


def _pod_labels(objects: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [d["spec"]["template"]["metadata"]["labels"] for d in objects if d["kind"] == "Deployment"]


def _selectors(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, str]]]:
    """Every label selector an object holds: workloads, Services, PDBs, policies, monitors, pools."""
    found = []
    for d in objects:
        spec, where = d.get("spec", {}), f"{d['kind']}/{d['metadata']['name']}"
        for key in ("selector", "podSelector"):
            value = spec.get(key)
            if isinstance(value, dict):
                found.append((where, value.get("matchLabels", value)))
        for rule in spec.get("ingress", []):
            found += [(where, p["podSelector"]["matchLabels"]) for p in rule["from"] if "podSelector" in p
                      and "namespaceSelector" not in p]
        for spread in spec.get("template", {}).get("spec", {}).get("topologySpreadConstraints", []):
            found.append((where, spread["labelSelector"]["matchLabels"]))
    return found


def test_two_fleets_in_one_namespace_never_select_each_others_pods(kubectl_bin: str, tmp_path: Path) -> None:
    fleets = {}
    for name in ("emb-a", "emb-b"):
        write_tree(tmp_path / name, render_k8s(K8sConfig(name=name, model="minilm" if name == "emb-a" else "tiny")))
        overlay = with_components(tmp_path / name, "everything", ("hpa", "prometheus-operator", "gateway-api",
                                                                 "inference-pool", "shared-cache"))
        fleets[name] = kustomize(kubectl_bin, overlay)
    for mine, other in (("emb-a", "emb-b"), ("emb-b", "emb-a")):
        selectors = _selectors(fleets[mine])
        assert len(selectors) >= 12
        for where, selector in selectors:
            assert any(selector.items() <= labels.items() for labels in _pod_labels(fleets[mine])), where
            assert not any(selector.items() <= labels.items() for labels in _pod_labels(fleets[other])), where
        names = {(d["kind"], d["metadata"]["name"]) for d in fleets[mine]}
        assert not names & {(d["kind"], d["metadata"]["name"]) for d in fleets[other]}
