"""W3C Trace Context (``traceparent``) and ``X-Request-ID`` handling, one hop at a time (gateway and replicas).

The gateway is one hop of a trace: it keeps the caller's trace id and sampling flag and gives the
request a new parent id (its own span id) before forwarding, per https://www.w3.org/TR/trace-context/
§3.2 and §4.3. With tracing off (the default) an absent or invalid ``traceparent`` starts a new trace,
not sampled: forcing sampling on would make every replica export every request. With tracing on
(:mod:`.otel`), a sampled request's own spans take this place, and the one it forwards is its attempt's.
``tracestate`` travels with a valid ``traceparent`` unchanged and is dropped with an invalid one.

``X-Request-ID`` from the client is kept when it is a short token (it ends up in logs), else replaced.
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass

_HEX = re.compile(r"[0-9a-f]+")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")
_VERSION_00_LENGTH = 55  # "00-" + 32 + "-" + 16 + "-" + 2
SAMPLED = 0x01


@dataclass(frozen=True, slots=True)
class TraceParent:
    trace_id: str  # 32 lowercase hex digits, not all zero
    parent_id: str  # 16 lowercase hex digits, not all zero
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & SAMPLED)

    def header(self) -> str:
        """The version-00 header value (what this implementation speaks, whatever it received)."""
        return f"00-{self.trace_id}-{self.parent_id}-{self.flags:02x}"


def _is_id(text: str, length: int) -> bool:
    return len(text) == length and _HEX.fullmatch(text) is not None and text.strip("0") != ""


def parse_traceparent(value: str | None) -> TraceParent | None:
    """The parsed header, or None when it is absent or invalid (then a new trace starts)."""
    if value is None:
        return None
    value = value.strip()
    version = value[:2]
    if len(version) != 2 or not _HEX.fullmatch(version) or version == "ff":
        return None
    # Version 00 is exactly 55 characters; a later version may append fields after a '-' (§3.3).
    if len(value) < _VERSION_00_LENGTH or (version == "00" and len(value) != _VERSION_00_LENGTH):
        return None
    if len(value) > _VERSION_00_LENGTH and value[_VERSION_00_LENGTH] != "-":
        return None
    dashes = (value[2], value[35], value[52])
    trace_id, parent_id, flags = value[3:35], value[36:52], value[53:55]
    if dashes != ("-", "-", "-") or not _is_id(trace_id, 32) or not _is_id(parent_id, 16):
        return None
    if not _HEX.fullmatch(flags):
        return None
    return TraceParent(trace_id, parent_id, int(flags, 16))


class IdGenerator:
    """Random trace, span and request ids; inject a seeded ``random.Random`` to make them repeatable."""

    def __init__(self, rng: random.Random | None = None) -> None:
        # Seeded from the OS per process, so forked or spawned workers never share a sequence.
        self._rng = rng if rng is not None else random.Random(os.urandom(16))

    def _hex(self, bits: int, spec: str) -> str:
        value = self._rng.getrandbits(bits)
        while not value:  # all-zero ids are invalid
            value = self._rng.getrandbits(bits)
        return format(value, spec)

    def trace_id(self) -> str:
        return self._hex(128, "032x")

    def span_id(self) -> str:
        return self._hex(64, "016x")

    def request_id(self) -> str:
        return self._hex(128, "032x")


def next_hop(incoming: TraceParent | None, ids: IdGenerator) -> TraceParent:
    """The ``traceparent`` to forward: same trace and flags with a new span id, or a new trace."""
    if incoming is None:
        return TraceParent(ids.trace_id(), ids.span_id(), 0)
    # Only the sampled bit has a meaning this hop knows; unknown bits are not passed on (§3.2.2.5).
    return TraceParent(incoming.trace_id, ids.span_id(), incoming.flags & SAMPLED)


def request_id(value: str | None, ids: IdGenerator) -> str:
    """The client's ``X-Request-ID`` when it is a sane token, else a fresh one."""
    if value is not None and _REQUEST_ID.fullmatch(value):
        return value
    return ids.request_id()
