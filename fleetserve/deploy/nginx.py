"""Render an ``nginx.conf`` that balances fleetserve replicas (``fleetserve deploy nginx``).

Open-source NGINX has no active health checks, so failure handling is passive: a backend that fails
``max_fails`` times within ``fail_timeout`` is skipped for ``fail_timeout``, and a refused connection,
a timeout or a 503 is retried once on another backend (``proxy_next_upstream``). Upstream keep-alive
needs HTTP/1.1 and an empty ``Connection`` header, see https://nginx.org/en/docs/http/ngx_http_upstream_module.html#keepalive.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from fleetserve.deploy.proxy import ProxyConfig, duration, integer_weights
from fleetserve.deploy.templating import render

# NGINX accepts any positive int; a small ceiling keeps the rendered weights readable.
MAX_WEIGHT = 1000
_SAFE_PATH = re.compile(r'^[^"\\;\n\r{}$]*$')


def _size(n: int) -> str:
    for unit, scale in (("m", 1 << 20), ("k", 1 << 10)):
        if n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def _files_prefix(prefix: Path | None) -> str:
    if prefix is None:
        return ""
    text = str(prefix.resolve())
    if not _SAFE_PATH.match(text):
        raise ValueError(f"prefix {text!r} holds characters NGINX would misread (quote, ;, braces, $)")
    return text.rstrip("/") + "/"


def render_nginx_config(config: ProxyConfig, prefix: Path | None = None) -> str:
    """The ``nginx.conf`` text; its pid, logs and temp files go under ``prefix`` (NGINX's ``-p`` when None)."""
    files = _files_prefix(prefix)
    weights = integer_weights([b.weight for b in config.backends], MAX_WEIGHT)
    servers = "\n".join(
        f"        server {b.address} weight={w} max_fails={config.max_fails} "
        f"fail_timeout={duration(config.fail_timeout_s)};"
        for b, w in zip(config.backends, weights, strict=True)
    )
    host = f"[{config.host}]" if ":" in config.host else config.host
    return render("nginx.conf", {
        "workers": config.workers or "auto",
        "files": files,
        "access_log": f'"{files}access.log" fleetserve' if config.access_log else "off",
        "max_body": _size(config.max_body_bytes),
        "balance": "        least_conn;\n" if config.policy == "least-conn" else "",
        "servers": servers,
        "keepalive": config.keepalive,
        "maxconn": config.maxconn,
        "listen": f"{host}:{config.port}",
        "connect_timeout": duration(config.connect_timeout_s),
        "timeout": duration(config.timeout_s),
        "tries": config.tries,
    })


def render_nginx(
    backends: Sequence[tuple[str, float]],
    port: int = 8080,
    policy: str = "round-robin",
    prefix: Path | None = None,
    *,
    host: str = "0.0.0.0",
    workers: int = 0,
    access_log: bool = True,
) -> str:
    """``nginx.conf`` for ``(url, weight)`` backends; ``policy`` is ``round-robin`` or ``least_conn``."""
    config = ProxyConfig.from_pairs(backends, port=port, policy=policy, host=host, workers=workers,
                                    access_log=access_log)
    return render_nginx_config(config, prefix)
