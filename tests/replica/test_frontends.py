"""``fleetserve serve tiny --frontends 2`` as real processes: two front ends share the HTTP and gRPC ports and run
their batches on the parent's one engine; answers equal a single-process replica's; ``/metrics`` from either front
end reports all three processes; SIGTERM stops them all; a dead front end or engine process stops the rest."""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetserve.replica.frontends import _reserve
from tests.gateway.test_server import listening_sockets, running, worker_pids
from tests.support.procs import Proc, free_port, replica, spawn
from tests.support.waiting import until_sync

READY = re.compile(r"fleetserve replica ready http://127\.0\.0\.1:(\d+)$")
GRACE_S = 0.2
FRONTENDS = 2
Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Replica:
    """A ``--frontends`` replica: the parent process (``proc``) and its front ends' PIDs."""

    proc: Proc
    frontends: list[int]
    tmpdir: Path  # the replica's TMPDIR: its engine and metrics sockets live in a folder here

    def sockets(self) -> Path:
        [folder] = self.tmpdir.glob("fleetserve-replica-*")
        return folder


def wait_ready(proc: Proc, timeout_s: float = 60) -> int:
    """The port of the ready line the replica prints once every front end is warm."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in list(proc.lines):
            if match := READY.match(line.strip()):
                return int(match.group(1))
        if proc.popen.poll() is not None:
            raise AssertionError(f"replica exited {proc.popen.returncode} before ready:\n{proc.output()}")
        time.sleep(0.02)
    raise AssertionError(f"no ready line within {timeout_s} s:\n{proc.output()}")


def _is_frontend(pid: int) -> bool:
    try:
        return running(pid) and b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@contextlib.contextmanager
def frontend_replica(*extra: str, frontends: int = FRONTENDS) -> Iterator[Replica]:
    """Start the replica on HTTP port 0 and a free gRPC port; at the end, kill whatever of it is left (only the
    PIDs it started)."""
    tmpdir = Path(tempfile.mkdtemp(prefix="fs-fe-"))  # short: Unix socket paths must fit in 108 bytes
    grpc_port = free_port()
    proc = spawn(["serve", "tiny", "--host", "127.0.0.1", "--port", "0", "--grpc-port", str(grpc_port),
                  "--drain-grace-s", str(GRACE_S), "--frontends", str(frontends), *extra], 0, grpc_port,
                 env={"TMPDIR": str(tmpdir)})
    started = Replica(proc, [], tmpdir)
    try:
        proc.port = wait_ready(proc)
        started.frontends = worker_pids(proc.popen.pid)
        assert len(started.frontends) == frontends, started.frontends
        yield started
    finally:
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(10)
        for pid in started.frontends:
            if _is_frontend(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmpdir, ignore_errors=True)


# --- requests ----------------------------------------------------------------------------------------------------

TEXTS = [f"query {i}: " + " ".join(["noise cancelling headphones"] * (i % 5)) + " under 200 dollars"
         for i in range(12)]


def post(url: str, body: dict[str, object]) -> dict[str, object]:
    """POST on a fresh connection (urllib closes each): the kernel spreads connections over the front ends."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        answer: dict[str, object] = json.loads(response.read())
        return answer


def tokens(text: str) -> np.ndarray:
    from fleetserve.models.store import ModelStore
    from fleetserve.models.tokenizer import TextTokenizer

    stored = ModelStore().resolve("tiny")
    assert stored.tokenizer_path is not None
    return TextTokenizer(stored.tokenizer_path, 512).encode([text]).input_ids


def v2_body(ids: np.ndarray) -> dict[str, object]:
    return {
        "inputs": [{"name": name, "datatype": "INT64", "shape": list(ids.shape), "data": array.ravel().tolist()}
                   for name, array in (("input_ids", ids), ("attention_mask", np.ones_like(ids)),
                                       ("token_type_ids", np.zeros_like(ids)))],
        "outputs": [{"name": "sentence_embedding"}, {"name": "last_hidden_state"}],
    }


def v2_outputs(answer: dict[str, object]) -> dict[str, np.ndarray]:
    outputs = answer["outputs"]
    assert isinstance(outputs, list)
    return {o["name"]: np.asarray(o["data"], dtype=np.float32).reshape(o["shape"]) for o in outputs}


def ask_everything(url: str, parallel: int) -> list[dict[str, np.ndarray]]:
    """One KServe v2 request per text and one ``/inference`` request per text (two texts each for odd ones)."""
    def v2(text: str) -> dict[str, np.ndarray]:
        return v2_outputs(post(f"{url}/v2/models/tiny/infer", v2_body(tokens(text))))

    def text_route(i: int) -> dict[str, np.ndarray]:
        texts = [TEXTS[i], TEXTS[(i + 1) % len(TEXTS)]][: 1 + i % 2]
        return {"embeddings": np.asarray(post(f"{url}/inference", {"texts": texts})["embeddings"], dtype=np.float32)}

    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        futures = [pool.submit(v2, text) for text in TEXTS] + [pool.submit(text_route, i) for i in range(len(TEXTS))]
        return [f.result() for f in futures]


SENT_REQUESTS = 2 * len(TEXTS)
SENT_ROWS = len(TEXTS) + sum(1 + i % 2 for i in range(len(TEXTS)))


# --- metrics -----------------------------------------------------------------------------------------------------

def parse(text: str) -> Metrics:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(metrics: Metrics, name: str) -> float:
    return sum(value for (sample, _), value in metrics.items() if sample == name)


def scrape(url: str) -> Metrics:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return parse(response.read().decode())


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=10)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(self._path))


