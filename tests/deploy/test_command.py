from pathlib import Path

import pytest
import yaml

from fleetserve.cli import main

REPO_DEPLOY = Path(__file__).parents[2] / "deploy"
HAND_WRITTEN = {"README.md"}


def test_nginx_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["deploy", "nginx", "--backend", "http://10.0.0.5:8000=2", "--backend", "http://10.0.0.6:8000",
               "--policy", "least_conn", "--port", "9090"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "server 10.0.0.5:8000 weight=2" in out and "server 10.0.0.6:8000 weight=1" in out
    assert "least_conn;" in out and "listen 0.0.0.0:9090" in out


def test_haproxy_to_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "conf" / "haproxy.cfg"
    rc = main(["deploy", "haproxy", "--backend", "http://10.0.0.5:8000", "--policy", "leastconn", "--out", str(out)])
    assert rc == 0 and capsys.readouterr().out == ""
    text = out.read_text()
    assert "balance leastconn" in text and "server replica-1 10.0.0.5:8000 weight 1" in text


def test_backends_from_the_environment(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLEETSERVE_BACKEND", "http://a:1,http://b:2")
    assert main(["deploy", "haproxy"]) == 0
    out = capsys.readouterr().out
    assert "server replica-1 a:1" in out and "server replica-2 b:2" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["deploy", "nginx"], "at least one --backend"),
    (["deploy", "nginx", "--backend", "https://r:1"], "only http://"),
    (["deploy", "k8s", "--replicas", "0"], "replicas must be >= 1"),
    (["deploy", "k8s", "--mig-profiles", "9g.1gb"], "MIG profile"),
    (["deploy", "nginx", "--weights-from", "/nonexistent.json"], "cannot read weights file"),
    (["deploy", "nginx", "--weights-from", "W", "--backend", "http://a:1"], "not both"),
    (["deploy", "prometheus"], "--out DIR"),
    (["deploy", "all"], "--out DIR"),
])
def test_bad_input_is_a_clear_error(argv: list[str], message: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    weights = tmp_path / "weights.json"
    weights.write_text('{"gpu_models": {"H200": 100}, "backends": {"http://b:1": "H200"}}')
    assert main([str(weights) if a == "W" else a for a in argv]) == 2
    assert message in capsys.readouterr().err


def test_k8s_stream_and_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "k8s", "--model", "bert-base", "--replicas", "4"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "Deployment", "Deployment", "NetworkPolicy", "PodDisruptionBudget",
                     "PodDisruptionBudget", "Service", "Service"]
    assert main(["deploy", "k8s", "--out", str(tmp_path), "--mig-profiles", "2g.35gb"]) == 0
    for overlay in ("cpu", "keda", "gpu", "mig-2g.35gb"):
        assert (tmp_path / "overlays" / overlay / "kustomization.yaml").is_file()
    assert not (tmp_path / "overlays" / "mig-1g.18gb").exists()
    assert (tmp_path / "prometheus-adapter" / "config.yaml").is_file()


def test_committed_deploy_tree_is_what_the_renderer_writes(tmp_path: Path) -> None:
    assert main(["deploy", "all", "--out", str(tmp_path)]) == 0
    rendered = {p.relative_to(tmp_path).as_posix(): p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    committed = {p.relative_to(REPO_DEPLOY).as_posix(): p.read_text() for p in REPO_DEPLOY.rglob("*")
                 if p.is_file() and p.name not in HAND_WRITTEN}
    assert sorted(committed) == sorted(rendered), "regenerate with: fleetserve deploy all --out deploy"
    stale = [path for path in rendered if rendered[path] != committed[path]]
    assert not stale, f"{stale} differ; regenerate with: fleetserve deploy all --out deploy"
