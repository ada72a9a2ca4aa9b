"""The actuator's membership: what a PUT body may say, and how it changes the balancer."""

from __future__ import annotations

from typing import Any

import pytest

from fleetserve.gateway.autoscale.members import ActuatorMembership, Members, parse_members
from fleetserve.gateway.balance import Balancer, BalancerConfig, RequestContext

A, B, C = "http://127.0.0.1:8100", "http://127.0.0.1:8102", "http://127.0.0.1:8104"


def test_a_full_body_parses_with_urls_normalised() -> None:
    members = parse_members({"ready": [A + "/", {"url": B, "weight": 2}], "starting": [C],
                             "draining": [], "startup_s": 1.25})
    assert members.ready_urls == (A, B)
    assert [ep.weight for ep in members.ready] == [1, 2]
    assert members.starting == (C,) and members.draining == ()
    assert members.startup_s == 1.25
    assert parse_members({"ready": []}) == Members()


@pytest.mark.parametrize(("body", "message"), [
    ([A], "JSON object"),
    ({"starting": [A]}, "'ready' is required"),
    ({"ready": [A], "extra": 1}, "unknown keys"),
    ({"ready": A}, "'ready' must be a list"),
    ({"ready": [A], "draining": [A]}, "listed twice"),
    ({"ready": [A, A]}, "listed twice"),
    ({"ready": [7]}, "ready\\[0\\]"),
    ({"ready": ["https://127.0.0.1:1"]}, "only http://"),
    ({"ready": ["not a url"]}, "not a url"),
    ({"ready": [], "startup_s": -1}, "startup_s"),
    ({"ready": [], "startup_s": "2"}, "startup_s"),
    ({"ready": [], "startup_s": True}, "startup_s"),
])
def test_a_malformed_body_is_refused_naming_the_problem(body: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_members(body)


def _routed(balancer: Balancer) -> set[str]:
    """Every replica ``pick`` offers, each excluded in turn once seen."""
    ctx = RequestContext("POST", "/v2/models/m/infer", 0, {}, "r")
    seen = []
    while (ep := balancer.pick(ctx, seen)) is not None:
        seen.append(ep)
    return {ep.url for ep in seen}


def test_the_balancer_routes_to_exactly_the_ready_replicas() -> None:
    balancer = Balancer(BalancerConfig())
    balancer.enable_active_health()  # a health checker runs: new endpoints wait for a probe, except these
    membership = ActuatorMembership(balancer)
    assert membership.apply(parse_members({"ready": [A, B], "starting": [C]})) == (2, 0)
    assert {ep.url for ep in balancer.endpoints()} == {A, B}
    assert {row["state"] for row in balancer.snapshot()} == {"healthy"}  # the actuator's check counted
    assert _routed(balancer) == {A, B}
    assert membership.apply(parse_members({"ready": [B, C], "draining": [A]})) == (1, 1)
    assert {ep.url for ep in balancer.endpoints()} == {B, C}
    assert _routed(balancer) == {B, C}
    assert membership.current.draining == (A,)


def test_a_weight_change_updates_the_replica_without_re_admitting_it() -> None:
    balancer = Balancer(BalancerConfig())
    balancer.enable_active_health()
    membership = ActuatorMembership(balancer)
    membership.apply(parse_members({"ready": [A, B]}))
    for _ in range(BalancerConfig().unhealthy_threshold):
        balancer.set_probe_result(balancer.endpoints()[0], False)
    assert membership.apply(parse_members({"ready": [A + "=3", B]})) == (0, 0)
    rows = {row["url"]: row for row in balancer.snapshot()}
    assert rows[A]["weight"] == 3 and rows[A]["state"] == "unhealthy"  # only a real probe re-admits it
