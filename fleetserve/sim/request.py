"""One simulated request and the answers a replica can give it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

OK = 200
OVERLOADED = 503  # the replica's queue was full (or it is draining)
RESET = 502  # the replica died with the request in hand: reset before any response byte
EXPIRED = 504  # waited in the replica's queue past its deadline
CONNECT_ERROR = 0  # nothing listened: the replica is down
NO_REPLICA = -1  # the gateway found no replica to try (all ejected, or every one tried)
LIMITED = -2  # the gateway's adaptive concurrency limit refused it at once (503 + Retry-After)


Reply = Callable[["Request", int, Any], None]


def _unrouted(request: Request, status: int, replica: Any) -> None:
    raise RuntimeError("a replica answered a request that no gateway worker routed")


class Request:
    """A client request: when it arrived, how long it is, and where it is in the gateway's retry loop."""

    __slots__ = ("arrived_at", "attempts", "budgeted", "reply", "rows", "slot", "ticket", "tickets", "tokens")

    def __init__(self, arrived_at: float, tokens: int, rows: int = 1) -> None:
        self.arrived_at = arrived_at
        self.tokens = tokens
        self.rows = rows
        self.attempts = 0
        self.budgeted = False  # the attempt in flight holds a retry-budget slot
        # Where a replica sends its answer: ``reply(request, status, replica)`` of the gateway worker routing it.
        self.reply: Reply = _unrouted
        self.ticket: Any = None  # the balancer's ticket of the attempt in flight
        self.tickets: list[Any] | None = None  # earlier attempts, so a retry goes elsewhere
        self.slot: Any = None  # its adaptive concurrency slot, held until it is answered
