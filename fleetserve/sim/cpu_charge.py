"""What a request costs its simulated process's CPU when it arrives (a replica's event loop, a gateway worker):
from the profile's curve of CPU per request against the requests the process has in hand, or from its one-in-flight
and busy figures where no curve was measured (:class:`~fleetserve.sim.profile.Profile`)."""

from __future__ import annotations

import itertools


def cpu_by_in_hand(curve: tuple[tuple[int, float], ...]) -> tuple[float, ...]:
    """A CPU curve as a table for the simulator: entry ``n - 1`` is the CPU per request with ``n`` requests in
    hand (n = 1 up to the last measured count, linear between measured counts); the last entry holds beyond it.
    Empty for an empty curve."""
    table: list[float] = []
    for (k0, c0), (k1, c1) in itertools.pairwise(curve):
        table += [c0 + (c1 - c0) * (n - k0) / (k1 - k0) for n in range(k0, k1)]
    if curve:
        table.append(curve[-1][1])
    return tuple(table)


class CpuCharge:
    """What a request costs its process's CPU when it arrives: from the measured curve by the requests the process
    has in hand, itself included (:func:`cpu_by_in_hand`), or without a curve the busy figure when the process is
    busy and the one-in-flight figure otherwise."""

    __slots__ = ("_busy_s", "_idle_s", "_table")

    def __init__(self, curve: tuple[tuple[int, float], ...], idle_s: float, busy_s: float) -> None:
        self._table = cpu_by_in_hand(curve)
        self._idle_s = idle_s
        self._busy_s = busy_s

    def __call__(self, in_hand: int, busy: bool) -> float:
        table = self._table
        if table:
            return table[min(in_hand, len(table)) - 1]
        return self._busy_s if busy else self._idle_s
