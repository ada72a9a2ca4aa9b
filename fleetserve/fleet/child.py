"""A process of a local fleet: ``python -m fleetserve.fleet.child CONFIG_FILE`` runs the replica or gateway whose
validated config the supervisor wrote there (pickled with the log level), and reads no flags or environment.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

from fleetserve.gateway.config import GatewayConfig
from fleetserve.replica.config import ReplicaConfig
from fleetserve.telemetry import logs


def main(path: str) -> int:
    config, log_level = pickle.loads(Path(path).read_bytes())
    logs.install(log_level)
    if isinstance(config, ReplicaConfig):
        from fleetserve.replica.server import run as run_replica

        return run_replica(config)
    if isinstance(config, GatewayConfig):
        from fleetserve.gateway.server import run_gateway

        return run_gateway(config)
    raise TypeError(f"{path} holds a {type(config).__name__}, not a replica or gateway config")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
