from __future__ import annotations

import pytest

from fleetserve.fleet.supervisor import Backoff, FleetConfig, Supervisor


def test_backoff_doubles_caps_and_resets_after_stable_uptime() -> None:
    b = Backoff(0.5, 4.0, stable_s=30)
    assert [b.next_delay(1.0) for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert b.next_delay(31.0) == 0.5
    assert b.next_delay(1.0) == 1.0


def test_fleet_layout_and_threads() -> None:
    cfg = FleetConfig(model="tiny", replicas=3, base_port=9000, cores=6, replica_args=("--precision", "int8"))
    sup = Supervisor(cfg)
    assert [m.url for m in sup.replicas] == [f"http://127.0.0.1:{p}" for p in (9000, 9002, 9004)]
    argv = sup.replicas[1].argv
    assert argv[argv.index("--grpc-port") + 1] == "9003"
    assert argv[argv.index("--threads") + 1] == "2"
    assert argv[-2:] == ["--precision", "int8"]
    gw = sup.gateway.argv
    assert [gw[i + 1] for i, a in enumerate(gw) if a == "--backend"] == [m.url for m in sup.replicas]


@pytest.mark.parametrize("bad", [{"replicas": 0}, {"backoff_initial_s": 0}, {"backoff_max_s": 0.1}])
def test_fleet_config_validation(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FleetConfig(**bad)  # type: ignore[arg-type]
