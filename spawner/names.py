"""Where the service lives in the hub: the names every side (service, spawners, widgets, CLI) agrees on."""

SERVICE_NAME = "gpupool"
"""The service's name in JupyterHub (``c.JupyterHub.services``) and in its scopes' filters."""

SERVICE_PREFIX = f"/services/{SERVICE_NAME}/"
"""The service's path under the hub's public URL; JupyterHub gives every service ``/services/<name>/``."""

API_PATH = "api/v1"
"""The versioned API under :data:`SERVICE_PREFIX`."""

UP_STATE = ".gpupool"
"""``gpupool up``'s state folder by default (``--state-dir``)."""

SERVICE_FILE = "service.json"
"""In that folder: where ``gpupool up``'s service listens, so the ``gpupool`` commands run there find it."""

URL_ENV = "GPUPOOL_SERVICE_URL"
"""Where a client finds the service: its URL with the prefix, e.g. :data:`EXAMPLE_URL`."""

TOKEN_ENV = "JUPYTERHUB_API_TOKEN"
"""Who a client calls as: a JupyterHub API token (a notebook server's own, or one passed with ``--token``)."""

EXAMPLE_URL = f"http://127.0.0.1:8000{SERVICE_PREFIX}"
"""The service behind ``gpupool up``'s proxy: the hub's public URL plus :data:`SERVICE_PREFIX`."""

ADMIN_REQUIRED = "admin_required"
"""The error of a 403 whose call only administrators (``custom:gpupool:admin``) may make: clients add how to
get an admin's token."""
