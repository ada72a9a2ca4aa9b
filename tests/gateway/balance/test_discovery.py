import asyncio
import json
import os
import socket
from collections.abc import Sequence
from pathlib import Path

import pytest

from fleetserve.gateway.balance.discovery import (
    DnsDiscovery,
    Event,
    FileDiscovery,
    Insert,
    Remove,
    StaticDiscovery,
    diff,
    parse_endpoint_list,
)
from fleetserve.gateway.balance.endpoint import Endpoint


def ep(spec: str) -> Endpoint:
    return Endpoint.parse(spec)


def summary(events: Sequence[Event]) -> list[str]:
    return [f"{type(e).__name__} {e.endpoint}" for e in events]


class StopPolling(Exception):
    pass


def write(path: Path, text: str, mtime_ns: int) -> None:
    path.write_text(text)
    # Distinct mtimes make each write visible even within one clock tick of the filesystem.
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_diff_orders_inserts_before_removes_and_detects_weight_changes() -> None:
    old = {e.url: e for e in [ep("http://a:1"), ep("http://b:1=2")]}
    new = {e.url: e for e in [ep("http://b:1=3"), ep("http://c:1")]}
    assert summary(diff(old, new)) == ["Insert http://b:1=3", "Insert http://c:1", "Remove http://a:1"]
    assert diff(new, new) == []


def test_parse_lines_with_comments_and_weights() -> None:
    text = "# fleet\nhttp://a:8000=2   # big box\n\n  http://b:8000\n"
    assert [str(e) for e in parse_endpoint_list(text)] == ["http://a:8000=2", "http://b:8000"]


def test_parse_yaml_and_json_lists() -> None:
    yaml_text = "- http://a:1=2\n- url: http://b:1\n  weight: 3\n  labels: {zone: eu-1}\n"
    parsed = parse_endpoint_list(yaml_text)
    assert [str(e) for e in parsed] == ["http://a:1=2", "http://b:1=3"]
    assert parsed[1].labels == {"zone": "eu-1"}
    json_text = json.dumps(["http://a:1", {"url": "http://b:1", "weight": 2}])
    assert [str(e) for e in parse_endpoint_list(json_text)] == ["http://a:1", "http://b:1=2"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("http://a:1\nnot-a-url\n", "line 2: backend 'not-a-url' needs a scheme"),
        ("- {url: http://a:1, colour: red}\n", "unknown keys \\['colour'\\]"),
        ("- {weight: 2}\n", "'url' must be a string"),
        ("- 5\n", "expected 'URL\\[=WEIGHT\\]' or a mapping"),
        ("{backends: []}\n", "expected a list of backends"),
        ("[http://a:1\n", "invalid YAML/JSON"),
        ("- url: http://a:1\n  weight: heavy\n", "weight must be a positive number"),
    ],
)
def test_parse_errors_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_endpoint_list(text, "backends.txt")


def test_file_discovery_diffs_each_change(tmp_path: Path) -> None:
    path = tmp_path / "backends.txt"
    write(path, "http://a:1\nhttp://b:1\n", 1_000)
    disc = FileDiscovery(path, poll_interval=1.0)
    assert summary(disc.poll()) == ["Insert http://a:1", "Insert http://b:1"]
    assert disc.poll() == []  # unchanged file: not even re-read
    write(path, "http://b:1=4\nhttp://c:1\n", 2_000)
    assert summary(disc.poll()) == ["Insert http://b:1=4", "Insert http://c:1", "Remove http://a:1"]
    write(path, "- http://c:1\n", 3_000)
    assert summary(disc.poll()) == ["Remove http://b:1=4"]


def test_file_discovery_keeps_the_last_good_set(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "backends.yaml"
    disc = FileDiscovery(path)
    assert disc.poll() == []  # missing file: nothing yet
    write(path, "- http://a:1\n", 1_000)
    assert summary(disc.poll()) == ["Insert http://a:1"]
    write(path, "- http://a:1\n- http://a:1\n", 2_000)
    assert disc.poll() == []
    assert "listed twice" in caplog.text
    path.unlink()
    assert disc.poll() == []
    write(path, "- http://b:1\n", 3_000)
    assert summary(disc.poll()) == ["Insert http://b:1", "Remove http://a:1"]


def test_file_discovery_rejects_oversized_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "backends.txt"
    write(path, "#" * ((1 << 20) + 1), 1_000)
    assert FileDiscovery(path).poll() == []
    assert "byte limit" in caplog.text


async def test_file_discovery_iterates_batches(tmp_path: Path) -> None:
    path = tmp_path / "backends.txt"
    write(path, "http://a:1\n", 1_000)
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) > 3:
            raise StopPolling
        write(path, f"http://a:1\nhttp://n{len(sleeps)}:1\n", 1_000 + len(sleeps))

    batches = []
    with pytest.raises(StopPolling):
        async for batch in FileDiscovery(path, poll_interval=0.5, sleep=sleep):
            batches.append(summary(batch))
    assert batches[0] == ["Insert http://a:1"]
    assert batches[1] == ["Insert http://n1:1"]
    assert batches[2] == ["Insert http://n2:1", "Remove http://n1:1"]
    assert sleeps[:3] == [0.5, 0.5, 0.5]


