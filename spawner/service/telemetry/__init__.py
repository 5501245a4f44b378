"""The service's telemetry loop: samples from the backend, kept recent and aggregated per minute."""
