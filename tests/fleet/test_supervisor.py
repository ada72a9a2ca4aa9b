from __future__ import annotations

import asyncio
import signal
import sys

import pytest

from fleetserve.engine.base import Precision
from fleetserve.errors import UsageError
from fleetserve.fleet.config import FleetConfig, gateway_config, replica_config
from fleetserve.fleet.supervisor import Backoff, Member, Supervisor, child_environ
from fleetserve.gateway.config import GatewayConfig
from fleetserve.replica.config import ReplicaConfig
from tests.support.waiting import until


def test_backoff_doubles_caps_and_resets_after_stable_uptime() -> None:
    b = Backoff(0.5, 4.0, stable_s=30)
    assert [b.next_delay(1.0) for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert b.next_delay(31.0) == 0.5
    assert b.next_delay(1.0) == 1.0


def test_fleet_layout_and_threads() -> None:
    cfg = FleetConfig(replicas=3, base_port=9000, cores=6)
    replica, gateway = replica_config("tiny", ("--precision", "int8")), gateway_config(("--policy", "least-pending"))
    sup = Supervisor(cfg, replica, gateway)
    assert [m.url for m in sup.replicas] == [f"http://127.0.0.1:{p}" for p in (9000, 9002, 9004)]
    second = sup.replicas[1].config
    assert isinstance(second, ReplicaConfig)
    assert (second.port, second.grpc_port, second.threads) == (9002, 9003, 2)
    assert (second.engine.model, second.engine.precision) == ("tiny", Precision.INT8)
    gateway = sup.gateway.config
    assert isinstance(gateway, GatewayConfig)
    assert gateway.backends == tuple(m.url for m in sup.replicas)
    assert (gateway.port, gateway.balancer.policy) == (8080, "least-pending")


def test_a_replica_flag_of_ones_own_wins_over_the_computed_threads() -> None:
    sup = Supervisor(FleetConfig(replicas=2, cores=8), replica_config("tiny", ("--threads", "1")))
    assert {m.config.threads for m in sup.replicas} == {1}  # type: ignore[union-attr]


def test_children_get_no_fleetserve_options_from_the_environment() -> None:
    env = child_environ({"FLEETSERVE_BACKEND": "onnxruntime", "FLEETSERVE_HOME": "/models", "PATH": "/bin"})
    assert env == {"FLEETSERVE_HOME": "/models", "PATH": "/bin"}


def test_bad_child_flags_are_a_usage_error_naming_the_option() -> None:
    with pytest.raises(UsageError, match=r"--replica-args: .*--instances"):
        replica_config("tiny", ("--instances", "many"))
    with pytest.raises(UsageError, match="--gateway-args: unrecognized arguments: --nope"):
        gateway_config(("--nope",))


@pytest.mark.parametrize("bad", [{"replicas": 0}, {"backoff_initial_s": 0}, {"backoff_max_s": 0.1}])
def test_fleet_config_validation(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FleetConfig(**bad)  # type: ignore[arg-type]


async def test_a_stop_while_the_fleet_starts_ends_it_without_waiting_for_readiness(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during a slow start (an engine build, say) stops the fleet at once, not after ready_timeout_s."""
    sup = Supervisor(FleetConfig(replicas=1, ready_timeout_s=600), replica_config("tiny"), gateway_config())
    started: list[asyncio.subprocess.Process] = []

    async def spawn_sleeper(member: Member) -> None:
        member.process = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(600)")
        started.append(member.process)

    monkeypatch.setattr(sup, "_spawn", spawn_sleeper)
    monkeypatch.setattr("fleetserve.fleet.supervisor.http_ok", lambda url: False)
    stop = asyncio.Event()
    run = asyncio.create_task(sup.run(stop))
    await until(lambda: len(started) == 2, what="the replica and the gateway were started")
    stop.set()
    await asyncio.wait_for(run, timeout=30)
    assert [p.returncode for p in started] == [-signal.SIGTERM, -signal.SIGTERM]
