"""Render a ``haproxy.cfg`` that balances fleetserve replicas (``fleetserve deploy haproxy``).

Unlike open-source NGINX, HAProxy checks backends actively: every ``inter`` it asks each replica's
``/v2/health/ready`` and takes it out after ``fall`` failures, back in after ``rise`` successes, so a
draining replica (not ready, still serving) leaves the rotation before it stops. Failed attempts are
retried on another server with layer-7 retries (``retry-on``, HAProxy >= 2.0), which replay bodies up to
the buffer size (``tune.bufsize``, 16 KiB by default), see https://docs.haproxy.org/2.6/configuration.html#4-retry-on.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetserve.deploy.proxy import HEALTH_PATH, ProxyConfig, duration, integer_weights
from fleetserve.deploy.templating import render

MAX_WEIGHT = 256  # HAProxy's ceiling for server weights


def render_haproxy_config(config: ProxyConfig) -> str:
    """The ``haproxy.cfg`` text for ``config``."""
    weights = integer_weights([b.weight for b in config.backends], MAX_WEIGHT)
    servers = "\n".join(
        f"    server replica-{i} {b.address} weight {w}"
        for i, (b, w) in enumerate(zip(config.backends, weights, strict=True), start=1)
    )
    host = f"[{config.host}]" if ":" in config.host else config.host
    return render("haproxy.cfg", {
        "maxconn": config.maxconn,
        "threads": f"    nbthread {config.workers}\n" if config.workers else "",
        "connect_timeout": duration(config.connect_timeout_s),
        "timeout": duration(config.timeout_s),
        "retries": config.tries - 1,
        "bind": f"{host}:{config.port}",
        "log_off": "" if config.access_log else "    no log\n",
        "max_body": config.max_body_bytes,
        "balance": "leastconn" if config.policy == "least-conn" else "roundrobin",
        "health_path": HEALTH_PATH,
        "inter": duration(config.health_interval_s),
        "fall": config.fall,
        "rise": config.rise,
        "servers": servers,
    })


def render_haproxy(
    backends: Sequence[tuple[str, float]],
    port: int = 8080,
    policy: str = "roundrobin",
    *,
    host: str = "0.0.0.0",
    workers: int = 0,
    access_log: bool = True,
    health_interval_s: float = 2.0,
) -> str:
    """``haproxy.cfg`` for ``(url, weight)`` backends; ``policy`` is ``roundrobin`` or ``leastconn``."""
    config = ProxyConfig.from_pairs(backends, port=port, policy=policy, host=host, workers=workers,
                                    access_log=access_log, health_interval_s=health_interval_s)
    return render_haproxy_config(config)
