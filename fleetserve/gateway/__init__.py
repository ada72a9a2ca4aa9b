"""The gateway: balances HTTP and gRPC inference requests across replicas by their real load.

Three wings, the way tower separates balance / load / discover:

- :mod:`.balance` — which replicas exist (discovery), how loaded each is (one estimator per module, ORCA
  reports), whether it may take traffic (health checks, outlier ejection, slow start, per-replica caps) and
  which one takes a request (one power-of-two-choices over a pluggable cost, round-robin, weighted
  round-robin); the retry budget;
- :mod:`.forward` — one forwarding core (pick → slot → attempt → classify → retry or hedge) with thin HTTP
  and gRPC adapters, the upstream keep-alive pool and hedging;
- :mod:`.edge` — the guards (input limits, shedding, JWT, rate limits) of both listeners, and the listeners.

Beside them, :mod:`.autoscale` runs the autoscaling rules (:mod:`fleetserve.autoscale`) on what the forwarding
core sees, takes the fleet an actuator pushes, and holds requests while no replica exists (scale from zero).

At the top: :mod:`.command` (``fleetserve gateway``), :mod:`.config`, :mod:`.server` (wires one gateway
process together; ``--workers N`` processes), :mod:`.app` (the HTTP routes), :mod:`.admin` and
:mod:`.metrics`.
"""
