"""Fleet simulator and capacity planner: predict p99, replicas and cost from measured engine profiles.

``profile`` / ``profiler``: what one engine and replica cost (``fleetserve profile``). ``events``: the
discrete-event core. ``host``: servers sharing CPU or GPU capacity. ``replica`` (the real batch collator),
``gateway`` + ``front`` (the real balancer, policies, health and ejection), ``arrivals``, ``faults``,
``scaling``: the pieces :mod:`fleetserve.sim.simulator` wires together. ``planner``: the smallest fleet that
holds an SLO (``fleetserve plan``).
"""
