"""Per-client token-bucket rate limits, by route prefix, with bounded memory.

A bucket holds up to ``burst`` tokens and refills continuously at ``rate`` tokens per second; a
request takes one token or is refused (the token bucket of NGINX ``limit_req`` and Envoy's local
rate limit filter, refilled lazily from elapsed time on each access instead of by a timer). Every rule
whose prefix matches applies, all-or-nothing: a token is taken from each matching bucket only if
all of them have one, so a refusal by one rule does not drain the others.

Buckets live in one LRU table per rule capped at ``max_entries`` (like an NGINX zone or an HAProxy
stick table): a client forgotten under pressure comes back with a full bucket, which errs towards
admitting and keeps memory flat however many addresses appear. Refusals are 429 with
``Retry-After`` (seconds until one token is back) and the ``RateLimit-Limit`` / ``-Remaining`` /
``-Reset`` fields of the IETF httpapi rate-limit headers draft (Reset: seconds until the bucket is
full again).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler

from fleetserve.gateway.edge.clientip import ClientAddress
from fleetserve.gateway.edge.config import IPNetwork, RateLimitRule
from fleetserve.gateway.edge.identity import Identity, identity_of
from fleetserve.gateway.edge.metrics import NullObserver, RejectionObserver
from fleetserve.gateway.edge.rejection import Rejection
from fleetserve.wire import retry_after

# Refill arithmetic in floats can land a hair below a whole token (3 x 1/300 s x 100/s); without this
# slack such a request would be refused and the fraction lost at the burst cap on the next refill.
_TOKEN_SLACK = 1e-9


class _Bucket:
    __slots__ = ("stamp", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp


class BucketTable:
    """The buckets of one rule, least recently used first, at most ``max_entries`` of them."""

    def __init__(self, rate: float, burst: int, max_entries: int) -> None:
        self.rate = rate
        self.burst = burst
        self.max_entries = max_entries
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def refilled(self, key: str, now: float) -> _Bucket:
        """The bucket of ``key`` with tokens brought up to ``now`` (a new one starts full)."""
        buckets = self._buckets
        bucket = buckets.get(key)
        if bucket is None:
            bucket = buckets[key] = _Bucket(float(self.burst), now)
            if len(buckets) > self.max_entries:
                buckets.popitem(last=False)
            return bucket
        buckets.move_to_end(key)
        elapsed = now - bucket.stamp
        if elapsed > 0:
            bucket.tokens = min(float(self.burst), bucket.tokens + elapsed * self.rate)
            bucket.stamp = now
        return bucket


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request was refused: the rule that ran dry and the client's state in it."""

    rule: RateLimitRule
    retry_after_s: float
    reset_s: float

    def headers(self) -> dict[str, str]:
        return {
            "Retry-After": retry_after(self.retry_after_s),
            "RateLimit-Limit": str(self.rule.burst),
            "RateLimit-Remaining": "0",
            "RateLimit-Reset": str(math.ceil(self.reset_s)),
        }


class RateLimiter:
    """The rules and their bucket tables; pure logic driven by an injected clock."""

    def __init__(self, rules: Sequence[RateLimitRule], clock: Callable[[], float] = time.monotonic) -> None:
        self.rules = tuple(rules)
        self.tables = tuple(BucketTable(r.rate, r.burst, r.max_entries) for r in self.rules)
        self._prefixes = tuple(r.prefix for r in self.rules)
        self._clock = clock

    def matching(self, path: str) -> list[int]:
        """Indices of the rules whose prefix ``path`` starts with."""
        return [i for i, prefix in enumerate(self._prefixes) if path.startswith(prefix)]

    def admit(self, indices: Sequence[int], keys: Sequence[str]) -> Refusal | None:
        """Take a token from bucket ``keys[j]`` of rule ``indices[j]`` for every j, or take none and
        return the tightest refusal."""
        now = self._clock()
        buckets = []
        refusal: Refusal | None = None
        for i, key in zip(indices, keys, strict=True):
            bucket = self.tables[i].refilled(key, now)
            buckets.append(bucket)
            if bucket.tokens < 1.0 - _TOKEN_SLACK:
                rule = self.rules[i]
                wait = (1.0 - bucket.tokens) / rule.rate
                if refusal is None or wait > refusal.retry_after_s:
                    refusal = Refusal(rule, wait, (rule.burst - bucket.tokens) / rule.rate)
        if refusal is None:
            for bucket in buckets:
                bucket.tokens -= 1.0
        return refusal


class RateLimitMiddleware:
    """Applies a :class:`RateLimiter` to every request outside ``exempt_paths``."""

    __middleware_version__ = 1

    def __init__(
        self,
        limiter: RateLimiter,
        trusted_proxies: Sequence[IPNetwork] = (),
        exempt_paths: Sequence[str] = (),
        observer: RejectionObserver | None = None,
    ) -> None:
        self.limiter = limiter
        self._kinds = tuple(rule.key for rule in limiter.rules)
        self.client_address = ClientAddress(trusted_proxies)
        self.exempt = frozenset(exempt_paths)
        self.needs_identity = any(kind != "ip" for kind in self._kinds)
        self._observer = observer or NullObserver()

    def keys(self, indices: Sequence[int], identity: Identity | None, client_ip: Callable[[], str]) -> list[str]:
        """The bucket key of a request under each rule in ``indices``: its verified identity where the rule
        is keyed by one and the request has it, else its client IP (``client_ip()``, asked at most once)."""
        ip_key = ""
        keys = []
        for i in indices:
            kind = self._kinds[i]
            value = None
            if kind != "ip" and identity is not None:
                value = identity.subject if kind == "subject" else identity.tenant
            if value is not None:
                keys.append(f"{kind}:{value}")
                continue
            if not ip_key:
                ip_key = "ip:" + client_ip()
            keys.append(ip_key)
        return keys

    def admit(self, path: str, identity: Identity | None, client_ip: Callable[[], str]) -> Rejection | None:
        """Take a token for a request to ``path`` from every matching rule's bucket, or refuse it (429)."""
        indices = self.limiter.matching(path)
        if not indices:
            return None
        refusal = self.limiter.admit(indices, self.keys(indices, identity, client_ip))
        if refusal is None:
            return None
        self._observer.rejected("rate_limited")
        rule = refusal.rule
        message = f"rate limit of {rule.rate:g}/s (burst {rule.burst}) per {rule.key} exceeded on {rule.prefix}"
        return Rejection(429, "rate_limited", message, refusal.headers())

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in self.exempt:
            return await handler(request)
        identity = identity_of(request) if self.needs_identity else None
        rejection = self.admit(path, identity, lambda: self.client_address(request))
        if rejection is not None:
            return rejection.response()
        return await handler(request)
