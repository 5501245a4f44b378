"""What gpupool's hub side needs from JupyterHub, on every version it supports (5.3 through 6.x).

Zero to JupyterHub's charts ship JupyterHub 5.x in their hub image; :class:`SpawnException` (a spawn refused
for a reason the user should read, with an HTTP status) arrived in 6.0. On 5.x the stand-in below gives the
same interface. Both set ``jupyterhub_message``, which the hub's progress page shows as the reason.
"""

from __future__ import annotations

from typing import Any

import jupyterhub  # type: ignore[import-untyped]
from tornado import web

try:
    from jupyterhub.spawner import SpawnException as _HubSpawnException  # type: ignore[import-untyped]
except ImportError:  # JupyterHub < 6

    class SpawnException(web.HTTPError):
        """JupyterHub 6's ``SpawnException`` for JupyterHub 5: ``message`` is what the user reads."""

        def __init__(
            self,
            message: str,
            *,
            reason: str,
            log_message: str = "",
            message_html: str = "",
            status_code: int = 400,
        ) -> None:
            super().__init__(status_code, log_message or message, reason=reason)  # what the log says
            self.message = message
            self.message_html = message_html
            self.jupyterhub_message = message  # JupyterHub 5's spawn page shows this instead of str(error)
            if message_html:
                self.jupyterhub_html_message = message_html

        def __str__(self) -> str:
            return f"{self.status_code} SpawnException(reason={self.reason}): {self.get_message()}"


else:

    class SpawnException(_HubSpawnException):  # type: ignore[no-redef,misc]
        """JupyterHub 6's ``SpawnException``, with ``jupyterhub_message`` set: the progress page then says
        "Spawn failed: <the message>", a sentence, not "503 SpawnException(reason=…): …"."""

        def __init__(self, message: str, **kwargs: Any) -> None:
            super().__init__(message, **kwargs)
            self.jupyterhub_message = message


__all__ = ["SpawnException", "service_start_timeout"]


def service_start_timeout(seconds: int) -> dict[str, int]:
    """A managed service's ``timeout`` (how long JupyterHub waits for it to answer before giving up), as the
    fields of its spec: JupyterHub 6 added the field (default 30 s); JupyterHub 5 refuses any field it does
    not know, and waits its own fixed ten tries instead."""
    return {"timeout": seconds} if _major(jupyterhub.__version__) >= 6 else {}


def _major(version: str) -> int:
    return int(version.split(".", 1)[0])
