"""Network partition of one replica of four under steady load through the real gateway (slow; root): its
packets dropped, or delayed 2 s each way — never refused. No request may fail, and the gateway must take the
replica out of rotation within its health checks' reach. Skipped with the reason where network namespaces
cannot be made."""

from __future__ import annotations

import asyncio

import pytest

from fleetserve.bench.netns import partition_unavailable
from fleetserve.bench.scenarios import HEALTH_INTERVAL_S, ScenarioConfig, run_scenario
from fleetserve.gateway.config import BalancerConfig

pytestmark = pytest.mark.slow

_B = BalancerConfig()
# A probe round that began just before the fault may still pass; after it, each failing round ends within the
# probe timeout and the next starts at most an interval later.
OUT_WITHIN_S = (_B.unhealthy_threshold + 1) * (HEALTH_INTERVAL_S + _B.health_timeout_s)


@pytest.fixture(autouse=True)
def _namespaces() -> None:
    reason = partition_unavailable()
    if reason:
        pytest.skip(f"network partitions cannot be made here: {reason}")


# With default settings: a request already sent to the replica when its link went silent gets no answer, so
# the gateway's per-try timeout (half the client's 10 s deadline) cuts it and retries it on another replica.
@pytest.mark.parametrize("fault", ["partition-drop", "partition-delay"])
def test_partitioned_replica_costs_no_request_and_leaves_rotation(fault: str) -> None:
    cfg = ScenarioConfig(fault=fault, rate=100, duration_s=OUT_WITHIN_S + 4, fault_at_s=2, base_port=23300,
                         gateway_port=23280)
    result = asyncio.run(run_scenario(cfg))
    assert result.report.errors == 0, result.report.errors_by_type
    assert result.events["out_after_s"] < OUT_WITHIN_S, result.events
