"""``fleetserve deploy TARGET``: render deployment assets to a file, a folder or stdout.

Targets: ``nginx`` and ``haproxy`` (a proxy config for ``--backend`` replicas), ``k8s`` (the kustomize
tree with ``--out DIR``, else the base's manifests as one YAML stream), ``prometheus`` (scrape configs
and rules, ``--out DIR``), ``grafana`` (the dashboard JSON) and ``all`` (the default tree committed under
``deploy/``, ``--out DIR``). One flat option list rather than
sub-commands, so every option also reads ``FLEETSERVE_<NAME>`` and the config file like other commands;
options a target does not use are ignored.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fleetserve.deploy.proxy import POLICIES, Backend, ProxyConfig

TARGETS = ("nginx", "haproxy", "k8s", "prometheus", "grafana", "all")
_POLICY_SPELLINGS = ("round-robin", "least_conn", "roundrobin", "leastconn", "least-conn")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", choices=TARGETS, help="what to render; all: the default tree of deploy/")
    parser.add_argument("--out", type=Path,
                        help="file (nginx, haproxy, grafana) or folder (k8s, prometheus, all); default: stdout")
    proxy = parser.add_argument_group("nginx and haproxy")
    proxy.add_argument("--backend", action="append", default=[], metavar="URL[=WEIGHT]",
                       help="a replica, repeatable, e.g. http://10.0.0.5:8000=2")
    proxy.add_argument("--host", default="0.0.0.0", help="address to listen on (default %(default)s)")
    proxy.add_argument("--port", type=int, default=8080, help="port to listen on (default %(default)s)")
    proxy.add_argument("--policy", default="round-robin", choices=_POLICY_SPELLINGS,
                       help=f"balancing: {' or '.join(POLICIES)}, in either proxy's spelling (default %(default)s)")
    proxy.add_argument("--workers", type=int, default=0,
                       help="NGINX worker processes / HAProxy threads (0 = one per core)")
    proxy.add_argument("--maxconn", type=int, default=ProxyConfig.maxconn, help="client connections at most")
    proxy.add_argument("--timeout-s", type=float, default=ProxyConfig.timeout_s, help="upstream response timeout")
    proxy.add_argument("--health-interval", type=float, default=ProxyConfig.health_interval_s,
                       help="seconds between HAProxy's readiness checks of each replica")
    proxy.add_argument("--prefix", type=Path,
                       help="NGINX: folder for pid, logs and temp files (default: NGINX's -p prefix)")
    k8s = parser.add_argument_group("k8s")
    k8s.add_argument("--model", default="minilm", help="model the replicas serve (default %(default)s)")
    k8s.add_argument("--replicas", type=int, default=3, help="replica pods (default %(default)s)")
    k8s.add_argument("--image", help="container image with fleetserve installed (default fleetserve:VERSION)")
    k8s.add_argument("--name", default="fleetserve", help="prefix of resource names (default %(default)s)")
    k8s.add_argument("--gateway-replicas", type=int, default=2, help="gateway pods (default %(default)s)")
    k8s.add_argument("--cpu", default="2", help="CPU request per replica (default %(default)s)")
    k8s.add_argument("--memory", default="4Gi", help="memory request and limit per replica (default %(default)s)")
    k8s.add_argument("--gpus", type=int, default=1, help="GPUs per replica in the gpu overlay (default %(default)s)")
    k8s.add_argument("--drain-grace-s", type=float, default=5.0, help="replica --drain-grace-s")
    k8s.add_argument("--drain-timeout-s", type=float, default=30.0, help="replica --drain-timeout-s")
    prom = parser.add_argument_group("prometheus")
    prom.add_argument("--p99-seconds", type=float, default=0.05, help="p99 latency alert threshold")
    prom.add_argument("--error-ratio", type=float, default=0.01, help="5xx ratio alert threshold")
    prom.add_argument("--queue-depth", type=int, default=512, help="queued rows per replica alert threshold")


def _proxy_config(args: argparse.Namespace) -> ProxyConfig:
    return ProxyConfig(
        backends=tuple(Backend.parse(spec) for spec in args.backend), host=args.host, port=args.port,
        policy=args.policy, workers=args.workers, maxconn=args.maxconn, timeout_s=args.timeout_s,
        health_interval_s=args.health_interval,
    )


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


def _k8s(args: argparse.Namespace) -> None:
    from fleetserve.deploy.k8s import K8sConfig, manifests, render_k8s

    config = K8sConfig(
        model=args.model, replicas=args.replicas, image=args.image or K8sConfig.image, name=args.name,
        gateway_replicas=args.gateway_replicas, cpu=args.cpu, memory=args.memory, gpus=args.gpus,
        drain_grace_s=args.drain_grace_s, drain_timeout_s=args.drain_timeout_s,
    )
    if args.out is None:
        _emit(manifests(config), None)
    else:
        _emit_tree(render_k8s(config), args.out)


def _prometheus(args: argparse.Namespace) -> None:
    from fleetserve.deploy.monitoring import MonitoringConfig, render_prometheus

    if args.out is None:
        raise ValueError("prometheus writes three files; give --out DIR")
    config = MonitoringConfig(p99_seconds=args.p99_seconds, error_ratio=args.error_ratio,
                              queue_depth=args.queue_depth)
    _emit_tree(render_prometheus(config), args.out)


def run(args: argparse.Namespace) -> int:
    if args.target == "nginx":
        from fleetserve.deploy.nginx import render_nginx_config

        _emit(render_nginx_config(_proxy_config(args), args.prefix), args.out)
    elif args.target == "haproxy":
        from fleetserve.deploy.haproxy import render_haproxy_config

        _emit(render_haproxy_config(_proxy_config(args)), args.out)
    elif args.target == "k8s":
        _k8s(args)
    elif args.target == "prometheus":
        _prometheus(args)
    elif args.target == "all":
        from fleetserve.deploy.assets import default_assets

        if args.out is None:
            raise ValueError("all writes a tree of files; give --out DIR (e.g. deploy)")
        _emit_tree(default_assets(), args.out)
    else:
        from fleetserve.deploy.monitoring import render_grafana

        _emit(render_grafana(), args.out)
    return 0
