"""What ``gpupool up -f`` files set for the gpupool service reaches that service.

The service is a process of its own, configured by its environment and command line, while ``-f`` files are
loaded into the hub's config. A trial found ``c.ServiceSettings.policy = "best-fit"`` in an ``-f`` file doing
nothing, and a profiles file given to the spawner filling the form with profiles the service had never heard
of (every start of them refused, "unknown profile"). After the ``-f`` files, :func:`pass_to_service` makes one
profiles file the form's and the service's, and hands every ``c.ServiceSettings`` value to the service on its
command line, which wins over its environment and its own config file. Mistakes stop the hub at start-up.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from traitlets import TraitError
from traitlets.config import Config

from ..files.profiles_file import EXAMPLE_PROFILES, load_profiles

#: ``ServiceSettings`` traits that name a file: made absolute, since the service runs in the state folder.
PATH_SETTINGS = ("config_file", "pool_file", "profiles_file", "quotas_file", "kubeconfig")


def pass_to_service(c: Config, name: str, *, kube: bool, environ: Mapping[str, str] = os.environ) -> None:
    """Give the spawner (``KubeGPUSpawner`` if ``kube``, else ``SimpleLocalGPUSpawner``) and the managed service
    ``name`` of ``c.JupyterHub.services`` one profiles file, checked now, and the ``c.ServiceSettings`` the
    config holds; SystemExit naming the setting."""
    if kube:
        from .kube_spawner import KubeGPUSpawner as spawner_class
    else:
        from .spawner import SimpleLocalGPUSpawner as spawner_class
    service = next(entry for entry in c.JupyterHub.services if entry.get("name") == name)
    settings = dict(c.ServiceSettings) if "ServiceSettings" in c else {}
    _check_service_settings(settings)
    for setting in PATH_SETTINGS:
        if settings.get(setting):
            settings[setting] = str(Path(str(settings[setting])).resolve())
    if kube and (namespace := _one_namespace(c, settings.get("kube_namespace"))):
        settings["kube_namespace"] = namespace  # one namespace for servers and jobs, whichever side set it
    if settings.get("quotas_file"):  # read now, as gpupool up reads GPUPOOL_QUOTAS: not once the hub is up
        _check_quotas_file(str(settings["quotas_file"]))
    profiles = _one_profiles_file(c, spawner_class, settings.get("profiles_file"), environ)
    c[spawner_class.__name__].profiles_file = profiles
    settings["profiles_file"] = profiles
    service["command"] = [*service["command"], *command_line(settings)]


def _check_quotas_file(path: str) -> None:
    from ..files.quotas_file import load_quotas

    try:
        load_quotas(path)
    except (OSError, ValueError) as error:
        raise SystemExit(f"gpupool: {error}") from None


def _one_namespace(c: Config, service_side: str | None) -> str | None:
    spawner_side = c.KubeGPUSpawner.get(
        "namespace"
    )  # gpupool up's: the kubeconfig context's, or an -f file's
    if spawner_side is None:
        if service_side:
            c.KubeGPUSpawner.namespace = service_side
        return service_side
    if service_side and service_side != spawner_side:
        raise SystemExit(
            f"gpupool: c.KubeGPUSpawner.namespace ({spawner_side}) and c.ServiceSettings.kube_namespace "
            f"({service_side}) differ: servers and jobs share one namespace; set the spawner's alone"
        )
    return str(spawner_side)


def command_line(settings: Mapping[str, Any]) -> list[str]:
    """``--ServiceSettings.name=value`` for each setting, as the service's command line reads them."""
    return [f"--ServiceSettings.{name}={value}" for name, value in settings.items()]


def _check_service_settings(settings: dict[str, Any]) -> None:
    from ..service.settings import ServiceSettings

    known = sorted(ServiceSettings.class_trait_names(config=True))
    for name in settings:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; it has {', '.join(known)}"
            raise SystemExit(
                f"gpupool: c.ServiceSettings.{name}: the gpupool service has no such setting{hint}"
            )
    try:
        ServiceSettings(config=Config({"ServiceSettings": settings}))
    except TraitError as error:
        raise SystemExit(f"gpupool: c.ServiceSettings: {error}") from None


def _one_profiles_file(
    c: Config, spawner_class: type, for_service: str | None, environ: Mapping[str, str]
) -> str:
    """The profiles file an ``-f`` file gave the spawner or the service (both: the same one), else
    ``GPUPOOL_PROFILES``, else the shipped example; absolute, and loaded once to check it."""
    for_spawner = _spawner_profiles_file(c, spawner_class)
    if for_spawner and for_service and Path(for_spawner[1]).resolve() != Path(for_service):
        raise SystemExit(
            f"gpupool: {for_spawner[0]} is {for_spawner[1]} but c.ServiceSettings.profiles_file is "
            f"{for_service}: the spawn form and the gpupool service must read the same profiles; set one"
        )
    chosen = (for_spawner and for_spawner[1]) or for_service or environ.get("GPUPOOL_PROFILES")
    path = str(Path(chosen).resolve()) if chosen else str(EXAMPLE_PROFILES)
    try:
        load_profiles(path)
    except (OSError, ValueError) as error:
        raise SystemExit(f"gpupool: {error}") from None
    return path


def _spawner_profiles_file(c: Config, spawner_class: type) -> tuple[str, str] | None:
    """Where the config sets ``profiles_file`` for ``spawner_class`` (its own section first, then its bases')
    and to what, if it does."""
    for cls in spawner_class.__mro__:
        if cls.__name__ in c and "profiles_file" in c[cls.__name__]:
            return f"c.{cls.__name__}.profiles_file", str(c[cls.__name__].profiles_file)
    return None
