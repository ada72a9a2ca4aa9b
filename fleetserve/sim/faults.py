"""Faults injected into simulated replicas, mirroring :mod:`fleetserve.bench.faults` on real processes.

- ``throttle``: the process is stopped ``stop_ms`` of every ``period_ms`` (the real scenario's SIGSTOP duty
  cycle, 80 of 100 ms: a thermally throttled GPU that still passes health checks). Its event loop and
  engine instances make no progress while stopped, and leave the host's capacity to others.
- ``crash``: the process dies (SIGKILL): requests in hand are reset, connections refused; the supervisor
  restarts it after ``restart_s`` and it is ready again after the profile's cold start.
- ``slow``: from ``at_s`` on, every batch takes ``factor`` times as long (a GPU running at reduced clocks).

Targets are replica indices (``0,3``) or a share of the fleet (``1%``: that many replicas, at least one,
chosen with the run's seed). Spec syntax for the CLI: ``KIND:TARGETS[@AT_S][xFACTOR]``, e.g.
``throttle:1%``, ``crash:0@10``, ``slow:2%x3@5``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

KINDS = ("throttle", "crash", "slow")
_SPEC = re.compile(r"^(?P<kind>[a-z]+):(?P<targets>[0-9.,%]+)(?:x(?P<factor>[0-9.]+))?(?:@(?P<at>[0-9.]+))?$")


@dataclass(frozen=True)
class Fault:
    kind: str
    indices: tuple[int, ...] = ()
    share: float | None = None  # fraction of the fleet, instead of indices
    at_s: float = 0.0
    stop_ms: float = 80.0
    period_ms: float = 100.0
    restart_s: float = 0.5  # the supervisor's first backoff
    factor: float = 2.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fault kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if (self.share is None) == (not self.indices):
            raise ValueError("a fault names either replica indices or a share of the fleet")
        if self.share is not None and not 0 < self.share <= 1:
            raise ValueError(f"fault share must be in (0, 1], got {self.share}")
        if any(i < 0 for i in self.indices):
            raise ValueError("fault replica indices must be >= 0")
        if self.at_s < 0 or self.restart_s < 0:
            raise ValueError("fault times must be >= 0")
        if not 0 < self.stop_ms < self.period_ms:
            raise ValueError(f"throttle needs 0 < stop_ms < period_ms, got {self.stop_ms}/{self.period_ms}")
        if self.factor < 1:
            raise ValueError(f"slow factor must be >= 1, got {self.factor}")

    @classmethod
    def parse(cls, spec: str) -> Fault:
        m = _SPEC.match(spec.strip())
        if m is None:
            raise ValueError(f"fault {spec!r} must look like KIND:TARGETS[xFACTOR][@AT_S], e.g. throttle:1%")
        targets = m["targets"]
        at = float(m["at"]) if m["at"] else 0.0
        factor = float(m["factor"]) if m["factor"] else 2.0
        try:
            if targets.endswith("%"):
                return cls(m["kind"], share=float(targets[:-1]) / 100, at_s=at, factor=factor)
            return cls(m["kind"], indices=tuple(int(t) for t in targets.split(",") if t), at_s=at, factor=factor)
        except ValueError as exc:
            raise ValueError(f"fault {spec!r}: {exc}") from None

    def targets(self, fleet_size: int, rng: random.Random) -> list[int]:
        if self.share is None:
            bad = [i for i in self.indices if i >= fleet_size]
            if bad:
                raise ValueError(f"fault {self.kind}: replica {bad[0]} is outside a fleet of {fleet_size}")
            return list(self.indices)
        count = max(1, round(self.share * fleet_size))
        return sorted(rng.sample(range(fleet_size), count))
