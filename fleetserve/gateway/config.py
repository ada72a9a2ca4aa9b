"""The gateway's configuration: one frozen, validated object built by the CLI and passed everywhere.

It holds plain values only (backends as ``URL[=WEIGHT]`` strings, key files as paths), so it pickles
into worker processes unchanged; :meth:`GatewayConfig.endpoints` turns the backends into endpoints.

``autoscale`` (off by default) runs an autoscaling rule in the gateway (:mod:`.autoscale`); with
``--discovery actuator`` the replicas come from the actuator that carries the rule's decisions out
(``PUT /gateway/autoscale/members``), and with ``--min-replicas 0`` requests wait for a first replica in a
bounded queue (``hold_max_requests``, ``hold_timeout_ms``).

``edge`` configures the edge guards (JWT, rate limits, shedding; input limits always on) of both
listeners, HTTP and gRPC. Settings that
two parts read are one setting, written from here into the other part so they can never disagree: the
body limit ``max_body_bytes`` (into ``edge.limits.max_body_bytes``) and the per-replica in-flight cap
``edge.shedding.replica_max_inflight`` (into ``balancer.replica_max_inflight``, where it is enforced).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fleetserve.autoscale.config import AutoscaleConfig
from fleetserve.eventloop import LOOPS
from fleetserve.gateway.balance import BalancerConfig
from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.edge.config import EdgeConfig
from fleetserve.gateway.forward.hedge import HedgeConfig
from fleetserve.gateway.forward.upstream import PoolConfig
from fleetserve.options import option, section
from fleetserve.telemetry.access_log import AccessLogConfig
from fleetserve.telemetry.otel import TracingConfig

DISCOVERY_KINDS = ("static", "file", "dns", "actuator")
SERVERS = ("aiohttp", "granian")


def _port(name: str, value: int) -> None:
    if not 0 <= value <= 65535:
        raise ValueError(f"{name} must be in 0..65535 (0 = any free port), got {value}")


@dataclass(frozen=True)
class GatewayConfig:
    host: str = option("0.0.0.0", "address to listen on")
    port: int = option(8080, "HTTP port (0: any free port)")
    grpc_port: int = option(0, "gRPC port balancing KServe ModelInfer per call (0: no gRPC listener)")
    workers: int = option(1, "worker processes sharing the port through SO_REUSEPORT")
    server: str = option("granian", "HTTP server of the public port (granian: Rust HTTP, 0.6x the CPU per request; "
                         "aiohttp: answers a slow request head 408 and takes extra aiohttp middlewares)",
                         choices=SERVERS)
    batch_threads: bool = option(True, "on Granian, run Granian's I/O threads under SCHED_BATCH (Linux): waking for a "
                                 "request, they wait for the event loop to yield the CPU they share instead of "
                                 "preempting it", flag="--granian-batch-threads")
    backends: tuple[str, ...] = option((), "a replica, repeatable (static discovery), e.g. http://10.0.0.5:8000=2",
                                       flag="--backend", metavar="URL[=WEIGHT]")
    discovery: str = option("static", "where the backends come from (actuator: PUT /gateway/autoscale/members "
                            "by the autoscaler's actuator)", choices=DISCOVERY_KINDS)
    discovery_file: str | None = option(None, "file of URL[=WEIGHT] lines or a YAML/JSON list, re-read when it "
                                        "changes (--discovery file)", metavar="FILE")
    discovery_poll_s: float = 2.0
    dns_name: str | None = option(None, "DNS name resolving to one address per replica, e.g. a headless Service "
                                  "(--discovery dns)")
    dns_port: int = option(8000, "replica HTTP port for --dns-name")
    dns_interval_s: float = 5.0
    request_timeout_ms: int = option(30_000, "default per-request deadline incl. retries; clients may send "
                                     "X-Fleetserve-Timeout-Ms", flag="--timeout-ms")
    max_request_timeout_ms: int = 600_000
    per_try_timeout_ms: int = option(0, "cut an attempt unanswered after this long and retry it on another replica "
                                     "(retry budget and deadline allowing); 0: the deadline split over the "
                                     "attempts allowed", flag="--per-try-timeout-ms")
    max_body_bytes: int = option(16 * 1024 * 1024, "largest request body; 413 beyond")
    max_retries: int = 1
    retry_after_s: int = 1
    # A replica's gRPC port: its endpoint label ``grpc_port`` if set, else its HTTP port + this offset.
    backend_grpc_port_offset: int = 1
    health_checks: bool = True
    loop: str = option("auto", "event loop (auto: uvloop if installed)", choices=LOOPS)
    hold_max_requests: int = option(256, "requests held while no replica is ready (autoscaling with "
                                    "--min-replicas 0); 503 beyond")
    hold_timeout_ms: int = option(10_000, "longest a request is held for a first replica (its own deadline may "
                                  "end the wait sooner); 503 after")
    upstream: PoolConfig = field(default_factory=PoolConfig)
    balancer: BalancerConfig = section(BalancerConfig, "balancing")
    edge: EdgeConfig = field(default_factory=EdgeConfig)
    hedge: HedgeConfig = section(HedgeConfig, "hedging")
    autoscale: AutoscaleConfig = section(AutoscaleConfig, "autoscaling")
    tracing: TracingConfig = section(TracingConfig, "tracing (OpenTelemetry)")
    access_log: AccessLogConfig = section(AccessLogConfig, "access log")

    def __post_init__(self) -> None:
        _port("port", self.port)
        _port("grpc_port", self.grpc_port)
        _port("dns_port", self.dns_port)
        if not self.host:
            raise ValueError("host must not be empty (use 0.0.0.0 for all interfaces)")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.workers > 1 and self.port == 0:
            raise ValueError("workers > 1 share one port through SO_REUSEPORT: give an explicit --port")
        if self.server not in SERVERS:
            raise ValueError(f"server must be one of {', '.join(SERVERS)}, got {self.server!r}")
        if self.discovery not in DISCOVERY_KINDS:
            raise ValueError(f"discovery must be one of {', '.join(DISCOVERY_KINDS)}, got {self.discovery!r}")
        if self.discovery == "static" and not self.backends:
            raise ValueError("static discovery needs at least one --backend URL[=WEIGHT]")
        if self.discovery != "static" and self.backends:
            raise ValueError(f"--backend is only used with --discovery static, not {self.discovery}")
        if self.discovery == "file" and not self.discovery_file:
            raise ValueError("file discovery needs --discovery-file PATH")
        if self.discovery == "dns" and not self.dns_name:
            raise ValueError("dns discovery needs --dns-name NAME")
        if self.discovery == "actuator" and not self.autoscale.enabled:
            raise ValueError("--discovery actuator takes replicas from the autoscaler's actuator: it needs "
                             "--autoscale hpa|predictive")
        if self.autoscale.enabled and self.workers > 1:
            raise ValueError("--autoscale runs in one gateway process: it needs --workers 1 (each worker would "
                             "see only its share of the traffic and of the actuator's updates)")
        if self.hold_max_requests < 1:
            raise ValueError(f"hold_max_requests must be >= 1, got {self.hold_max_requests}")
        if self.hold_timeout_ms < 1:
            raise ValueError(f"hold_timeout_ms must be >= 1, got {self.hold_timeout_ms}")
        for name in ("discovery_poll_s", "dns_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 < self.request_timeout_ms <= self.max_request_timeout_ms:
            raise ValueError(f"request_timeout_ms must be in 1..max_request_timeout_ms "
                             f"({self.max_request_timeout_ms}), got {self.request_timeout_ms}")
        if self.per_try_timeout_ms < 0:
            raise ValueError(f"per_try_timeout_ms must be >= 0, got {self.per_try_timeout_ms}")
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        if not isinstance(self.edge, EdgeConfig):
            raise ValueError(f"edge must be an EdgeConfig, got {type(self.edge).__name__}")
        if self.edge.limits.max_body_bytes != self.max_body_bytes:
            limits = replace(self.edge.limits, max_body_bytes=self.max_body_bytes)
            object.__setattr__(self, "edge", replace(self.edge, limits=limits))
        cap = None if self.edge.shedding is None else self.edge.shedding.replica_max_inflight
        if self.balancer.replica_max_inflight != cap:
            object.__setattr__(self, "balancer", replace(self.balancer, replica_max_inflight=cap))
        if not 0 <= self.max_retries <= 3:
            raise ValueError(f"max_retries must be in 0..3, got {self.max_retries}")
        if self.retry_after_s < 1:
            raise ValueError(f"retry_after_s must be >= 1, got {self.retry_after_s}")
        if not 0 <= self.backend_grpc_port_offset < 65535:
            raise ValueError(f"backend_grpc_port_offset must be in 0..65534, got {self.backend_grpc_port_offset}")
        self.endpoints()  # each backend must parse

    def endpoints(self) -> list[Endpoint]:
        """The static backends as endpoints (ValueError naming a backend that does not parse)."""
        endpoints = [Endpoint.parse(spec) for spec in self.backends]
        for ep in endpoints:
            if not ep.url.startswith("http://"):
                raise ValueError(f"backend {ep.url}: only http:// backends are supported")
        return endpoints
