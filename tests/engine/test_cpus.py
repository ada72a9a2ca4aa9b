"""The cgroup CPU quota parser, on cgroup trees written to temp folders (v2, v1, namespaced, nested)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetserve.engine import cpus
from fleetserve.engine.cpus import available_cpus, cgroup_cpu_limit


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _v2(tmp_path: Path, relative: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    _write(root / "cgroup.controllers", "cpu memory\n")
    for rel, text in files.items():
        _write(root / rel, text)
    proc = tmp_path / "proc-self-cgroup"
    _write(proc, f"0::{relative}\n")
    return root, proc


def test_v2_quota_of_a_namespaced_container(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, "/", {"cpu.max": "250000 100000\n"})
    assert cgroup_cpu_limit(root, proc) == pytest.approx(2.5)


def test_v2_without_a_quota(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, "/", {"cpu.max": "max 100000\n"})
    assert cgroup_cpu_limit(root, proc) is None


def test_v2_the_tightest_ancestor_binds(tmp_path: Path) -> None:
    root, proc = _v2(tmp_path, "/kubepods/pod1/ctr", {
        "kubepods/cpu.max": "max 100000",
        "kubepods/pod1/cpu.max": "150000 100000",
        "kubepods/pod1/ctr/cpu.max": "400000 100000",
    })
    assert cgroup_cpu_limit(root, proc) == pytest.approx(1.5)


def test_v1_cfs_quota(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _write(root / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_quota_us", "300000\n")
    _write(root / "cpu,cpuacct" / "docker" / "abc" / "cpu.cfs_period_us", "100000\n")
    _write(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")
    _write(root / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    proc = tmp_path / "proc"
    _write(proc, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n")
    assert cgroup_cpu_limit(root, proc) == pytest.approx(3.0)


def test_v1_unlimited_and_separate_controller_mounts(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    _write(root / "cpu" / "cpu.cfs_quota_us", "-1\n")
    _write(root / "cpu" / "cpu.cfs_period_us", "100000\n")
    proc = tmp_path / "proc"
    _write(proc, "2:cpuacct:/\n1:cpu:/\n0::/\n")
    assert cgroup_cpu_limit(root, proc) is None


@pytest.mark.parametrize("text", ["", "garbage", "0 100000", "100000 0", "1 2 3", "abc 100000"])
def test_unreadable_quota_files_mean_no_quota(tmp_path: Path, text: str) -> None:
    root, proc = _v2(tmp_path, "/", {"cpu.max": text})
    assert cgroup_cpu_limit(root, proc) is None


def test_no_cgroup_files_at_all(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path / "none", tmp_path / "missing") is None


def test_available_cpus_rounds_the_quota_down_and_never_below_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 96)
    root, proc = _v2(tmp_path, "/", {"cpu.max": "250000 100000"})
    assert available_cpus(root, proc) == 2
    (root / "cpu.max").write_text("50000 100000")
    assert available_cpus(root, proc) == 1
    (root / "cpu.max").write_text("max 100000")
    assert available_cpus(root, proc) == 96
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 4)
    (root / "cpu.max").write_text("800000 100000")
    assert available_cpus(root, proc) == 4  # a quota above the cores the process may run on changes nothing
