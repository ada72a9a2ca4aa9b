"""fleetserve installed from a wheel into a fresh virtualenv, beside the packages users put next to it.

The generated gRPC code fixes the protobuf and grpcio floors (``fleetserve/replica/proto/generate.py``); these
tests hold the whole declared range to account. Each builds a wheel from a copy of this checkout, installs it
with pip into a new virtualenv (packages come from the index, through pip's cache), starts a replica (model
``tiny``) from the virtualenv's own ``fleetserve`` script, outside the checkout so nothing imports the
source tree, and calls it with NVIDIA's tritonclient over gRPC, checked against the HTTP route.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.support.procs import Proc, replica

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# [CLS] four word pieces [SEP] in the tiny model's vocabulary.
TOKENS = np.array([[2, 40, 41, 42, 43, 3]], dtype=np.int64)
VERSIONS = """
import importlib.metadata as md, json
def v(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
print(json.dumps({n: v(n) for n in ("fleetserve", "protobuf", "grpcio", "tritonclient")}))
"""
# A notebook's view: tritonclient's and fleetserve's generated modules in one process, then a tritonclient call.
TRITONCLIENT_IN_THE_VENV = """
import json, sys
import numpy as np
import tritonclient.grpc as grpcclient
import fleetserve.replica.grpc_server  # imports the generated modules
client = grpcclient.InferenceServerClient(sys.argv[1])
ids = np.array(json.loads(sys.argv[2]), dtype=np.int64)
inputs = []
for name, array in (("input_ids", ids), ("attention_mask", np.ones_like(ids)), ("token_type_ids", 0 * ids)):
    tensor = grpcclient.InferInput(name, list(array.shape), "INT64")
    tensor.set_data_from_numpy(array)
    inputs.append(tensor)
result = client.infer("tiny", inputs, outputs=[grpcclient.InferRequestedOutput("sentence_embedding")])
print(json.dumps(result.as_numpy("sentence_embedding").tolist()))
"""


def _floor(requirements: list[str], name: str) -> str:
    for requirement in requirements:
        match = re.fullmatch(rf"{re.escape(name)}>=(\S+)", requirement)
        if match:
            return match.group(1)
    raise AssertionError(f"no {name}>= floor in {requirements}")


class Venv:
    """A virtualenv without its own pip: the test's pip installs into it (``pip --python``)."""

    def __init__(self, path: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
        self.path = path
        self.python = path / "bin" / "python"

    def pip(self, *args: str, cwd: Path | None = None) -> str:
        command = [sys.executable, "-m", "pip", "--python", str(self.python), "--disable-pip-version-check",
                   "--no-input", *args]
        done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=600)
        assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def install(self, *requirements: str) -> None:
        self.pip("install", "--no-compile", *requirements)

    def run(self, script: str, *args: str, cwd: Path) -> str:
        done = subprocess.run([str(self.python), "-c", script, *args], capture_output=True, text=True, cwd=cwd,
                              env=_env(), timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def versions(self, cwd: Path) -> dict[str, str | None]:
        versions: dict[str, str | None] = json.loads(self.run(VERSIONS, cwd=cwd))
        return versions


def _env() -> dict[str, str]:
    """Our environment, without a PYTHONPATH that could put the checkout before the installed package."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """The files a wheel is built from, copied: a build writes build/ and *.egg-info beside its sources."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "fleetserve", src / "fleetserve", ignore=shutil.ignore_patterns("__pycache__"))
    return src


def _wheel(venv: Venv, source: Path, *options: str) -> Path:
    dist = source.parent / "dist"
    venv.pip("wheel", "--no-deps", *options, "--wheel-dir", str(dist), str(source))
    (wheel,) = dist.glob("fleetserve-*.whl")
    return wheel


def _serve(venv: Venv) -> contextlib.AbstractContextManager[Proc]:
    """A replica run by the venv's console script from the venv's directory: nothing can import the checkout."""
    return replica("tiny", command=[str(venv.path / "bin" / "fleetserve")], cwd=venv.path, env={"PYTHONPATH": ""})


def _http_embedding(proc: Proc) -> np.ndarray:
    body = {"inputs": [{"name": name, "shape": list(TOKENS.shape), "datatype": "INT64", "data": data.tolist()}
                       for name, data in (("input_ids", TOKENS), ("attention_mask", np.ones_like(TOKENS)),
                                          ("token_type_ids", 0 * TOKENS))],
            "outputs": [{"name": "sentence_embedding"}]}
    request = urllib.request.Request(f"{proc.url}/v2/models/tiny/infer", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        (output,) = json.loads(response.read())["outputs"]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


def _grpc_embedding(proc: Proc) -> np.ndarray:
    grpcclient = pytest.importorskip("tritonclient.grpc")
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{proc.grpc_port}")
    try:
        assert client.is_server_ready() and client.is_model_ready("tiny")
        inputs = []
        for name, array in (("input_ids", TOKENS), ("attention_mask", np.ones_like(TOKENS)),
                            ("token_type_ids", 0 * TOKENS)):
            tensor = grpcclient.InferInput(name, list(array.shape), "INT64")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        result = client.infer("tiny", inputs, outputs=[grpcclient.InferRequestedOutput("sentence_embedding")])
        embedding: np.ndarray = result.as_numpy("sentence_embedding")
        return embedding
    finally:
        client.close()


def _answers(proc: Proc) -> np.ndarray:
    """The replica's gRPC answer to a tritonclient call, checked against its HTTP answer and the model's shape."""
    over_http = _http_embedding(proc)
    over_grpc = _grpc_embedding(proc)
    assert over_grpc.shape == (1, 32)
    np.testing.assert_allclose(np.linalg.norm(over_grpc, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(over_grpc, over_http, atol=1e-6)
    return over_grpc


def test_newest_tritonclient_installs_beside_fleetserve_and_the_replica_still_serves(
    tmp_path: Path, source: Path
) -> None:
    venv = Venv(tmp_path / "venv")
    venv.install(str(_wheel(venv, source)))
    alone = venv.versions(venv.path)
    assert alone["fleetserve"] == PYPROJECT["project"]["version"] and alone["tritonclient"] is None
    with _serve(venv) as proc:
        expected = _answers(proc)

    # What a notebook user does next; newest tritonclient caps protobuf below 7 and pip moves it down.
    venv.install("--upgrade", "tritonclient[grpc,http]")
    beside = venv.versions(venv.path)
    assert beside["tritonclient"] is not None
    venv.pip("check")
    with _serve(venv) as proc:
        np.testing.assert_allclose(_answers(proc), expected, atol=1e-6)
        in_the_venv = venv.run(TRITONCLIENT_IN_THE_VENV, f"127.0.0.1:{proc.grpc_port}", json.dumps(TOKENS.tolist()),
                               cwd=venv.path)
    np.testing.assert_allclose(np.asarray(json.loads(in_the_venv)), expected, atol=1e-6)


@pytest.mark.slow
def test_declared_floors_build_install_and_serve(tmp_path: Path, source: Path) -> None:
    venv = Venv(tmp_path / "venv")
    build_floor = _floor(PYPROJECT["build-system"]["requires"], "setuptools")
    venv.install(f"setuptools=={build_floor}")
    wheel = _wheel(venv, source, "--no-build-isolation")  # metadata valid for the declared build floor
    dependencies = PYPROJECT["project"]["dependencies"]
    floors = {name: _floor(dependencies, name) for name in ("protobuf", "grpcio")}
    venv.install(str(wheel), *(f"{name}=={version}" for name, version in floors.items()))
    versions = venv.versions(venv.path)
    assert {name: versions[name] for name in floors} == floors
    venv.pip("check")
    with _serve(venv) as proc:
        _answers(proc)