def own_metrics(path: Path) -> Metrics:
    """One process's own exposition, from its metrics socket (what its siblings merge)."""
    connection = _UnixHTTPConnection(path)
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        assert response.status == 200
        return parse(response.read().decode())
    finally:
        connection.close()


# --- tests -------------------------------------------------------------------------------------------------------

def test_front_ends_share_the_ports_answer_as_one_replica_and_stop_on_sigterm() -> None:
    with frontend_replica() as fe, replica("tiny", grpc=False) as single:
        url = fe.proc.url
        assert listening_sockets(fe.proc.port) == FRONTENDS
        assert listening_sockets(fe.proc.grpc_port) == FRONTENDS

        got = ask_everything(url, parallel=6)
        expected = ask_everything(single.url, parallel=1)
        for answer, reference in zip(got, expected, strict=True):
            assert answer.keys() == reference.keys()
            for name in answer:
                assert answer[name].shape == reference[name].shape, name
                np.testing.assert_allclose(answer[name], reference[name], rtol=1e-5, atol=1e-5, err_msg=name)

        # Whichever front end a scrape reaches, it reports the replica's three processes and every request.
        for _ in range(4):
            merged = scrape(url)
            assert merged[("fleetserve_replica_processes", ())] == FRONTENDS + 1
            assert total(merged, "fleetserve_requests_total") == SENT_REQUESTS
            assert merged[("fleetserve_requests_total", (("code", "200"), ("model", "tiny")))] == SENT_REQUESTS
            assert total(merged, "fleetserve_batch_size_sum") == SENT_ROWS  # the front ends batched each row once
            assert total(merged, "fleetserve_engine_batch_size_count") > 0
            assert total(merged, "fleetserve_engine_batch_size_sum") >= SENT_ROWS  # the engine ran every row
        # Both front ends served (the kernel spread the fresh connections), and the engine process ran the batches.
        folder = fe.sockets()
        own = [own_metrics(folder / f"worker-{i}.sock") for i in range(FRONTENDS + 1)]
        served = [total(metrics, "fleetserve_requests_total") for metrics in own[:FRONTENDS]]
        assert sum(served) == SENT_REQUESTS and all(n > 0 for n in served), served
        assert total(own[FRONTENDS], "fleetserve_engine_batch_size_count") > 0
        assert total(own[FRONTENDS], "fleetserve_requests_total") == 0

        import tritonclient.grpc as grpcclient

        ids = tokens(TEXTS[3])
        for _ in range(4):  # a new channel each time: either front end may take it
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{fe.proc.grpc_port}")
            try:
                assert client.is_server_ready() and client.is_model_ready("tiny")
                inputs = []
                for name, array in (("input_ids", ids), ("attention_mask", np.ones_like(ids)),
                                    ("token_type_ids", np.zeros_like(ids))):
                    tensor = grpcclient.InferInput(name, list(array.shape), "INT64")
                    tensor.set_data_from_numpy(array)
                    inputs.append(tensor)
                result = client.infer("tiny", inputs, outputs=[grpcclient.InferRequestedOutput("sentence_embedding")])
                np.testing.assert_allclose(result.as_numpy("sentence_embedding"), expected[3]["sentence_embedding"],
                                           rtol=1e-5, atol=1e-5)
            finally:
                client.close()

        started = time.monotonic()
        fe.proc.signal(signal.SIGTERM)
        assert fe.proc.popen.wait(GRACE_S + 10) == 0, fe.proc.output()
        assert time.monotonic() - started < GRACE_S + 10
        assert not any(running(pid) for pid in fe.frontends)
        assert list(fe.tmpdir.glob("fleetserve-replica-*")) == []  # the engine and metrics sockets' folder is gone
        assert "Traceback" not in fe.proc.output(), fe.proc.output()


def test_a_front_end_that_dies_stops_the_replica_with_exit_1() -> None:
    with frontend_replica() as fe:
        dead, other = fe.frontends
        os.kill(dead, signal.SIGKILL)
        until_sync(lambda: fe.proc.popen.poll() is not None, GRACE_S + 10,
                   what="the replica stopped after a front end died")
        assert fe.proc.popen.returncode == 1, fe.proc.output()
        until_sync(lambda: not running(other), 5, what="the other front end exited")
        assert "exited with -9; stopping the replica" in fe.proc.output()
        assert "Traceback" not in fe.proc.output(), fe.proc.output()


def test_front_ends_stop_themselves_when_the_engine_process_dies() -> None:
    with frontend_replica() as fe:
        fe.proc.popen.kill()
        fe.proc.popen.wait(10)
        until_sync(lambda: not any(running(pid) for pid in fe.frontends), GRACE_S + 10,
                   what="both front ends exited after the engine process died")


@pytest.mark.parametrize(("flag", "message"), [(("--frontends", "-1"), "frontends must be >= 0"),
                                               (("--frontend-batches", "0"), "frontend_batches >= 1")])
def test_a_bad_frontends_option_is_a_one_line_error_and_exit_2(flag: tuple[str, str], message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "fleetserve.cli", "serve", "tiny", *flag], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_port_another_reuse_port_service_listens_on_is_refused() -> None:
    """SO_REUSEPORT alone would let the front ends join another service's port and split its traffic."""
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    other.bind(("127.0.0.1", 0))
    other.listen()
    port = other.getsockname()[1]
    try:
        with pytest.raises(OSError, match=r"cannot listen on 127\.0\.0\.1"):
            _reserve("127.0.0.1", port)
    finally:
        other.close()
    _reserve("127.0.0.1", port).close()  # free once nothing listens
