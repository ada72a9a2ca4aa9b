"""The gateway: balances HTTP and gRPC inference requests across replicas by their real load.

Data plane: ``app`` (aiohttp routes), ``proxy`` (forward, retry, deadline), ``upstream`` and
``http1`` (keep-alive connection pools), ``grpc_proxy`` (per-call gRPC balancing), ``admin`` and
``metrics``, ``tracing``; ``server`` runs it all (``fleetserve gateway``). Balancing core:
``balancer``, ``policies/``, ``load``, ``health``, ``outlier``, ``slowstart``, ``retry``,
``discovery``. Edge guards live in ``edge/``.
"""
