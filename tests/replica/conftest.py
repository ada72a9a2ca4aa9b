"""Fixtures for the KServe front-end tests: the fake served models (``tests/support/fake_models.py``),
a repository of them, and codec limits small enough to hit."""

from __future__ import annotations

import pytest

from fleetserve.replica.codec import CodecLimits
from fleetserve.replica.model import ModelRepository
from tests.support.fake_models import FakeModel, make_math_model, make_text_model


@pytest.fixture
def math_model() -> FakeModel:
    return make_math_model()


@pytest.fixture
def text_model() -> FakeModel:
    return make_text_model()


@pytest.fixture
def repo(math_model: FakeModel, text_model: FakeModel) -> ModelRepository:
    return ModelRepository([math_model, text_model])


@pytest.fixture
def limits() -> CodecLimits:
    return CodecLimits(max_elements_per_tensor=10_000, max_total_bytes=1 << 20, max_json_bytes=1 << 20)
