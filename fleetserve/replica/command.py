"""``fleetserve serve MODEL``: one replica (engine + batcher + KServe v2 HTTP/gRPC + /inference + metrics)."""

from __future__ import annotations

import argparse

from fleetserve.config import ReplicaConfig
from fleetserve.engine.command import add_engine_arguments, engine_config


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(s) for s in text.split(",") if s.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (KServe v2, /inference, /metrics)")
    parser.add_argument("--grpc-port", type=int, default=8001, help="gRPC port (KServe v2); 0 disables gRPC")
    parser.add_argument("--model-name", help="name under /v2/models/ (default: the model's name)")
    parser.add_argument("--instances", type=int, default=1, help="engine instances run concurrently")
    parser.add_argument("--threads", type=int, default=0, help="threads per instance (0: cores / instances)")
    parser.add_argument("--max-delay-ms", type=float, default=2.0, help="longest wait to fill a batch")
    parser.add_argument("--preferred-batch", type=_sizes, default=(), help="comma list of preferred batch sizes")
    parser.add_argument("--max-queue", type=int, default=1024, help="rows queued before 503 + Retry-After")
    parser.add_argument("--default-timeout-ms", type=float, help="queue timeout of requests that set none")
    parser.add_argument("--max-body-bytes", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--drain-grace-s", type=float, default=5.0, help="serve this long after SIGTERM, not ready")
    parser.add_argument("--drain-timeout-s", type=float, default=30.0, help="then finish in-flight work within")
    parser.add_argument("--padding", choices=("bucket", "longest", "fixed"), default="bucket",
                        help="bucket: group by sequence bucket, pad a batch to its longest request; longest: no "
                             "grouping, pad to the longest; fixed: truncate and pad every request to --fixed-seq")
    parser.add_argument("--fixed-seq", type=int, default=128, help="tokens per request with --padding fixed")
    parser.add_argument("--promote-overdue", action=argparse.BooleanOptionalAction, default=False,
                        help="fill spare rows of a longer bucket's batch with overdue shorter requests, padded up")
    parser.add_argument("--extra-latency-ms", type=float, default=0.0,
                        help="fault injection: add service time per request (emulates a slow GPU)")


def replica_config(args: argparse.Namespace) -> ReplicaConfig:
    return ReplicaConfig(
        engine=engine_config(args), host=args.host, port=args.port, grpc_port=args.grpc_port,
        model_name=args.model_name, instances=args.instances, threads=args.threads, max_batch=args.max_batch,
        max_delay_ms=args.max_delay_ms, preferred_batch_sizes=args.preferred_batch, max_queue=args.max_queue,
        default_timeout_ms=args.default_timeout_ms, max_body_bytes=args.max_body_bytes,
        drain_grace_s=args.drain_grace_s, drain_timeout_s=args.drain_timeout_s,
        extra_latency_ms=args.extra_latency_ms, padding=args.padding, fixed_seq=args.fixed_seq,
        promote_overdue=args.promote_overdue,
    )


def run(args: argparse.Namespace) -> int:
    from fleetserve.replica.server import run as run_replica

    return run_replica(replica_config(args))
