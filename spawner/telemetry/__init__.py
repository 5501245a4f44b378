"""Telemetry as plain records: samples of devices, a ring buffer of recent ones, per-minute aggregates.

Pure domain code: no I/O and no clock. Backends (:mod:`..backends.nvml_telemetry`,
:mod:`..backends.simulated_telemetry`) produce :class:`Snapshot` objects; the service keeps them here.
"""

from .aggregates import Holder, MinuteAggregate, MinuteAggregator
from .history import SampleHistory
from .samples import Sample, Snapshot

__all__ = ["Holder", "MinuteAggregate", "MinuteAggregator", "Sample", "SampleHistory", "Snapshot"]
