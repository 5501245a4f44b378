"""The proxy ``gpupool up`` starts: JupyterHub's configurable-http-proxy, with every route in place at once.

JupyterHub adds the hub's route and the services' routes only after every managed service has answered, so
with a plain ``ConfigurableHTTPProxy`` the login page waits on the gpupool service's start (a second and more
of imports and opening the store, after the hub's own start). :class:`RoutedAtStartProxy` adds the routes
JupyterHub would add to a proxy it finds restarted (:meth:`Proxy.restore_routes`: the hub, the servers it
knows, the services) as soon as the proxy runs. The hub then answers as soon as it listens, and a request for
the service's prefix goes to the service's port, where it waits for the service instead of reaching the hub.
JupyterHub's own route check, once the services answer, finds every route already there.
"""

from __future__ import annotations

from jupyterhub.proxy import ConfigurableHTTPProxy  # type: ignore[import-untyped]


class RoutedAtStartProxy(ConfigurableHTTPProxy):  # type: ignore[misc]  # jupyterhub is untyped
    """``ConfigurableHTTPProxy`` that routes the hub and the services when it starts, not after the services
    have started. Set as ``c.JupyterHub.proxy_class`` by ``hub_config/embedded.py``."""

    async def start(self) -> None:
        await super().start()
        await self.restore_routes()
