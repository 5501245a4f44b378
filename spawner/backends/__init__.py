"""Backends that discover devices and build a pool: simulated (pool file) and NVML."""
