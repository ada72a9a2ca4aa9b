"""Service discovery: streams of ``Insert(endpoint)`` / ``Remove(endpoint)`` batches.

Discovery is split from choosing and measuring as in tower (``tower::discover``): a source only says
which replicas exist; the balancer decides what to do with them. Every source is an async iterator
of event batches, so the balancer can consume any of them the same way (``run_discovery``), and the
autoscaler's local actuator can speak the same events when it starts or stops a replica.

* :class:`StaticDiscovery` — a fixed list (``--backend URL[=WEIGHT]``), announced once.
* :class:`FileDiscovery` — a file re-read when it changes: ``URL[=WEIGHT]`` lines (``#`` comments),
  or a YAML/JSON list of such strings or of ``{url, weight, labels}`` mappings. A file that is
  missing or invalid keeps the last good set (a half-written file must not empty the fleet).
* :class:`DnsDiscovery` — re-resolves a name, one endpoint per address; with a Kubernetes headless
  Service that is one A record per ready pod. A failed or empty answer keeps the last set too:
  health checks and outlier ejection take dead replicas out, a DNS outage must not empty the fleet.

An ``Insert`` for a URL the balancer already knows updates that endpoint's weight and labels.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml

from fleetserve.gateway.balance.endpoint import Endpoint

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 1 << 20
MAX_ENDPOINTS = 10_000

Sleep = Callable[[float], Awaitable[None]]
Resolver = Callable[[str], Awaitable[Collection[str]]]


@dataclass(frozen=True, slots=True)
class Insert:
    endpoint: Endpoint


@dataclass(frozen=True, slots=True)
class Remove:
    endpoint: Endpoint


Event = Insert | Remove


class Discovery(Protocol):
    def __aiter__(self) -> AsyncIterator[list[Event]]: ...


class EventSink(Protocol):
    def apply(self, event: Event) -> None: ...


async def run_discovery(sink: EventSink, discovery: Discovery) -> None:
    """Apply every event batch from ``discovery`` to ``sink`` (the balancer) until it ends."""
    async for batch in discovery:
        for event in batch:
            sink.apply(event)


def diff(old: Mapping[str, Endpoint], new: Mapping[str, Endpoint]) -> list[Event]:
    """Events that turn the set ``old`` into ``new`` (both keyed by URL); inserts come first."""
    events: list[Event] = []
    for url, ep in new.items():
        known = old.get(url)
        if known is None or known.weight != ep.weight or dict(known.labels) != dict(ep.labels):
            events.append(Insert(ep))
    events.extend(Remove(ep) for url, ep in old.items() if url not in new)
    return events


def _index(endpoints: Iterable[Endpoint], source: str) -> dict[str, Endpoint]:
    by_url: dict[str, Endpoint] = {}
    for ep in endpoints:
        if ep.url in by_url:
            raise ValueError(f"{source}: backend {ep.url} is listed twice")
        by_url[ep.url] = ep
        if len(by_url) > MAX_ENDPOINTS:
            raise ValueError(f"{source}: more than {MAX_ENDPOINTS} backends")
    return by_url


def endpoint_from_item(item: object, where: str) -> Endpoint:
    """One backend given as ``URL[=WEIGHT]`` or as a ``{url, weight, labels}`` mapping (ValueError naming
    ``where``)."""
    if isinstance(item, str):
        return Endpoint.parse(item)
    if isinstance(item, dict):
        unknown = set(item) - {"url", "weight", "labels"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)} (allowed: url, weight, labels)")
        url, weight, labels = item.get("url"), item.get("weight", 1), item.get("labels") or {}
        if not isinstance(url, str):
            raise ValueError(f"{where}: 'url' must be a string")
        if not isinstance(labels, dict) or not all(isinstance(k, str) for k in labels):
            raise ValueError(f"{where}: 'labels' must be a mapping of strings")
        return Endpoint.from_url(url, weight=weight, labels={k: str(v) for k, v in labels.items()})
    raise ValueError(f"{where}: expected 'URL[=WEIGHT]' or a mapping, got {type(item).__name__}")


def parse_endpoint_list(text: str, source: str = "backends") -> list[Endpoint]:
    """Parse ``URL[=WEIGHT]`` lines, or a YAML/JSON list when the text starts with ``[`` or ``-``."""
    body = "\n".join(line.split("#", 1)[0] for line in text.splitlines()).strip()
    if body.startswith(("[", "-", "{")):
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{source}: invalid YAML/JSON: {exc}") from None
        if not isinstance(data, list):
            raise ValueError(f"{source}: expected a list of backends, got {type(data).__name__}")
        return [endpoint_from_item(item, f"{source} item {i}") for i, item in enumerate(data)]
    endpoints = []
    for number, line in enumerate(text.splitlines(), start=1):
        spec = line.split("#", 1)[0].strip()
        if spec:
            try:
                endpoints.append(Endpoint.parse(spec))
            except ValueError as exc:
                raise ValueError(f"{source} line {number}: {exc}") from None
    return endpoints


class StaticDiscovery:
    """A fixed set of endpoints, announced as one batch."""

    def __init__(self, endpoints: Iterable[Endpoint]) -> None:
        self._endpoints = _index(endpoints, "static backends")

    async def __aiter__(self) -> AsyncIterator[list[Event]]:
        yield [Insert(ep) for ep in self._endpoints.values()]


class FileDiscovery:
    """Endpoints listed in a file, re-read when its size, mtime or inode changes."""

    def __init__(self, path: str | os.PathLike[str], poll_interval: float = 2.0, *, sleep: Sleep = asyncio.sleep):
        if poll_interval <= 0:
            raise ValueError(f"file discovery poll_interval must be > 0, got {poll_interval}")
        self.path = Path(path)
        self._interval = poll_interval
        self._sleep = sleep
        self._current: dict[str, Endpoint] = {}
        self._signature: tuple[int, int, int] | None = None
        self._last_error: str | None = None

    def _warn_once(self, message: str) -> None:
        if message != self._last_error:
            log.warning("%s", message)
            self._last_error = message

    def poll(self) -> list[Event]:
        """Re-read the file if it changed; the events since the last good read (often none)."""
        try:
            st = self.path.stat()
            signature = (st.st_mtime_ns, st.st_size, st.st_ino)
            if signature == self._signature:
                return []
            if st.st_size > MAX_FILE_BYTES:
                raise ValueError(f"{self.path} is {st.st_size} bytes, over the {MAX_FILE_BYTES} byte limit")
            text = self.path.read_text(encoding="utf-8")
            new = _index(parse_endpoint_list(text, str(self.path)), str(self.path))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            self._warn_once(f"file discovery keeps the last {len(self._current)} backends: {exc}")
            return []
        self._signature = signature
        self._last_error = None
        events = diff(self._current, new)
        self._current = new
        return events

    async def __aiter__(self) -> AsyncIterator[list[Event]]:
        while True:
            # A blocking read is fine here: the file is bounded and usually unchanged (one stat).
            events = self.poll()
            if events:
                yield events
            await self._sleep(self._interval)


# getaddrinfo's answers for a name with no address (NXDOMAIN, or a name without A/AAAA records).
_NO_ADDRESS = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


async def system_resolver(hostname: str) -> list[str]:
    """All addresses ``hostname`` resolves to, through the system resolver (getaddrinfo)."""
    infos = await asyncio.get_running_loop().getaddrinfo(hostname, None, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class DnsDiscovery:
    """One endpoint per address of ``hostname``, re-resolved every ``interval`` seconds.

    A failed lookup keeps the last answer (a DNS blip must not empty the fleet). With ``allow_empty`` (a
    gateway that scales from zero), the resolver's "no such name / no address" — what a headless Service
    with no ready pod answers — empties it, so the gateway holds requests for the first replica instead of
    routing to addresses that are gone.
    """

    def __init__(
        self,
        hostname: str,
        port: int,
        interval: float = 5.0,
        *,
        resolver: Resolver = system_resolver,
        scheme: str = "http",
        sleep: Sleep = asyncio.sleep,
        allow_empty: bool = False,
    ) -> None:
        if not hostname:
            raise ValueError("DNS discovery needs a hostname")
        if not 0 < port < 65536:
            raise ValueError(f"DNS discovery port {port} is outside 1..65535")
        if interval <= 0:
            raise ValueError(f"DNS discovery interval must be > 0, got {interval}")
        if scheme not in ("http", "https"):
            raise ValueError(f"DNS discovery scheme must be http or https, got {scheme!r}")
        self.hostname = hostname
        self._port = port
        self._interval = interval
        self._resolver = resolver
        self._scheme = scheme
        self._sleep = sleep
        self._allow_empty = allow_empty
        self._current: dict[str, Endpoint] = {}

    def _endpoint(self, address: str) -> Endpoint:
        host = f"[{address}]" if ":" in address else address
        return Endpoint.from_url(f"{self._scheme}://{host}:{self._port}", labels={"dns": self.hostname})

    async def resolve_once(self) -> list[Event]:
        """Resolve now; the events against the last answer (none on failure or an empty answer)."""
        try:
            addresses = await self._resolver(self.hostname)
        except socket.gaierror as exc:
            if not (self._allow_empty and exc.errno in _NO_ADDRESS):
                log.warning("DNS discovery keeps %d backends: resolving %s failed: %s", len(self._current),
                            self.hostname, exc)
                return []
            addresses = []
        except OSError as exc:
            log.warning(
                "DNS discovery keeps %d backends: resolving %s failed: %s",
                len(self._current),
                self.hostname,
                exc,
            )
            return []
        # Link-local IPv6 with a zone id cannot be put in a URL host; pods never get one.
        usable = [a for a in addresses if "%" not in a][:MAX_ENDPOINTS]
        if not usable and self._allow_empty:
            events = diff(self._current, {})
            self._current = {}
            return events
        if not usable:
            log.warning("DNS discovery keeps %d backends: %s has no addresses", len(self._current), self.hostname)
            return []
        new: dict[str, Endpoint] = {}
        for address in usable:
            try:
                ep = self._endpoint(address)
            except ValueError as exc:
                log.warning("DNS discovery skips address %r of %s: %s", address, self.hostname, exc)
                continue
            new[ep.url] = ep
        if not new:
            return []
        events = diff(self._current, new)
        self._current = new
        return events

    async def __aiter__(self) -> AsyncIterator[list[Event]]:
        while True:
            events = await self.resolve_once()
            if events:
                yield events
            await self._sleep(self._interval)
