"""Render the Kubernetes kustomize tree (``fleetserve deploy k8s``): a base, components and overlays.

``base``: the replica Deployment (an init container builds the engine into the engine-cache volume, the
replica loads it; probes on the KServe v2 health routes; a preStop pause and a termination grace long enough
for the replica's drain; threads from the CPU request), the headless replica Service the gateway discovers
through DNS, a NetworkPolicy that admits only the fleet's gateway and Prometheus to the replicas, the gateway
Deployment and Service, a PodDisruptionBudget for each, and the engine settings both containers read.
``components`` (kustomize Components, combined by the overlays): ``hpa``, ``keda`` (scale to zero),
``shared-cache`` (a PersistentVolumeClaim for the engine cache), ``prometheus-operator`` (PodMonitor,
ServiceMonitor, PrometheusRule), ``gateway-api`` (HTTPRoute), ``inference-pool`` (InferencePool) and
``frontends`` (``serve --frontends`` with the CPU request it needs).
``overlays``: ``cpu``, ``keda``, ``gpu`` (a whole GPU) and one per MIG profile (:mod:`.accelerators`).
``prometheus-adapter/config.yaml`` holds the rules the HPA's metrics come through (:mod:`.adapter`).
Every object carries ``app.kubernetes.io/instance`` (the fleet's name) in its labels and selectors, so two
fleets in one namespace never select each other's pods. Defaults mirror ``fleetserve serve`` and
``fleetserve gateway``; the tests check they stay in sync.
"""

from __future__ import annotations

import math
import re
import textwrap
from dataclasses import dataclass

from fleetserve import __version__
from fleetserve.deploy.accelerators import DEFAULT_MIG_PROFILES, WHOLE_GPU, Accelerator, mig_slice
from fleetserve.deploy.adapter import render_adapter_config
from fleetserve.deploy.monitoring import MonitoringConfig, render_prometheus
from fleetserve.deploy.templating import render
from fleetserve.models.zoo import ZOO
from fleetserve.options import option, section

BASE_FILES = (
    "replica-deployment.yaml", "replica-service.yaml", "replica-pdb.yaml", "replica-networkpolicy.yaml",
    "gateway-deployment.yaml", "gateway-service.yaml", "gateway-pdb.yaml",
)
COMPONENTS = {
    "hpa": ("kustomization.yaml", "replica-hpa.yaml"),
    "keda": ("kustomization.yaml", "replica-scaledobject.yaml"),
    "shared-cache": ("kustomization.yaml", "engine-cache-pvc.yaml", "replica-engine-cache.yaml"),
    "prometheus-operator": ("kustomization.yaml", "replica-podmonitor.yaml", "gateway-servicemonitor.yaml",
                            "prometheusrule.yaml"),
    "gateway-api": ("kustomization.yaml", "httproute.yaml"),
    "inference-pool": ("kustomization.yaml", "inferencepool.yaml", "replica-networkpolicy-gateway-api.yaml"),
    "frontends": ("kustomization.yaml", "replica-frontends.yaml"),
}
FRONTEND_CORES = 0.6  # CPU per front end at saturation, one text per request (BENCHMARKS.md §10.6)
IMAGE_MODELS = "/opt/fleetserve/models"  # where the Dockerfiles put exported zoo models
STARTUP_PERIOD_S = 5  # the startupProbe's periodSeconds
TERMINATION_MARGIN_S = 5
SCALE_UP_PODS = 4

