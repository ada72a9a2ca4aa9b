"""Validated configuration of the dynamic batcher.

Units: ``max_batch``, ``preferred_batch_sizes`` and ``max_queue`` count *rows* (one request may carry
several rows, e.g. several texts), because rows, not requests, are what an engine call and the queue's
memory cost. Times are seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# How a batch's sequence length is chosen; see ``BatcherConfig.pad_to``.
PAD_MODES = ("bucket", "longest")


def _require_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class BatcherConfig:
    """How the batcher groups requests.

    - ``max_batch``: most rows in one engine call (must not exceed the engine profile's ``max_batch``).
    - ``max_delay_s``: longest time the oldest queued request of a sequence bucket waits for company.
    - ``preferred_batch_sizes``: row counts to aim for; a batch is sent as soon as one is reached and
      never grows past the largest (NVIDIA Triton semantics). Empty: aim for ``max_batch``.
    - ``max_queue``: most rows waiting at once; beyond it ``submit`` raises ``Overloaded``.
    - ``default_timeout_s``: queue timeout for requests that name none (``None``: wait forever).
    - ``seq_buckets``: padded sequence lengths; ``None`` takes the engine profile's buckets. The
      largest bucket is the longest sequence accepted.
    - ``priority_levels``: levels ``0 .. priority_levels - 1``; a lower number is served first (Triton).
    - ``default_priority``: level of requests that name none; ``None`` means the lowest level.
    - ``promote_overdue``: let requests of a shorter bucket that already waited past ``max_delay_s``
      fill spare rows of a longer bucket's batch (padded up) instead of waiting for another engine call.
    - ``group_by_length``: keep one queue per sequence bucket, so a batch only holds requests of
      similar length (off: one queue, batches form by arrival alone, like a length-unaware batcher).
    - ``pad_to``: ``"longest"`` pads a batch to its longest request (never past its bucket), so no
      row pays for padding nobody in the batch needed; ``"bucket"`` pads to the bucket size, for
      engines that run fixed shapes. A fixed length for every request is ``pad_to="bucket"`` with a
      single bucket (``seq_buckets=(128,)``). Engines that capture one graph per bucket (CUDA graphs,
      TensorRT profiles) pad up to their captured shape themselves.

    ``promote_overdue`` defaults to off: measured on CPU (benchmarks/replica.py), padding short
    requests up into a long bucket's batch cost more engine time than the extra engine call it saved.
    """

    max_batch: int = 32
    max_delay_s: float = 0.002
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue: int = 1024
    default_timeout_s: float | None = None
    seq_buckets: tuple[int, ...] | None = None
    priority_levels: int = 2
    default_priority: int | None = None
    promote_overdue: bool = False
    group_by_length: bool = True
    pad_to: str = "longest"

    def __post_init__(self) -> None:
        _require_int("max_batch", self.max_batch, 1)
        if not isinstance(self.max_delay_s, int | float) or not math.isfinite(self.max_delay_s):
            raise ValueError(f"max_delay_s must be a finite number, got {self.max_delay_s!r}")
        if self.max_delay_s < 0:
            raise ValueError(f"max_delay_s must be >= 0, got {self.max_delay_s}")
        preferred = tuple(sorted({_require_int("preferred batch size", p, 1) for p in self.preferred_batch_sizes}))
        if preferred and preferred[-1] > self.max_batch:
            raise ValueError(f"preferred batch size {preferred[-1]} exceeds max_batch {self.max_batch}")
        object.__setattr__(self, "preferred_batch_sizes", preferred)
        _require_int("max_queue", self.max_queue, 1)
        if self.max_queue < self.max_batch:
            # Otherwise a request of max_batch rows could never be queued, even on an idle server.
            raise ValueError(f"max_queue ({self.max_queue}) must be >= max_batch ({self.max_batch})")
        if self.default_timeout_s is not None and not (
            isinstance(self.default_timeout_s, int | float) and self.default_timeout_s > 0
        ):
            raise ValueError(f"default_timeout_s must be None or > 0, got {self.default_timeout_s!r}")
        if self.seq_buckets is not None:
            buckets = tuple(sorted({_require_int("seq bucket", b, 1) for b in self.seq_buckets}))
            if not buckets:
                raise ValueError("seq_buckets must be None (use the engine's) or non-empty")
            object.__setattr__(self, "seq_buckets", buckets)
        _require_int("priority_levels", self.priority_levels, 1)
        default = self.priority_levels - 1 if self.default_priority is None else self.default_priority
        _require_int("default_priority", default, 0)
        if default >= self.priority_levels:
            raise ValueError(f"default_priority {default} is outside 0..{self.priority_levels - 1} (priority_levels)")
        object.__setattr__(self, "default_priority", default)
        if not isinstance(self.promote_overdue, bool):
            raise ValueError(f"promote_overdue must be a bool, got {self.promote_overdue!r}")
        if not isinstance(self.group_by_length, bool):
            raise ValueError(f"group_by_length must be a bool, got {self.group_by_length!r}")
        if self.pad_to not in PAD_MODES:
            raise ValueError(f"pad_to must be one of {', '.join(PAD_MODES)}, got {self.pad_to!r}")

    @property
    def default_level(self) -> int:
        """The priority level of requests that name none, with ``None`` resolved."""
        return self.priority_levels - 1 if self.default_priority is None else self.default_priority
