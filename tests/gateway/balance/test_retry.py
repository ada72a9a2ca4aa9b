import pytest

from fleetserve.gateway.balance.retry import RetryBudget, RetryBudgetConfig


class Active:
    def __init__(self) -> None:
        self.value = 0

    def __call__(self) -> int:
        return self.value


def test_min_concurrency_allows_a_few_retries_when_quiet() -> None:
    active = Active()
    budget = RetryBudget(RetryBudgetConfig(budget_percent=20.0, min_concurrency=3), active)
    assert [budget.try_acquire() for _ in range(4)] == [True, True, True, False]
    assert budget.active_retries == 3
    budget.release()
    assert budget.try_acquire()


def test_budget_is_a_share_of_active_requests() -> None:
    active = Active()
    budget = RetryBudget(RetryBudgetConfig(budget_percent=20.0, min_concurrency=3), active)
    active.value = 100
    assert budget.limit() == 20.0
    granted = sum(budget.try_acquire() for _ in range(50))
    assert granted == 20
    active.value = 10  # load dropped: no new retries until enough finish
    assert not budget.try_acquire()
    for _ in range(17):
        budget.release()
    assert not budget.try_acquire()
    budget.release()
    assert budget.try_acquire()


def test_zero_budget_and_zero_floor_forbid_retries() -> None:
    active = Active()
    active.value = 1000
    budget = RetryBudget(RetryBudgetConfig(budget_percent=0.0, min_concurrency=0), active)
    assert not budget.try_acquire()


def test_release_without_acquire_is_an_error() -> None:
    budget = RetryBudget(RetryBudgetConfig(), Active())
    with pytest.raises(RuntimeError, match="without a matching"):
        budget.release()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"budget_percent": -1.0}, "retry_budget_percent"), ({"min_concurrency": -1}, "retry_min_concurrency")],
)
def test_config_validation(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryBudgetConfig(**kwargs)  # type: ignore[arg-type]
