"""Fault injection for scenario runs: what a sick GPU, a crash and a rollout do to one replica process.

- :func:`duty_cycle_stop`: SIGSTOP the process for ``stop_ms`` of every ``period_ms`` — a thermally
  throttled GPU that still passes health checks (the seed's overheating card), as seen from the network.
- :func:`crash`: SIGKILL, no drain — a pod lost to an OOM kill or a node failure.
- :func:`rolling_restart`: SIGTERM each replica in turn and wait until the supervisor brought it back
  ready — a Kubernetes rolling update.
- network partitions (``partition-drop``, ``partition-delay`` in :mod:`fleetserve.bench.scenarios`): the replica
  runs in its own network namespace and its packets are dropped or delayed, never refused — a node or link
  that went silent; the namespace and its faults are :class:`fleetserve.bench.netns.NetworkNamespace`.
Only PIDs of processes this program started are ever signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable, Sequence


async def duty_cycle_stop(pid: int, stop: asyncio.Event, *, stop_ms: float = 80, period_ms: float = 100) -> int:
    """Alternate SIGSTOP/SIGCONT until ``stop`` is set; returns the cycles run. Always leaves it running."""
    cycles = 0
    try:
        while not stop.is_set():
            os.kill(pid, signal.SIGSTOP)
            await asyncio.sleep(stop_ms / 1000)
            os.kill(pid, signal.SIGCONT)
            cycles += 1
            await asyncio.sleep((period_ms - stop_ms) / 1000)
    except ProcessLookupError:
        pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    return cycles


def crash(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


async def rolling_restart(
    pids: Callable[[], Sequence[int]],
    wait_ready: Callable[[int], Awaitable[None]],
    *,
    pause_s: float = 1.0,
) -> int:
    """SIGTERM replica i, wait until it is back and ready, pause, go on; returns replicas restarted."""
    count = len(pids())
    for i in range(count):
        os.kill(pids()[i], signal.SIGTERM)
        await wait_ready(i)
        await asyncio.sleep(pause_s)
    return count
