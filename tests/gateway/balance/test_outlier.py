import pytest

from fleetserve.gateway.balance.outlier import OutlierConfig, OutlierDetector, OutlierState


def eject(
    detector: OutlierDetector, state: OutlierState, now: float, ejected: int = 0, total: int = 10
) -> float | None:
    until = None
    for _ in range(detector.config.consecutive_errors):
        until = detector.record(state, True, now, ejected, total)
    return until


def test_ejects_after_consecutive_failures_only() -> None:
    detector = OutlierDetector(OutlierConfig(consecutive_errors=3, base_ejection_s=5.0))
    state = OutlierState()
    assert detector.record(state, True, 0.0, 0, 10) is None
    assert detector.record(state, True, 0.0, 0, 10) is None
    assert detector.record(state, False, 0.0, 0, 10) is None  # a success breaks the streak
    assert detector.record(state, True, 0.0, 0, 10) is None
    assert detector.record(state, True, 0.0, 0, 10) is None
    assert detector.record(state, True, 0.0, 0, 10) == 5.0
    assert state.ejected
    # Failures of requests still in flight while ejected neither extend nor re-eject.
    assert detector.record(state, True, 1.0, 1, 10) is None
    assert state.ejected_until == 5.0


def test_ejection_time_grows_with_each_ejection_and_is_capped() -> None:
    detector = OutlierDetector(OutlierConfig(consecutive_errors=1, base_ejection_s=5.0, max_ejection_s=12.0))
    state = OutlierState()
    now = 0.0
    durations = []
    for _ in range(4):
        until = eject(detector, state, now)
        assert until is not None
        durations.append(until - now)
        assert not detector.expired(state, until - 0.001)
        assert detector.expired(state, until)
        detector.readmit(state, until)
        now = until + 1.0
    assert durations == [5.0, 10.0, 12.0, 12.0]
    assert state.ejections_total == 4


def test_multiplier_decays_while_the_endpoint_behaves() -> None:
    cfg = OutlierConfig(consecutive_errors=1, base_ejection_s=5.0, multiplier_decay_s=30.0)
    detector = OutlierDetector(cfg)
    state = OutlierState()
    eject(detector, state, 0.0)
    detector.readmit(state, 5.0)
    eject(detector, state, 6.0)  # soon after: multiplier 2
    assert state.ejected_until == pytest.approx(16.0)
    detector.readmit(state, 16.0)
    eject(detector, state, 16.0 + 65.0)  # two quiet periods: multiplier 2 -> 0 -> 1
    assert state.ejected_until == pytest.approx(81.0 + 5.0)


def test_max_ejection_percent() -> None:
    detector = OutlierDetector(OutlierConfig(max_ejection_percent=50))
    assert detector.may_eject(ejected=0, total=2)
    assert not detector.may_eject(ejected=1, total=2)
    assert not detector.may_eject(ejected=0, total=1)
    assert detector.may_eject(ejected=1, total=5)
    assert not detector.may_eject(ejected=2, total=5)
    state = OutlierState()
    assert eject(detector, state, 0.0, ejected=2, total=5) is None
    assert not state.ejected
    # The streak is kept, so the next failure ejects as soon as there is room.
    assert detector.record(state, True, 1.0, 1, 5) == 6.0


def test_readmit_resets_the_streak() -> None:
    detector = OutlierDetector(OutlierConfig(consecutive_errors=2))
    state = OutlierState()
    eject(detector, state, 0.0)
    detector.readmit(state, 5.0)
    assert state.consecutive_failures == 0
    assert detector.record(state, True, 5.0, 0, 10) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"consecutive_errors": 0}, "consecutive_errors"),
        ({"base_ejection_s": 0.0}, "base_ejection_s"),
        ({"max_ejection_percent": 101.0}, "max_ejection_percent"),
        ({"multiplier_decay_s": 0.0}, "multiplier_decay_s"),
    ],
)
def test_config_validation(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OutlierConfig(**kwargs)  # type: ignore[arg-type]


def test_connect_errors_eject_sooner_than_5xx() -> None:
    detector = OutlierDetector(OutlierConfig(consecutive_errors=5, consecutive_connect_errors=2))
    refused, failing = OutlierState(), OutlierState()
    assert detector.record(refused, True, 0.0, 0, 4, connect_error=True) is None
    assert detector.record(refused, True, 0.1, 0, 4, connect_error=True) == 5.1
    for i in range(4):
        assert detector.record(failing, True, float(i), 1, 4) is None
    # A 5xx in between breaks a connect-error streak but still counts towards the general one.
    mixed = OutlierState()
    detector.record(mixed, True, 0.0, 0, 4, connect_error=True)
    detector.record(mixed, True, 0.1, 0, 4)
    assert detector.record(mixed, True, 0.2, 0, 4, connect_error=True) is None
    assert mixed.consecutive_failures == 3
