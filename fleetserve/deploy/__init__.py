"""Deployment assets: render NGINX, HAProxy, Kubernetes (kustomize), Prometheus and Grafana files.

``proxy`` holds the validated settings shared by the two third-party proxies; ``nginx`` and ``haproxy``
render their configs; ``k8s`` the kustomize tree; ``monitoring`` the Prometheus scrape config, the
recording/alert rules and the Grafana dashboard; ``local`` runs NGINX or HAProxy as a foreground
process on 127.0.0.1 (benchmarks and tests); ``command`` is ``fleetserve deploy``. Templates are
package data under ``templates/`` and use ``@{name}`` placeholders (``templating``), so the ``$``
of NGINX variables and Prometheus templates needs no escaping.
"""
