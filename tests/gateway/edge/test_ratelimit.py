"""Token-bucket rate limits on a fake clock: accuracy, isolation, all-or-nothing rules, bounded
memory, and the 429 answer over HTTP."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.typedefs import Handler

from fleetserve.gateway.edge.config import RateLimitRule, parse_networks
from fleetserve.gateway.edge.identity import IDENTITY_KEY, Identity
from fleetserve.gateway.edge.ratelimit import BucketTable, RateLimiter, RateLimitMiddleware, Refusal
from tests.support.clock import FakeClock
from tests.support.jwt_keys import ServeFn


def _admit(limiter: RateLimiter, path: str, key: str) -> Refusal | None:
    """One request from client ``key`` (the same key under every matching rule)."""
    indices = limiter.matching(path)
    return limiter.admit(indices, [key] * len(indices))


def _drive(limiter: RateLimiter, clock: FakeClock, clients: dict[str, float], seconds: float) -> dict[str, int]:
    """Each client sends at its own steady rate for ``seconds``; returns admitted counts."""
    events = sorted((i / rate, name) for name, rate in clients.items() for i in range(int(rate * seconds)))
    admitted = dict.fromkeys(clients, 0)
    start = clock.now
    for offset, name in events:
        clock.now = start + offset
        if _admit(limiter, "/v2/models/m/infer", name) is None:
            admitted[name] += 1
    return admitted


@pytest.mark.parametrize(("rate", "burst"), [(10.0, 20), (100.0, 1), (0.5, 5), (37.0, 50)])
def test_three_times_the_rate_admits_rate_times_time_plus_burst(rate: float, burst: int) -> None:
    clock = FakeClock(100.0)
    limiter = RateLimiter([RateLimitRule(rate=rate, burst=burst)], clock)
    seconds = 10.0
    admitted = _drive(limiter, clock, {"greedy": 3 * rate, "polite": rate / 2}, seconds)
    expected = rate * seconds + burst
    assert abs(admitted["greedy"] - expected) <= 0.1 * expected, admitted
    assert admitted["polite"] == int(rate / 2 * seconds)  # other clients are unaffected


def test_refusal_reports_retry_after_and_reset() -> None:
    clock = FakeClock(100.0)
    rule = RateLimitRule(rate=2.0, burst=4)
    limiter = RateLimiter([rule], clock)
    for _ in range(4):
        assert _admit(limiter, "/", "c") is None
    clock.now += 0.25  # half a token back
    refusal = _admit(limiter, "/", "c")
    assert refusal is not None
    assert refusal.retry_after_s == pytest.approx(0.25)
    assert refusal.reset_s == pytest.approx(1.75)
    assert refusal.headers() == {
        "Retry-After": "1",
        "RateLimit-Limit": "4",
        "RateLimit-Remaining": "0",
        "RateLimit-Reset": "2",
    }
    clock.now += 0.25
    assert _admit(limiter, "/", "c") is None


def test_rules_apply_all_or_nothing() -> None:
    clock = FakeClock(100.0)
    limiter = RateLimiter(
        [RateLimitRule(rate=0.001, burst=5), RateLimitRule(rate=0.001, burst=2, prefix="/v2/models")], clock
    )
    results = [_admit(limiter, "/v2/models/m", "c") for _ in range(4)]
    assert [r is None for r in results] == [True, True, False, False]
    refused = results[2]
    assert refused is not None and refused.rule.prefix == "/v2/models"
    # The refused requests did not drain the "/" bucket: 3 of its 5 tokens are left.
    assert [_admit(limiter, "/other", "c") is None for _ in range(4)] == [True, True, True, False]
    assert _admit(limiter, "/healthz-like-but-unmatched", "c") is not None
    assert _admit(RateLimiter([RateLimitRule(rate=1, burst=1, prefix="/v2")], clock), "/x", "c") is None


def test_table_stays_at_its_cap_with_100k_addresses() -> None:
    clock = FakeClock(100.0)
    limiter = RateLimiter([RateLimitRule(rate=1.0, burst=3, max_entries=10_000)], clock)
    for i in range(100_000):
        clock.now += 0.0001
        _admit(limiter, "/", f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}")
    assert len(limiter.tables[0]) == 10_000


def test_lru_keeps_active_clients_and_forgets_idle_ones() -> None:
    table = BucketTable(rate=1.0, burst=2, max_entries=3)
    table.refilled("a", 0.0).tokens = 0.0
    table.refilled("b", 0.0).tokens = 0.0
    table.refilled("c", 0.0)
    table.refilled("a", 0.0)  # "a" used again: "b" is now least recently used
    table.refilled("d", 0.0)
    assert len(table) == 3
    assert table.refilled("a", 0.0).tokens == 0.0  # kept, still empty
    assert table.refilled("b", 0.0).tokens == 2.0  # forgotten: comes back full


async def test_http_429_with_headers_per_forwarded_client(serve: ServeFn) -> None:
    clock = FakeClock(100.0)
    limiter = RateLimiter([RateLimitRule(rate=1.0, burst=2)], clock)
    middleware = RateLimitMiddleware(limiter, parse_networks(["127.0.0.1/32"]), exempt_paths=("/healthz",))
    client = await serve([middleware])
    a, b = {"X-Forwarded-For": "1.1.1.1"}, {"X-Forwarded-For": "2.2.2.2"}
    assert [(await client.get("/v2/models", headers=a)).status for _ in range(3)] == [200, 200, 429]
    refused = await client.get("/v2/models", headers=a)
    assert refused.status == 429
    assert refused.headers["Retry-After"] == "1"
    assert refused.headers["RateLimit-Limit"] == "2"
    assert refused.headers["RateLimit-Remaining"] == "0"
    assert refused.headers["RateLimit-Reset"] == "2"
    assert "rate limit of 1/s (burst 2) per ip exceeded" in (await refused.json())["error"]
    assert (await client.get("/v2/models", headers=b)).status == 200
    assert [(await client.get("/healthz", headers=a)).status for _ in range(5)] == [200] * 5
    clock.now += 1.0
    assert (await client.get("/v2/models", headers=a)).status == 200


async def test_subject_keys_share_a_bucket_across_addresses(serve: ServeFn) -> None:
    clock = FakeClock(100.0)

    @web.middleware
    async def fake_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        subject = request.headers.get("X-Test-Subject")
        if subject:
            request[IDENTITY_KEY] = Identity(subject, None, frozenset(), {})
        return await handler(request)

    limiter = RateLimiter([RateLimitRule(rate=1.0, burst=2, key="subject")], clock)
    client = await serve([fake_auth, RateLimitMiddleware(limiter, parse_networks(["127.0.0.1/32"]))])
    statuses = [
        (await client.get("/", headers={"X-Test-Subject": "alice", "X-Forwarded-For": f"3.3.3.{i}"})).status
        for i in range(3)
    ]
    assert statuses == [200, 200, 429]
    assert (await client.get("/", headers={"X-Test-Subject": "bob"})).status == 200
    # Anonymous requests fall back to their address.
    assert [(await client.get("/")).status for _ in range(3)] == [200, 200, 429]
