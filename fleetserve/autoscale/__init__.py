"""Autoscaling: one fleet snapshot per tick (:mod:`.signals`), rules that turn snapshots into a replica count
(:mod:`.rules`), and actuators that carry the count out (:mod:`.actuators`).

The rules run in the gateway, where the signals already are; an actuator (``fleetserve up``'s local one, or
Kubernetes' HorizontalPodAutoscaler reading ``fleetserve_autoscale_desired_replicas``) applies the result.
"""
