"""BatcherConfig: defaults, normalisation and validation messages."""

from __future__ import annotations

import re
from typing import Any

import pytest

from fleetserve.batching import BatcherConfig


def test_defaults_match_the_documented_ones() -> None:
    config = BatcherConfig()
    assert config.max_batch == 32
    assert config.max_delay_s == 0.002
    assert config.preferred_batch_sizes == ()
    assert config.max_queue == 1024
    assert config.default_timeout_s is None
    assert config.seq_buckets is None
    assert config.priority_levels == 2
    # Triton: a lower number is a higher priority; requests naming none get the lowest level.
    assert config.default_priority == 1
    assert config.default_level == 1
    assert config.pad_to == "longest"
    assert config.group_by_length is True
    assert config.promote_overdue is False


def test_sizes_and_buckets_are_sorted_and_deduplicated() -> None:
    config = BatcherConfig(max_batch=8, preferred_batch_sizes=(8, 4, 4), seq_buckets=(64, 16, 16))
    assert config.preferred_batch_sizes == (4, 8)
    assert config.seq_buckets == (16, 64)


def test_default_priority_follows_the_number_of_levels() -> None:
    assert BatcherConfig(priority_levels=3).default_level == 2
    assert BatcherConfig(priority_levels=3, default_priority=0).default_level == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch": 0}, "max_batch must be >= 1"),
        ({"max_batch": 2.5}, "max_batch must be an integer"),
        ({"max_batch": True}, "max_batch must be an integer"),
        ({"max_delay_s": -0.001}, "max_delay_s must be >= 0"),
        ({"max_delay_s": float("nan")}, "max_delay_s must be a finite number"),
        ({"max_batch": 4, "preferred_batch_sizes": (2, 8)}, "preferred batch size 8 exceeds max_batch 4"),
        ({"preferred_batch_sizes": (0,)}, "preferred batch size must be >= 1"),
        ({"max_batch": 8, "max_queue": 4}, "max_queue (4) must be >= max_batch (8)"),
        ({"default_timeout_s": 0}, "default_timeout_s must be None or > 0"),
        ({"seq_buckets": ()}, "seq_buckets must be None"),
        ({"seq_buckets": (16, -1)}, "seq bucket must be >= 1"),
        ({"priority_levels": 0}, "priority_levels must be >= 1"),
        ({"priority_levels": 2, "default_priority": 2}, "default_priority 2 is outside 0..1"),
        ({"promote_overdue": "yes"}, "promote_overdue must be a bool"),
        ({"pad_to": "fixed"}, "pad_to must be one of bucket, longest, got 'fixed'"),
    ],
)
def test_invalid_values_are_rejected_with_a_clear_message(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        BatcherConfig(**kwargs)


def test_config_is_frozen() -> None:
    config = BatcherConfig()
    with pytest.raises(AttributeError):
        config.max_batch = 4  # type: ignore[misc]
