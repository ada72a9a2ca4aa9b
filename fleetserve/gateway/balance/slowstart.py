"""Slow start: ramp a new or re-admitted endpoint's weight up over a window.

A replica that just joined (or came back after an ejection or failed health checks) has cold caches
and, for GPU engines, may still be compiling kernels for shapes it has not seen; sending it a full
share at once turns its first seconds into timeouts. Envoy's slow start mode scales the weight by

    factor = max(min_weight_percent / 100, time_factor ** (1 / aggression))
    time_factor = max(seconds_since_start, 1) / window_s

until the window has passed (Envoy docs, "Slow start mode", arch_overview/upstream/load_balancing).
``aggression`` > 1 ramps faster early, < 1 slower; ``min_weight_percent`` keeps a floor so the
endpoint is not starved entirely.

How policies use the factor: weighted policies multiply the endpoint's weight by it; the P2C
policies divide their cost by the effective weight (so at factor 0.1 an idle new replica looks as
loaded as an old one with ~9 requests pending). Plain round-robin ignores weights and so slow start.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SlowStartConfig:
    window_s: float = 0.0  # 0 disables slow start
    aggression: float = 1.0
    min_weight_percent: float = 10.0

    def __post_init__(self) -> None:
        if self.window_s < 0:
            raise ValueError(f"slow_start_s must be >= 0, got {self.window_s}")
        if self.aggression <= 0:
            raise ValueError(f"slow start aggression must be > 0, got {self.aggression}")
        if not 0 < self.min_weight_percent <= 100:
            raise ValueError(f"slow start min_weight_percent must be in (0, 100], got {self.min_weight_percent}")

    @property
    def enabled(self) -> bool:
        return self.window_s > 0


class SlowStartRamp:
    """Where one endpoint is on its ramp; :meth:`restart` when it becomes routable again."""

    __slots__ = ("_config", "_started_at")

    def __init__(self, config: SlowStartConfig) -> None:
        self._config = config
        self._started_at: float | None = None  # None: no ramp running (disabled, or its window has passed)

    def restart(self, now: float) -> None:
        if self._config.enabled:
            self._started_at = now

    def factor(self, now: float) -> float:
        """Weight multiplier in (0, 1]; exactly 1 once the window has passed or when disabled."""
        started = self._started_at
        if started is None:
            return 1.0
        cfg = self._config
        elapsed = now - started
        if elapsed >= cfg.window_s:
            # Forget the start so later calls take the cheap path.
            self._started_at = None
            return 1.0
        time_factor = max(elapsed, 1.0) / cfg.window_s
        return min(1.0, max(cfg.min_weight_percent / 100.0, time_factor ** (1.0 / cfg.aggression)))

    def active(self, now: float) -> bool:
        return self.factor(now) < 1.0
