"""A process of a local fleet: ``python -m fleetserve.fleet.child CONFIG_FILE PARENT_PID`` runs the replica or
gateway whose validated config the supervisor wrote there (pickled with the log level), and reads no flags or
environment. It is asked to stop (SIGTERM: a replica drains) when its supervisor dies, even by SIGKILL, so no
child outlives its fleet.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
from pathlib import Path

from fleetserve.gateway.config import GatewayConfig
from fleetserve.replica.config import ReplicaConfig
from fleetserve.telemetry import logs

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def stop_with_parent(parent: int) -> None:
    """SIGTERM this process when ``parent`` exits (Linux ``prctl(PR_SET_PDEATHSIG)``); at once if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the supervisor's own stop() is all there is
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def main(path: str, parent: int) -> int:
    config, log_level, log_format = pickle.loads(Path(path).read_bytes())
    logs.install(log_level, log_format)
    stop_with_parent(parent)
    if isinstance(config, ReplicaConfig):
        from fleetserve.replica.server import run as run_replica

        return run_replica(config)
    if isinstance(config, GatewayConfig):
        from fleetserve.gateway.workers import run_gateway

        return run_gateway(config)
    raise TypeError(f"{path} holds a {type(config).__name__}, not a replica or gateway config")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
