"""The HTTP client protocol the load generator drives, its config, error kinds and the registry.

Two implementations: ``fast`` (fleetserve.bench.fastclient, asyncio Protocols + httptools, plain
HTTP only) and ``aiohttp`` (HTTPS, and a cross-check of the fast one). ``auto`` picks ``fast`` for
``http://`` URLs and ``aiohttp`` for ``https://``. Registry entries are import strings, imported
only when chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

from fleetserve.bench.workloads import Payload
from fleetserve.importer import Registry

CLIENTS: Registry[Callable[[ClientConfig], HttpClient]] = Registry("client", {
    "fast": "fleetserve.bench.fastclient:FastClient",
    "aiohttp": "fleetserve.bench.aiohttpclient:AiohttpClient",
})

# Error kinds besides ``http_<status>``; ``dropped`` is decided by the generator, not a client.
TIMEOUT = "timeout"
CONNECT = "connect"
CONNECTION = "connection"
PROTOCOL = "protocol"
DROPPED = "dropped"


class RequestError(Exception):
    """A request that got no HTTP response; ``kind`` is one of the error kinds above."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


@dataclass(frozen=True)
class ClientConfig:
    url: str
    connections: int = 512
    timeout_s: float = 10.0
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must look like http://host:port[/prefix], got {self.url!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"url must not have a query or fragment: {self.url!r}")
        if self.connections < 1:
            raise ValueError(f"connections must be >= 1, got {self.connections}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        for name, value in self.headers.items():
            if not name or any(c in name for c in ":\r\n ") or "\r" in value or "\n" in value:
                raise ValueError(f"invalid header {name!r}: {value!r}")

    @property
    def base_path(self) -> str:
        return urlsplit(self.url).path.rstrip("/")


class HttpClient(Protocol):
    """Sends prepared requests; ``send`` returns the HTTP status or raises :class:`RequestError`."""

    def prepare(self, payload: Payload) -> object: ...

    async def start(self) -> None: ...

    async def send(self, prepared: object) -> int: ...

    async def close(self) -> None: ...


def client_name(name: str, url: str) -> str:
    """Resolve ``auto`` and check the name; raises ValueError naming the choices."""
    if name == "auto":
        return "aiohttp" if urlsplit(url).scheme == "https" else "fast"
    if name not in CLIENTS:
        raise ValueError(f"unknown client {name!r}; choose auto or one of {sorted(CLIENTS)}")
    return name


async def open_client(name: str, config: ClientConfig) -> HttpClient:
    client: HttpClient = CLIENTS.load(client_name(name, config.url))(config)
    await client.start()
    return client
