"""A local fleet's shape (``fleetserve up``), and the replica and gateway configs its children run with.

The parent validates every child's config before starting anything and hands it over whole (see
:mod:`fleetserve.fleet.child`): a child never re-parses flags or reads the parent's environment, so an
option meant for one kind of process (``FLEETSERVE_BACKEND`` is an engine backend to ``up`` and ``serve``
but a replica URL to ``gateway``) cannot leak into another.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fleetserve.errors import UsageError
from fleetserve.gateway.config import GatewayConfig
from fleetserve.options import Parser, add_options, option, resolve
from fleetserve.replica.config import ReplicaConfig

C = TypeVar("C")


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class FleetConfig:
    replicas: int = option(3, "replicas to start")
    host: str = option("127.0.0.1", "address the gateway and every replica listen on")
    gateway_port: int = option(8080, "gateway port", flag="--port")
    base_port: int = option(8100, "replica i listens on BASE+2i (HTTP) and BASE+2i+1 (gRPC)", flag="--base-port",
                            metavar="BASE")
    gateway: bool = option(True, "start a gateway in front (--no-gateway: replicas only, e.g. for NGINX)")
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 10.0
    stable_s: float = 30.0
    ready_timeout_s: float = 300.0
    status_interval_s: float = 2.0
    cores: int = field(default_factory=_cpus)

    def __post_init__(self) -> None:
        if not 1 <= self.replicas <= 64:
            raise ValueError(f"replicas must be in 1..64, got {self.replicas}")
        if self.backoff_initial_s <= 0 or self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("backoff must be positive and max >= initial")
        if not 1 <= self.base_port <= 65535 - 2 * self.replicas:
            raise ValueError(f"base_port must leave room for {self.replicas} replicas' two ports, got {self.base_port}")

    def replica_port(self, i: int) -> int:
        return self.base_port + 2 * i

    def threads_per_replica(self) -> int:
        return max(1, self.cores // self.replicas)


def from_flags(cls: type[C], argv: Sequence[str], overrides: Mapping[str, Any] | None, what: str) -> C:
    """``cls`` from command-line flags alone (no environment, no file), ``overrides`` (dotted paths) winning."""
    parser = Parser(prog=what, add_help=False)
    add_options(parser, cls)
    try:
        return resolve(cls, parser.parse_args(list(argv)), overrides=overrides)
    except UsageError as exc:
        raise UsageError(f"{what}: {exc.message}") from None


def replica_config(model: str, argv: Sequence[str] = (), overrides: Mapping[str, Any] | None = None) -> ReplicaConfig:
    """The config of a fleet's replicas: ``fleetserve serve MODEL ARGV...``, then ``overrides``."""
    return from_flags(ReplicaConfig, [model, *argv], overrides, "--replica-args")


def gateway_config(argv: Sequence[str] = (), overrides: Mapping[str, Any] | None = None) -> GatewayConfig:
    """The config of a fleet's gateway: ``fleetserve gateway ARGV...``, then ``overrides``; the supervisor
    fills in the backends."""
    from fleetserve.gateway.command import GatewayOptions

    placeholder = {"gateway.backends": ("http://127.0.0.1:1",)}
    options = from_flags(GatewayOptions, argv, placeholder | dict(overrides or {}), "--gateway-args")
    return options.config()


def split_flags(text: str) -> tuple[str, ...]:
    """A ``--replica-args``/``--gateway-args`` string as argv (shell quoting)."""
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise ValueError(f"cannot split {text!r} into flags: {exc}") from None
