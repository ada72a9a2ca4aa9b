import re
import subprocess
from pathlib import Path

import pytest

from fleetserve.deploy.nginx import render_nginx, render_nginx_config
from fleetserve.deploy.proxy import Backend, ProxyConfig

BACKENDS = [("http://127.0.0.1:8000", 1.0), ("http://10.0.0.7:8000", 2.0), ("http://[fd00::5]:8000", 0.5)]


def _upstream(conf: str) -> str:
    match = re.search(r"upstream fleetserve_replicas \{(.*?)\n    \}", conf, re.S)
    assert match, conf
    return match.group(1)


def test_upstream_servers_weights_passive_health_and_keepalive() -> None:
    upstream = _upstream(render_nginx(BACKENDS, 8080, "round-robin"))
    servers = re.findall(r"server (\S+) weight=(\d+) max_fails=3 fail_timeout=10s;", upstream)
    assert servers == [("127.0.0.1:8000", "2"), ("10.0.0.7:8000", "4"), ("[fd00::5]:8000", "1")]
    assert "keepalive 64;" in upstream
    assert "least_conn" not in upstream


def test_least_conn_policy() -> None:
    assert "least_conn;" in _upstream(render_nginx(BACKENDS, 8080, "least_conn"))


def test_proxy_settings_for_keepalive_and_retries() -> None:
    conf = render_nginx(BACKENDS, 8123, "round-robin", host="127.0.0.1")
    for line in (
        "listen 127.0.0.1:8123 backlog=4096;",
        "proxy_pass http://fleetserve_replicas;",
        "proxy_http_version 1.1;",
        'proxy_set_header Connection "";',
        "proxy_next_upstream error timeout http_503 non_idempotent;",
        "proxy_next_upstream_tries 2;",
        "proxy_connect_timeout 2s;",
        "proxy_read_timeout 30s;",
        "client_max_body_size 16m;",
        "worker_processes auto;",
    ):
        assert line in conf
    assert "$upstream_response_time" in conf and "access_log \"access.log\" fleetserve;" in conf


def test_paths_stay_inside_the_prefix(tmp_path: Path) -> None:
    conf = render_nginx(BACKENDS, 8080, "round-robin", tmp_path, workers=2, access_log=False)
    paths = re.findall(r'"(/[^"]*)"', conf)
    assert len(paths) == 7  # pid, error log, five temp folders
    assert all(p.startswith(f"{tmp_path.resolve()}/") for p in paths)
    assert "access_log off;" in conf and "worker_processes 2;" in conf
    directives = [line for line in conf.splitlines() if not line.strip().startswith("#")]
    assert not [line for line in directives if "/var/" in line or "/run/" in line]


def test_relative_paths_without_a_prefix() -> None:
    conf = render_nginx(BACKENDS, 8080, "round-robin")
    assert 'pid "nginx.pid";' in conf and 'client_body_temp_path "client_body_temp";' in conf


def test_prefix_that_would_break_the_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="prefix"):
        render_nginx(BACKENDS, 8080, "round-robin", tmp_path / 'x";')


def test_tries_and_timeouts_follow_the_config() -> None:
    config = ProxyConfig((Backend("r", 8000),), tries=3, timeout_s=1.5, connect_timeout_s=0.25, max_body_bytes=4096)
    conf = render_nginx_config(config)
    assert "proxy_next_upstream_tries 3;" in conf
    assert "proxy_read_timeout 1500ms;" in conf and "proxy_connect_timeout 250ms;" in conf
    assert "client_max_body_size 4k;" in conf


@pytest.mark.parametrize("policy", ["round-robin", "least_conn"])
def test_nginx_accepts_the_config(nginx_bin: str, tmp_path: Path, policy: str) -> None:
    conf = tmp_path / "nginx.conf"
    conf.write_text(render_nginx(BACKENDS, 18080, policy, tmp_path))
    result = subprocess.run([nginx_bin, "-t", "-p", f"{tmp_path}/", "-c", str(conf), "-e", "stderr"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "syntax is ok" in result.stderr
