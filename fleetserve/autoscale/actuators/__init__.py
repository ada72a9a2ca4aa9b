"""Actuators carry out the gateway's desired replica count: :mod:`.local` with processes on this machine
(``fleetserve up --autoscale``). On Kubernetes the HorizontalPodAutoscaler reads the gateway's metrics instead."""
