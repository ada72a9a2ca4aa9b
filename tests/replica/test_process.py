"""A real `fleetserve serve` process driven by NVIDIA's tritonclient (HTTP JSON, HTTP binary, gRPC) and raw HTTP."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from fleetserve.wire import LOAD_REPORT_HEADER, parse_load_report
from tests.support.procs import replica
from tests.support.waiting import until_sync


def post(url: str, body: bytes, timeout: float = 30) -> tuple[int, dict[str, object], dict[str, str]]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), dict(e.headers)


@pytest.fixture(scope="module")
def tiny():
    with replica("tiny") as proc:
        yield proc


def _tokens(url: str, text: str) -> np.ndarray:
    from fleetserve.models.store import ModelStore
    from fleetserve.models.tokenizer import TextTokenizer

    stored = ModelStore().resolve("tiny")
    assert stored.tokenizer_path is not None
    return TextTokenizer(stored.tokenizer_path, 512).encode([text]).input_ids


def test_tritonclient_http_and_grpc_agree_with_inference_route(tiny) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    text = "noise cancelling headphones under 200 dollars"
    status, body, headers = post(f"{tiny.url}/inference", json.dumps({"texts": [text]}).encode())
    assert status == 200
    report = parse_load_report(headers[LOAD_REPORT_HEADER])
    assert report is not None and report.queue_depth >= 0 and report.inflight >= 0
    expected = np.asarray(body["embeddings"], dtype=np.float32)  # type: ignore[arg-type]
    ids = _tokens(tiny.url, text)

    http = httpclient.InferenceServerClient(f"127.0.0.1:{tiny.port}")
    assert http.is_server_live() and http.is_server_ready() and http.is_model_ready("tiny")
    meta = http.get_model_metadata("tiny")
    assert [i["name"] for i in meta["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    for binary in (False, True):
        inputs = []
        for name, arr in (("input_ids", ids), ("attention_mask", np.ones_like(ids)), ("token_type_ids", 0 * ids)):
            t = httpclient.InferInput(name, list(arr.shape), "INT64")
            t.set_data_from_numpy(arr, binary_data=binary)
            inputs.append(t)
        out = [httpclient.InferRequestedOutput("sentence_embedding", binary_data=binary)]
        res = http.infer("tiny", inputs, outputs=out)
        np.testing.assert_allclose(res.as_numpy("sentence_embedding"), expected, atol=1e-5)

    g = grpcclient.InferenceServerClient(f"127.0.0.1:{tiny.grpc_port}")
    assert g.is_server_live() and g.is_model_ready("tiny")
    ginputs = []
    for name, arr in (("input_ids", ids), ("attention_mask", np.ones_like(ids)), ("token_type_ids", 0 * ids)):
        t = grpcclient.InferInput(name, list(arr.shape), "INT64")
        t.set_data_from_numpy(arr)
        ginputs.append(t)
    gres = g.infer("tiny", ginputs, outputs=[grpcclient.InferRequestedOutput("sentence_embedding")])
    np.testing.assert_allclose(gres.as_numpy("sentence_embedding"), expected, atol=1e-5)


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/inference", b"{not json", 400, "not valid JSON"),
        ("/inference", b'{"texts": []}', 400, "must not be empty"),
        ("/inference", b'{"texts": [1]}', 400, "must be a string"),
        ("/inference", b'{"query": "q", "candidates": ["a"], "top_k": 0}', 400, "top_k"),
        ("/v2/models/tiny/infer", b'{"inputs": [{"name": "nope", "datatype": "INT64", "shape": [1], "data": [1]}]}',
         400, "nope"),
        ("/v2/models/tiny/infer", b'{"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 3], '
         b'"data": [1, 2]}]}', 400, ""),
        ("/v2/models/other/infer", b'{"inputs": []}', 404, "unknown model"),
        # Token id past the vocabulary: refused before batching, so it cannot fail other requests' batch.
        ("/v2/models/tiny/infer", b'{"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 2], '
         b'"data": [2, 99999]}, {"name": "attention_mask", "datatype": "INT64", "shape": [1, 2], "data": [1, 1]}, '
         b'{"name": "token_type_ids", "datatype": "INT64", "shape": [1, 2], "data": [0, 0]}]}', 400,
         "'input_ids' has values outside 0.."),
    ],
)
def test_bad_input_is_4xx_and_server_keeps_serving(tiny, path: str, body: bytes, status: int, needle: str) -> None:
    code, answer, _ = post(tiny.url + path, body)
    assert code == status, answer
    assert needle in str(answer.get("error"))
    ok, _, _ = post(f"{tiny.url}/inference", b'{"texts": ["still alive"]}')
    assert ok == 200


def test_oversized_body_is_413() -> None:
    with replica("tiny", "--max-body-bytes", "2048", grpc=False) as proc:
        code, answer, _ = post(f"{proc.url}/inference", json.dumps({"texts": ["x" * 4096]}).encode())
        assert code == 413 and "error" in answer


def test_ranking_orders_by_similarity(tiny) -> None:
    code, answer, _ = post(f"{tiny.url}/inference", json.dumps(
        {"query": "cheap running shoes", "candidates": ["dog food", "cheap running shoes", "yoga mat"], "top_k": 2}
    ).encode())
    assert code == 200
    results = answer["results"]
    assert isinstance(results, list) and len(results) == 2
    assert results[0]["index"] == 1 and results[0]["score"] > results[1]["score"]


def _accepted(url: str) -> float:
    """Inference requests the replica has taken: those in progress plus those answered (its /metrics)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(("fleetserve_inflight_requests{", "fleetserve_requests_total{")))


