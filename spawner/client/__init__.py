"""One client for the gpupool service's HTTP API, used by the spawners, the widgets and the CLI.

:class:`Connection` finds the service (arguments, else ``GPUPOOL_SERVICE_URL``/``JUPYTERHUB_API_TOKEN``)
and calls it, blocking or asynchronously; :class:`ServiceClient` adds the hub's lease calls; every failure
is one :class:`GpupoolError` with the service's sentence.
"""

from .connection import EXAMPLE_URL, Connection, locate
from .errors import GpupoolError
from .leases import Availability, ServiceClient

__all__ = ["EXAMPLE_URL", "Availability", "Connection", "GpupoolError", "ServiceClient", "locate"]
