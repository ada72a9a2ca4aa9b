"""Local fleet: N supervised replica processes and a gateway on one machine (``fleetserve up``)."""
