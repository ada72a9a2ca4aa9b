"""A clock that unit tests set and advance; inject it wherever the code takes ``clock: Callable[[], float]``."""

from __future__ import annotations


class FakeClock:
    """Returns ``now``; tests move time by assigning ``now`` or calling :meth:`advance`."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now
