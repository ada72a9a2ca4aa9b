import re
import subprocess
from pathlib import Path

import pytest

from fleetserve.deploy.haproxy import render_haproxy, render_haproxy_config
from fleetserve.deploy.proxy import Backend, ProxyConfig

BACKENDS = [("http://127.0.0.1:8000", 1.0), ("http://10.0.0.7:8000", 2.0), ("http://[fd00::5]:8000", 1000.0)]


def test_servers_weights_and_active_health_checks() -> None:
    cfg = render_haproxy(BACKENDS, 8080, "roundrobin")
    assert re.findall(r"server (\S+) (\S+) weight (\d+)", cfg) == [
        ("replica-1", "127.0.0.1:8000", "1"), ("replica-2", "10.0.0.7:8000", "1"),
        ("replica-3", "[fd00::5]:8000", "256"),  # 1000:1 exceeds HAProxy's 256 ceiling; small ones floor at 1
    ]
    assert "default-server check inter 2s fall 3 rise 2" in cfg
    assert "http-check send meth GET uri /v2/health/ready" in cfg
    assert "http-check expect status 200" in cfg
    assert "balance roundrobin" in cfg


def test_retries_reuse_timeouts_and_limits() -> None:
    cfg = render_haproxy(BACKENDS, 8181, "leastconn", host="127.0.0.1", workers=2)
    for line in (
        "balance leastconn", "http-reuse always", "retries 1", "option redispatch 1",
        "retry-on conn-failure empty-response response-timeout 503", "timeout connect 2s", "timeout server 30s",
        "maxconn 4096", "bind 127.0.0.1:8181", "nbthread 2", "monitor-uri /healthz",
    ):
        assert line in cfg


def test_log_off_and_health_interval() -> None:
    config = ProxyConfig((Backend("r", 8000),), access_log=False, health_interval_s=0.25, fall=2, rise=1, tries=3)
    cfg = render_haproxy_config(config)
    assert "    no log\n" in cfg and "inter 250ms fall 2 rise 1" in cfg and "retries 2" in cfg
    assert "nbthread" not in cfg


@pytest.mark.parametrize("policy", ["roundrobin", "leastconn"])
def test_haproxy_accepts_the_config(haproxy_bin: str, tmp_path: Path, policy: str) -> None:
    path = tmp_path / "haproxy.cfg"
    path.write_text(render_haproxy(BACKENDS, 18081, policy, workers=1))
    result = subprocess.run([haproxy_bin, "-c", "-f", str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout + result.stderr
