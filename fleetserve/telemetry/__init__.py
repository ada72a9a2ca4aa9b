"""Telemetry: Prometheus metrics, GPU statistics (NVML) and W3C trace context."""
