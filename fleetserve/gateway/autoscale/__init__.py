"""The autoscaler inside the gateway: the rules (:mod:`fleetserve.autoscale`) run where the signals are.

- :mod:`.hold` — scale from zero: requests wait in a bounded queue while no replica exists;
- :mod:`.members` — membership an actuator pushes (``--discovery actuator``);
- :mod:`.scaler` — the tick task: the signal window's snapshot, the rule's decision, the state actuators read;
- :mod:`.metrics` — ``fleetserve_autoscale_*`` on the gateway's ``/metrics``;
- :mod:`.routes` — ``GET /gateway/autoscale`` and ``PUT /gateway/autoscale/members``.
"""
