"""All keys a gateway verifies tokens with: static files, plus JWK Sets fetched from URLs.

A JWKS URL is fetched on first use, again once it is older than ``jwks_refresh_interval_s``, and
again when a token names a ``kid`` no loaded key has (the issuer rotated keys) — but never twice
within ``jwks_min_refresh_interval_s``, so tokens with made-up kids cannot turn the gateway into a
flood against the key server (Envoy jwt_authn's remote JWKS cache behaves the same way). Concurrent
refreshes of one URL wait for one shared fetch; a failed fetch keeps the keys it had.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import aiohttp

from fleetserve.gateway.edge.jwtconfig import JwtConfig, KeySpec
from fleetserve.gateway.edge.keys import VerificationKey, keys_from_jwks, load_pem, load_secret

log = logging.getLogger(__name__)

MAX_JWKS_BYTES = 1024 * 1024
JwksFetcher = Callable[[str, float], Awaitable[object]]


class KeyLookupError(Exception):
    """No key can verify the token; the message says why (unknown kid, algorithm not allowed)."""


async def fetch_jwks(url: str, timeout_s: float) -> object:
    """GET a JWK Set document (at most ``MAX_JWKS_BYTES``) and parse it as JSON."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as response:
        if response.status != 200:
            raise ValueError(f"HTTP {response.status}")
        body = await response.content.read(MAX_JWKS_BYTES + 1)
        if len(body) > MAX_JWKS_BYTES:
            raise ValueError(f"JWK Set larger than {MAX_JWKS_BYTES} bytes")
        return json.loads(body)


class RemoteJwks:
    """One JWKS URL: its current keys and when they were fetched."""

    def __init__(self, spec: KeySpec, config: JwtConfig, fetch: JwksFetcher, clock: Callable[[], float]) -> None:
        self.url = spec.location
        self._algorithms = spec.algorithms
        self._refresh_after = config.jwks_refresh_interval_s
        self._min_interval = config.jwks_min_refresh_interval_s
        self._timeout = config.jwks_fetch_timeout_s
        self._fetch = fetch
        self._clock = clock
        self._inflight: asyncio.Future[bool] | None = None
        self.keys: list[VerificationKey] = []
        self.fetched_at: float | None = None
        self.attempted_at: float | None = None

    def stale(self) -> bool:
        return self.fetched_at is None or self._clock() - self.fetched_at >= self._refresh_after

    async def refresh(self) -> bool:
        """Fetch again, unless a fetch started within the minimum interval; True if keys were loaded.

        Callers arriving while a fetch is in flight wait for that fetch instead of starting another.
        """
        if self._inflight is None:
            seen = self.attempted_at
            if seen is not None and self._clock() - seen < self._min_interval:
                return False
            self.attempted_at = self._clock()
            task = asyncio.ensure_future(self._load())
            task.add_done_callback(self._clear_inflight)
            self._inflight = task
        # Shielded: a caller that goes away (client disconnect) must not cancel the others' fetch.
        return await asyncio.shield(self._inflight)

    def _clear_inflight(self, task: asyncio.Future[bool]) -> None:
        if self._inflight is task:
            self._inflight = None

    async def _load(self) -> bool:
        try:
            document = await self._fetch(self.url, self._timeout)
            self.keys = keys_from_jwks(document, self._algorithms, f"jwks_url {self.url}")
        except Exception as exc:  # any failure (network, HTTP, JSON, shape) keeps the old keys
            log.warning("fetching JWK Set %s failed: %s", self.url, exc)
            return False
        self.fetched_at = self._clock()
        return True


class KeySet:
    """Static keys plus remote JWK Sets; :meth:`select` finds the keys that may check a token."""

    def __init__(self, static: Sequence[VerificationKey], remotes: Sequence[RemoteJwks]) -> None:
        self.static = tuple(static)
        self.remotes = tuple(remotes)

    @classmethod
    def from_config(
        cls,
        config: JwtConfig,
        fetch: JwksFetcher = fetch_jwks,
        clock: Callable[[], float] = time.monotonic,
    ) -> KeySet:
        """Loads key files now (a bad file is a ValueError at startup); URLs are fetched on first use."""
        static: list[VerificationKey] = []
        remotes = []
        for spec in config.keys:
            try:
                if spec.source == "pem":
                    static.append(load_pem(spec.location, spec.algorithms, spec.kid))
                elif spec.source == "secret_file":
                    static.append(load_secret(spec.location, spec.algorithms, spec.kid))
                elif spec.source == "jwks_file":
                    with open(spec.location, "rb") as f:
                        document = json.load(f)
                    found = keys_from_jwks(document, spec.algorithms, f"jwks_file {spec.location}")
                    if not found:
                        raise ValueError(f"jwks_file {spec.location} holds no usable key")
                    static.extend(found)
                else:
                    remotes.append(RemoteJwks(spec, config, fetch, clock))
            except OSError as exc:
                raise ValueError(f"cannot read {spec.source} {spec.location}: {exc}") from exc
        return cls(static, remotes)

    def _all(self) -> list[VerificationKey]:
        keys = list(self.static)
        for remote in self.remotes:
            keys.extend(remote.keys)
        return keys

    async def select(self, kid: str | None, alg: str) -> list[VerificationKey]:
        """Keys to try for a token with this ``kid`` and ``alg``, best first; raises KeyLookupError."""
        for remote in self.remotes:
            if remote.stale():
                await remote.refresh()
        if kid is None:
            keys = [k for k in self._all() if alg in k.algorithms]
            keys.sort(key=lambda k: k.kid is not None)
            if not keys:
                raise KeyLookupError(f"no key allows algorithm {alg}")
            return keys
        named = [k for k in self._all() if k.kid == kid]
        if not named and self.remotes:
            for remote in self.remotes:
                await remote.refresh()
            named = [k for k in self._all() if k.kid == kid]
        if named:
            keys = [k for k in named if alg in k.algorithms]
            if not keys:
                raise KeyLookupError(f"algorithm {alg} is not allowed for key {kid!r}")
            return keys
        # An issuer may stamp a kid on tokens even for a single key configured without one.
        unnamed = [k for k in self.static if k.kid is None and alg in k.algorithms]
        if not unnamed:
            raise KeyLookupError(f"unknown key id {kid!r}")
        return unnamed
