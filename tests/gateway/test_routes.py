"""The one definition of the routes the gateway forwards."""

from __future__ import annotations

import pytest

from fleetserve.gateway.routes import proxied


@pytest.mark.parametrize("path", ["/v2", "/v2/", "/v2/models/minilm/infer", "/v2/health/ready", "/inference"])
def test_forwarded_paths(path: str) -> None:
    assert proxied(path)


@pytest.mark.parametrize("path", ["/v2x", "/v20/models", "/inference/x", "/inferences", "/metrics", "/gateway/backends",
                                  "/", ""])
def test_paths_of_the_gateway_itself(path: str) -> None:
    assert not proxied(path)
