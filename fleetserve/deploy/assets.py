"""The default asset tree committed under ``deploy/`` (``fleetserve deploy all --out deploy``).

The proxies front a default ``fleetserve up`` fleet (replicas on 127.0.0.1:8100, 8102, 8104) and listen
next to its gateway (8080): NGINX on 8090, HAProxy on 8091, Envoy on 8092 (admin 9901), so the four can be
compared side by side.
"""

from __future__ import annotations

from fleetserve.deploy.envoy import EnvoyConfig, render_envoy_config
from fleetserve.deploy.haproxy import render_haproxy_config
from fleetserve.deploy.k8s import K8sConfig, render_k8s
from fleetserve.deploy.monitoring import MonitoringConfig, render_grafana, render_prometheus
from fleetserve.deploy.nginx import render_nginx_config
from fleetserve.deploy.proxy import Backend, ProxyConfig

LOCAL_REPLICAS = tuple(Backend("127.0.0.1", 8100 + 2 * i) for i in range(3))
NGINX_PORT = 8090
HAPROXY_PORT = 8091
ENVOY_PORT = 8092


def default_assets() -> dict[str, str]:
    """Relative path under ``deploy/`` -> text, for every generated file there (README.md is written by hand)."""
    files = {f"k8s/{path}": text for path, text in render_k8s(K8sConfig()).items()}
    files |= {f"prometheus/{name}": text for name, text in render_prometheus(MonitoringConfig()).items()}
    files["grafana/fleetserve.json"] = render_grafana()
    files["nginx/nginx.conf"] = render_nginx_config(ProxyConfig(LOCAL_REPLICAS, port=NGINX_PORT))
    files["haproxy/haproxy.cfg"] = render_haproxy_config(ProxyConfig(LOCAL_REPLICAS, port=HAPROXY_PORT))
    files["envoy/envoy.yaml"] = render_envoy_config(EnvoyConfig(LOCAL_REPLICAS, port=ENVOY_PORT))
    return files
