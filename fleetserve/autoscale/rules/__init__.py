"""Scaling rules, chosen by name (:data:`RULES`): pure functions of snapshots and an injected clock."""

from __future__ import annotations

from fleetserve.autoscale.rules.base import Recommendation, Rule, ScaleBounds
from fleetserve.importer import Registry

RULES: Registry[type[Rule]] = Registry("autoscale rule", {
    "hpa": "fleetserve.autoscale.rules.hpa:HpaRule",
    "predictive": "fleetserve.autoscale.rules.predictive:PredictiveRule",
})

__all__ = ["RULES", "Recommendation", "Rule", "ScaleBounds"]
