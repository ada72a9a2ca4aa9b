"""The edge guards as one declarative list, built into aiohttp middlewares in order.

Order matters and is fixed here, outermost first (each layer only sees what the ones before let
through, so cheap refusals come first and the expensive body read last):

1. ``head_limits`` — oversized heads and declared bodies, before anything else runs;
2. ``identity`` — strip client-sent identity headers, with auth (without it nothing in the gateway has
   an identity to trust, and the proxy drops such headers on the way to replicas regardless);
3. ``shedding`` — refuse beyond the in-flight cap before spending work on auth;
4. ``auth`` — verify the bearer token, check route scopes, record the identity;
5. ``rate_limit`` — per client (IP, or the identity auth just recorded);
6. ``adaptive_concurrency`` — the latency-driven in-flight limit: the excess of an overload is refused
   before its body is read and scanned, the work of every request that reaches this point, so a refusal
   costs the gateway as little as the guards above (the latency it learns from then includes the body's
   arrival, which for the small bodies that came with their head is nothing, and which its median
   ignores for a minority of slow senders);
7. ``body_limits`` — read and bound the body, only for requests everyone else admitted.

A layer's builder returns ``None`` when its section is absent or off (``head_limits`` and ``body_limits``
never do). The auth layer imports PyJWT and cryptography only when configured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp.typedefs import Middleware

from fleetserve.gateway.edge.adaptive import GradientController
from fleetserve.gateway.edge.adaptive_guard import AdaptiveConcurrencyMiddleware
from fleetserve.gateway.edge.config import EdgeConfig
from fleetserve.gateway.edge.identity import StripIdentityHeaders
from fleetserve.gateway.edge.limits import BodyLimits, HeadLimits
from fleetserve.gateway.edge.metrics import NullObserver, RejectionObserver
from fleetserve.gateway.edge.ratelimit import RateLimiter, RateLimitMiddleware
from fleetserve.gateway.edge.shed import LoadShedMiddleware

if TYPE_CHECKING:
    from fleetserve.gateway.edge.keyset import JwksFetcher


@dataclass(frozen=True)
class BuildContext:
    config: EdgeConfig
    observer: RejectionObserver
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    jwks_fetch: JwksFetcher | None = None
    unlimited: Callable[[], bool] | None = None  # the adaptive limit refuses nothing while this says so


def _head_limits(ctx: BuildContext) -> Middleware | None:
    return HeadLimits(ctx.config.limits, ctx.observer)


def _identity(ctx: BuildContext) -> Middleware | None:
    return None if ctx.config.jwt is None else StripIdentityHeaders()


def _shedding(ctx: BuildContext) -> Middleware | None:
    c = ctx.config
    return None if c.shedding is None else LoadShedMiddleware(c.shedding, c.exempt_paths, ctx.observer)


def _auth(ctx: BuildContext) -> Middleware | None:
    c = ctx.config
    if c.jwt is None:
        return None
    from fleetserve.gateway.edge.auth import JwtAuthMiddleware
    from fleetserve.gateway.edge.keyset import fetch_jwks

    return JwtAuthMiddleware.create(
        c.jwt,
        c.exempt_paths,
        ctx.observer,
        clock=ctx.clock,
        wall_clock=ctx.wall_clock,
        fetch=ctx.jwks_fetch or fetch_jwks,
    )


def _rate_limit(ctx: BuildContext) -> Middleware | None:
    c = ctx.config
    if not c.rate_limits:
        return None
    limiter = RateLimiter(c.rate_limits, ctx.clock)
    return RateLimitMiddleware(limiter, c.trusted_proxies, c.exempt_paths, ctx.observer)


def _body_limits(ctx: BuildContext) -> Middleware | None:
    return BodyLimits(ctx.config.limits, ctx.observer)


def _adaptive_concurrency(ctx: BuildContext) -> Middleware | None:
    c = ctx.config
    if not c.adaptive.enabled:
        return None
    controller = GradientController(c.adaptive, ctx.clock)
    return AdaptiveConcurrencyMiddleware(controller, c.adaptive.retry_after_s, c.exempt_paths, ctx.observer,
                                         ctx.unlimited)


LAYERS: tuple[tuple[str, Callable[[BuildContext], Middleware | None]], ...] = (
    ("head_limits", _head_limits),
    ("identity", _identity),
    ("shedding", _shedding),
    ("auth", _auth),
    ("rate_limit", _rate_limit),
    ("adaptive_concurrency", _adaptive_concurrency),
    ("body_limits", _body_limits),
)


def build_middlewares(
    config: EdgeConfig,
    metrics: RejectionObserver | None = None,
    clock: Callable[[], float] = time.monotonic,
    *,
    wall_clock: Callable[[], float] = time.time,
    jwks_fetch: JwksFetcher | None = None,
    unlimited: Callable[[], bool] | None = None,
) -> list[Middleware]:
    """The configured guards, outermost first, for ``web.Application(middlewares=...)``.

    ``clock`` (monotonic) drives rate limits and JWKS refresh timing, ``wall_clock`` (epoch seconds)
    token expiry. ``jwks_fetch`` replaces the HTTP fetch of JWK Sets (tests). ``unlimited``: while it says
    so, the adaptive concurrency limit refuses nothing (the gateway's autoscaler can still add replicas).
    """
    ctx = BuildContext(config, metrics or NullObserver(), clock, wall_clock, jwks_fetch, unlimited)
    middlewares = []
    for _name, build in LAYERS:
        middleware = build(ctx)
        if middleware is not None:
            middlewares.append(middleware)
    return middlewares
