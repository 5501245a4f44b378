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
