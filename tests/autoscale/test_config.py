"""AutoscaleConfig: flags generated from its fields, validated values, off by default."""

from __future__ import annotations

import pytest

from fleetserve.autoscale.config import AutoscaleConfig, HpaConfig, PredictiveConfig, ScalingPolicy
from fleetserve.errors import UsageError
from fleetserve.options import Parser, add_options, resolve


def parse(*argv: str) -> AutoscaleConfig:
    parser = Parser(prog="t")
    add_options(parser, AutoscaleConfig)
    return resolve(AutoscaleConfig, parser.parse_args(list(argv)), environ={})


def test_off_by_default_with_kubernetes_hpa_defaults() -> None:
    config = parse()
    assert not config.enabled
    assert (config.min_replicas, config.max_replicas, config.interval_s) == (1, 10, 1.0)
    assert config.hpa.tolerance == 0.1 and config.hpa.scale_down_stabilization_s == 300.0
    assert config.hpa.scale_up_policies == (ScalingPolicy("percent", 100, 15), ScalingPolicy("pods", 4, 15))


def test_flags_reach_the_nested_rule_settings() -> None:
    config = parse("--autoscale", "predictive", "--min-replicas", "0", "--max-replicas", "4", "--slo-p99-ms", "50",
                   "--hpa-target-queue-depth", "8", "--predictive-startup-s", "2")
    assert config.rule == "predictive" and config.enabled
    assert config.bounds.min_replicas == 0 and config.bounds.max_replicas == 4
    assert config.slo_p99_s == pytest.approx(0.05)
    assert config.hpa.target_queue_depth == 8 and config.predictive.startup_s == 2


@pytest.mark.parametrize("argv", [("--autoscale", "knative"), ("--min-replicas", "5", "--max-replicas", "2"),
                                  ("--slo-p99-ms", "0"), ("--hpa-target-gpu-utilization", "150"),
                                  ("--predictive-target-load-percent", "0")])
def test_bad_values_are_usage_errors(argv: tuple[str, ...]) -> None:
    with pytest.raises(UsageError):
        parse(*argv)


def test_validation_names_the_problem() -> None:
    with pytest.raises(ValueError, match="at least one target"):
        HpaConfig(target_queue_depth=0, target_gpu_utilization=0, target_inflight=0)
    with pytest.raises(ValueError, match="kind"):
        ScalingPolicy("replicas", 1, 15)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="trend_window_s"):
        PredictiveConfig(trend_window_s=0)
