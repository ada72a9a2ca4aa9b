"""The Granian benchmark front's HTTP adapter (the front itself needs Granian, which is not a dependency)."""

from __future__ import annotations

import importlib

from fleetserve.gateway.balance.endpoint import Endpoint
from fleetserve.gateway.forward.http1 import UpstreamResponse


def test_granian_gateway_passes_an_answer_on_without_hop_by_hop_headers_and_reads_its_load_report() -> None:
    gg = importlib.import_module("granian_gateway")
    ep = Endpoint.parse("http://127.0.0.1:9000")
    exchange = gg.RsgiExchange(None, "POST", "/v2/models/m/infer", [], b"{}", "00-" + "1" * 32 + "-" + "2" * 16 + "-00")
    reply = UpstreamResponse(503, [("Content-Type", "application/json"), ("Connection", "keep-alive"),
                                   ("X-Request-ID", "theirs"), ("Endpoint-Load-Metrics", "TEXT queue=3")], b"{}")
    outcome = exchange.answered(ep, reply)
    assert outcome.answer == (503, [("Content-Type", "application/json"), ("Endpoint-Load-Metrics", "TEXT queue=3")],
                              b"{}")
    assert outcome.retryable and outcome.verdict == 503 and outcome.backend == ep.url
    assert outcome.report == "TEXT queue=3"
    assert not exchange.answered(ep, UpstreamResponse(200, [], b"ok")).retryable
