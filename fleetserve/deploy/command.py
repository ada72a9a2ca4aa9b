"""``fleetserve deploy TARGET``: render deployment assets to a file, a folder or stdout.

Targets: ``nginx`` and ``haproxy`` (a proxy config for ``--backend`` replicas, or for those of a
``--weights-from`` file weighted by measured throughput per GPU model), ``envoy`` (a static Envoy bootstrap
for the same replicas with the gateway's balancing defaults and its edge guards as Envoy filters), ``k8s``
(the kustomize tree with ``--out DIR``: base, components, CPU/GPU/MIG/KEDA overlays, prometheus-adapter
rules; else the base's manifests as one YAML stream), ``prometheus`` (scrape configs and rules,
``--out DIR``), ``grafana`` (the dashboard JSON) and ``all`` (the default tree committed under
``deploy/``, ``--out DIR``). One flat option list rather than
sub-commands, so every option also reads ``FLEETSERVE_<NAME>`` and the config file like other commands;
options a target does not use are ignored.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from fleetserve.deploy.envoy import ENVOY_POLICIES, EnvoyConfig
from fleetserve.deploy.k8s import K8sConfig
from fleetserve.deploy.monitoring import MonitoringConfig
from fleetserve.deploy.proxy import POLICIES, Backend, ProxyConfig
from fleetserve.errors import UsageError
from fleetserve.gateway.command import EdgeOptions
from fleetserve.options import option, section

TARGETS = ("nginx", "haproxy", "envoy", "k8s", "prometheus", "grafana", "all")
_POLICY_SPELLINGS = ("round-robin", "least_conn", "roundrobin", "leastconn", "least-conn")


@dataclass(frozen=True)
class ProxyOptions:
    """NGINX and HAProxy: ``ProxyConfig``'s defaults, its backends required only by those targets."""

    backend: tuple[Backend, ...] = option((), "a replica, repeatable, e.g. http://10.0.0.5:8000=2",
                                          parse=Backend.parse, metavar="URL[=WEIGHT]")
    host: str = option(ProxyConfig.host, "address to listen on")
    port: int = option(ProxyConfig.port, "port to listen on")
    policy: str = option(ProxyConfig.policy, f"balancing: {' or '.join(POLICIES)}, in either proxy's spelling",
                         choices=_POLICY_SPELLINGS)
    workers: int = option(ProxyConfig.workers, "NGINX worker processes / HAProxy threads (0: one per core)")
    maxconn: int = option(ProxyConfig.maxconn, "client connections at most")
    timeout_s: float = option(ProxyConfig.timeout_s, "upstream response timeout")
    health_interval_s: float = option(ProxyConfig.health_interval_s, "seconds between HAProxy's and Envoy's "
                                      "readiness checks of each replica", flag="--health-interval")
    prefix: Path | None = option(None, "NGINX: folder for pid, logs and temp files", default_text="NGINX's -p prefix")
    weights_from: Path | None = option(None, "JSON: measured throughput per GPU model and each backend's model; "
                                       "the backends, weighted by it (instead of --backend)", metavar="FILE")

    def config(self) -> ProxyConfig:
        backends = self.backend
        if self.weights_from is not None:
            from fleetserve.deploy.weights import weighted_backends

            if backends:
                raise UsageError("give the backends either with --backend or in --weights-from, not both")
            backends = weighted_backends(self.weights_from)
        return ProxyConfig(backends=backends, host=self.host, port=self.port, policy=self.policy,
                           workers=self.workers, maxconn=self.maxconn, timeout_s=self.timeout_s,
                           health_interval_s=self.health_interval_s)