def _readiness(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def test_sigterm_drains_without_losing_accepted_requests() -> None:
    with replica("tiny", "--extra-latency-ms", "300", "--drain-grace-s", "1.0", grpc=False) as proc:
        body = json.dumps({"texts": ["wireless earbuds"]}).encode()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(post, f"{proc.url}/inference", body) for _ in range(16)]
            until_sync(lambda: _accepted(proc.url) == 16, 30, what="all 16 requests accepted")
            proc.signal(signal.SIGTERM)
            # Within the drain grace (1 s), while accepted requests still wait on the injected latency.
            until_sync(lambda: _readiness(proc.url) == 503, 1.0, what="readiness 503 at once on SIGTERM")
            results = [f.result() for f in futures]
        assert [r[0] for r in results] == [200] * 16
        assert proc.popen.wait(20) == 0


def test_model_config_for_perf_analyzer(tiny) -> None:
    """perf_analyzer reads Triton's model configuration before it sends anything."""
    with urllib.request.urlopen(f"{tiny.url}/v2/models/tiny/config", timeout=5) as r:
        config = json.loads(r.read())
    assert config["name"] == "tiny" and config["max_batch_size"] == 32
    assert config["input"][0] == {"name": "input_ids", "data_type": "TYPE_INT64", "dims": [-1]}
    assert {"name": "sentence_embedding", "data_type": "TYPE_FP32", "dims": [32]} in config["output"]
    assert "dynamic_batching" in config


def test_a_warm_up_delay_keeps_a_live_replica_unready_that_long() -> None:
    """The slow-start fault autoscaling experiments use: live at once, ready only after the delay."""
    with replica("tiny", "--warmup-delay-s", "3", ready=False) as proc:
        until_sync(lambda: _status(f"{proc.url}/v2/health/live") == 200, 60, what="live")
        live_at = time.monotonic()
        assert _status(f"{proc.url}/v2/health/ready") == 503
        until_sync(lambda: _status(f"{proc.url}/v2/health/ready") == 200, 60, what="ready")
        assert time.monotonic() - live_at >= 2.5  # warm-up itself takes ~0.1 s for tiny


def _status(url: str) -> int:
    """The HTTP status, 0 while nothing listens."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except urllib.error.URLError:
        return 0