async def test_static_discovery_announces_once() -> None:
    batches = [batch async for batch in StaticDiscovery([ep("http://a:1"), ep("http://b:1=2")])]
    assert [summary(b) for b in batches] == [["Insert http://a:1", "Insert http://b:1=2"]]
    with pytest.raises(ValueError, match="listed twice"):
        StaticDiscovery([ep("http://a:1"), ep("http://a:1=3")])


class FakeResolver:
    def __init__(self, answers: list[list[str] | OSError]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def __call__(self, hostname: str) -> list[str]:
        self.asked.append(hostname)
        answer = self.answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer


async def test_dns_discovery_one_endpoint_per_address() -> None:
    resolver = FakeResolver([
        ["10.1.0.4", "10.1.0.5"],
        ["10.1.0.5", "10.1.0.6"],
        OSError("SERVFAIL"),
        [],
        ["fd00::7", "fe80::1%eth0"],
    ])  # fmt: skip
    disc = DnsDiscovery("replicas.ns.svc.cluster.local", 8000, interval=5.0, resolver=resolver)
    first = await disc.resolve_once()
    assert summary(first) == ["Insert http://10.1.0.4:8000", "Insert http://10.1.0.5:8000"]
    assert first[0].endpoint.labels == {"dns": "replicas.ns.svc.cluster.local"}
    assert summary(await disc.resolve_once()) == ["Insert http://10.1.0.6:8000", "Remove http://10.1.0.4:8000"]
    assert await disc.resolve_once() == []  # failure keeps the set
    assert await disc.resolve_once() == []  # so does an empty answer
    assert summary(await disc.resolve_once()) == [
        "Insert http://[fd00::7]:8000",
        "Remove http://10.1.0.5:8000",
        "Remove http://10.1.0.6:8000",
    ]
    assert resolver.asked == ["replicas.ns.svc.cluster.local"] * 5


async def test_dns_discovery_that_may_be_empty_empties_on_no_such_name_only() -> None:
    no_name = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    timeout = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    resolver = FakeResolver([["10.1.0.4"], timeout, no_name, ["10.1.0.5"], []])
    disc = DnsDiscovery("replicas", 8000, resolver=resolver, allow_empty=True)
    assert summary(await disc.resolve_once()) == ["Insert http://10.1.0.4:8000"]
    assert await disc.resolve_once() == []  # a resolver failure keeps the set
    assert summary(await disc.resolve_once()) == ["Remove http://10.1.0.4:8000"]  # no pod ready: none
    assert summary(await disc.resolve_once()) == ["Insert http://10.1.0.5:8000"]
    assert summary(await disc.resolve_once()) == ["Remove http://10.1.0.5:8000"]
    strict = DnsDiscovery("replicas", 8000, resolver=FakeResolver([["10.1.0.4"], no_name]))
    await strict.resolve_once()
    assert await strict.resolve_once() == []  # without allow_empty, no answer keeps the set


async def test_dns_discovery_iterates_and_sleeps_between_resolutions() -> None:
    resolver = FakeResolver([["10.0.0.1"], ["10.0.0.1"], ["10.0.0.2"]])
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            raise StopPolling

    batches = []
    with pytest.raises(StopPolling):
        async for batch in DnsDiscovery("svc", 9000, interval=7.0, resolver=resolver, sleep=sleep):
            batches.append(summary(batch))
    assert batches == [
        ["Insert http://10.0.0.1:9000"],
        ["Insert http://10.0.0.2:9000", "Remove http://10.0.0.1:9000"],
    ]
    assert slept == [7.0, 7.0, 7.0]


async def test_dns_discovery_with_the_system_resolver_finds_localhost() -> None:
    disc = DnsDiscovery("localhost", 8000)
    events = await asyncio.wait_for(disc.resolve_once(), timeout=5.0)
    assert events and all(isinstance(e, Insert) for e in events)
    assert all(e.endpoint.port == 8000 for e in events)


@pytest.mark.parametrize(
    ("args", "message"),
    [(("", 80, 1.0), "hostname"), (("svc", 0, 1.0), "port"), (("svc", 80, 0.0), "interval")],
)
def test_dns_discovery_validates_arguments(args: tuple[str, int, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DnsDiscovery(*args)


def test_file_discovery_validates_interval(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="poll_interval"):
        FileDiscovery(tmp_path / "x", poll_interval=0)


def test_remove_event_matches_by_url() -> None:
    assert Remove(ep("http://a:1=3")) == Remove(ep("http://a:1"))
