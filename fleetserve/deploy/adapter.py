"""prometheus-adapter rules that serve fleetserve's scaling signals to the Kubernetes metrics APIs.

The HorizontalPodAutoscaler reads Pods metrics (``custom.metrics.k8s.io``: queue depth and GPU utilisation
per replica pod) and an External metric (``external.metrics.k8s.io``: the gateway's
``fleetserve_autoscale_desired_replicas``). prometheus-adapter answers both from Prometheus with the rules
rendered here (its ``--config`` file; the format is ``MetricsDiscoveryConfig`` of kubernetes-sigs/prometheus-
adapter ``pkg/config``). A rule's ``metricsQuery`` is a Go template: the adapter substitutes ``<<.Series>>``,
``<<.LabelMatchers>>`` (the namespace and the pods the HPA asks about, plus the metric selector) and
``<<.GroupBy>>`` (``pod`` for Pods metrics). Targets need ``namespace`` and ``pod`` labels, which both the
plain scrape config and the Prometheus Operator monitors give them, and ``fleet`` (the pod's
``app.kubernetes.io/instance``), which tells two fleets in one namespace apart.
"""

from __future__ import annotations

from typing import Any

import yaml

QUEUE_DEPTH = "fleetserve_queue_depth"
GPU_UTILIZATION = "fleetserve_gpu_utilization_ratio"
DESIRED_REPLICAS = "fleetserve_autoscale_desired_replicas"



def _resources(*labels: str) -> dict[str, Any]:
    """Prometheus label -> the Kubernetes resource it names (label and resource are spelt alike here)."""
    return {"overrides": {label: {"resource": label} for label in labels}}


def _rule(series: str, selector: str, resources: dict[str, Any], query: str) -> dict[str, Any]:
    return {
        "seriesQuery": f"{series}{{{selector}}}",
        "resources": resources,
        "name": {"matches": f"^{series}$", "as": series},
        "metricsQuery": query,
    }


def adapter_rules() -> dict[str, Any]:
    """The adapter's config: ``rules`` (Pods metrics) and ``externalRules`` (External metrics)."""
    return {
        "rules": [
            # Rows waiting in each replica's batcher, summed over the models a replica serves.
            _rule(QUEUE_DEPTH, 'namespace!="",pod!=""', _resources("namespace", "pod"),
                  "sum by (<<.GroupBy>>) (<<.Series>>{<<.LabelMatchers>>})"),
            # The busiest whole GPU a replica sees (mig="": MIG slices report no utilisation).
            _rule(GPU_UTILIZATION, 'namespace!="",pod!=""', _resources("namespace", "pod"),
                  'max by (<<.GroupBy>>) (<<.Series>>{<<.LabelMatchers>>,mig=""})'),
        ],
        "externalRules": [
            # Every gateway pod of a fleet exports the same recommendation: one value per (fleet, rule).
            _rule(DESIRED_REPLICAS, 'namespace!="",fleet!=""', _resources("namespace"),
                  "max(<<.Series>>{<<.LabelMatchers>>})"),
        ],
    }


def render_adapter_config() -> str:
    header = ("# prometheus-adapter rules for fleetserve's HorizontalPodAutoscaler, rendered by\n"
              "# `fleetserve deploy k8s`. Give it to the adapter as its --config file (Helm chart: the\n"
              "# rules.custom and rules.external values).\n")
    return header + yaml.safe_dump(adapter_rules(), sort_keys=False, width=120)
