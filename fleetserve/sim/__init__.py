"""Fleet simulator and capacity planner: predict p99, replicas and cost from measured engine profiles.

- ``profile`` (the profile format), ``profiler`` and ``costs`` (how ``fleetserve profile`` measures one);
- ``events`` (the discrete-event core), ``host`` (FIFO servers sharing CPU or GPU capacity);
- ``replica`` (the real batch collator), ``gateway`` (the one door to the real balancer, policies, health and
  ejection) and ``front`` (gateway workers and their retry rule), ``arrivals``, ``faults``, ``scaling``,
  ``request``, ``config``, ``results``: the pieces :mod:`fleetserve.sim.simulator` wires together;
- ``planner`` and ``plot``: the smallest fleet that holds an SLO (``fleetserve plan``).
"""
