"""An endpoint: one replica the gateway can forward to.

An :class:`Endpoint` is an immutable description (normalized base URL, host, port, weight, labels).
Its identity is the URL alone: two endpoints with the same URL are equal and hash alike even when
their weights differ, so a discovery source can announce a new weight for a known replica with a
plain ``Insert`` and a ``Remove`` built from the URL finds the replica it names. Everything that
changes per request (pending count, latency, reported load) lives in :mod:`fleetserve.gateway.balance.load`.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from fleetserve.wire import MAX_WEIGHT, check_weight, format_weighted, parse_weighted

__all__ = ["MAX_WEIGHT", "Endpoint"]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_NO_LABELS: Mapping[str, str] = types.MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One replica. Build it with :meth:`parse` or :meth:`from_url` rather than by hand."""

    url: str
    host: str
    port: int
    weight: float = field(default=1.0, compare=False)
    labels: Mapping[str, str] = field(default_factory=lambda: _NO_LABELS, compare=False)

    def __post_init__(self) -> None:
        if not self.url or not self.host:
            raise ValueError(f"endpoint needs a url and a host, got url={self.url!r} host={self.host!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"endpoint {self.url}: port {self.port} is outside 1..65535")
        object.__setattr__(self, "weight", check_weight(self.weight, self.url))
        if self.labels is not _NO_LABELS:
            # A private read-only copy: the caller's dict may change after the endpoint is built.
            object.__setattr__(self, "labels", types.MappingProxyType(dict(self.labels)))

    @classmethod
    def from_url(cls, url: str, weight: float = 1.0, labels: Mapping[str, str] | None = None) -> Endpoint:
        """Normalize ``url`` (scheme, host and port made explicit, trailing slash dropped)."""
        text = url.strip()
        if "://" not in text:
            raise ValueError(f"backend {url!r} needs a scheme, e.g. http://{text}")
        parts = urlsplit(text)
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise ValueError(f"backend {url!r}: scheme must be http or https, got {parts.scheme!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"backend {url!r} must not have a query or fragment")
        if parts.username or parts.password:
            raise ValueError(f"backend {url!r} must not carry credentials")
        host = parts.hostname
        if not host:
            raise ValueError(f"backend {url!r} has no host")
        try:
            port = parts.port or _DEFAULT_PORTS[scheme]
        except ValueError as exc:
            raise ValueError(f"backend {url!r}: {exc}") from None
        netloc = f"[{host}]" if ":" in host else host
        path = parts.path.rstrip("/")
        return cls(
            url=f"{scheme}://{netloc}:{port}{path}",
            host=host,
            port=port,
            weight=weight,
            labels=labels if labels is not None else _NO_LABELS,
        )

    @classmethod
    def parse(cls, spec: str) -> Endpoint:
        """Parse the CLI/file form ``URL[=WEIGHT]``, e.g. ``http://10.0.0.5:8000=2.5``."""
        url, weight = parse_weighted(spec)
        return cls.from_url(url, weight=weight)

    def __str__(self) -> str:
        return format_weighted(self.url, self.weight)
