"""Slow: build the CPU image from the repository's Dockerfile with buildah, then run it as Kubernetes would:
the init container's ``fleetserve build`` into a cache volume, then a replica that loads that engine.

buildah runs rootless-style here: chroot isolation and the vfs storage driver, no daemon. Docker Hub (the
Dockerfile's ``python:3.11-slim-bookworm``) cannot be reached from this machine, so the base is a Debian 12
root file system made with debootstrap from Debian's mirror (python3 3.11, the same Debian release as that
image), passed as ``PYTHON_IMAGE``; the site's CA bundle and a pip.conf naming it are added to that base, as
a company base image would carry them. The image is built with ``MODEL=tiny`` and no ``export`` extra:
building MiniLM's needs torch's CPU wheel index, which is not reachable here either.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import free_port, wait_http

REPO = Path(__file__).parents[2]
BASE = "localhost/fleetserve-test-base:bookworm"
IMAGE = "localhost/fleetserve-test:tiny"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # building the image takes minutes


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed; `make setup` installs it (Debian package {name})")
    return path


def _buildah(*args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([_tool("buildah"), "--storage-driver", "vfs", *args], capture_output=True, text=True,
                            timeout=timeout)
    if check:
        assert result.returncode == 0, f"buildah {' '.join(args)}:\n{result.stdout[-4000:]}{result.stderr[-4000:]}"
    return result


def _base_image(work: Path) -> str:
    """The Debian 12 + python3 base (built once per machine, kept in buildah's storage)."""
    if _buildah("images", "--quiet", BASE, check=False).returncode == 0:
        return BASE
    if os.geteuid() != 0:
        pytest.skip("debootstrap needs root to make the base root file system")
    rootfs = work / "rootfs"
    subprocess.run([_tool("debootstrap"), "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
                    "bookworm", str(rootfs), DEBIAN_MIRROR], check=True, capture_output=True, timeout=900)
    if CA_BUNDLE.is_file():
        shutil.copy(CA_BUNDLE, rootfs / CA_BUNDLE.relative_to("/"))
        (rootfs / "etc" / "pip.conf").write_text(f"[global]\ncert = {CA_BUNDLE}\n")
    context = work / "base"
    context.mkdir()
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(context / "rootfs.tar"), "."], check=True, timeout=300)
    (context / "Containerfile").write_text('FROM scratch\nADD rootfs.tar /\nCMD ["/bin/bash"]\n')
    _buildah("build", "--isolation", "chroot", "-t", BASE, str(context))
    shutil.rmtree(rootfs, ignore_errors=True)
    return BASE


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A working container of the freshly built image (removed afterwards, with the image)."""
    base = _base_image(tmp_path_factory.mktemp("image-base"))
    _buildah("build", "--isolation", "chroot", "--build-arg", f"PYTHON_IMAGE={base}", "--build-arg", "MODEL=tiny",
             "--build-arg", "EXPORT_EXTRA=", "-t", IMAGE, "-f", str(REPO / "Dockerfile"), str(REPO), timeout=1800)
    name = _buildah("from", "--name", f"fleetserve-test-{os.getpid()}", IMAGE).stdout.strip().splitlines()[-1]
    try:
        yield name
    finally:
        _buildah("rm", name, check=False)
        _buildah("rmi", IMAGE, check=False)


def _run(name: str, *command: str, volume: Path | None = None) -> list[str]:
    mount = ["--volume", f"{volume}:/var/cache/fleetserve"] if volume else []
    return [_tool("buildah"), "--storage-driver", "vfs", "run", "--isolation", "chroot", *mount, name, "--",
            *command]


def test_image_runs_as_non_root_without_torch(container: str) -> None:
    config = json.loads(_buildah("inspect", "--type", "image", IMAGE).stdout)["OCIv1"]["config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["fleetserve"] and config["Cmd"] == ["serve"]
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["FLEETSERVE_MODEL"] == "/opt/fleetserve/models/tiny/model.onnx"
    assert env["FLEETSERVE_HOME"] == "/var/cache/fleetserve"
    probe = subprocess.run(_run(container, "python", "-c", "import importlib.util, os; print(os.getuid(), "
                                "importlib.util.find_spec('torch') is None, importlib.util.find_spec('onnxruntime')"
                                " is not None)"), capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["10001", "True", "True"]


def test_init_container_builds_the_engine_and_the_replica_loads_it(container: str, tmp_path: Path) -> None:
    cache = tmp_path / "engine-cache"
    cache.mkdir()
    os.chown(cache, 10001, 10001)
    env = [f"{k}={v}" for k, v in {"FLEETSERVE_PRECISION": "int8"}.items()]  # the ConfigMap's job in Kubernetes
    build = subprocess.run(_run(container, "env", *env, "fleetserve", "build", "--json", volume=cache),
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    report = json.loads(build.stdout)
    assert report["cache_hit"] is False and report["precision"] == "int8"
    engines = sorted(p.name for p in (cache / "engines").iterdir() if not p.name.startswith("."))
    assert engines == [report["key"]]

    port = free_port()
    serve = subprocess.Popen(
        _run(container, "env", *env, "fleetserve", "serve", "--host", "127.0.0.1", "--port", str(port),
             "--grpc-port", "0", volume=cache),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/v2/health/ready", timeout=120)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/inference", data=b'{"texts": ["a pod"]}',
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            body = json.loads(response.read())
        assert len(body["embeddings"]) == 1 and len(body["embeddings"][0]) == 32
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/tiny", timeout=10) as response:
            assert json.loads(response.read())["name"] == "tiny"
        # The replica found the init container's engine: nothing new in the cache.
        assert sorted(p.name for p in (cache / "engines").iterdir() if not p.name.startswith(".")) == engines
    finally:
        os.killpg(serve.pid, signal.SIGTERM)  # buildah and the replica it runs: the group we started
        try:
            serve.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait(10)
