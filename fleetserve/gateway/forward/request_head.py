"""What one request to an upstream looks like on the wire: its validated request line and encoded head.

The request line (method, the upstream's base path plus the client's target, ``HTTP/1.1``) and the ``Host``
header are validated once per (method, target) and cached: a gateway sees few distinct ones, so the cache
spares two regex matches and a format per request. Header bytes are re-encoded exactly as aiohttp's server
decoded them (UTF-8 with surrogateescape), and a name or value holding CR, LF or NUL is refused, never
put on the wire.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import urlsplit

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(r"/[\x21-\x7e]*")
_NO_BODY_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
# Validated request lines (plus Host) per (method, target): a gateway sees few distinct ones, so the
# cache spares two regex matches and a format per request. Bounded: targets up to _MAX_CACHED_TARGET
# characters, emptied when it holds _MAX_REQUEST_LINES (clients choose query strings).
_MAX_REQUEST_LINES = 1024
_MAX_CACHED_TARGET = 256


def parse_upstream_url(url: str) -> tuple[str, int, str]:
    """``http://host[:port][/base]`` -> (host, port, base path without trailing slash).

    Anything else is a ValueError naming the problem; TLS to replicas is not supported.
    """
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"upstream URL {url!r}: only http:// upstreams are supported")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"upstream URL {url!r} must not have a query, fragment or credentials")
    try:
        port = parts.port or 80
    except ValueError as exc:
        raise ValueError(f"upstream URL {url!r}: {exc}") from None
    if not parts.hostname:
        raise ValueError(f"upstream URL {url!r} has no host")
    base = parts.path.rstrip("/")
    if base and not _TARGET.fullmatch(base):
        raise ValueError(f"upstream URL {url!r} has an invalid path")
    return parts.hostname, port, base


class RequestHead:
    """Request heads for one upstream ``host:port`` under its base path."""

    __slots__ = ("_base_path", "_host_header", "_request_lines")

    def __init__(self, host: str, port: int, base_path: str) -> None:
        bracketed = f"[{host}]" if ":" in host else host
        self._host_header = bracketed if port == 80 else f"{bracketed}:{port}"
        self._base_path = base_path
        self._request_lines: dict[tuple[str, str], str] = {}

    def encode(self, method: str, target: str, headers: Sequence[tuple[str, str]], length: int) -> bytes:
        """The request head; ValueError for a bad method, target, or a header with CR, LF or NUL."""
        lines = [self._request_line(method, target)]
        lines += [f"{name}: {value}\r\n" for name, value in headers]
        if length or method not in _NO_BODY_METHODS:
            lines.append(f"Content-Length: {length}\r\n")
        lines.append("\r\n")
        head = "".join(lines)
        newlines = head.count("\n")
        if newlines != len(lines) + 1 or head.count("\r") != newlines or "\x00" in head:
            raise ValueError("request header names and values must not contain CR, LF or NUL")
        # surrogateescape round-trips the exact bytes aiohttp's server decoded (no re-encoding).
        return head.encode("utf-8", "surrogateescape")

    def _request_line(self, method: str, target: str) -> str:
        """``METHOD /base/target HTTP/1.1`` and the Host header line; ValueError for a bad method or target."""
        line = self._request_lines.get((method, target))
        if line is None:
            if not _TOKEN.fullmatch(method) or not _TARGET.fullmatch(target):
                raise ValueError(f"invalid request line {method!r} {target!r}")
            line = f"{method} {self._base_path}{target} HTTP/1.1\r\nHost: {self._host_header}\r\n"
            if len(target) <= _MAX_CACHED_TARGET:
                if len(self._request_lines) >= _MAX_REQUEST_LINES:
                    self._request_lines.clear()
                self._request_lines[method, target] = line
        return line
