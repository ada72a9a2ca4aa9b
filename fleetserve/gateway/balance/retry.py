"""Retry budget: cap concurrent retries at a share of the requests in flight.

Envoy's retry budgets (``RetryBudget`` in the cluster circuit breakers): a retry may start while
``active retries < max(min_retry_concurrency, budget_percent% of active requests)``. Per-request
retry limits alone let a fleet-wide failure multiply the load by the retry count exactly when the
replicas can least absorb it; a budget keeps retries a bounded fraction of traffic, while the floor
still lets a quiet gateway retry a few requests.

Call ``try_acquire()`` before sending a retry and, only when it returned True, ``release()`` once
that retry has finished.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryBudgetConfig:
    budget_percent: float = 20.0
    min_concurrency: int = 3

    def __post_init__(self) -> None:
        if not 0 <= self.budget_percent <= 100:
            raise ValueError(f"retry_budget_percent must be in 0..100, got {self.budget_percent}")
        if self.min_concurrency < 0:
            raise ValueError(f"retry_min_concurrency must be >= 0, got {self.min_concurrency}")


class RetryBudget:
    """Counts active retries against a budget derived from ``active_requests()``."""

    def __init__(self, config: RetryBudgetConfig, active_requests: Callable[[], int]) -> None:
        self._config = config
        self._active_requests = active_requests
        self._active_retries = 0

    @property
    def active_retries(self) -> int:
        return self._active_retries

    def limit(self) -> float:
        cfg = self._config
        return max(float(cfg.min_concurrency), cfg.budget_percent / 100.0 * self._active_requests())

    def try_acquire(self) -> bool:
        """Reserve one retry; False when the budget is spent (answer the original error instead)."""
        if self._active_retries >= self.limit():
            return False
        self._active_retries += 1
        return True

    def release(self) -> None:
        """Return a retry reserved by a successful :meth:`try_acquire`."""
        if self._active_retries == 0:
            raise RuntimeError("RetryBudget.release() without a matching successful try_acquire()")
        self._active_retries -= 1