@dataclass(frozen=True)
class EnvoyOptions:
    """Envoy's own options; the rest of its balancing settings are the gateway's defaults."""

    envoy_policy: str = option(EnvoyConfig.policy, "least-request: power of two choices on active requests; "
                               "client-side-weighted-round-robin: weights from the replicas' ORCA reports",
                               choices=ENVOY_POLICIES)
    admin_port: int = option(EnvoyConfig.admin_port, "Envoy's admin interface port (on 127.0.0.1)")
    per_try_timeout_s: float = option(EnvoyConfig.per_try_timeout_s, "Envoy: one attempt's timeout; a timed-out "
                                      "attempt is retried on another replica")
    retries: int = option(EnvoyConfig.retries, "Envoy: retries per request (within the retry budget)")


@dataclass(frozen=True)
class DeployOptions:
    target: str = option("all", "what to render; all: the default tree of deploy/", positional=True, required=True,
                         choices=TARGETS)
    out: Path | None = option(None, "file (nginx, haproxy, envoy, grafana) or folder (k8s, prometheus, all)",
                              default_text="stdout")
    proxy: ProxyOptions = section(ProxyOptions, "nginx, haproxy and envoy")
    envoy: EnvoyOptions = section(EnvoyOptions, "envoy")
    edge: EdgeOptions = section(EdgeOptions, "envoy's edge filters (jwt_authn, local_ratelimit; also the edge: "
                                "section of --config)")
    k8s: K8sConfig = section(K8sConfig, "k8s")
    prometheus: MonitoringConfig = section(MonitoringConfig, "prometheus and grafana")


OPTIONS = DeployOptions


def _emit(text: str, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(text)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)


def _emit_tree(files: dict[str, str], out: Path) -> None:
    from fleetserve.deploy.templating import write_tree

    for path in write_tree(out, files):
        print(f"wrote {path}", file=sys.stderr)


def envoy_config(options: DeployOptions) -> EnvoyConfig:
    """The Envoy config the options describe (ValueError naming a bad value)."""
    proxy, envoy = options.proxy, options.envoy
    if proxy.policy != ProxyConfig.policy:
        raise ValueError("--policy is NGINX's and HAProxy's; Envoy's is --envoy-policy")
    # Through ProxyConfig: --backend or --weights-from, checked the same way for every proxy.
    return EnvoyConfig(backends=proxy.config().backends, host=proxy.host, port=proxy.port, admin_port=envoy.admin_port,
                       policy=envoy.envoy_policy, timeout_s=proxy.timeout_s, per_try_timeout_s=envoy.per_try_timeout_s,
                       retries=envoy.retries, health_interval_s=proxy.health_interval_s, edge=options.edge.build())


def run(options: DeployOptions) -> int:
    target, out = options.target, options.out
    if target == "envoy":
        from fleetserve.deploy.envoy import render_envoy_config

        try:
            text = render_envoy_config(envoy_config(options))
        except ValueError as exc:  # a bad value, an unreadable key file, a guard Envoy cannot enforce
            raise UsageError(str(exc)) from None
        _emit(text, out)
    elif target == "nginx":
        from fleetserve.deploy.nginx import render_nginx_config

        _emit(render_nginx_config(options.proxy.config(), options.proxy.prefix), out)
    elif target == "haproxy":
        from fleetserve.deploy.haproxy import render_haproxy_config

        _emit(render_haproxy_config(options.proxy.config()), out)
    elif target == "k8s":
        from fleetserve.deploy.k8s import manifests, render_k8s

        if out is None:
            _emit(manifests(options.k8s), None)
        else:
            _emit_tree(render_k8s(options.k8s, options.prometheus), out)
    elif target == "prometheus":
        from fleetserve.deploy.monitoring import render_prometheus

        if out is None:
            raise UsageError("prometheus writes three files; give --out DIR")
        _emit_tree(render_prometheus(options.prometheus), out)
    elif target == "all":
        from fleetserve.deploy.assets import default_assets

        if out is None:
            raise UsageError("all writes a tree of files; give --out DIR (e.g. deploy)")
        _emit_tree(default_assets(), out)
    else:
        from fleetserve.deploy.monitoring import render_grafana

        _emit(render_grafana(options.prometheus), out)
    return 0
