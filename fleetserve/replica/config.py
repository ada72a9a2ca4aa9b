"""One replica process (``fleetserve serve``): its engine, batcher, servers and lifecycle."""

from __future__ import annotations

from dataclasses import dataclass

from fleetserve.engine.config import EngineConfig
from fleetserve.eventloop import LOOPS
from fleetserve.options import option, positive_ints, section
from fleetserve.telemetry.access_log import AccessLogConfig
from fleetserve.telemetry.otel import TracingConfig

PADDING = ("bucket", "longest", "fixed")


@dataclass(frozen=True)
class ReplicaConfig:
    """Every knob of ``fleetserve serve``; the engine's are in :class:`EngineConfig`."""

    engine: EngineConfig = section(EngineConfig, "engine")
    host: str = option("0.0.0.0", "address to listen on")
    port: int = option(8000, "HTTP port: KServe v2, /inference, /health, /metrics (0: any free port)")
    grpc_port: int = option(8001, "gRPC port: KServe v2 GRPCInferenceService (0: no gRPC server)")
    model_name: str | None = option(None, "name served under /v2/models/", default_text="the model's name")
    instances: int = option(1, "engine instances running batches concurrently")
    frontends: int = option(0, "front-end processes sharing the ports: each parses HTTP and gRPC, tokenises and "
                            "batches, and this process runs their batches on its one engine, merged (0: this "
                            "process does everything)")
    frontend_batches: int = option(2, "with --frontends: batches each front end may have at the engine at once")
    tokenize_threads: int = option(2, "threads tokenising /inference texts beside the event loop (0: on the loop, "
                                   "without two thread hand-offs per batch of texts; for a loop with time to spare)")
    threads: int = option(0, "intra-op threads per instance (0: the CPUs this process may use / instances)")
    max_delay_ms: float = option(2.0, "longest wait for a batch to fill")
    preferred_batch_sizes: tuple[int, ...] = option((), "batch sizes to aim for, e.g. 8,16", flag="--preferred-batch",
                                                    parse=positive_ints, repeat=False, metavar="N[,N...]")
    max_queue: int = option(1024, "rows queued at most; beyond, 503 + Retry-After at once")
    default_timeout_ms: float | None = option(None, "queue timeout of requests that set none (504 past it)",
                                              default_text="no timeout")
    max_body_bytes: int = option(16 * 1024 * 1024, "largest request body; 413 beyond")
    drain_grace_s: float = option(5.0, "after SIGTERM: keep serving, not ready, this long so balancers notice")
    drain_timeout_s: float = option(30.0, "then finish queued and in-flight work within this long")
    padding: str = option("bucket", "bucket: batch requests of similar length, pad to the batch's longest; "
                          "longest: one queue, pad to the longest; fixed: every request to --fixed-seq tokens",
                          choices=PADDING)
    fixed_seq: int = option(128, "tokens per request with --padding fixed")
    promote_overdue: bool = option(False, "fill spare rows of a longer bucket's batch with overdue shorter requests")
    extra_latency_ms: float = option(0.0, "fault injection: added service time per request (a slow GPU)")
    batch_latency_ms: float = option(0.0, "fault injection: added engine time per batch, its instance busy meanwhile "
                                     "(a slower accelerator: capacity about instances x max-batch / this)")
    warmup_delay_s: float = option(0.0, "fault injection: seconds between warm-up and turning ready (a slow "
                                   "engine load or image pull, for autoscaling experiments)")
    loop: str = option("auto", "event loop (auto: uvloop if installed)", choices=LOOPS)
    tracing: TracingConfig = section(TracingConfig, "tracing (OpenTelemetry)")
    access_log: AccessLogConfig = section(AccessLogConfig, "access log")

    def __post_init__(self) -> None:
        for name in ("port", "grpc_port"):
            value = getattr(self, name)
            if not 0 <= value <= 65535:
                raise ValueError(f"{name} must be in 0..65535, got {value}")
        if self.instances < 1:
            raise ValueError(f"instances must be >= 1, got {self.instances}")
        if self.frontends < 0 or self.frontend_batches < 1:
            raise ValueError("frontends must be >= 0 and frontend_batches >= 1")
        if self.tokenize_threads < 0:
            raise ValueError(f"tokenize_threads must be >= 0, got {self.tokenize_threads}")
        if self.threads < 0:
            raise ValueError(f"threads must be >= 0 (0: automatic), got {self.threads}")
        if self.max_delay_ms < 0 or self.drain_grace_s < 0 or self.drain_timeout_s <= 0 or self.extra_latency_ms < 0 \
                or self.batch_latency_ms < 0 or self.warmup_delay_s < 0:
            raise ValueError("delays and timeouts must be non-negative (drain timeout positive)")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.padding not in PADDING:
            raise ValueError(f"padding must be bucket, longest or fixed, got {self.padding!r}")
        if self.fixed_seq < 1:
            raise ValueError(f"fixed_seq must be >= 1, got {self.fixed_seq}")
