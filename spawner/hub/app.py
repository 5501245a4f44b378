"""The JupyterHub application ``gpupool up`` and the installed hub's launcher run: JupyterHub, with its users'
servers stopped before its services, no proxy left behind by a start that fails, and where to log in said once
it has started.

A setting no class the hub runs with has (a typo in an ``-f`` file) stops it at start, naming the setting
and the closest one there is (:mod:`.setting_names`).

JupyterHub's shutdown stops the managed services first and the single-user servers after them. A gpupool
server's stop hands its lease back to the gpupool service, which by then is gone: every release failed, was
logged as such, and the leases stayed held until the next start's reconciliation. Stopping the servers first,
while the service still answers, returns each lease at once. With ``cleanup_servers = False`` (the production
configuration: servers outlive a hub restart) nothing changes.
"""

from __future__ import annotations

import asyncio
import atexit
from typing import Any

from jupyterhub.app import JupyterHub  # type: ignore[import-untyped]
from jupyterhub.crypto import CryptKeeper  # type: ignore[import-untyped]
from traitlets import Unicode

from .setting_names import unknown_setting


class GpupoolHub(JupyterHub):  # type: ignore[misc]
    """JupyterHub whose shutdown stops the users' servers while the gpupool service still runs, and whose
    proxy never outlives a start that ends early: a Ctrl-C while it is still starting (JupyterHub handles the
    signal only once it has started: before, the interrupt ends the process without its cleanup), or a
    managed service that fails to start (JupyterHub then exits at once, its proxy left running)."""

    started_message = Unicode(
        "",
        help="""A line printed once the hub has started, its proxy and services up (``gpupool up``: where to
        log in, with the demo password), so that a start that fails, such as an ``-f`` file that raises,
        invites no one to log in. Empty: none.""",
    )

    def load_config_file(self, *args: Any, **kwargs: Any) -> None:
        """JupyterHub's, then a stop on a setting no class the hub runs with has (``setting_names``)."""
        super().load_config_file(*args, **kwargs)
        running_with = [
            type(self),
            self.spawner_class,
            self.authenticator_class,
            self.proxy_class,
            CryptKeeper,
        ]
        unknown = unknown_setting(self.config, running_with)
        if unknown:
            raise SystemExit(f"gpupool: {unknown}")

    async def start(self) -> None:
        atexit.register(self._stop_proxy_left_running)
        await super().start()
        if self.started_message:
            print(self.started_message, flush=True)

    def _stop_proxy_left_running(self) -> None:
        process = getattr(self.proxy, "proxy_process", None)
        if process is not None and process.poll() is None:
            process.terminate()

    async def cleanup(self) -> None:
        if self.cleanup_servers:
            stopping = [
                user.stop(name)
                for user in self.users.values()
                for name, spawner in list(user.spawners.items())
                if spawner.active
            ]
            if stopping:
                self.log.info("Stopping %i single-user servers before the services...", len(stopping))
                for failure in await asyncio.gather(*stopping, return_exceptions=True):
                    if isinstance(failure, Exception):
                        self.log.error("Failed to stop a server: %s", failure)
        await super().cleanup()  # the services, the proxy; no server is left active for it to stop


main = GpupoolHub.launch_instance

if __name__ == "__main__":
    main()
