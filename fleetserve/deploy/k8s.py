"""Render the Kubernetes kustomize tree (``fleetserve deploy k8s``): a base and a ``gpu`` overlay.

The base holds the replica Deployment (startup/readiness/liveness probes on the KServe v2 health
routes, a preStop pause and a termination grace long enough for the replica's own drain), the headless
replica Service the gateway discovers through DNS, the gateway Deployment and Service, and a
PodDisruptionBudget for each. ``overlays/gpu`` adds ``nvidia.com/gpu`` and runs the engine on CUDA.
Defaults mirror ``fleetserve serve`` and ``fleetserve gateway``; the tests check they stay in sync.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from fleetserve import __version__
from fleetserve.deploy.templating import render
from fleetserve.options import option

BASE_FILES = (
    "replica-deployment.yaml", "replica-service.yaml", "replica-pdb.yaml",
    "gateway-deployment.yaml", "gateway-service.yaml", "gateway-pdb.yaml",
)
GPU_FILES = ("kustomization.yaml", "replica-gpu.yaml", "replica-gpu-args.yaml")
STARTUP_PERIOD_S = 10  # the startupProbe's periodSeconds in the template
TERMINATION_MARGIN_S = 5

_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")  # leaves room for "-replica" in 63 chars
_MODEL = re.compile(r"^[A-Za-z0-9._/-]{1,200}$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")


@dataclass(frozen=True)
class K8sConfig:
    """What the manifests run. Times are seconds."""

    model: str = option("minilm", "model the replicas serve")
    replicas: int = option(3, "replica pods")
    image: str = option(f"fleetserve:{__version__}", "container image with fleetserve installed")
    name: str = option("fleetserve", "prefix of resource names")
    gateway_replicas: int = option(2, "gateway pods")
    port: int = 8000
    grpc_port: int = 8001
    gateway_port: int = 8080
    gateway_grpc_port: int = 8081
    drain_grace_s: float = option(5.0, "replica --drain-grace-s")
    drain_timeout_s: float = option(30.0, "replica --drain-timeout-s")
    pre_stop_s: int = 5  # endpoints, DNS and the gateway's re-resolution catch up meanwhile
    startup_budget_s: int = 900  # engine export + build + warm-up on a CPU
    gpu_startup_budget_s: int = 1800
    cpu: str = option("2", "CPU request per replica")
    memory: str = option("4Gi", "memory request and limit per replica")
    gpus: int = option(1, "GPUs per replica in the gpu overlay")
    gpu_precision: str = "fp16"

    def __post_init__(self) -> None:
        if not _DNS_LABEL.match(self.name):
            raise ValueError(f"name {self.name!r} must be a lowercase DNS label of at most 40 characters")
        if not _MODEL.match(self.model):
            raise ValueError(f"model {self.model!r} must be a zoo name or a path without spaces or quotes")
        if not _IMAGE.match(self.image):
            raise ValueError(f"image {self.image!r} is not a valid image reference")
        for quantity in (self.cpu, self.memory):
            if not _QUANTITY.match(quantity):
                raise ValueError(f"resource quantity {quantity!r} is not a Kubernetes quantity (e.g. 2, 500m, 4Gi)")
        if self.gpu_precision not in ("fp32", "fp16", "bf16", "int8", "fp8"):
            raise ValueError(f"gpu_precision must be fp32, fp16, bf16, int8 or fp8, got {self.gpu_precision!r}")
        for field_name in ("replicas", "gateway_replicas", "gpus"):
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


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def render_k8s(config: K8sConfig) -> dict[str, str]:
    """The kustomize tree: relative path (``base/...``, ``overlays/gpu/...``) -> file text."""
    values = {
        "name": config.name,
        "model": config.model,
        "image": config.image,
        "replicas": config.replicas,
        "gateway_replicas": config.gateway_replicas,
        "port": config.port,
        "grpc_port": config.grpc_port,
        "gateway_port": config.gateway_port,
        "gateway_grpc_port": config.gateway_grpc_port,
        "drain_grace_s": _seconds(config.drain_grace_s),
        "drain_timeout_s": _seconds(config.drain_timeout_s),
        "pre_stop_s": config.pre_stop_s,
        "termination_grace_s": config.termination_grace_s,
        "startup_failures": math.ceil(config.startup_budget_s / STARTUP_PERIOD_S),
        "gpu_startup_failures": math.ceil(config.gpu_startup_budget_s / STARTUP_PERIOD_S),
        "cpu": config.cpu,
        "memory": config.memory,
        "gpus": config.gpus,
        "gpu_precision": config.gpu_precision,
    }
    files = {f"base/{n}": render(f"k8s/base/{n}", values) for n in ("kustomization.yaml", *BASE_FILES)}
    files |= {f"overlays/gpu/{n}": render(f"k8s/overlays/gpu/{n}", values) for n in GPU_FILES}
    return files


def manifests(config: K8sConfig) -> str:
    """The base's resources as one multi-document YAML stream (for ``kubectl apply -f -``)."""
    files = render_k8s(config)
    return "---\n".join(files[f"base/{n}"] for n in BASE_FILES)
