"""The rendered Prometheus config and rules, run by the real Prometheus against a real local fleet (two
``tiny`` replicas and a gateway): the recorded request rates equal what the test sent (within 10%), the
recorded latency quantiles are the fleet's, and killing a replica fires the ejection alert.

The scrape config is the rendered ``prometheus-local.yml`` (the static-target variant for ``fleetserve up``)
with its targets pointed at this fleet's ports; scrapes and rule evaluations run every second and the rules'
window is 15 s, so the test sees steady state within seconds instead of minutes.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetserve.deploy.monitoring import MonitoringConfig, panels, render_prometheus
from tests.deploy.prometheus_server import Prometheus, running_prometheus
from tests.steady_load import steady_load
from tests.support.procs import gateway, replica

RATE = 40.0
WINDOW_S = 15
# Ejections alert at > 0: one crash is enough here (the shipped default is > 3 in 15 minutes).
CONFIG = MonitoringConfig(scrape_interval_s=1, window=f"{WINDOW_S}s", ejections=0)


def local_config(rendered: str, gateway: str, replicas: list[str]) -> dict[str, Any]:
    """The rendered static-target config with this fleet's addresses as its targets (host:port)."""
    config: dict[str, Any] = yaml.safe_load(rendered)
    (job,) = config["scrape_configs"]
    groups = {group["labels"]["component"]: group for group in job["static_configs"]}
    assert set(groups) == {"gateway", "replica"}
    groups["gateway"]["targets"] = [gateway]
    groups["replica"]["targets"] = replicas
    return config


def _address(url: str) -> str:
    return url.removeprefix("http://")


def _settled_values(prom: Prometheus, promql: str, since: float, count: int = 3) -> list[tuple[float, float]]:
    """The series' next ``count`` evaluations, each taken after ``since`` (wall clock), one value each."""
    seen: dict[float, float] = {}

    def enough() -> bool:
        found = prom.value(f"timestamp({promql})")
        if found is not None and found[1] > since:
            sample = prom.value(promql)
            if sample is not None:
                seen[found[1]] = sample[1]
        return len(seen) >= count

    prom.wait(enough, 60, f"{count} evaluations of {promql} after the window filled")
    return sorted(seen.items())[:count]


def _targets_up(prom: Prometheus) -> float:
    found = prom.value('sum(up{job="fleetserve"})')
    return 0.0 if found is None else found[1]


def _firing(prom: Prometheus, name: str) -> list[dict[str, Any]]:
    return [a for a in prom.alerts() if a["labels"]["alertname"] == name and a["state"] == "firing"]


@pytest.mark.slow
async def test_rules_evaluate_to_the_fleets_real_values(tmp_path: Path) -> None:
    window = CONFIG.window
    with replica("tiny", grpc=False) as first, replica("tiny", grpc=False) as second, \
            gateway([first.url, second.url], "--policy", "round-robin") as front:
        files = render_prometheus(CONFIG)
        config = local_config(files["prometheus-local.yml"], _address(front.url),
                              [_address(first.url), _address(second.url)])
        with running_prometheus(tmp_path, config, {"rules.yml": files["rules.yml"]}) as prom:
            # Scraping every target before the load starts, so the window fills with samples taken under it.
            await asyncio.to_thread(prom.wait, lambda: _targets_up(prom) == 3, 60, "all three targets scraped")
            async with steady_load(front.url, RATE) as load:
                started = time.time()
                # Rates of a full window of steady load: evaluations from one window (plus two scrapes) on.
                gateway_rate = f"sum(fleetserve:gateway_requests:rate{window})"
                samples = await asyncio.to_thread(_settled_values, prom, gateway_rate, started + WINDOW_S + 2)
                for at, value in samples:
                    sent = load.sent_between(at - WINDOW_S, at) / WINDOW_S
                    assert abs(sent - RATE) <= 0.02 * RATE, f"the load itself lagged: {sent}/s"
                    assert value == pytest.approx(sent, rel=0.10), (at, value, sent)
                (at, replicas_rate), = await asyncio.to_thread(
                    _settled_values, prom, f"sum(fleetserve:requests:rate{window})", samples[-1][0], 1)
                assert replicas_rate == pytest.approx(load.sent_between(at - WINDOW_S, at) / WINDOW_S, rel=0.10)
                assert prom.query(f'fleetserve:gateway_requests:rate{window}{{code!="200"}} > 0') == []
                p50 = prom.value(f"fleetserve:gateway_request_duration_seconds:p50_{window}")
                p99 = prom.value(f"fleetserve:gateway_request_duration_seconds:p99_{window}")
                assert p50 is not None and p99 is not None and 0 < p50[1] <= p99[1] < 1.0
                # Every Grafana panel's query is PromQL this Prometheus accepts (Grafana fills in the interval).
                for _title, _unit, queries in panels(window):
                    for expr, _ in queries:
                        prom.query(expr.replace("$__rate_interval", f"{WINDOW_S}s"))
                shown = prom.query(f"fleetserve:gateway_request_duration_seconds:p99_{window}")
                assert shown, "the dashboard's end-to-end p99 panel would be empty"
                healthy = prom.value('sum(fleetserve_gateway_backends{state="healthy"})')
                assert healthy is not None and healthy[1] == 2
                assert _firing(prom, "FleetserveGatewayEjections") == []

                first.popen.send_signal(signal.SIGKILL)
                alert = await asyncio.to_thread(
                    prom.wait, lambda: _firing(prom, "FleetserveGatewayEjections"), 30,
                    "FleetserveGatewayEjections firing after a replica was killed")
                assert [a["labels"]["backend"] for a in alert] == [first.url]
                assert _firing(prom, "FleetserveNoHealthyBackends") == []
            assert load.answers.get(200, 0) >= 0.95 * len(load.sent_at)  # the kill cost the clients little
