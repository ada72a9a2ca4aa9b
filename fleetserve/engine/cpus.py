"""How many CPUs this process may really use: its affinity mask, capped by its cgroup's CPU quota.

``os.sched_getaffinity`` sees every core of the node inside a container without a cpuset, so a pod with
a 2-CPU limit on a 96-core node would start 96 ONNX Runtime threads and spend its quota on contention.
The quota is read the way the Linux kernel documents it: cgroup v2 ``cpu.max`` ("QUOTA PERIOD", or
"max PERIOD" for none), cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1 for none), for the
process's own cgroup (``/proc/self/cgroup``) and every ancestor, keeping the smallest — a limit set on a
parent (the pod) binds its children (the containers), as Go's runtime reads it since Go 1.25.

Threads are the quota rounded *down* (at least one): a fractional remainder cannot run a whole thread
without CFS throttling the process at the end of each period, which shows as tail latency.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
_V1_CONTROLLER_DIRS = ("cpu,cpuacct", "cpu", "cpuacct,cpu")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _v2_quota(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")
    if not text:
        return None
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_quota(directory: Path) -> float | None:
    quota_text, period_text = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    if quota_text is None or period_text is None:
        return None
    try:
        quota, period = int(quota_text), int(period_text)
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _lineage(mount: Path, relative: str) -> list[Path]:
    """The cgroup's directory under ``mount`` and its ancestors up to ``mount``. Inside a cgroup namespace
    the path in /proc/self/cgroup is "/" and the mount itself is the container's cgroup."""
    leaf = mount / relative.strip("/")
    if not leaf.is_dir():
        return [mount]
    dirs = [leaf]
    while dirs[-1] != mount and mount in dirs[-1].parents:
        dirs.append(dirs[-1].parent)
    return dirs


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The CPU quota in CPUs (e.g. 2.5) that binds this process, or None where no quota is set."""
    lines = (_read(proc_cgroup) or "").splitlines()
    limits: list[float] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, relative = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            v2_mount = root if (root / "cgroup.controllers").is_file() else root / "unified"
            limits += [q for d in _lineage(v2_mount, relative) if (q := _v2_quota(d)) is not None]
        elif "cpu" in controllers.split(","):
            for name in _V1_CONTROLLER_DIRS:
                if (root / name).is_dir():
                    limits += [q for d in _lineage(root / name, relative) if (q := _v1_quota(d)) is not None]
                    break
    return min(limits) if limits else None


def affinity_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def available_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int:
    """Whole CPUs to size thread pools by: the affinity mask, capped by the cgroup quota rounded down."""
    cpus = affinity_cpus()
    limit = cgroup_cpu_limit(root, proc_cgroup)
    if limit is not None:
        cpus = min(cpus, max(1, math.floor(limit)))
    return cpus