_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")  # leaves room for "-replica" in 63 chars
_MODEL_PATH = re.compile(r"^/[A-Za-z0-9._/-]{1,200}\.onnx$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
_URL = re.compile(r"^https?://[A-Za-z0-9._:-]{1,200}(/[A-Za-z0-9._/-]*)?$")


@dataclass(frozen=True)
class AutoscaleConfig:
    """What the HPA and KEDA objects aim for."""

    min_replicas: int = option(2, "fewest replicas the HPA keeps (KEDA: zero when idle)")
    max_replicas: int = option(10, "most replicas the HPA or KEDA runs")
    target_queue_depth: int = option(16, "rows waiting per replica the autoscaler aims for (half a CPU batch)")
    target_gpu_utilization: float = option(0.75, "GPU utilisation per replica the GPU overlay's HPA aims for")

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 1 <= min_replicas <= max_replicas, got {self.min_replicas}, {self.max_replicas}")
        if self.target_queue_depth < 1:
            raise ValueError(f"target_queue_depth must be >= 1, got {self.target_queue_depth}")
        if not 0 < self.target_gpu_utilization <= 1:
            raise ValueError(f"target_gpu_utilization must be in (0, 1], got {self.target_gpu_utilization}")


@dataclass(frozen=True)
class K8sConfig:
    """What the manifests run. Times are seconds."""

    model: str = option("minilm", "zoo model baked into the image, or the path of an .onnx file inside it")
    replicas: int = option(3, "replica pods (until an autoscaler takes over)")
    image: str = option(f"fleetserve:{__version__}", "CPU image (Dockerfile)")
    gpu_image: str = option(f"fleetserve:{__version__}-gpu", "GPU image of the gpu and MIG overlays (Dockerfile.gpu)")
    name: str = option("fleetserve", "the fleet's name: resource name prefix and app.kubernetes.io/instance")
    namespace: str = option("fleetserve", "namespace of the fleet's objects")
    gateway_replicas: int = option(2, "gateway pods")
    precision: str = option("int8", "engine precision of the CPU replicas", choices=("fp32", "int8"))
    port: int = 8000
    grpc_port: int = 8001
    gateway_port: int = 8080
    gateway_grpc_port: int = 8081
    drain_grace_s: float = option(5.0, "replica --drain-grace-s")
    drain_timeout_s: float = option(30.0, "replica --drain-timeout-s")
    pre_stop_s: int = 5  # endpoints, DNS and the gateway's re-resolution catch up meanwhile
    startup_budget_s: int = 120  # load a built engine + warm up (MiniLM int8: 14.5 s on 2 shared cores)
    gpu_startup_budget_s: int = 300  # + one CUDA graph capture per bucket and instance
    cpu: str = option("2", "CPU request per CPU replica (also its ONNX Runtime threads)")
    memory: str = option("4Gi", "memory request and limit per CPU replica")
    gpu_cpu: str = option("4", "CPU request per GPU replica")
    gpu_memory: str = option("8Gi", "memory request and limit per GPU replica")
    gpu_precision: str = option("fp16", "engine precision on GPUs", choices=("fp16", "bf16", "fp8"))
    frontends: int = option(10, "front-end processes per replica in the frontends component (serve --frontends)")
    mig_profiles: tuple[str, ...] = option(DEFAULT_MIG_PROFILES, "MIG profiles to render an overlay for",
                                           metavar="PROFILE")
    cache_size: str = option("4Gi", "engine cache volume size (emptyDir limit or PersistentVolumeClaim)")
    prometheus_namespace: str = option("monitoring", "namespace of Prometheus (NetworkPolicy, KEDA's server)")
    prometheus_url: str = option("http://prometheus-operated.monitoring.svc:9090",
                                 "Prometheus URL the KEDA triggers query")
    gateway_api_parent: str = option("inference-gateway", "Gateway API Gateway the HTTPRoute attaches to")
    gateway_api_namespace: str = option("gateway-system", "namespace of that Gateway (and of InferencePool traffic)")
    autoscale: AutoscaleConfig = section(AutoscaleConfig, "k8s autoscaling")

    def __post_init__(self) -> None:
        for field_name in ("name", "namespace", "prometheus_namespace", "gateway_api_parent",
                           "gateway_api_namespace"):
            if not _DNS_LABEL.match(getattr(self, field_name)):
                raise ValueError(f"{field_name} {getattr(self, field_name)!r} must be a lowercase DNS label "
                                 "of at most 40 characters")
        if self.model not in ZOO and not _MODEL_PATH.match(self.model):
            raise ValueError(f"model {self.model!r} must be a zoo name ({', '.join(ZOO)}) or the absolute path "
                             "of an .onnx file inside the image")
        for image in (self.image, self.gpu_image):
            if not _IMAGE.match(image):
                raise ValueError(f"image {image!r} is not a valid image reference")
        for quantity in (self.cpu, self.memory, self.gpu_cpu, self.gpu_memory, self.cache_size):
            if not _QUANTITY.match(quantity):
                raise ValueError(f"resource quantity {quantity!r} is not a Kubernetes quantity (e.g. 2, 500m, 4Gi)")
        if self.precision not in ("fp32", "int8"):
            raise ValueError(f"precision must be fp32 or int8 on CPUs, got {self.precision!r}")
        if self.gpu_precision not in ("fp16", "bf16", "fp8"):
            raise ValueError(f"gpu_precision must be fp16, bf16 or fp8, got {self.gpu_precision!r}")
        if not _URL.match(self.prometheus_url):
            raise ValueError(f"prometheus_url {self.prometheus_url!r} must be an http(s) URL")
        for profile in self.mig_profiles:
            mig_slice(profile)
        if not 1 <= self.frontends <= 64:
            raise ValueError(f"frontends must be in 1..64, got {self.frontends}")
        for field_name in ("replicas", "gateway_replicas"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"{field_name} must be >= 1, got {getattr(self, field_name)}")
        ports = (self.port, self.grpc_port, self.gateway_port, self.gateway_grpc_port)
        if not all(0 < p < 65536 for p in ports):
            raise ValueError(f"ports must be in 1..65535, got {ports}")
        if self.port == self.grpc_port or self.gateway_port == self.gateway_grpc_port:
            raise ValueError("a pod's HTTP and gRPC ports must differ")
        if self.drain_grace_s < 0 or self.drain_timeout_s <= 0 or self.pre_stop_s < 0:
            raise ValueError("drain grace and preStop must be >= 0 and the drain timeout > 0")
        if self.startup_budget_s < STARTUP_PERIOD_S or self.gpu_startup_budget_s < STARTUP_PERIOD_S:
            raise ValueError(f"start-up budgets must be >= {STARTUP_PERIOD_S} s")

    @property
    def termination_grace_s(self) -> int:
        """preStop + drain grace + drain timeout + a margin, so the kubelet never kills a draining replica."""
        return math.ceil(self.pre_stop_s + self.drain_grace_s + self.drain_timeout_s) + TERMINATION_MARGIN_S

    @property
    def model_path(self) -> str:
        """The ONNX file the containers serve: a zoo model sits where the Dockerfiles exported it."""
        return f"{IMAGE_MODELS}/{self.model}/model.onnx" if self.model in ZOO else self.model

    def engine_env(self) -> dict[str, str]:
        """The CPU replicas' engine settings, as ``FLEETSERVE_<OPTION>`` for ``build`` and ``serve``."""
        return {"FLEETSERVE_MODEL": self.model_path, "FLEETSERVE_PRECISION": self.precision,
                "FLEETSERVE_BACKEND": "onnxruntime", "FLEETSERVE_DEVICE": "cpu", "FLEETSERVE_MAX_BATCH": "32",
                "FLEETSERVE_INSTANCES": "1"}


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _values(config: K8sConfig, monitoring: MonitoringConfig) -> dict[str, object]:
    auto = config.autoscale
    rules = render_prometheus(monitoring)["rules.yml"]
    groups = rules[rules.index("groups:"):]
    return {
        "name": config.name, "namespace": config.namespace, "image": config.image, "gpu_image": config.gpu_image,
        "replicas": config.replicas, "gateway_replicas": config.gateway_replicas,
        "port": config.port, "grpc_port": config.grpc_port,
        "gateway_port": config.gateway_port, "gateway_grpc_port": config.gateway_grpc_port,
        "drain_grace_s": _seconds(config.drain_grace_s), "drain_timeout_s": _seconds(config.drain_timeout_s),
        "pre_stop_s": config.pre_stop_s, "termination_grace_s": config.termination_grace_s,
        "startup_period_s": STARTUP_PERIOD_S,
        "startup_failures": math.ceil(config.startup_budget_s / STARTUP_PERIOD_S),
        "gpu_startup_failures": math.ceil(config.gpu_startup_budget_s / STARTUP_PERIOD_S),
        "cpu": config.cpu, "memory": config.memory, "gpu_cpu": config.gpu_cpu, "gpu_memory": config.gpu_memory,
        "gpu_precision": config.gpu_precision, "cache_size": config.cache_size, "frontends": config.frontends,
        "frontends_cpu": str(math.ceil(config.frontends * FRONTEND_CORES) + 1),  # + the engine process
        "engine_literals": "\n".join(f"      - {k}={v}" for k, v in config.engine_env().items()),
        "prometheus_namespace": config.prometheus_namespace, "prometheus_url": config.prometheus_url,
        "gateway_api_parent": config.gateway_api_parent, "gateway_api_namespace": config.gateway_api_namespace,
        "min_replicas": auto.min_replicas, "max_replicas": auto.max_replicas,
        "target_queue_depth": auto.target_queue_depth, "scale_up_pods": SCALE_UP_PODS,
        "target_gpu_utilization": f"{round(auto.target_gpu_utilization * 1000)}m",
        "gpu_util_percent": f"{auto.target_gpu_utilization * 100:g}",
        "scrape_interval": f"{monitoring.scrape_interval_s}s",
        "rule_groups": textwrap.indent(groups, "  ").rstrip("\n"),
    }


def _accelerator_files(accel: Accelerator, values: dict[str, object]) -> dict[str, str]:
    hpa_patch = ("  - path: replica-hpa-gpu.yaml\n    target:\n      kind: HorizontalPodAutoscaler\n"
                 f"      name: {values['name']}-replica") if accel.whole else ""
    local = values | {"title": accel.title, "settings_note": accel.settings_note, "gpu_resource": accel.resource,
                      "gpu_count": 1, "gpu_instances": accel.instances, "gpu_max_batch": accel.max_batch,
                      "hpa_patch": hpa_patch}
    names = ("kustomization.yaml", "replica-gpu.yaml", *(("replica-hpa-gpu.yaml",) if accel.whole else ()))
    out = {f"overlays/{accel.overlay}/{n}": render(f"k8s/overlays/accelerator/{n}", local) for n in names}
    kustomization = f"overlays/{accel.overlay}/kustomization.yaml"
    out[kustomization] = out[kustomization].rstrip("\n") + "\n"
    return out


def render_k8s(config: K8sConfig, monitoring: MonitoringConfig | None = None) -> dict[str, str]:
    """The kustomize tree: relative path (``base/...``, ``components/...``, ``overlays/...``) -> file text."""
    values = _values(config, monitoring or MonitoringConfig())
    files = {f"base/{n}": render(f"k8s/base/{n}", values) for n in ("kustomization.yaml", *BASE_FILES)}
    for component, names in COMPONENTS.items():
        files |= {f"components/{component}/{n}": render(f"k8s/components/{component}/{n}", values) for n in names}
    for overlay in ("cpu", "keda"):
        files[f"overlays/{overlay}/kustomization.yaml"] = render(f"k8s/overlays/{overlay}/kustomization.yaml", values)
    for accel in (WHOLE_GPU, *(mig_slice(p) for p in config.mig_profiles)):
        files |= _accelerator_files(accel, values)
    files["prometheus-adapter/config.yaml"] = render_adapter_config()
    return files


def manifests(config: K8sConfig) -> str:
    """The base's resources and its engine ConfigMap as one YAML stream (for ``kubectl apply -n NS -f -``)."""
    files = render_k8s(config)
    data = "".join(f'  {k}: "{v}"\n' for k, v in config.engine_env().items())
    configmap = f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {config.name}-engine\ndata:\n{data}"
    return "---\n".join([configmap, *(files[f"base/{n}"] for n in BASE_FILES)])
