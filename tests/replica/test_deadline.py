"""The forwarded deadline as the replica reads it (pure parsing; the process tests prove it is honoured)."""

from __future__ import annotations

import pytest

from fleetserve.errors import InvalidInput
from fleetserve.replica.deadline import forwarded_deadline, remaining_deadline
from fleetserve.wire import TIMEOUT_HEADER


def test_a_forwarded_timeout_becomes_an_absolute_deadline() -> None:
    assert forwarded_deadline("250", now=100.0) == pytest.approx(100.25)
    assert forwarded_deadline("0.5", now=100.0) == pytest.approx(100.0005)
    assert forwarded_deadline(None, now=100.0) is None


@pytest.mark.parametrize("value", ["", "soon", "0", "-5", "nan", "inf"])
def test_a_bad_forwarded_timeout_is_the_callers_mistake(value: str) -> None:
    with pytest.raises(InvalidInput, match=TIMEOUT_HEADER):
        forwarded_deadline(value, now=0.0)


def test_grpc_time_remaining_becomes_an_absolute_deadline() -> None:
    assert remaining_deadline(1.5, now=10.0) == pytest.approx(11.5)
    assert remaining_deadline(None, now=10.0) is None
